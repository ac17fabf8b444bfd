#!/usr/bin/env bash
# The main job, end to end on this machine (until the lifecycle DAG lands, issue 4): the
# bundled example job's events go into the ETT store of an embedded setup (SQLite under
# $AIRFLOW_HOME, which defaults to ./airflow_home in the project), and its ETT% with the
# Level-1/Level-2 breakdown is read back from the store.
#
#   scripts/demo.sh         (or: make demo, which runs make setup first)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ -x .venv/bin/airflow-ett ] || { echo "demo: ERROR: .venv is missing: run \`make setup\`" >&2; exit 1; }

EVENTS=airflow_ett/examples/demo_job.jsonl
[ -f "$EVENTS" ] || { echo "demo: ERROR: $EVENTS is missing" >&2; exit 1; }
export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/airflow_home}"
mkdir -p "$AIRFLOW_HOME"
ett=.venv/bin/airflow-ett
JOB="$(head -n 1 "$EVENTS" | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["job"])')"

echo "demo: AIRFLOW_HOME=$AIRFLOW_HOME"
echo "demo: \$ airflow-ett db upgrade";   "$ett" db upgrade
echo "demo: \$ airflow-ett ingest $EVENTS"; "$ett" ingest "$EVENTS"
echo "demo: \$ airflow-ett runs list";    "$ett" runs list
echo "demo: \$ airflow-ett runs show $JOB"
echo
"$ett" runs show "$JOB"
