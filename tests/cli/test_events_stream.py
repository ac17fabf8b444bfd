"""`compute` and `ingest` stream an events file (issue 22): memory does not grow with the
file, a line too long to be an event is one bad line, and every other line still counts.
Peak memory at 1M lines is a benchmark (`python -m bench.events_stream`, bench/RESULTS.md);
here the growth from 10k to 100k lines is measured, in fresh processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.ett.events import MAX_LINE_BYTES, event_to_json
from airflow_ett.ett.synthetic import EXAMPLE_SPEC, simulate
from bench.events_stream import write_events_file

_PEAK = """
import os, resource, sys
from airflow_ett.cli import main
sys.stdout = open(os.devnull, "w")
code = main(sys.argv[1:])
print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def peak_kb(*argv: str) -> int:
    done = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True,
                          text=True, timeout=600, check=False)
    code, peak = done.stderr.strip().splitlines()[-1].split()
    assert code == "0", done.stderr[-2000:]
    return int(peak)


@pytest.mark.slow
def test_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    """Before, both commands held every line and every event: 100k lines (18 MB) cost
    ~150 MB more than 10k. Streamed, the difference is the per-event offsets (8 bytes) and
    the SQLite page cache."""
    small, large = tmp_path / "10k.jsonl", tmp_path / "100k.jsonl"
    write_events_file(small, 10_000)
    write_events_file(large, 100_000)
    for command in ("compute", "ingest"):
        def run(path: Path, command: str = command) -> int:
            if command == "compute":
                return peak_kb(command, str(path), "--json")
            url = f"sqlite:///{path}.db"
            assert main(["db", "upgrade", "--store-url", url]) == 0
            return peak_kb(command, str(path), "--store-url", url)

        grew_mb = (run(large) - run(small)) / 1024
        assert grew_mb < 25, f"{command}: {grew_mb:.0f} MB more for 10x the lines"


def test_a_line_too_long_is_one_bad_line_and_the_rest_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = simulate(EXAMPLE_SPEC)
    path = tmp_path / "events.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(event_to_json(events[0]) + "\n")
        fh.write("x" * (3 * MAX_LINE_BYTES) + "\n")  # line 2: never held whole
        for event in events[1:]:
            fh.write(event_to_json(event) + "\n")
    assert main(["compute", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["job"] == EXAMPLE_SPEC.job
    assert f"line 2: line longer than {MAX_LINE_BYTES:,} bytes (3,145,729)" in err
    assert f"skipped 1 bad line(s) of {len(events) + 1}" in err
    url = f"sqlite:///{tmp_path}/ett.db"
    assert main(["db", "upgrade", "--store-url", url]) == 0
    assert main(["ingest", str(path), "--store-url", url]) == 0
    assert f"stored {len(events)} new event(s) of {len(events)} read" in capsys.readouterr().out
    assert main(["ingest", str(path), "--store-url", url, "--strict"]) == 1
    assert "1 bad line(s)" in capsys.readouterr().err


def test_ingest_in_batches_equals_ingest_at_once(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Across batch boundaries: the same events stored, duplicates counted as before."""
    path = tmp_path / "events.jsonl"
    jobs = write_events_file(path, 12_000)  # three batches of 5,000
    url = f"sqlite:///{tmp_path}/ett.db"
    assert main(["db", "upgrade", "--store-url", url]) == 0
    capsys.readouterr()
    assert main(["ingest", str(path), "--store-url", url]) == 0
    assert capsys.readouterr().out.strip() == (
        f"stored 12000 new event(s) of 12000 read (0 already there) for {jobs} job(s)")
    assert main(["ingest", str(path), "--store-url", url]) == 0
    assert capsys.readouterr().out.strip() == (
        f"stored 0 new event(s) of 12000 read (12000 already there) for {jobs} job(s)")
