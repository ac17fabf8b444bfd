"""Two windows compared (`rollup.compare`): the hand-made fortnight of compare_days.py
worked out on paper, and, over any parts, the splits adding up to the change exactly."""

from __future__ import annotations

import datetime as dt
import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.rollup import JobDay, Totals, day_parts
from airflow_ett.rollup.compare import (
    Comparison,
    PartSums,
    Span,
    View,
    WindowParts,
    compare,
    sums_of,
)
from airflow_ett.rollup.figures import LOST_COMPONENTS
from tests.rollup.compare_days import WEEK_1, WEEK_2, week


def _window(first: dt.date, parts: list[PartSums]) -> WindowParts:
    last = first + dt.timedelta(days=6)
    return WindowParts(span=Span(first=first.isoformat(), last=last.isoformat(), days=7),
                       parts=parts)


def _fortnight() -> Comparison:
    return compare(_window(WEEK_1, week(WEEK_1)), _window(WEEK_2, week(WEEK_2)))


def test_the_fleet_as_operated_split_three_ways() -> None:
    c = _fortnight()
    fleet = c.fleet
    assert fleet.before.ett_pct == pytest.approx(95.8)  # 1 - 8,400 / 200,000
    assert fleet.after.ett_pct == pytest.approx(262_400 / 2_800)  # 1 - 17,600 / 280,000
    assert fleet.change_points == pytest.approx(262_400 / 2_800 - 95.8)
    components = {m.component: m.ett_points for m in fleet.components}
    assert components["initialization"] == pytest.approx(0.2 - 4000 / 2800)
    assert components["wasted_training"] == pytest.approx(2.0 - 8000 / 2800)
    assert components["compilation"] == pytest.approx(0.8 - 3200 / 2800)
    assert components["shutdown"] == 0.0
    assert fleet.components[0].component == "initialization"  # the largest first
    models = {m.name: m for m in fleet.models}
    assert [m.name for m in fleet.models] == ["fresh", "ctr", "old", "rank"]
    # fresh entered: its weight 1/7 at 80% against the old fleet's 95.8%
    assert models["fresh"].points == pytest.approx((80 - 95.8) / 7)
    assert models["fresh"].rate_points == 0.0 and models["fresh"].before_pct is None
    assert models["old"].points == pytest.approx(0.2 * (95.8 - 90))  # left: 20% at 90%
    # rank ran as well as ever (98%) on twice the GPUs: a mix effect only
    assert models["rank"].rate_points == 0.0
    assert models["rank"].points == pytest.approx((4 / 7 - 0.4) * (98 - 95.8))
    assert models["ctr"].rate_points == pytest.approx(2 / 7 * (92 - 96.5))
    tenants = {t.name: t for t in fleet.tenants}
    assert tenants["ads"].gpu_hours_before == pytest.approx(7 * 80_000 / 3600)


def test_the_cohort_and_the_models_that_came_went_or_moved() -> None:
    c = _fortnight()
    assert c.cohort_models == 2
    assert c.cohort.before.ett_pct == pytest.approx(97.25)  # 1 - 4,400 / 160,000
    assert c.cohort.after.ett_pct == pytest.approx(96.0)  # 1 - 9,600 / 240,000
    assert {m.name for m in c.cohort.models} == {"ctr", "rank"}
    assert [(m.model, m.tenants, m.gpus_before, m.gpus_after) for m in c.entered] == [
        ("fresh", ["search"], [], [4])]
    assert [(m.model, m.gpus_before, m.gpus_after) for m in c.left] == [("old", [4], [])]
    assert [(m.model, m.gpus_before, m.gpus_after) for m in c.platform_changed] == [
        ("rank", [8], [16])]
    assert c.platform_unknown == []
    assert c.churn is not None
    assert c.churn.entered_points == pytest.approx((80 - 95.8) / 7)
    assert c.churn.left_points == pytest.approx(0.2 * (95.8 - 90))


def test_a_window_against_itself_moves_nothing() -> None:
    parts = week(WEEK_1)
    c = compare(_window(WEEK_1, parts), _window(WEEK_1, parts))
    for view in (c.fleet, c.cohort):
        assert view.change_points == 0.0
        assert all(m.ett_points == 0.0 for m in view.components)
        assert all(g.points == 0.0 for g in (*view.tenants, *view.models))
    assert (c.entered, c.left, c.platform_changed) == ([], [], [])


