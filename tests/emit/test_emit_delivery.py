"""Delivery under trouble: a failing, hanging or slow sink; overflow; recovery; replay."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.emit import Emitter, replay_spool
from tests.emit.conftest import (
    ControlledSink,
    CountingSink,
    Destination,
    spool_files,
    spooled_ids,
    wait_until,
)
from tests.factories import T0 as T


def emit_progress(em: Emitter, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        em.progress(i, i + 1, i, i + 1, start_ts=T + i, end_ts=T + i + 0.5)


def test_failing_sink_spools_and_replay_inserts_each_event_once(
        dest: Destination, spool_dir: Path) -> None:
    sink = ControlledSink(dest.sink())
    sink.fail = True
    em = Emitter("job-1", "a1", sink=sink, spool_dir=spool_dir, emit_timeout=2.0,
                 batch_size=50)
    emit_progress(em, 500)
    assert em.flush()  # the store is down, but everything is safely on disk
    assert em.stats().spooled == 500 and em.stats().written == 0
    assert sink.calls  # it was tried, then backed off
    live = replay_spool(dest.sink(), spool_dir)
    assert live.replayed == 0 and live.skipped == 1  # the live writer's file is left alone
    em.close()

    assert sum(spooled_ids(spool_dir).values()) == 500
    result = replay_spool(dest.spec if dest.spec.startswith("sqlite") else dest.sink(),
                          spool_dir)
    assert (result.replayed, result.files, result.errors) == (500, 1, ())
    ids = dest.ids("job-1")
    assert len(ids) == 500 and set(ids.values()) == {1}
    assert spool_files(spool_dir) == []
    assert replay_spool(dest.sink(), spool_dir).replayed == 0


def test_hanging_sink_does_not_hold_up_flush_and_loses_nothing(
        dest: Destination, spool_dir: Path) -> None:
    sink = ControlledSink(dest.sink())
    sink.hang_s = 1.5
    timeout = 0.3
    em = Emitter("job-1", "a1", sink=sink, spool_dir=spool_dir, emit_timeout=timeout)
    emit_progress(em, 100)
    start = time.monotonic()
    em.flush()
    assert time.monotonic() - start < timeout + 0.25
    emit_progress(em, 100, start=100)  # meanwhile the call is still stuck: straight to disk
    start = time.monotonic()
    em.close()
    assert time.monotonic() - start < timeout + 0.25
    assert len(spooled_ids(spool_dir)) == 200  # every event is on disk, once
    assert set(spooled_ids(spool_dir).values()) == {1}

    sink.hang_s = 0
    wait_until(lambda: sink.delivered, timeout=3)  # the stuck write finishes late...
    result = replay_spool(dest.sink(), spool_dir)
    assert result.replayed == 200
    ids = dest.ids("job-1")  # ...and the store still counts each event once
    assert len(ids) == 200 and set(ids.values()) == {1}


def test_close_returns_only_once_a_batch_being_spooled_is_on_disk(
        dest: Destination, spool_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain thread has claimed a failed batch for the spool and is still encoding it
    when close's own wait runs out: close must not return (and let the process exit, the
    daemon thread with it) before those events are on disk. Seen under load: a child's
    1000 events were neither in the store nor in the spool."""
    from airflow_ett.emit import spool

    encode = spool.encode_each

    def slow_in_the_drain_thread(events: object) -> object:
        if threading.current_thread().name == "ett-emit":
            time.sleep(1.0)  # longer than emit_timeout: close's wait runs out first
        return encode(events)  # type: ignore[arg-type]

    monkeypatch.setattr(spool, "encode_each", slow_in_the_drain_thread)
    sink = ControlledSink(dest.sink())
    sink.fail = True
    em = Emitter("job-1", "a1", sink=sink, spool_dir=spool_dir, emit_timeout=0.3)
    emit_progress(em, 100)
    em.close()
    assert sum(spooled_ids(spool_dir).values()) == 100
    assert set(spooled_ids(spool_dir).values()) == {1}


def test_full_queue_spools_instead_of_blocking(dest: Destination, spool_dir: Path) -> None:
    sink = ControlledSink(dest.sink())
    sink.gate = threading.Event()  # the sink blocks until we open the gate
    em = Emitter("job-1", "a1", sink=sink, spool_dir=spool_dir, emit_timeout=10.0,
                 queue_size=20, batch_size=5)
    worst = 0.0
    for i in range(300):
        start = time.perf_counter()
        em.progress(i, i + 1, i, i + 1, start_ts=T + 1.0, end_ts=T + 2.0)
        worst = max(worst, time.perf_counter() - start)
    assert worst < 0.5  # an append to the spool, never a wait on the sink stuck for good
    assert em.stats().overflowed >= 250
    sink.gate.set()
    assert em.close()
    replay_spool(dest.sink(), spool_dir)
    ids = dest.ids("job-1")
    assert len(ids) == 300 and set(ids.values()) == {1}


