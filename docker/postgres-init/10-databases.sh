#!/usr/bin/env bash
# Creates the deployment's two databases on the first start of an empty data volume (the
# postgres image runs /docker-entrypoint-initdb.d/* once, as $POSTGRES_USER):
#   airflow  Airflow's metadata database (and the Celery result backend)
#   ett      the ETT store (airflow_ett/store: its own engine, its own migrations)
# Separate databases, because the store is never written through Airflow's session and its
# migrations (alembic, `airflow-ett db upgrade`) must not meet Airflow's in one schema.
# Idempotent: a database that exists is left alone. ETT_INIT_DATABASES replaces the two
# names (tests/docker/test_compose.py runs this script against a real server with
# throwaway names); compose.yaml's URLs name `airflow` and `ett`.
set -euo pipefail

for db in ${ETT_INIT_DATABASES:-airflow ett}; do
    psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres -v db="$db" <<'SQL'
SELECT format('CREATE DATABASE %I OWNER %I', :'db', current_user)
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db')\gexec
SQL
done
