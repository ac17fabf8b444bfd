"""The CSV report against spreadsheet formula injection: a text cell that starts like a
formula (=, +, -, @, tab, carriage return: OWASP's list) is written behind a `'`; numbers,
negative ones too, stay numbers; a reader that drops one leading `'` gets every value
back (csv round trip)."""

from __future__ import annotations

import csv
import io

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.report.tabular import FORMULA_STARTS, csv_cell, csv_text, to_csv, write_csv
from airflow_ett.rollup import (
    DayRollup,
    day_parts,
    day_window,
    job_day,
    load_components,
    rollup_of_parts,
)
from tests.rollup.scenarios import LO, D

TENANTS = ["=HYPERLINK(\"http://evil.example\",\"x\")", "-2+3", "+1", "@SUM(A1:A9)",
           "\tx", "\rx", "'=quoted", "plain", "a=b", "-"]


def day_of(tenants: list[str]) -> DayRollup:
    """A day of one job per tenant, rolled up by the rollup's own pure stages."""
    window = day_window(D, "UTC")
    days = []
    for i, tenant in enumerate(tenants):
        spec = JobSpec(job=f"{tenant}-job{i}", tenant=tenant, model=f"@model{i}",
                       submit_ts=LO + 600 * (i + 1),
                       failures=(InjectedFailure(at_step=40),) if i % 2 else ())
        cut = job_day(attribute_job(simulate(spec), now=LO + 86400), window)
        assert cut is not None
        days.append(cut)
    parts = day_parts(days, cut_pct=50.0, start_s=60.0)
    return rollup_of_parts(window, parts, load_components(), computed_at=LO + 86400)


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_no_text_cell_starts_like_a_formula_and_every_value_comes_back() -> None:
    day = day_of(TENANTS)
    written = rows(to_csv([day]))
    assert written[0] == ["day", "scope", "key", "metric", "value"]
    for row in written[1:]:
        for cell in row[:4]:  # day, scope, key, metric: text
            assert not cell.startswith(FORMULA_STARTS), row
        assert not row[4].startswith(FORMULA_STARTS) or is_number(row[4]), row
    keys = {csv_text(r[2]) for r in written[1:] if r[1] == "tenant"}
    assert keys == set(TENANTS)
    top_runs = {csv_text(r[2]) for r in written[1:] if r[1] == "top_run"}
    assert top_runs == {run.job for run in day.top_runs}
    models = {csv_text(r[2]) for r in written[1:] if r[1] == "model"}
    assert models == set(day.models) and all(m.startswith("@") for m in models)
    tenant_cells = {csv_text(r[4]) for r in written[1:] if r[1] == "top_run"
                    and r[3] == "tenant"}
    assert tenant_cells <= set(TENANTS) and tenant_cells


def test_numbers_stay_numbers_negative_ones_too() -> None:
    day = day_of(["plain"])
    worse = msgspec.structs.replace(day.what_if[0], gain_pts=-0.25, ett_pct_after=-1.5)
    day = msgspec.structs.replace(day, what_if=[worse, *day.what_if[1:]])
    written = rows(to_csv([day]))
    values = {(r[1], r[2], r[3]): r[4] for r in written[1:]}
    assert values["what_if", worse.label, "gain_pts"] == "-0.25"
    assert values["what_if", worse.label, "ett_pct_after"] == "-1.5"
    assert float(values["fleet", "", "ett_pct"]) == pytest.approx(day.fleet.ett_pct)
    assert float(values["fleet", "", "jobs"]) == 1


@pytest.mark.parametrize(("value", "cell"), [
    ("=1+1", "'=1+1"), ("+1", "'+1"), ("-1", "'-1"), ("@x", "'@x"), ("\tx", "'\tx"),
    ("\rx", "'\rx"), ("'x", "''x"), ("x=1", "x=1"), ("", ""), (None, ""),
    (-1.5, -1.5), (-3, -3), (0.0, 0.0), (True, True),
])
def test_csv_cell(value: object, cell: object) -> None:
    assert csv_cell(value) == cell


@given(st.lists(st.lists(st.one_of(st.text(), st.floats(allow_nan=False), st.integers()),
                         min_size=1, max_size=4), min_size=1, max_size=4))
def test_any_cells_are_written_inert_and_read_back_whole(table: list[list[object]]) -> None:
    """Text with newlines and carriage returns anywhere included: one row per row."""
    text = write_csv(table)
    assert text.endswith("\n")
    read = rows(text)
    assert len(read) == len(table)
    for written, cells in zip(read, table, strict=True):
        for cell, value in zip(written, cells, strict=True):
            if isinstance(value, str):
                assert not cell.startswith(FORMULA_STARTS)
                assert csv_text(cell) == value
            else:  # a number, written as one: -1 stays -1
                assert type(value)(cell) == value
