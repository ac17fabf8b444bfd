"""Emitter fixtures: a real destination for events, and sinks that misbehave on purpose.

Events go to the real ETT store (a SQLite file) when `airflow_ett.store` is installed,
otherwise to a real JSON-lines file (`JsonlSink`); both are idempotent by id, as the
emitter requires. The misbehaving sinks wrap that destination, so what they do let
through lands for real.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from airflow_ett.emit import EventSink, JsonlSink, StoreSink, reset_default_emitter
from airflow_ett.emit._log import rate_limited
from airflow_ett.ett.events import Event

# ETT_TEST_NO_STORE=1 runs the suite against the file destination even with the store.
HAVE_STORE = (importlib.util.find_spec("airflow_ett.store") is not None
              and not os.environ.get("ETT_TEST_NO_STORE"))


class Destination:
    """Where delivered events end up: the real store, or a JSON-lines file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        if HAVE_STORE:
            from airflow_ett.store import EttStore, upgrade

            self.spec = f"sqlite:///{root / 'ett.db'}"
            upgrade(self.spec)
            self._store = EttStore(self.spec)
        else:
            self.spec = f"jsonl:{root / 'events.jsonl'}"

    def sink(self) -> EventSink:
        return sink_from_spec(self.spec)

    def events(self, *jobs: str) -> list[Event]:
        if HAVE_STORE:
            return [e for job in jobs for e in self._store.job_events(job)]
        return [e for e in JsonlSink(self.spec[len("jsonl:"):]).read() if e.job in jobs]

    def ids(self, *jobs: str) -> Counter[str]:
        return Counter(e.id for e in self.events(*jobs))

    def close(self) -> None:
        if HAVE_STORE:
            self._store.close()


def sink_from_spec(spec: str) -> EventSink:
    if spec.startswith("jsonl:"):
        return JsonlSink(spec[len("jsonl:"):])
    return StoreSink(spec)


class ControlledSink:
    """Wraps a real sink; can fail, hang, or be gated, and records every call."""

    def __init__(self, inner: EventSink) -> None:
        self.inner = inner
        self.fail = False
        self.hang_s = 0.0
        self.gate: threading.Event | None = None
        self.calls: list[list[str]] = []
        self.delivered: Counter[str] = Counter()
        self._lock = threading.Lock()

    def write(self, events: Sequence[Event]) -> None:
        with self._lock:
            self.calls.append([e.id for e in events])
        if self.gate is not None:
            self.gate.wait(30)
        if self.hang_s:
            time.sleep(self.hang_s)
        if self.fail:
            raise ConnectionError("store down (test)")
        self.inner.write(events)
        with self._lock:
            self.delivered.update(e.id for e in events)


class CountingSink:
    """Not idempotent on purpose: counts every delivery of every id, so that a double
    delivery shows up instead of being absorbed by the store."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.counts: Counter[str] = Counter()
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def write(self, events: Sequence[Event]) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            self.events.extend(events)
            self.counts.update(e.id for e in events)


@pytest.fixture
def dest(tmp_path: Path) -> Iterator[Destination]:
    destination = Destination(tmp_path)
    yield destination
    destination.close()


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No test reads the developer's airflow.cfg or shares the process-wide emitter."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow_home"))
    monkeypatch.delenv("AIRFLOW_CONFIG", raising=False)
    for key in ("STORE_URL", "DISABLED", "SPOOL_DIR", "EMIT_TIMEOUT"):
        monkeypatch.delenv(f"AIRFLOW__ETT__{key}", raising=False)
    monkeypatch.delenv("ETT_JOB_ID", raising=False)
    monkeypatch.delenv("ETT_ATTEMPT_ID", raising=False)
    rate_limited.reset()
    yield
    reset_default_emitter()
    rate_limited.reset()


def spool_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("spool-*.jsonl*")) if directory.exists() else []


def spooled_ids(directory: Path) -> Counter[str]:
    from airflow_ett.ett.events import parse_line

    ids: Counter[str] = Counter()
    for path in spool_files(directory):
        for line in path.read_bytes().splitlines():
            if line.strip():
                ids[parse_line(line).id] += 1
    return ids


def wait_until(predicate: object, timeout: float = 5.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())
