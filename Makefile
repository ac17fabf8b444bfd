# airflow-ett developer entry points. Every target that needs .venv builds it first
# (scripts/setup.sh is a no-op when .venv is current).
SHELL := /bin/bash
.DEFAULT_GOAL := help

.PHONY: help setup test demo ui lint constraints mutation

help:
	@echo "make setup        create/refresh .venv from constraints.txt (idempotent)"
	@echo "make test         setup, then ruff, mypy and every pytest tier (what CI runs)"
	@echo "make demo         setup, then run the demo lifecycle DAG on an embedded Airflow and print its ETT%"
	@echo "make ui           setup, then start the embedded Airflow UI with the plugin (Ctrl-C stops it)"
	@echo "make lint         setup, then ruff check and mypy only"
	@echo "make constraints  re-resolve pyproject.toml into constraints.txt"
	@echo "make mutation     setup, then mutation-test airflow_ett/ett/ with mutmut (not in CI; ~15 min)"

setup:
	@bash scripts/setup.sh

test: setup
	@bash scripts/test.sh

demo: setup
	@bash scripts/demo.sh

ui: setup
	@bash scripts/ui.sh

lint: setup
	.venv/bin/ruff check .
	.venv/bin/mypy -p airflow_ett

constraints:
	@bash scripts/update-constraints.sh

mutation: setup
	@bash scripts/mutation.sh
