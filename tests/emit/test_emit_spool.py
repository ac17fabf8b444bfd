"""Spool files and replay: claims, live writers, crashes, bad lines, concurrent replayers."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.emit import replay_spool
from airflow_ett.emit.spool import SpoolWriter
from airflow_ett.ett.events import MAX_LINE_BYTES, Event, JobEnded, Progress, event_to_json
from tests.emit.conftest import CountingSink, Destination, spool_files
from tests.factories import T0 as T

DEAD_PID = 999_999_999  # names only; liveness is decided by the lock


def progress(i: int, job: str = "job-1") -> Progress:
    return Progress(id=f"e-{job}-{i}", job=job, ts=T + i + 1, attempt="a", start_ts=T + i,
                    step_start=i, step_end=i + 1, cursor_start=i, cursor_end=i + 1)


def write_spool(directory: Path, name: str, lines: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_corrupt_line_is_kept_aside_with_its_error(dest: Destination,
                                                     spool_dir: Path) -> None:
    good = [progress(i) for i in range(3)]
    lines = [event_to_json(good[0]), "{not json", event_to_json(good[1]),
             json.dumps({"type": "progress", "id": "x", "job": "j"}), event_to_json(good[2])]
    path = write_spool(spool_dir, f"spool-{DEAD_PID}-abc123.jsonl", lines)
    with path.open("a") as fh:
        fh.write(event_to_json(progress(9))[:40])  # a torn last line from a killed writer

    result = replay_spool(dest.sink(), spool_dir)
    assert (result.replayed, result.files, result.rejected) == (3, 1, 3)
    assert sorted(dest.ids("job-1")) == sorted(e.id for e in good)
    assert not path.exists() and spool_files(spool_dir) == []
    kept = [json.loads(line) for line in
            (spool_dir / f"spool-{DEAD_PID}-abc123.rejected").read_text().splitlines()]
    assert [k["line"] for k in kept] == [2, 4, 6]
    assert "not valid JSON" in kept[0]["error"] and kept[0]["text"] == "{not json"
    assert "required field" in kept[1]["error"]
    assert all(k["source"] == f"spool-{DEAD_PID}-abc123.jsonl" for k in kept)
    # Replaying again finds nothing: the rejected file is not a spool file.
    assert replay_spool(dest.sink(), spool_dir).replayed == 0


@pytest.mark.timeout(60)
def test_a_fifo_named_like_a_spool_file_is_left_alone(dest: Destination,
                                                      spool_dir: Path) -> None:
    """Opened as the replay opened it, a FIFO with no writer blocked the replay forever
    (and the emitter's thread with it); it is reported and the other files go in."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(spool_dir / f"spool-{DEAD_PID}-aaa.jsonl")
    write_spool(spool_dir, f"spool-{DEAD_PID}-bbb.jsonl", [event_to_json(progress(0))])
    result = replay_spool(dest.sink(), spool_dir)
    assert result.replayed == 1
    assert any("aaa.jsonl: not a regular file" in e for e in result.errors), result.errors


def test_a_line_too_long_to_be_an_event_is_kept_aside_without_its_text(
        dest: Destination, spool_dir: Path) -> None:
    lines = [event_to_json(progress(0)), "x" * (MAX_LINE_BYTES + 10), event_to_json(progress(1))]
    write_spool(spool_dir, f"spool-{DEAD_PID}-ccc.jsonl", lines)
    result = replay_spool(dest.sink(), spool_dir)
    assert (result.replayed, result.rejected) == (2, 1)
    (kept,) = [json.loads(line) for line in
               (spool_dir / f"spool-{DEAD_PID}-ccc.rejected").read_text().splitlines()]
    assert kept["line"] == 2 and kept["text"] == "" and "line longer than" in kept["error"]


def test_a_live_writers_file_is_never_taken(spool_dir: Path) -> None:
    writer = SpoolWriter(spool_dir)
    writer.append([progress(0)], sync=True)
    sink = CountingSink()
    result = replay_spool(sink, spool_dir)
    assert (result.replayed, result.skipped) == (0, 1)
    writer.append([progress(1)], sync=True)  # still its own, still appending
    writer.rotate()  # closed: from now on replay may take it
    writer.append([progress(2)], sync=True)  # goes to a new file
    assert len(spool_files(spool_dir)) == 2
    result = replay_spool(sink, spool_dir)
    assert (result.replayed, result.files, result.skipped) == (2, 1, 1)
    writer.close()
    assert replay_spool(sink, spool_dir).replayed == 1
    assert sorted(sink.counts) == sorted(progress(i).id for i in range(3))
    assert set(sink.counts.values()) == {1}


def test_a_file_left_by_a_crashed_replayer_is_claimed_again(spool_dir: Path) -> None:
    name = f"spool-{DEAD_PID}-abc.jsonl.replaying-{DEAD_PID}-def"
    write_spool(spool_dir, name, [event_to_json(progress(i)) for i in range(5)])
    sink = CountingSink()
    result = replay_spool(sink, spool_dir)
    assert (result.replayed, result.files) == (5, 1)
    assert list(spool_dir.iterdir()) == []


def test_a_claim_held_by_a_live_replayer_is_left_alone(spool_dir: Path) -> None:
    path = write_spool(spool_dir, f"spool-{DEAD_PID}-abc.jsonl.replaying-1-def",
                       [event_to_json(progress(0))])
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert replay_spool(CountingSink(), spool_dir).skipped == 1
    finally:
        os.close(fd)
    assert path.exists()


def test_a_failing_sink_keeps_the_file_for_later(spool_dir: Path) -> None:
    write_spool(spool_dir, f"spool-{DEAD_PID}-abc.jsonl",
                [event_to_json(progress(i)) for i in range(5)])

    class Down:
        def write(self, events: object) -> None:
            raise ConnectionError("refused")

    result = replay_spool(Down(), spool_dir, chunk_size=2)
    assert result.replayed == 0 and result.files == 0 and len(result.errors) == 1
    assert len(spool_files(spool_dir)) == 1
    sink = CountingSink()
    assert replay_spool(sink, spool_dir).replayed == 5


def test_replay_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert replay_spool(CountingSink(), tmp_path / "nope").replayed == 0


def _make_files(spool_dir: Path, files: int, per_file: int) -> set[str]:
    ids = set()
    for f in range(files):
        events = [progress(i, job=f"job-{f}") for i in range(per_file)]
        write_spool(spool_dir, f"spool-{DEAD_PID}-{f:06x}.jsonl",
                    [event_to_json(e) for e in events])
        ids |= {e.id for e in events}
    return ids


def test_two_replayer_threads_never_deliver_a_file_twice(spool_dir: Path) -> None:
    expected = _make_files(spool_dir, files=30, per_file=20)
    sink = CountingSink(delay_s=0.002)  # not idempotent: a double delivery would show
    barrier = threading.Barrier(3)
    results = []

    def replay() -> None:
        barrier.wait()
        results.append(replay_spool(sink, spool_dir, chunk_size=7))

    pool = [threading.Thread(target=replay) for _ in range(3)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert set(sink.counts) == expected and set(sink.counts.values()) == {1}
    assert sum(r.files for r in results) == 30
    assert spool_files(spool_dir) == []


APPEND_SINK = """
import os, sys, time
from airflow_ett.emit import replay_spool
from airflow_ett.ett.events import event_to_json

class AppendSink:  # a real file, deliberately without dedupe
    def write(self, events):
        time.sleep(0.003)
        fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, "".join(event_to_json(e) + "\\n" for e in events).encode())
        os.close(fd)

while not os.path.exists(sys.argv[3]):
    time.sleep(0.001)
print(replay_spool(AppendSink(), sys.argv[1], chunk_size=5).files)
"""


@pytest.mark.integration
def test_two_replayer_processes_never_deliver_a_file_twice(dest: Destination,
                                                           tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    expected = _make_files(spool_dir, files=30, per_file=20)
    out, go = tmp_path / "delivered.jsonl", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", APPEND_SINK, str(spool_dir), str(out),
                               str(go)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    go.touch()
    files = [int(p.communicate(timeout=30)[0]) for p in procs]
    assert sum(files) == 30
    delivered = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(delivered) == sorted(expected)  # each exactly once
    # And into the real destination, through the ordinary path, once more: still once.
    from airflow_ett.ett.events import parse_line
    dest.sink().write([parse_line(line) for line in out.read_text().splitlines()])
    assert set(dest.ids(*{f"job-{f}" for f in range(30)}).values()) == {1}


junk = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\n\r"),
            min_size=1, max_size=30).filter(lambda s: s.strip() != ""),
    st.builds(lambda i: json.dumps({"type": "progress", "id": f"j{i}", "job": "j"}),
              st.integers(0, 100)),
    st.just('{"type": "nope", "id": "x", "job": "j", "ts": 1795856001}'),
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.lists(st.one_of(st.integers(0, 10_000), junk), min_size=1, max_size=30))
def test_replay_delivers_the_good_lines_and_keeps_every_bad_one(
        tmp_path_factory: pytest.TempPathFactory, layout: list[int | str]) -> None:
    spool_dir = tmp_path_factory.mktemp("spool")
    lines: list[str] = []
    good: list[Event] = []
    bad_lines: list[int] = []
    for item in layout:
        if isinstance(item, int):
            event: Event = (progress(item) if item % 2
                            else JobEnded(id=f"end-{item}", job="j", ts=T + 1.0, status="success"))
            good.append(event)
            lines.append(event_to_json(event))
        else:
            lines.append(item)
            bad_lines.append(len(lines))
    write_spool(spool_dir, f"spool-{DEAD_PID}-fff.jsonl", lines)
    sink = CountingSink()
    result = replay_spool(sink, spool_dir, chunk_size=4)
    assert sink.events == good  # all of them, in file order
    assert result.rejected == len(bad_lines)
    rejected = spool_dir / f"spool-{DEAD_PID}-fff.rejected"
    if bad_lines:
        kept = [json.loads(line) for line in rejected.read_text().splitlines()]
        assert [k["line"] for k in kept] == bad_lines
        assert [k["text"] for k in kept] == [lines[n - 1] for n in bad_lines]
    else:
        assert not rejected.exists()
    assert spool_files(spool_dir) == []