def test_store_recovery_replays_what_was_spooled_meanwhile(dest: Destination,
                                                            spool_dir: Path) -> None:
    sink = ControlledSink(dest.sink())
    sink.fail = True
    em = Emitter("job-1", "a1", sink=sink, spool_dir=spool_dir, emit_timeout=2.0)
    emit_progress(em, 50)
    assert em.flush()
    assert em.stats().spooled == 50
    sink.fail = False
    time.sleep(0.6)  # past the first backoff
    emit_progress(em, 50, start=50)
    assert em.flush()
    # The live write succeeded; the writer released its spool file and replays it.
    assert wait_until(lambda: len(dest.ids("job-1")) == 100)
    assert wait_until(lambda: spool_files(spool_dir) == [])
    em.close()
    assert set(dest.ids("job-1").values()) == {1}


def test_a_new_emitter_replays_old_spool_files_in_the_background(
        dest: Destination, spool_dir: Path) -> None:
    broken = ControlledSink(dest.sink())
    broken.fail = True
    old = Emitter("job-1", "a1", sink=broken, spool_dir=spool_dir, emit_timeout=2.0)
    emit_progress(old, 300)
    old.close()
    assert len(spool_files(spool_dir)) == 1

    start = time.perf_counter()
    new = Emitter("job-1", "a2", sink=dest.sink(), spool_dir=spool_dir, emit_timeout=2.0)
    assert time.perf_counter() - start < 0.5  # not on the caller's thread (300 to replay)
    assert wait_until(lambda: len(dest.ids("job-1")) == 300)
    assert wait_until(lambda: spool_files(spool_dir) == [])
    new.close()
    assert new.stats().replayed == 300


def test_a_broken_store_does_not_flood_the_log(spool_dir: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    class Down:
        def write(self, events: object) -> None:
            raise ConnectionError("refused")

    caplog.set_level(logging.WARNING, logger="airflow_ett.emit")
    em = Emitter("job-1", "a1", sink=Down(), spool_dir=spool_dir, emit_timeout=1.0,
                 batch_size=1, linger=0)
    for i in range(200):
        emit_progress(em, 1, start=i)
        if i % 20 == 0:
            em.flush()
    em.close()
    assert em.stats().spooled == 200
    assert len(caplog.records) <= 3


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.integers(1, 40), st.sampled_from(["ok", "fail", "flush"])),
                     min_size=1, max_size=8))
def test_whatever_fails_each_event_is_delivered_exactly_once(
        tmp_path_factory: pytest.TempPathFactory,
        plan: list[tuple[int, str]]) -> None:
    """Invariant: after close and a replay, the sink saw every emitted id exactly once
    (the sink here does not dedupe, so a double delivery would show)."""
    spool = tmp_path_factory.mktemp("spool")
    counting = CountingSink()

    class Switchable:
        fail = False

        def write(self, events: object) -> None:
            if self.fail:
                raise ConnectionError("down")
            counting.write(events)  # type: ignore[arg-type]

    sink = Switchable()
    em = Emitter("job", "a", sink=sink, spool_dir=spool, emit_timeout=2.0, batch_size=7,
                 linger=0.001, queue_size=25)
    emitted = 0
    for n, mode in plan:
        sink.fail = mode == "fail"
        emit_progress(em, n, start=emitted)
        emitted += n
        if mode in ("fail", "flush"):
            em.flush()
    sink.fail = False
    em.close()
    replay_spool(counting, spool)
    assert sum(counting.counts.values()) == emitted
    assert set(counting.counts.values()) == {1}


def test_close_waits_for_its_own_replay_so_nothing_is_delivered_twice_or_left_locked(
        tmp_path: Path) -> None:
    """Regression: an overflow spools, the next good batch starts a replay of that file,
    and close() comes right after. close() used to return while the replay still held the
    claimed file (left locked: a later replay skipped it) or had delivered it without
    unlinking it (a later replay delivered it again)."""
    for trial in range(40):
        spool = tmp_path / f"spool-{trial}"
        counting = CountingSink()
        em = Emitter("job", "a", sink=counting, spool_dir=spool, emit_timeout=2.0,
                     batch_size=7, linger=0.001, queue_size=25)
        emit_progress(em, 33)
        em.close()
        result = replay_spool(counting, spool)
        assert result.skipped == 0, f"trial {trial}: a spool file is still locked"
        assert sum(counting.counts.values()) == 33, f"trial {trial}"
        assert set(counting.counts.values()) == {1}, f"trial {trial}"
