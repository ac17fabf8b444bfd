"""The log tail a failing component's error quotes: the last lines of this start's part
of the log, read from its end only (a day-long log is hundreds of MB)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from airflow_ett.embedded.processes import LOG_TAIL_LINES, tail


def test_the_tail_of_a_large_log_is_its_last_lines_read_from_the_end(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    with open(log, "w", encoding="utf-8") as fh:
        for i in range(400_000):  # ~10 MB
            fh.write(f"line {i:07d} " + "x" * 12 + "\n")
    tracemalloc.start()
    got = tail(log)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert got.splitlines() == [f"line {i:07d} " + "x" * 12
                                for i in range(400_000 - LOG_TAIL_LINES, 400_000)]
    assert peak < 2 << 20  # the whole log would be 10 MB read, twice that decoded


def test_only_this_starts_part_counts(tmp_path: Path) -> None:
    log = tmp_path / "api-server.log"
    log.write_text("old run\n")
    offset = log.stat().st_size
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("new 1\nnew 2\n")
    assert tail(log, offset=offset) == "new 1\nnew 2"
    assert tail(log, offset=log.stat().st_size) == "(empty)"
