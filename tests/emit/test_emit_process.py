"""Whole processes: the atexit flush, an unreachable or hung store at exit, and fork."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from airflow_ett.emit import replay_spool
from tests.emit.conftest import HAVE_STORE, Destination, spool_files, spooled_ids

CHILD = str(Path(__file__).with_name("_child.py"))
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


#: The emitter's timeout in a child whose store answers: what is tested there is that
#: every event is delivered at exit, not how fast; a loaded machine may take seconds to
#: write 1000 events, and 1 s would spool them instead (seen under load).
ANSWERING_EMIT_TIMEOUT_S = "60"


def run_child(*args: str, timeout: float = 90,
              emit_timeout: str = "1") -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT,
                          env={**os.environ, "CHILD_EMIT_TIMEOUT": emit_timeout})
    return proc, time.monotonic() - start


def test_events_are_flushed_at_exit(dest: Destination, spool_dir: Path) -> None:
    proc, _ = run_child(dest.spec, str(spool_dir), "job-exit", "1000",
                        emit_timeout=ANSWERING_EMIT_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    ids = dest.ids("job-exit")
    assert len(ids) == 1000 and set(ids.values()) == {1}
    assert spool_files(spool_dir) == []


def test_unreachable_store_exits_promptly_and_replay_delivers_once(
        dest: Destination, spool_dir: Path) -> None:
    _, baseline = run_child(dest.spec, str(spool_dir / "baseline"), "job-none", "0")
    # Nothing listens on port 9 (connection refused); without the store, a file sink
    # whose folder cannot be created.
    unreachable = ("postgresql+psycopg2://ett@127.0.0.1:9/ett" if HAVE_STORE
                   else "jsonl:/proc/no-such-dir/events.jsonl")
    proc, took = run_child(unreachable, str(spool_dir), "job-down", "1000")
    assert proc.returncode == 0, proc.stderr
    assert took < baseline + 1.0 + 1.5  # emit_timeout is 1 s in the child
    assert sum(spooled_ids(spool_dir).values()) == 1000
    result = replay_spool(dest.sink(), spool_dir)
    assert (result.replayed, result.files) == (1000, 1)
    ids = dest.ids("job-down")
    assert len(ids) == 1000 and set(ids.values()) == {1}


def test_a_hung_store_does_not_hold_up_exit(dest: Destination, spool_dir: Path) -> None:
    """We hold the destination's lock, so the child's write really hangs: the store's
    SQLite file waits out its 30 s busy timeout; the file sink blocks on its flock. The
    child must still leave after about emit_timeout, its events on disk."""
    _, baseline = run_child(dest.spec, str(spool_dir / "baseline"), "job-none", "0")
    with ExitStack() as held:
        if HAVE_STORE:
            lock = sqlite3.connect(dest.spec[len("sqlite:///"):], isolation_level=None)
            lock.execute("BEGIN EXCLUSIVE")
            held.callback(lock.close)
            held.callback(lock.execute, "ROLLBACK")
        else:
            fd = os.open(dest.spec[len("jsonl:"):], os.O_RDWR | os.O_CREAT)
            held.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        proc, took = run_child(dest.spec, str(spool_dir), "job-hung", "1000")
    assert proc.returncode == 0, proc.stderr
    assert took < baseline + 1.0 + 1.5  # emit_timeout is 1 s in the child
    assert dest.ids("job-hung") == {}
    assert sum(spooled_ids(spool_dir).values()) == 1000
    result = replay_spool(dest.sink(), spool_dir)
    assert result.replayed == 1000
    ids = dest.ids("job-hung")
    assert len(ids) == 1000 and set(ids.values()) == {1}


def test_a_forked_child_gets_its_own_writer(dest: Destination, spool_dir: Path) -> None:
    proc, _ = run_child(dest.spec, str(spool_dir), "job-fork", "400", "fork",
                        emit_timeout=ANSWERING_EMIT_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    child = dict(kv.split("=") for kv in lines["child"].split())
    parent = dict(kv.split("=") for kv in lines["parent"].split())
    assert child["flushed"] == "True" and child["thread"] == "True"
    assert child["written"] == "200"  # only its own: the parent's queue stayed the parent's
    assert parent["child_status"] == "0"
    assert child["prefix"] != parent["prefix"]
    ids = dest.ids("job-fork")
    assert len(ids) == 400 and set(ids.values()) == {1}  # none lost, none doubled
    assert sum(1 for i in ids if i.startswith(child["prefix"])) == 200
    assert spool_files(spool_dir) == []
