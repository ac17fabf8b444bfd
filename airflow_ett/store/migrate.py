"""Schema migrations: `upgrade(url)` is what `airflow-ett db upgrade` runs.

The Alembic environment ships inside the package (`migrations/`) and its Config is built
here in code, so the store can be migrated from any working directory, by any installed
copy, with no alembic.ini to find or keep in step. The engine is handed to `env.py`
through `Config.attributes`, so migrations run with the same SQLite settings (WAL,
busy timeout, BEGIN IMMEDIATE) as the store itself, and concurrent upgrades queue.

To write a new revision during development::

    from alembic import command
    command.revision(make_config("sqlite:////tmp/dev.db"), "what changed")
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sqlalchemy.exc import DBAPIError

from airflow_ett.store.engine import make_engine, writer
from airflow_ett.store.errors import StoreError, sqlite_path, translate
from airflow_ett.store.schema import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Engine

SCRIPT_LOCATION: Final = Path(__file__).resolve().parent / "migrations"


def _store_url(url: str | None) -> str:
    if url is not None:
        return url
    from airflow_ett.settings import EttSettings

    return EttSettings.load().store_url


def make_config(url: str | None = None, engine: Engine | None = None) -> Config:
    """An Alembic Config for the packaged migrations, with no ini file behind it.

    The URL travels in `attributes`, not in `sqlalchemy.url`: the main options go through
    configparser interpolation, which mangles the `%` of URL-encoded passwords.
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.attributes["url"] = url
    config.attributes["engine"] = engine
    config.attributes["version_table"] = VERSION_TABLE
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the store at `url` (default: `[ett] store_url`) up to `revision`.

    Idempotent and safe to run from several processes at once: on SQLite the migration
    transaction holds the write lock, on PostgreSQL an advisory lock, so later runs wait
    and then find nothing to do.
    """
    from alembic import command

    url = _store_url(url)
    engine = make_engine(url, create=True)  # the one caller that may create a SQLite file
    try:
        with _one_upgrade_at_a_time(url):
            command.upgrade(make_config(url, writer(engine)), revision)
    except DBAPIError as exc:
        raise translate(exc, url) from exc
    finally:
        engine.dispose()


@contextlib.contextmanager
def _one_upgrade_at_a_time(url: str) -> Iterator[None]:
    """On SQLite, upgrades of one directory's stores run one at a time (an exclusive
    `flock` on the directory, which `make_engine` has made): a fresh file's first
    connections race to switch it to WAL and to create the version table, and SQLite
    answers some of those races "database is locked" at once, without waiting out the
    busy timeout (seen with three upgrades started together on a loaded host). The
    later upgrades then find nothing to do. PostgreSQL's migrations take an advisory
    lock instead (`migrations/env.py`)."""
    path = sqlite_path(url)
    if path is None or str(path).startswith("file:") or not path.parent.is_dir():
        yield
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # a file system without flock: as before
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def current(url: str | None = None) -> str | None:
    """The revision the store at `url` is at; None for a database never upgraded.

    A SQLite file that does not exist was never upgraded either: None, and no file made.
    """
    from alembic.runtime.migration import MigrationContext

    url = _store_url(url)
    engine = make_engine(url)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        engine.dispose()
        return None
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    except DBAPIError as exc:
        raise translate(exc, url) from exc
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision this copy of the package ships."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(make_config()).get_heads()
    if len(heads) != 1:
        raise StoreError(f"ETT migrations must have exactly one head, found {heads}")
    return heads[0]
