"""The store's own SQLAlchemy engine, tuned for several writer processes.

The store never borrows Airflow's session: workers have no metadata-DB access in
Airflow 3, and scheduler-side hooks must not commit inside the scheduler's transaction.

SQLite is the embedded default and sees several writers at once (task processes, the
scheduler's listener, the CLI). What keeps them from failing:

- WAL journal: readers never block the writer, nor the writer them.
- A busy timeout (30 s): a writer that finds the lock taken waits instead of failing.
- `BEGIN IMMEDIATE` for write transactions: the write lock is taken when the transaction
  starts. With a plain (deferred) BEGIN a transaction that read first must *upgrade* its
  lock, and SQLite fails that upgrade at once with "database is locked", busy timeout or
  not, since waiting could deadlock. Taking the lock up front makes writers queue.
  sqlite3's own implicit BEGIN is switched off so that SQLAlchemy's `begin` event can
  emit ours (the recipe in SQLAlchemy's SQLite dialect docs).
- `synchronous=NORMAL`: durable at every checkpoint and safe against corruption in WAL
  mode; a power cut may lose the last commits, which the emitter's replay tolerates.

Write transactions are marked with the execution option `ett_write=True` (see `writer`);
everything else gets a deferred BEGIN, so reads never take the write lock.

Only `upgrade` creates a SQLite file (and its folders). Every other engine opens the file
with SQLite's `mode=rw`, which never creates one: a read-only command pointed at a
mistyped path must say the store does not exist, not leave an empty database behind
(which would then say "schema missing" to everyone after it).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from airflow_ett.store.errors import StoreError, StoreUnavailable, mask_url

BUSY_TIMEOUT_S: Final = 30.0
CONNECT_TIMEOUT_S: Final = 10
WRITE_OPTION: Final = "ett_write"
_DRIVERS: Final = {"sqlite": {"pysqlite"}, "postgresql": {"psycopg2"}}
# Driverless names people write, and the installed driver they mean. SQLAlchemy would
# pick psycopg2 for "postgresql" too, but says so nowhere; "postgres" it refuses outright.
_DEFAULT_DRIVER: Final = {"postgresql": "postgresql+psycopg2", "postgres": "postgresql+psycopg2"}


def parse_url(url: str) -> URL:
    """Parse and vet a store URL, raising `StoreError` for one the store cannot use.

    Every store URL passes here (the store, migrations, the emitter's sink), so this is
    where `postgresql://` and `postgres://` become the installed driver's URL. A URL with
    a NUL or a lone surrogate (a path that is not UTF-8) is refused here by the event
    format's rule for text, before a driver fails to encode it.
    """
    from airflow_ett.ett.events import EventError, check_string

    try:
        check_string("store_url", url)
    except EventError as exc:  # the flaw only: the URL may hold a password
        raise StoreError(f"ETT store URL: {exc.message}") from None
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError) as exc:
        raise StoreError(f"ETT store URL {mask_url(url)} is not a valid SQLAlchemy URL: "
                         f"{exc}") from None
    if parsed.drivername in _DEFAULT_DRIVER:
        parsed = parsed.set(drivername=_DEFAULT_DRIVER[parsed.drivername])
    if parsed.host is not None and "@" in parsed.host:
        # SQLAlchemy splits userinfo at the first '@': the rest of the password became
        # part of the host name, which the driver would then quote in its errors.
        raise StoreError(f"ETT store URL {mask_url(url)}: the password holds a character "
                         "that must be percent-encoded in a URL ('@' as %40, ':' as %3A, "
                         "'/' as %2F)")
    try:
        backend, driver = parsed.get_backend_name(), parsed.get_driver_name()
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StoreError(f"ETT store URL {mask_url(url)}: {exc}") from None
    if driver not in _DRIVERS.get(backend, set()):
        raise StoreError(f"ETT store URL {mask_url(url)}: unsupported database "
                         f"'{parsed.drivername}'; use sqlite:///PATH or "
                         "postgresql+psycopg2://USER@HOST/DB")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise StoreError(f"ETT store URL {mask_url(url)}: in-memory SQLite cannot be shared "
                         "between processes; give a file path, e.g. sqlite:////path/ett.db")
    return parsed


def is_sqlite(engine: Engine | Connection) -> bool:
    return engine.dialect.name == "sqlite"


def writer(engine: Engine) -> Engine:
    """The same engine (same pool), with its transactions marked as writes."""
    return engine.execution_options(**{WRITE_OPTION: True})


def make_engine(url: str, *, create: bool = False) -> Engine:
    """An engine for `url`; no connection is made yet.

    SQLite: with `create` (upgrade only) the file's folder is created here, so that a bad
    path fails now with a clear message rather than as sqlite3's "unable to open database
    file"; without it the file is opened as is and never created (`StoreMissing` if absent).
    """
    parsed = parse_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_engine(parsed, create=create)
        return sa.create_engine(
            parsed,
            pool_pre_ping=True,
            connect_args={"connect_timeout": CONNECT_TIMEOUT_S,
                          "application_name": "airflow-ett"},
        )
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StoreError(f"ETT store URL {mask_url(url)}: {exc}") from None


def _sqlite_engine(url: URL, *, create: bool) -> Engine:
    assert url.database is not None
    path = Path(url.database).expanduser()
    user_uri = url.database.startswith("file:") or bool(url.query.get("uri"))
    if create and not user_uri:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"ETT store {mask_url(url)} is unavailable: cannot "
                                   f"create {path.parent}: {exc.strerror or exc}") from None
    engine = sa.create_engine(url if user_uri else url.set(database=str(path)),
                              connect_args={"timeout": BUSY_TIMEOUT_S})
    if not create and not user_uri:
        sa.event.listen(engine, "do_connect", _open_existing_only)
    sa.event.listen(engine, "connect", _on_sqlite_connect)
    sa.event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def _open_existing_only(_dialect: Any, _record: Any, cargs: list[Any],
                        cparams: dict[str, Any]) -> None:
    """Open the file with SQLite's `mode=rw`: read-write, never create.

    Done at connect time, so the engine's URL (shown in messages) stays the one the user
    wrote. The path is percent-quoted since '?' and '#' would end it inside a SQLite URI.
    """
    cargs[0] = f"file:{quote(os.path.abspath(cargs[0]))}?mode=rw"
    cparams["uri"] = True


def _on_sqlite_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
    # Turn off sqlite3's implicit BEGIN; `_on_sqlite_begin` emits the right one.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # Switching to WAL needs a lock; skip it when the file is already WAL (it persists).
        if cursor.execute("PRAGMA journal_mode").fetchone() != ("wal",):
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def _on_sqlite_begin(conn: Connection) -> None:
    if conn.get_execution_options().get(WRITE_OPTION):
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        conn.exec_driver_sql("BEGIN")
