"""The ETT model: events in, attribution out. Pure Python: no Airflow, no SQL, no I/O."""
