#!/usr/bin/env bash
# Mutation testing of airflow_ett/ett/ with mutmut (settings: [tool.mutmut] in
# pyproject.toml: mutate airflow_ett/ett/, run tests/ett). Not in CI: about 10-15 min on 2
# cores. Prints the score and every mutant that was not killed; bench/RESULTS.md keeps the
# latest score and why each survivor is equivalent.
#   make mutation                 (a fresh run: the mutants/ folder is made anew)
#   scripts/mutation.sh --resume  (go on from an interrupted run)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ "${1:-}" == "--resume" ]] || rm -rf mutants
mkdir -p mutants
log=mutants/run.log
echo "mutation: mutmut run over airflow_ett/ett/ (log: $log)"
.venv/bin/mutmut run --max-children "${JOBS:-$(nproc)}" >"$log" 2>&1 || {
    echo "mutation: mutmut failed; the end of $log:" >&2; tail -n 30 "$log" >&2; exit 1; }
.venv/bin/mutmut results --all true | .venv/bin/python scripts/mutation_report.py
