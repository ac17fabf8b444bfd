"""What can go wrong with the store, in terms its callers act on.

Callers care about two things only: is the store unreachable right now (the emitter
spools and retries later), or is something wrong that waiting will not fix (a bad URL, a
missing schema). Driver exceptions are translated into those two at the store's edge, with
a one-line message that names the URL, password masked, since these messages end up in
task logs that many people can read.
"""

from __future__ import annotations

import re
from typing import Final

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

_PASSWORD_IN_URL: Final = re.compile(r"(://[^:/@]*:)[^@]*(@)")
_MISSING_SCHEMA: Final = re.compile(
    r"no such (table|column)|(relation|column) \S+ does not exist|has no column named"
)
_RETRYABLE_PGCODES: Final = frozenset({"40P01", "40001"})  # deadlock, serialization failure
UPGRADE_HINT: Final = "run `airflow-ett db upgrade`"


class StoreError(Exception):
    """The store cannot do what was asked, and retrying as is will not help."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or is too busy now; the same call may work later."""


class JobNotFound(LookupError):
    """No event of this job has been stored."""


def mask_url(url: object) -> str:
    """The URL as it may be logged: with `***` where a password was.

    Works on strings that SQLAlchemy cannot parse too, since those are exactly the ones
    that show up in error messages.
    """
    text = str(url)
    try:
        return make_url(text).render_as_string(hide_password=True)
    except (ArgumentError, ValueError, TypeError):
        return _PASSWORD_IN_URL.sub(r"\1***\2", text)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


def is_retryable(exc: DBAPIError) -> bool:
    """A PostgreSQL deadlock or serialization failure: the transaction can simply rerun."""
    return getattr(exc.orig, "pgcode", None) in _RETRYABLE_PGCODES


def translate(exc: DBAPIError, url: str) -> StoreError:
    """Map a driver error to `StoreUnavailable` (transient) or `StoreError` (needs a fix).

    Connection failures, lost connections, "database is locked" after the busy timeout and
    I/O errors are all OperationalError/InterfaceError in both drivers; a missing table is
    OperationalError in sqlite3 but needs an upgrade, not a retry, so it is told apart.
    """
    reason = _first_line(exc)
    where = f"ETT store {mask_url(url)}"
    if _MISSING_SCHEMA.search(reason):
        return StoreError(f"{where}: schema missing or out of date ({UPGRADE_HINT}): {reason}")
    if exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError):
        return StoreUnavailable(f"{where} is unavailable: {reason}")
    return StoreError(f"{where}: {reason}")
