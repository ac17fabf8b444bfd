"""A bad value through the emitter, the spool and replay: it goes alone, the rest goes on.

One lone surrogate in a message used to lose its whole batch (with a false "spool is not
writable"), and one such line in the oldest spool file stopped every later replay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.emit import Emitter, replay_spool
from airflow_ett.emit.spool import SpoolWriter
from airflow_ett.ett.events import (
    AttemptEnded,
    Event,
    EventError,
    JobEnded,
    event_to_json,
)
from tests.emit.conftest import ControlledSink, CountingSink, Destination, spool_files
from tests.factories import T0 as T

DEAD_PID = 999_999_999


def make(sink: object, spool_dir: Path, job: str = "job-1") -> Emitter:
    return Emitter(job, "att-1", sink=sink, spool_dir=spool_dir,  # type: ignore[arg-type]
                   emit_timeout=5.0)


def emit_lifecycle(em: Emitter, message: str) -> None:
    """Five events in one batch: job_submitted and job_ended among them."""
    em.job_submitted(tenant="t", ts=T)
    em.attempt_started(host="h", ts=T + 1)
    em.attempt_ended("failed", cause="infra", message=message, ts=T + 2)
    em.attempt_started(host="h", ts=T + 3)
    em.job_ended("success", ts=T + 4)


def test_a_surrogate_in_a_message_is_escaped_and_its_batch_delivered(
        dest: Destination, spool_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    em = make(dest.sink(), spool_dir)
    emit_lifecycle(em, "/data/\udcff.bin")
    assert em.close()
    events = dest.events("job-1")
    assert len(events) == 5 and em.stats().written == 5
    ended = [e for e in events if isinstance(e, AttemptEnded)]
    assert ended[0].message == "/data/\\udcff.bin"
    assert em.stats().rejected == em.stats().dropped == 0
    assert "not writable" not in caplog.text


@pytest.mark.parametrize("down", [False, True])
def test_an_identifier_no_store_can_hold_is_rejected_alone(
        dest: Destination, spool_dir: Path, caplog: pytest.LogCaptureFixture,
        down: bool) -> None:
    sink = ControlledSink(dest.sink())
    sink.fail = down
    em = make(sink, spool_dir)
    emit_lifecycle(em, "ok")
    bad = em.bind("job\x00x")
    bad.job_ended("success", ts=T + 5)
    assert em.close()
    assert em.stats().rejected == 1 and em.stats().dropped == 0
    records = [r for r in caplog.records if "invalid event" in r.getMessage()]
    assert len(records) == 1 and "field 'job'" in records[0].getMessage()
    assert "NUL" in records[0].getMessage()
    assert "not writable" not in caplog.text
    kept = [json.loads(x) for p in spool_dir.glob("invalid-*.rejected")
            for x in p.read_text().splitlines()]
    assert len(kept) == 1 and "field 'job'" in str(kept[0]["error"])
    if down:  # its five batch-mates wait in the spool, all of them
        assert em.stats().spooled == 5
        sink.fail = False
        assert replay_spool(sink, spool_dir).replayed == 5
    assert len(dest.events("job-1")) == 5


def test_the_spool_writer_keeps_what_it_can_encode(spool_dir: Path) -> None:
    writer = SpoolWriter(spool_dir)
    good = JobEnded(id="g", job="j", ts=T, status="success")
    raw = AttemptEnded(id="b", job="j", ts=T, attempt="1", status="success",
                       message="\ud800")  # not validated: the writer's last line of defence
    failed = writer.append([good, raw, good], sync=True)
    assert [e.id for e, _ in failed] == ["b"] and isinstance(failed[0][1], UnicodeError)
    writer.close()
    (path,) = spool_files(spool_dir)
    assert len(path.read_text().splitlines()) == 2


def write_spool(directory: Path, name: str, lines: list[str], mtime: float) -> Path:
    import os

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("".join(x + "\n" for x in lines))
    os.utime(path, (mtime, mtime))
    return path


def ended(i: int, job: str = "j") -> JobEnded:
    return JobEnded(id=f"e{i}", job=job, ts=T + i, status="success")


def test_a_bad_line_in_the_oldest_spool_file_is_quarantined_and_replay_goes_on(
        dest: Destination, spool_dir: Path) -> None:
    bad = [r'{"type":"job_ended","id":"x\ud800","job":"j","ts":1795856000,"status":"success"}',
           r'{"type":"job_ended","id":"y","job":"j\u0000","ts":1795856000,"status":"success"}',
           '{"type":"job_ended","id":"z","job":"j","ts":1795856000000,"status":"success"}']
    old = write_spool(spool_dir, f"spool-{DEAD_PID}-a1.jsonl",
                      [event_to_json(ended(1)), *bad, event_to_json(ended(2))], 1000.0)
    new = write_spool(spool_dir, f"spool-{DEAD_PID}-b2.jsonl", [event_to_json(ended(3))],
                      2000.0)
    result = replay_spool(dest.sink(), spool_dir)
    assert (result.replayed, result.files, result.rejected, result.errors) == (3, 2, 3, ())
    assert sorted(e.id for e in dest.events("j")) == ["e1", "e2", "e3"]
    assert not old.exists() and not new.exists()
    kept = [json.loads(x) for x in
            (spool_dir / f"spool-{DEAD_PID}-a1.rejected").read_text().splitlines()]
    assert [k["line"] for k in kept] == [2, 3, 4]
    assert "surrogate" in kept[0]["error"] and "NUL" in kept[1]["error"]
    assert "milliseconds" in kept[2]["error"]


class PickySink:
    """Refuses any batch holding a given id, as a store refuses a value it cannot hold."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.inner = CountingSink()

    def write(self, events: Sequence[Event]) -> None:
        if any(e.id == self.refused for e in events):
            raise EventError(f"event {self.refused!r} cannot be stored: test")
        self.inner.write(events)


