"""Alembic environment for the ETT store.

Run by `airflow_ett.store.migrate`, which passes the engine (or the URL) in
`config.attributes`; there is no alembic.ini and no logging setup here, since the caller
(CLI, tests, a DAG) owns logging.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Engine

from airflow_ett.store.engine import make_engine, writer
from airflow_ett.store.schema import VERSION_TABLE, metadata

# Any constant will do; it only has to be the same in every process that upgrades.
_PG_ADVISORY_LOCK_KEY = 0x45_54_54_00  # "ETT\0"


def _url() -> str:
    config = context.config
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("ETT migrations need a URL: use airflow_ett.store.migrate.upgrade()")
    return str(url)


def _version_table() -> str:
    return str(context.config.attributes.get("version_table") or VERSION_TABLE)


def run_migrations_offline() -> None:
    url = _url()
    context.configure(url=url, target_metadata=metadata, version_table=_version_table(),
                      literal_binds=True, transactional_ddl=True,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = context.config.attributes.get("engine")
    engine: Engine = given if given is not None else writer(make_engine(_url()))
    try:
        with engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            # On SQLite the store's own BEGIN makes DDL transactional, which Alembic does
            # not assume by default: one upgrade commits whole or not at all.
            context.configure(connection=connection, target_metadata=metadata,
                              version_table=_version_table(), transactional_ddl=True,
                              render_as_batch=sqlite)
            with context.begin_transaction():
                if connection.dialect.name == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                       {"key": _PG_ADVISORY_LOCK_KEY})
                context.run_migrations()
    finally:
        if given is None:
            engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
