"""The CLI's output through `airflow_ett.console` (rich): plain text anywhere but a
terminal (no escapes, no borders, no value cut or wrapped), rich's boxes and colours on
one; the report's tables; the runs listing through the real CLI; progress."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from airflow_ett import console
from airflow_ett.cli import main
from airflow_ett.cli.render import job_view, render_job, render_row
from airflow_ett.ett.attribution import attribute
from airflow_ett.ett.events import event_to_json, read_events
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.ett.synthetic import EXAMPLE_SPEC, InjectedFailure, JobSpec, simulate
from tests.cli.test_cli import EXAMPLE

# A job id as long as the demo's, and one far past any terminal width.
DEMO_JOB = "ett_dlrm_demo__manual__2026-11-29T11:39:15.808330+00:00"
LONG_JOB = "x" * 150 + "__manual__2026-11-29T11:39:15.808330+00:00"
ROUNDED = set("╭╮╰╯─│")


@pytest.fixture(autouse=True)
def _rich_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich reads these: a developer's or CI's settings must not decide a test's mode."""
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "80")


def _example_dict() -> dict[str, Any]:
    parsed = read_events(str(EXAMPLE))
    assert not parsed.errors
    (result,) = attribute(parsed.events).values()
    return result.summary().to_dict()


def _section(text: str, heading: str) -> list[str]:
    """The lines under `heading`, up to the next blank line."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start:end]


# --- plain: no escapes, no borders, long values whole -------------------------------------


def test_plain_report_has_no_escapes_and_keeps_long_values_on_one_line() -> None:
    d = _example_dict() | {"job": LONG_JOB, "e2e_s": 1795856400000000.0}
    d["phases"] = {**d["phases"], "p" * 120: 1795856400000000.0}
    out = render_row(d)
    assert "\x1b" not in out
    assert out.isascii()  # no box-drawing characters either
    assert f"job {LONG_JOB} (ads-ranking / dlrm_small)   ETT% " in out.splitlines()[0]
    assert "E2E 498849000000.00 h" in out.splitlines()[0]
    (phase_line,) = [x for x in out.splitlines() if "p" * 120 in x]
    assert phase_line.split() == ["p" * 120, "498849000000.00", "h", "100.0%", "?"]
    assert all(x == x.rstrip() for x in out.splitlines())  # no padding out to a width


def test_terminal_report_has_escapes_and_boxes() -> None:
    out = render_row(_example_dict(), terminal=True)
    assert "\x1b[" in out
    assert set(out) >= ROUNDED
    assert "ETT% 55.08" in out  # a styled span, but still one piece of text


def test_no_color_keeps_the_boxes_and_drops_the_colours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    out = render_row(_example_dict(), terminal=True)
    assert set(out) >= ROUNDED
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", out)  # no foreground colour
    assert "\x1b[1m" in out  # bold is not a colour


def test_level2_lists_every_component_with_its_time_and_share() -> None:
    d = _example_dict()
    out = render_row(d)
    rows = _section(out, "Level 2")
    assert rows[0].split() == ["component", "time", "share"]
    e2e = d["e2e_s"]
    by_name = {row.split()[0]: row.split()[1:] for row in rows[1:]}
    assert list(by_name) == [*COMPONENTS, "total"]
    for component in COMPONENTS:
        seconds = d["components"][component]
        time_text = (f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s")
        assert by_name[component] == [*time_text.split(), f"{100 * seconds / e2e:.1f}%"]
    assert by_name["total"] == ["45.4", "min"]
    # The numbers are right-aligned: every time ends in the same column.
    ends = {row.index(" s  ") + 2 if " s  " in row else row.index(" min ") + 4
            for row in rows[1:-1]}
    assert len(ends) == 1, rows


def test_level3_is_the_largest_phases_first_with_their_component() -> None:
    d = _example_dict()
    rows = _section(render_row(d, top_phases=3), "Level 3 (largest phases)")
    assert rows[0].split() == ["phase", "time", "share", "component"]
    biggest = sorted(d["phases"].items(), key=lambda kv: -kv[1])[:3]
    assert [row.split()[0] for row in rows[1:]] == [name for name, _ in biggest]
    assert rows[1].split()[-1] == d["phase_components"][biggest[0][0]]


def test_odd_values_still_render() -> None:
    out = render_row({"job": "odd", "ett_pct": None, "e2e_s": math.inf, "tts_s": math.nan,
                      "nof": {"total": 0}, "components": {"scheduling": "1e999"},
                      "phases": {"x": math.nan, "y": 2.0}, "warnings": ["w [bold]"]})
    assert "ETT% -" in out and "E2E inf s" in out and "TTS    nan s" in out
    level2 = {row.split()[0]: row.split()[1:] for row in _section(out, "Level 2")[1:]}
    assert level2["scheduling"] == ["1e999", "s", "-"]
    assert level2["initialization"] == ["-", "-"]
    level3 = _section(out, "Level 3 (largest phases)")[1:]
    assert [row.split()[0] for row in level3] == ["y", "x", "note:"]  # the NaN last
    assert out.splitlines()[-1] == "note: w [bold]"  # brackets are text, not markup


def test_a_provisional_flag_in_brackets_is_printed_not_parsed() -> None:
    d = _example_dict() | {"provisional": True}
    assert "   [provisional: still running]" in render_row(d).splitlines()[0]
    assert "[provisional: still running]" in render_row(d, terminal=True)


def test_render_job_is_the_summary_dict_rendered() -> None:
    parsed = read_events(str(EXAMPLE))
    assert not parsed.errors
    (result,) = attribute(parsed.events).values()
    assert render_job(result.summary()) == render_row(result.summary().to_dict())


# --- emit / line: the stream decides, by rich's rules -------------------------------------


def test_emit_is_plain_off_a_terminal_and_rich_when_forced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    view = job_view(_example_dict(), terminal=False)
    plain = io.StringIO()
    console.emit(view, file=plain)
    assert plain.getvalue() == render_row(_example_dict()) + "\n"

    monkeypatch.setenv("FORCE_COLOR", "1")  # rich's switch: this "file" is a terminal
    assert console.is_terminal(io.StringIO())
    forced = io.StringIO()
    console.emit(job_view(_example_dict(), terminal=True), file=forced)
    assert "\x1b[" in forced.getvalue() and set(forced.getvalue()) >= ROUNDED


def test_line_is_its_plain_text_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    text = console.Text.assemble(("airflow-ett:", "bold cyan"), " [x] started")
    out = io.StringIO()
    console.line(text, file=out)
    assert out.getvalue() == "airflow-ett: [x] started\n"
    monkeypatch.setenv("FORCE_COLOR", "1")
    styled = io.StringIO()
    console.line(text, file=styled)
    assert "\x1b[" in styled.getvalue() and "[x] started" in styled.getvalue()


def test_embedded_progress_is_the_same_line_on_stderr(
        capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_ett.cli.embedded import _progress

    _progress("stopping Airflow")
    captured = capsys.readouterr()
    assert captured.err == "airflow-ett: stopping Airflow\n"
    assert captured.out == ""


def test_table_plain_and_terminal() -> None:
    rows = [(DEMO_JOB, "1795856400000000.0"), ("b", "2")]
    grid = console.table(["job", console.Column("raw", justify="right")], rows,
                         totals=[("total", "3")], terminal=False)
    text = console.render_to_text(grid, terminal=False, width=40)  # plain: width ignored
    w, r = len(DEMO_JOB), len("1795856400000000.0")
    assert text.splitlines() == [
        f"{'job':<{w}}  {'raw':>{r}}",
        f"{DEMO_JOB}  1795856400000000.0",
        f"{'b':<{w}}  {'2':>{r}}",
        f"{'total':<{w}}  {'3':>{r}}",
    ]
    boxed = console.render_to_text(console.table(["job", "raw"], rows, terminal=True),
                                   terminal=True, width=120)
    assert set(boxed) >= ROUNDED and DEMO_JOB in boxed


# --- progress -------------------------------------------------------------------------------


def test_progress_off_a_terminal_is_a_few_plain_lines() -> None:
    out = io.StringIO()
    with console.progress(25, "rollup", file=out) as advance:
        for _ in range(25):
            advance()
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue()
    assert lines[-1] == "rollup: 25/25"
    assert lines[0] == "rollup: 3/25"  # each tenth of the way (ceil(25 / 10) = 3 steps)
    assert len(lines) == 9


def test_progress_advances_by_n_and_never_counts_past_the_total() -> None:
    out = io.StringIO()
    with console.progress(4, "backfill", file=out) as advance:
        advance(3)
        advance(5)
    assert out.getvalue().splitlines() == ["backfill: 3/4", "backfill: 4/4"]


def test_progress_on_a_terminal_is_a_rich_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    out = io.StringIO()
    with console.progress(5, "rollup", file=out) as advance:
        for _ in range(5):
            advance()
    assert "\x1b[" in out.getvalue() and "5/5" in out.getvalue()


# --- the runs listing, through the real CLI -------------------------------------------------


def _store_with_runs(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    assert main(["db", "upgrade", "--store-url", url]) == 0
    log = tmp_path / "runs.jsonl"
    events = [*simulate(EXAMPLE_SPEC),
              *simulate(JobSpec(job=DEMO_JOB, tenant="demo",
                                failures=(InjectedFailure(at_step=20),))),
              *simulate(JobSpec(job=LONG_JOB, tenant="t", model="m"))]
    log.write_text("".join(event_to_json(e) + "\n" for e in events))
    assert main(["ingest", str(log), "--store-url", url]) == 0
    return url


def test_runs_list_is_a_plain_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _store_with_runs(tmp_path)
    capsys.readouterr()
    assert main(["runs", "list", "--store-url", url]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.isascii()
    header, *rows = out.splitlines()
    assert re.split(r"\s{2,}", header) == ["job", "tenant", "model", "submitted (UTC)",
                                           "status"]
    assert len(rows) == 3
    cells = {r.split()[0]: r.split()[1:] for r in rows}
    assert cells[EXAMPLE_SPEC.job] == ["ads-ranking", "dlrm_small", "2026-11-28",
                                       "09:00:00", "success"]
    assert cells[LONG_JOB][:2] == ["t", "m"]  # 190 characters, whole, on its line
    assert cells[DEMO_JOB][0] == "demo"
    status_column = header.index("status")
    assert all(r[status_column:].rstrip() == "success" for r in rows), out  # aligned
    # --json is untouched by the table.
    assert main(["runs", "list", "--store-url", url, "--json"]) == 0
    assert {r["job"] for r in json.loads(capsys.readouterr().out)} == {
        EXAMPLE_SPEC.job, DEMO_JOB, LONG_JOB}


def test_runs_show_is_the_plain_report(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    url = _store_with_runs(tmp_path)
    capsys.readouterr()
    assert main(["runs", "show", EXAMPLE_SPEC.job, "--store-url", url]) == 0
    out = capsys.readouterr().out
    assert out == render_row(_example_dict()) + "\n"


def test_level1_says_the_slow_steps_and_the_ideal_step_time() -> None:
    d = _example_dict()
    slow = d["slow_steps"]
    out = render_row(d)
    assert (f"  slow steps  {slow['lost_s']:.1f} s of effective training "
            f"({slow['lost_pct_of_effective']:.1f}%) above the ideal step time "
            f"{slow['ideal_step_s']:.4g} s; {slow['slow_spans']} of {slow['spans']} progress "
            "spans slow") in out
    assert "slow steps" not in render_row({**d, "slow_steps": None})


def test_level1_names_a_straggler_and_every_ranks_own_step() -> None:
    d = _example_dict()
    ranks = {"ranks": [{"rank": 0, "reports": 4, "steps": 40, "step_s": 0.1, "wait_step_s": 0.05},
                       {"rank": 1, "reports": 4, "steps": 40, "step_s": 0.15,
                        "wait_step_s": 0.0}],
             "stragglers": [{"attempt": "2", "rank": 1, "step_s": 0.15, "others_step_s": 0.1,
                             "slowdown": 1.5, "slow_share": 1.0, "lost_s": 2.0}]}
    out = render_row({**d, "rank_steps": ranks})
    assert ("  straggler  rank 1 of attempt 2: 0.15 s a step of its own against 0.1 s for "
            "the others (1.50x), slower in 100% of its steps; the job waited 2.0 s for it"
            ) in out
    assert "  own step per rank  0: 0.1 s  1: 0.15 s" in out
    assert "straggler" not in render_row({**d, "rank_steps": None})
    # a row with odd values still renders (the JSON form is input)
    assert "rank None" in render_row({**d, "rank_steps": {"stragglers": [{}], "ranks": "x"}})
