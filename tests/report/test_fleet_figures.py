"""Fleet figures in every report form (decision 0010): a day with no job has no ETT%
(`none` in text, `-` in HTML, `null` in JSON, an empty cell in CSV), never 0.0 and never an
SLO breach, and the trends pass over it instead of plotting 0; issue 22's day reads as its
GPU time says."""

from __future__ import annotations

import csv
import io
import json
import re

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.report import html as report
from airflow_ett.report.files import report_text
from airflow_ett.report.tabular import to_csv, to_json
from airflow_ett.rollup import DayRollup, day_window, load_components, rollup_day
from tests.report import rollup
from tests.rollup.scenarios import PREVIOUS, WINDOW, D, issue_day_jobs, job_a

ISSUE_WINDOW = day_window(D.replace(day=29), "UTC")


def three_days() -> list[DayRollup]:
    """D-1: job A's first hour (ETT% 83.3); D: no job at all; D+1: issue 22's day."""
    before = rollup(PREVIOUS, [attribute_job(job_a())])
    empty = rollup_day(WINDOW, [], load_components(), computed_at=WINDOW.hi + 60)
    issue = rollup_day(ISSUE_WINDOW, issue_day_jobs(), load_components(),
                       computed_at=ISSUE_WINDOW.hi + 60)
    return [before, empty, issue]


def test_issue_22s_day_headlines_its_gpu_time() -> None:
    """GPU-h 64.53, lost 12.30: 80.9, not the 74.0 the seconds made of it."""
    issue = three_days()[2]
    lines = report_text([issue], None).splitlines()
    assert lines[0] == ("fleet ETT% 80.9   jobs 2   GPU-h 64.53   lost 12.30   "
                        "day 2026-11-29 (UTC)")
    # every share of the GPU time, ETT% the rest: 8 x 3000 GPU-s wasted of 232,308
    assert any(line.split()[:2] == ["wasted_training", "10.3%"] for line in lines)
    assert any(line.split()[:2] == ["effective_training", "80.9%"] for line in lines)


def test_a_day_with_no_job_reads_none_in_text() -> None:
    before, empty, issue = three_days()
    lines = report_text([before, empty], None).splitlines()
    trend = {line.split()[0]: line.split() for line in lines[1:3]}
    assert trend[D.isoformat()][:3] == [D.isoformat(), "none", "0"]  # no change, no 0.0
    day = lines[lines.index("") + 1:]
    assert day[0].startswith("fleet ETT% none   jobs 0")
    components = {line.split()[0]: line.split() for line in day if line.split()
                  and line.split()[0] in COMPONENTS}
    assert {row[1] for row in components.values()} == {"none"}
    assert all(row[-1] == "-" for row in components.values())  # no verdict, no BREACH
    assert "BREACH" not in "\n".join(day)
    # the change of D+1 is against D-1, the last day with figures: 80.94 - 83.33
    trend3 = report_text([before, empty, issue], None).splitlines()[3].split()
    assert trend3[:3] == ["2026-11-29", "80.9", "-2.4"]


def test_a_day_with_no_job_is_null_in_json_and_empty_in_csv() -> None:
    _, empty, _ = three_days()
    (day,) = json.loads(to_json([empty]))
    assert day["fleet"]["ett_pct"] is None
    assert set(day["fleet"]["shares_pct"].values()) == {None}
    assert {row["share_pct"] for row in day["slo"]} == {None}
    assert {row["status"] for row in day["slo"]} == {"none"}
    rows = {(r["scope"], r["metric"]): r["value"]
            for r in csv.DictReader(io.StringIO(to_csv([empty])))}
    assert rows["fleet", "ett_pct"] == "" and rows["fleet", "jobs"] == "0"
    assert rows["fleet", "shares_pct.effective_training"] == ""
    assert rows["slo", "share_pct"] == ""


def test_a_day_with_no_job_is_a_gap_in_the_html_report() -> None:
    before, empty, issue = three_days()
    page = report.render_html([before, empty], [], title="x", script_src="plotly.js")
    assert re.search(r'id="fleet-ett"[^>]*>-<', page)
    assert "fleet-ett-delta" not in page
    trend = report.trend_figure([before, empty, issue])["data"][0]["y"]
    assert trend[1] is None and trend[0] is not None and trend[2] is not None
    shares = report.shares_figure([before, empty, issue])["data"]
    assert all(t["y"][1] is None for t in shares)
    components = page.split('id="components"', 1)[1].split("</section>", 1)[0]
    assert "BREACH" not in components
    shares = re.findall(r'<td class="num">([^<]*)</td>', components)[::2]  # share, GPU-h
    assert len(shares) == len(COMPONENTS) and set(shares) == {"-"}  # not "0.0%"
