"""airflow-ett: training-job lifecycles on Airflow, with Effective Training Time measured.

Kept import-free on purpose: Airflow instantiates our plugin in every process, and the
trainer imports `airflow_ett.trainer` without Airflow at all.
"""

__version__ = "0.1.0"