def test_a_line_the_sink_refuses_is_quarantined_alone(spool_dir: Path) -> None:
    lines = [event_to_json(ended(i)) for i in range(10)]
    write_spool(spool_dir, f"spool-{DEAD_PID}-c3.jsonl", lines, 1000.0)
    write_spool(spool_dir, f"spool-{DEAD_PID}-d4.jsonl", [event_to_json(ended(10))], 2000.0)
    sink = PickySink("e6")
    result = replay_spool(sink, spool_dir, chunk_size=4)
    assert sorted(sink.inner.counts) == sorted(f"e{i}" for i in range(11) if i != 6)
    assert max(sink.inner.counts.values()) == 1
    assert (result.files, result.rejected, result.errors) == (2, 1, ())
    kept = [json.loads(x) for x in
            (spool_dir / f"spool-{DEAD_PID}-c3.rejected").read_text().splitlines()]
    assert [k["line"] for k in kept] == [7] and "refused by the sink" in kept[0]["error"]
    assert spool_files(spool_dir) == []


def test_an_unavailable_sink_still_stops_replay_and_keeps_the_file(spool_dir: Path) -> None:
    path = write_spool(spool_dir, f"spool-{DEAD_PID}-e5.jsonl", [event_to_json(ended(1))],
                       1000.0)
    sink = ControlledSink(CountingSink())
    sink.fail = True  # ConnectionError: the store is down, not the data bad
    result = replay_spool(sink, spool_dir)
    assert result.errors and result.rejected == 0
    assert spool_files(spool_dir) and not path.with_suffix(".rejected").exists()


nasty = st.text(st.one_of(st.characters(), st.sampled_from(["\x00", "\ud800", "\udcff"])),
                max_size=6)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.tuples(st.sampled_from(["job", "message", "tenant", "host"]), nasty),
                      min_size=1, max_size=6))
def test_arbitrary_text_through_emitter_spool_and_replay(
        tmp_path_factory: pytest.TempPathFactory, items: list[tuple[str, str]]) -> None:
    root = tmp_path_factory.mktemp("prop")
    spool_dir = root / "spool"
    down = ControlledSink(CountingSink())
    down.fail = True  # everything goes through the spool
    em = Emitter("j", "a", sink=down, spool_dir=spool_dir, emit_timeout=5.0,
                 replay_on_start=False)
    expect_bad = 0
    for n, (field, text) in enumerate(items):
        view = em.bind(job_id=f"j{text}") if field == "job" else em
        if field == "job" and ("\x00" in text or any(0xD800 <= ord(c) < 0xE000 for c in text)):
            expect_bad += 1
        if field == "message":
            view.attempt_ended("success", message=text, ts=T + n)
        elif field == "tenant":
            if "\x00" in text or any(0xD800 <= ord(c) < 0xE000 for c in text):
                expect_bad += 1
            view.job_submitted(tenant=text, ts=T + n)
        elif field == "host":
            view.attempt_started(host=text, ts=T + n)
        else:
            view.job_ended("success", ts=T + n)
    assert em.close()
    stats = em.stats()
    assert stats.rejected == expect_bad and stats.dropped == 0
    assert stats.spooled == len(items) - expect_bad
    sink = CountingSink()
    result = replay_spool(sink, spool_dir)
    assert result.rejected == 0 and result.errors == ()
    assert len(sink.events) == len(items) - expect_bad
    assert max(sink.counts.values(), default=1) == 1
    for event in sink.events:
        event_to_json(event)  # what was delivered can be stored
