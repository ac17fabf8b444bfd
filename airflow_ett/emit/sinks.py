"""Where batches of events go: the `EventSink` protocol and the sinks we ship.

The emitter depends on this small protocol rather than on the store, so that tests,
other trainers and a future transport can stand in for it. A sink must be idempotent by
event id: after a timeout the emitter spools a batch whose write may still complete, and
replay sends spooled events again; both rely on a second insert of an id being a no-op.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from airflow_ett._fs import write_all
from airflow_ett.ett.events import Event, EventError, bounded_lines, event_to_json, parse_line
from airflow_ett.masking import mask_url


@runtime_checkable
class EventSink(Protocol):
    """Writes a batch, all of it, or raises. Called from one thread at a time."""

    def write(self, events: Sequence[Event]) -> None: ...


class StoreSink:
    """Inserts into the ETT store at `url`.

    The store (and SQLAlchemy behind it) is imported and connected on the first write,
    which the emitter makes on its own background thread: the caller's thread never pays
    for the import or the connection, and a process that emits nothing never connects.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.last_inserted = 0
        self._store: Any = None

    def _get_store(self) -> Any:
        if self._store is None:
            # Imported by name so that this module (loaded in every Airflow process with
            # the plugin) stays light; the store brings SQLAlchemy and its migrations.
            store_module = importlib.import_module("airflow_ett.store")
            self._store = store_module.EttStore(self.url)
        return self._store

    def write(self, events: Sequence[Event]) -> None:
        inserted = self._get_store().insert_events(events)
        self.last_inserted = int(inserted) if isinstance(inserted, int) else 0

    def close(self) -> None:
        store, self._store = self._store, None
        for name in ("close", "dispose"):
            closer = getattr(store, name, None)
            if callable(closer):
                closer()
                return

    def __repr__(self) -> str:
        return f"StoreSink({mask_url(self.url)!r})"


class JsonlSink:
    """Appends events to one JSON-lines file, skipping ids it already holds.

    For debugging, tests and trainers that hand their events over as a file; not for
    production volumes (it rereads the file on every write to stay idempotent across
    processes, under an exclusive `flock`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def write(self, events: Sequence[Event]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            seen = {event.id for event in self._read(fd)}
            out = []
            for event in events:
                if event.id not in seen:
                    seen.add(event.id)
                    out.append(event_to_json(event) + "\n")
            if out:
                write_all(fd, "".join(out).encode())
                os.fsync(fd)
        finally:
            os.close(fd)  # releases the flock

    def read(self) -> list[Event]:
        """Every event in the file, in the order written."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return []
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"events file {self.path}: not a regular file")
            os.set_blocking(fd, True)
            fcntl.flock(fd, fcntl.LOCK_SH)
            return self._read(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _read(fd: int) -> list[Event]:
        with open(fd, "rb", closefd=False) as fh:
            fh.seek(0)
            events: list[Event] = []
            for _, line in bounded_lines(fh):
                if isinstance(line, EventError):  # a line too long to be an event
                    raise line
                if line.strip():
                    events.append(parse_line(line))
            return events

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.path)!r})"

