#!/usr/bin/env bash
# The main job: the demo lifecycle DAG `ett_dlrm_demo` (prewarm compile cache -> train
# with one injected failure, recovered in place -> publish on CPU) run by a real embedded
# Airflow: SQLite metadata DB and LocalExecutor under $AIRFLOW_HOME (default
# ./airflow_home in the project), with the scheduler, dag-processor, triggerer and API
# server as separate processes. It waits for the run, prints its ETT% with the
# Level-1/Level-2 breakdown, stops every process it started, and exits 0 when the run
# succeeded.
#
#   scripts/demo.sh         (or: make demo, which runs make setup first)
#   DEMO_CONF='{"inject_fault": "none"}' scripts/demo.sh     # the trigger form's params
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ -x .venv/bin/airflow-ett ] || { echo "demo: ERROR: .venv is missing: run \`make setup\`" >&2; exit 1; }

export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/airflow_home}"
echo "demo: AIRFLOW_HOME=$AIRFLOW_HOME"
args=(embedded run ett_dlrm_demo --home "$AIRFLOW_HOME" --dags-folder "$ROOT/dags" --timeout 900)
[ -n "${DEMO_CONF:-}" ] && args+=(--conf "$DEMO_CONF")
exec .venv/bin/airflow-ett "${args[@]}"
