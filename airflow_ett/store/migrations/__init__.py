"""The store's Alembic environment; run through `airflow_ett.store.migrate`, not alembic.ini."""
