"""The nightly fleet rollup: each day's ETT figures into the ett_daily_* tables and the
day's reports into <[ett] report_dir>/<date>/ (see airflow_ett/operators/rollup.py)."""

from airflow_ett.operators.rollup import fleet_rollup_dag

dag = fleet_rollup_dag()
