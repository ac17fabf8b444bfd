"""The ETT model: events in, attribution out, and the typed `JobSummary` every reader outside
the model gets (`ett.summary`). Pure Python: no Airflow, no SQL, no I/O."""