def test_an_empty_window_has_no_change_and_no_split() -> None:
    c = compare(_window(WEEK_1, []), _window(WEEK_2, week(WEEK_2)))
    assert c.fleet.before.ett_pct is None and c.fleet.change_points is None
    assert c.fleet.tenants == [] and c.fleet.models == [] and c.churn is None
    assert all(m.ett_points is None for m in c.fleet.components)
    assert [m.model for m in c.entered] == ["rank", "ctr", "fresh"]  # most GPU-hours first
    assert c.cohort_models == 0 and c.cohort.after.ett_pct is None


def test_a_part_stored_without_gpu_counts_leaves_the_platform_unknown() -> None:
    old = [msgspec.structs.replace(p, gpu_counts={}) for p in week(WEEK_1)]  # stored before
    c = compare(_window(WEEK_1, old), _window(WEEK_2, week(WEEK_2)))
    assert c.platform_unknown == ["ctr", "rank"] and c.platform_changed == []
    assert c.left[0].gpus_before is None


# -- any parts: the splits add up ---------------------------------------------------------

_LOST = st.fixed_dictionaries({c: st.integers(0, 3_000) for c in LOST_COMPONENTS})
_JOB = st.tuples(st.sampled_from(["t1", "t2", "t3"]), st.sampled_from(["", "m1", "m2", "m3",
                                                                       "m4", "m5"]),
                 st.sampled_from([1, 2, 8, 64]), st.integers(0, 20_000), _LOST)


def _job_days(drawn: list[tuple[str, str, int, int, dict[str, int]]], tag: str
              ) -> list[JobDay]:
    out = []
    for i, (tenant, model, gpus, extra_s, lost_s) in enumerate(drawn):
        us = {c: s * 1_000_000 for c, s in lost_s.items()}
        us[EFFECTIVE] = extra_s * 1_000_000
        out.append(JobDay(job=f"{tag}{i}", tenant=tenant, model=model, dag_id=f"d{i % 3}",
                          run_id=None, gpus=gpus, provisional=False, synthetic=False,
                          e2e_us=sum(us.values()), components_us={c: us[c] for c in COMPONENTS},
                          tts_us=None, failures=(), attempts=1, preempted_attempts=0))
    return out


def _adds_up(view: View) -> None:
    change = view.change_points
    if change is None:
        assert view.tenants == [] and view.models == []
        return
    tol = 1e-9 * max(1.0, abs(change))
    assert math.isclose(sum(m.ett_points or 0.0 for m in view.components), change, abs_tol=tol)
    for moves in (view.tenants, view.models):
        assert math.isclose(sum(g.points for g in moves), change, abs_tol=1e-9)
        for g in moves:
            assert math.isclose(g.rate_points + g.mix_points, g.points, abs_tol=1e-12)
        sizes = [abs(g.points) for g in moves]
        assert sizes == sorted(sizes, reverse=True)


@settings(max_examples=120, deadline=None)
@given(before=st.lists(_JOB, max_size=12), after=st.lists(_JOB, max_size=12))
def test_every_split_adds_up_to_the_change(
        before: list[tuple[str, str, int, int, dict[str, int]]],
        after: list[tuple[str, str, int, int, dict[str, int]]]) -> None:
    days_b, days_a = _job_days(before, "b"), _job_days(after, "a")
    c = compare(_window(WEEK_1, [sums_of(p) for p in day_parts(days_b, cut_pct=50.0,
                                                                start_s=60.0)]),
                _window(WEEK_2, [sums_of(p) for p in day_parts(days_a, cut_pct=50.0,
                                                                start_s=60.0)]))
    _adds_up(c.fleet)
    _adds_up(c.cohort)
    for days, side in ((days_b, c.fleet.before), (days_a, c.fleet.after)):
        totals = Totals()
        for d in days:
            totals.add(d)
        assert side.ett_pct == totals.figures().ett_pct  # the rollup's own figure
    ran_b = {d.model or "-" for d in days_b if d.gpu_us > 0}
    ran_a = {d.model or "-" for d in days_a if d.gpu_us > 0}
    assert {m.model for m in c.entered} == ran_a - ran_b
    assert {m.model for m in c.left} == ran_b - ran_a
    assert c.cohort_models == len(ran_a & ran_b)
    assert {g.name for g in c.cohort.models} <= ran_a & ran_b
    if c.churn is not None:
        assert c.fleet.change_points is not None
        assert math.isclose(c.churn.cohort_points + c.churn.entered_points
                            + c.churn.left_points, c.fleet.change_points, abs_tol=1e-9)
    for m in c.platform_changed:
        assert m.gpus_before != m.gpus_after and m.model in ran_a & ran_b
