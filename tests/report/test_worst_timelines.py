"""The worst runs' timelines and a day's report files, drawn from events the caller reads
(`report.timeline.worst_timelines`, `report.files.write_day_report`): report/ reads no
store, so here the events come from a dict.

On D (tests/rollup/scenarios.py) job B (tenant t2) is the one run that lost GPU time, so
it is the day's only worst run; job A lost nothing in D.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import Event
from airflow_ett.report.files import FILE_NAMES, write_day_report
from airflow_ett.report.timeline import run_timeline, worst_timelines
from tests.report import rollup
from tests.rollup.scenarios import PREVIOUS, WINDOW, job_a, job_b


def test_the_worst_runs_are_drawn_from_the_events_the_caller_gives() -> None:
    day = rollup(WINDOW, [attribute_job(job_a()), attribute_job(job_b())])
    asked: list[str] = []

    def events_of(job: str) -> Sequence[Event]:
        asked.append(job)
        return {"a": job_a(), "b": job_b()}[job]

    got = worst_timelines(day, events_of)
    assert [r.job for r in day.top_runs] == ["b"] and asked == ["b"]
    assert got == [run_timeline(attribute_job(job_b(), now=day.computed_at))]


def test_another_tenant_or_a_zero_limit_draws_nothing_and_reads_nothing() -> None:
    day = rollup(WINDOW, [attribute_job(job_a()), attribute_job(job_b())])
    asked: list[str] = []

    def events_of(job: str) -> Sequence[Event]:
        asked.append(job)
        return job_b()

    assert worst_timelines(day, events_of, tenant="t1") == []
    assert worst_timelines(day, events_of, limit=0) == []
    assert asked == []
    assert [t.job for t in worst_timelines(day, events_of, tenant="t2")] == ["b"]


def test_a_run_whose_events_are_gone_is_skipped() -> None:
    day = rollup(WINDOW, [attribute_job(job_a()), attribute_job(job_b())])
    assert worst_timelines(day, lambda job: []) == []  # the store was pruned


def test_a_days_report_files_carry_its_worst_runs_timeline(tmp_path: Path) -> None:
    a, b = attribute_job(job_a()), attribute_job(job_b())
    day, before = rollup(WINDOW, [a, b]), rollup(PREVIOUS, [a, b])
    written = write_day_report(tmp_path, day, before, {"a": job_a(), "b": job_b()}.__getitem__)
    assert {p.name for p in written.values()} == set(FILE_NAMES.values())
    assert all(p.parent == tmp_path and p.is_file() for p in written.values())
    assert "timeline-0" in written["html"].read_text()
    gone = write_day_report(tmp_path / "pruned", day, None, lambda job: [])
    assert "timeline-0" not in gone["html"].read_text()
