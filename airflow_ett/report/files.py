"""A day's report files: `report.txt`, `report.json`, `report.csv` and `index.html` (with
the charts), written atomically into one directory (`<report_dir>/<date>/` for the nightly
rollup), so a reader never opens a half-written report. `write_day_report` is the
nightly DAG's: every file of one day, the timelines of its worst runs drawn from the
events its caller reads (this module reads no store)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from airflow_ett._fs import atomic_write
from airflow_ett.console import render_to_text
from airflow_ett.report.tabular import to_csv, to_json
from airflow_ett.report.text import day_view, trend_view
from airflow_ett.report.timeline import RunTimeline, worst_timelines
from airflow_ett.rollup import DayRollup

if TYPE_CHECKING:
    from airflow_ett.ett.events import Event

FORMATS: Final = ("text", "json", "csv", "html")
FILE_NAMES: Final = {"text": "report.txt", "json": "report.json", "csv": "report.csv",
                     "html": "index.html"}


def report_text(days: Sequence[DayRollup], before: DayRollup | None, *,
                tenant: str | None = None, terminal: bool = False) -> str:
    """The text report: a trend over several days, then the last day in full."""
    if not days:
        raise ValueError("days: no rolled-up day to report")
    parts = []
    if len(days) > 1:
        parts.append(render_to_text(trend_view(days, tenant=tenant, terminal=terminal),
                                    terminal=terminal))
    previous = days[-2] if len(days) > 1 else before
    parts.append(render_to_text(day_view(days[-1], previous, tenant=tenant, terminal=terminal),
                                terminal=terminal))
    return "\n\n".join(parts)


def write_reports(out_dir: Path, days: Sequence[DayRollup], before: DayRollup | None,
                  timelines: Sequence[RunTimeline], *, tenant: str | None = None,
                  formats: Sequence[str] = FORMATS, title: str | None = None
                  ) -> dict[str, Path]:
    """The report in each of `formats` under `out_dir`; returns the path of each file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for fmt in formats:
        path = out_dir / FILE_NAMES[fmt]
        if fmt == "text":
            atomic_write(path, (report_text(days, before, tenant=tenant) + "\n").encode())
        elif fmt == "json":
            atomic_write(path, to_json(days, tenant=tenant).encode())
        elif fmt == "csv":
            atomic_write(path, to_csv(days, tenant=tenant).encode())
        elif fmt == "html":
            from airflow_ett.report.html import write_html_report

            name = title or _title(days, tenant)
            path = write_html_report(out_dir, days, timelines, title=name, before=before)
        else:
            raise ValueError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
        written[fmt] = path
    return written


def write_day_report(out_dir: Path, rollup: DayRollup, before: DayRollup | None,
                     events_of: Callable[[str], Sequence[Event]]) -> dict[str, Path]:
    """Every report file of one stored day under `out_dir` (`before`: the day before, for
    the change), with the timelines of its worst runs from `events_of(job)`; returns the
    path of each file."""
    return write_reports(out_dir, [rollup], before, worst_timelines(rollup, events_of))


def _title(days: Sequence[DayRollup], tenant: str | None) -> str:
    span = days[0].day if len(days) == 1 else f"{days[0].day} to {days[-1].day}"
    return f"ETT report {span}" + (f", tenant {tenant}" if tenant else "")
