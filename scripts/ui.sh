#!/usr/bin/env bash
# The Airflow UI with the airflow_ett plugin loaded, on the same embedded setup as the
# demo ($AIRFLOW_HOME, default ./airflow_home): scheduler, dag-processor, triggerer and
# API server as separate processes, the UI on http://127.0.0.1:${PORT:-8080}. It prints
# the login (user admin, password generated into
# $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated). Ctrl-C stops everything.
#
#   scripts/ui.sh           (or: make ui, which runs make setup first)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ -x .venv/bin/airflow-ett ] || { echo "ui: ERROR: .venv is missing: run \`make setup\`" >&2; exit 1; }

export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/airflow_home}"
exec .venv/bin/airflow-ett embedded ui --home "$AIRFLOW_HOME" --dags-folder "$ROOT/dags" \
    --port "${PORT:-8080}"
