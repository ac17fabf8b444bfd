"""What can go wrong with the store, in terms its callers act on.

Callers care about two things only: is the store unreachable right now (the emitter
spools and retries later), or is something wrong that waiting will not fix (a bad URL, a
missing schema, a database that does not exist). Driver exceptions are translated into
those at the store's edge, with a one-line message that names the URL with its
credentials masked (`mask_url`), since these messages end up in task logs that many
people can read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

from airflow_ett.masking import mask_text, mask_url

__all__ = ["JobNotFound", "StoreError", "StoreMissing", "StoreUnavailable", "is_retryable",
           "mask_text", "mask_url", "missing_sqlite", "sqlite_path", "translate"]

_MISSING_SCHEMA: Final = re.compile(
    r"no such (table|column)|(relation|column) \S+ does not exist|has no column named"
    # a day with no job has no ETT%: NULL, allowed since migration 0003
    r"|ett_daily_days\.ett_pct|\"ett_pct\" of relation \"ett_daily_days\""
)
_MISSING_DATABASE: Final = re.compile(r'database "(?P<name>[^"]*)" does not exist')
_RETRYABLE_PGCODES: Final = frozenset({"40P01", "40001"})  # deadlock, serialization failure
UPGRADE_HINT: Final = "run `airflow-ett db upgrade`"



class StoreError(Exception):
    """The store cannot do what was asked, and retrying as is will not help."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or is too busy now; the same call may work later."""


class StoreMissing(StoreError):
    """The database itself does not exist: someone has to create it (or run `db upgrade`)."""


class JobNotFound(LookupError):
    """No event of this job has been stored."""


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return mask_text(lines[0]) if lines else type(orig).__name__


def is_retryable(exc: DBAPIError) -> bool:
    """A PostgreSQL deadlock or serialization failure: the transaction can simply rerun."""
    return getattr(exc.orig, "pgcode", None) in _RETRYABLE_PGCODES


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite store URL (None for any other URL, or one that does not parse)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return None
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    database = parsed.database
    if database.startswith("file:"):  # a SQLite URI (uri=true): its path part
        database = database[len("file:"):].split("?", 1)[0]
    return Path(database).expanduser()


def missing_sqlite(url: str) -> StoreMissing:
    path = sqlite_path(url)
    return StoreMissing(f"ETT store {mask_url(url)} does not exist (no file {path}): "
                        f"{UPGRADE_HINT} to create it, or check [ett] store_url / --store-url")


def translate(exc: DBAPIError, url: str) -> StoreError:
    """Map a driver error to `StoreUnavailable` (transient) or `StoreError` (needs a fix).

    Connection failures, lost connections, "database is locked" after the busy timeout and
    I/O errors are all OperationalError/InterfaceError in both drivers. Told apart from
    them, since waiting will not fix these: a missing table (OperationalError in sqlite3:
    needs an upgrade), a PostgreSQL database that does not exist and a SQLite file that
    does not exist (`StoreMissing`).
    """
    reason = _first_line(exc)
    where = f"ETT store {mask_url(url)}"
    if _MISSING_SCHEMA.search(reason):
        return StoreError(f"{where}: schema missing or out of date ({UPGRADE_HINT}): {reason}")
    missing_db = _MISSING_DATABASE.search(reason)
    if missing_db is not None:
        name = missing_db.group("name")
        return StoreMissing(f"{where}: database {name!r} does not exist: create it "
                            f"(e.g. `createdb {name}`), then {UPGRADE_HINT}")
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return missing_sqlite(url)
    if exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError):
        return StoreUnavailable(f"{where} is unavailable: {reason}")
    return StoreError(f"{where}: {reason}")
