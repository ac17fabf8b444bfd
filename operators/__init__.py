"""Airflow operators for training-job lifecycles (installed as `airflow_ett.operators`).

The prewarm, train and publish operators and the lifecycle DAG factory land with the
Airflow-integration work; this package exists now so that the install layout (the
`airflow_ett/operators` symlink) is exercised by every tool from the first commit.
"""
