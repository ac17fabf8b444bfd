"""Fleet figures weigh GPU time (issue 22, decision 0010): every group's ETT% and Level-2
share is GPU-seconds over GPU-seconds, agrees with the GPU-hours printed beside it, adds
up over parts, and is the old seconds weighting exactly when every job has as many GPUs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.rollup import JobDay, Totals, aggregate, load_components, rollup_day, what_ifs
from airflow_ett.rollup.figures import LOST_COMPONENTS, US_PER_H
from tests.rollup.scenarios import issue_day_jobs
from tests.rollup.test_parts import WINDOW, fleets


def _gpu(days: list[JobDay]) -> int:
    return sum(d.e2e_us * d.gpus for d in days)


@settings(max_examples=80, deadline=None)
@given(days=fleets)
def test_every_group_is_gpu_seconds_over_gpu_seconds(days: list[JobDay]) -> None:
    rollup = rollup_day(WINDOW, days, load_components(), computed_at=1.0)
    groups = [(rollup.fleet, days),
              *((g, [d for d in days if d.tenant == t]) for t, g in rollup.tenants.items()),
              *((g, [d for d in days if (d.model or "-") == m]) for m, g in rollup.models.items())]
    for g, members in groups:
        gpu = _gpu(members)
        if gpu == 0:  # no GPU time: no figure, never 0.0
            assert g.ett_pct is None and set(g.shares_pct.values()) == {None}
            continue
        effective = sum(d.components_us[EFFECTIVE] * d.gpus for d in members)
        assert g.ett_pct == 100.0 * effective / gpu
        shares = {c: s for c, s in g.shares_pct.items() if s is not None}
        assert shares.keys() == set(COMPONENTS)
        assert sum(shares.values()) == pytest.approx(100.0, abs=1e-9)
        # ETT% is 100 minus the lost shares, each its GPU-hours lost over the GPU-hours
        assert g.ett_pct == pytest.approx(100.0 - sum(shares[c] for c in LOST_COMPONENTS),
                                          abs=1e-9)
        for c in LOST_COMPONENTS:
            assert shares[c] == pytest.approx(
                100.0 * g.gpu_hours_lost_by_component[c] / g.gpu_hours, rel=1e-12, abs=1e-12)
        assert g.ett_pct == pytest.approx(100.0 * (1 - g.gpu_hours_lost / g.gpu_hours),
                                          abs=1e-9)
    slo = {row.component: row for row in rollup.slo}
    assert all(slo[c].share_pct == rollup.fleet.shares_pct[c] for c in COMPONENTS)
    if rollup.fleet.ett_pct is None:
        assert {row.status for row in rollup.slo} == {"none"} and rollup.what_if == []
    else:
        assert {w.ett_pct_before for w in rollup.what_if} == {rollup.fleet.ett_pct}


@settings(max_examples=80, deadline=None)
@given(days=fleets, seed=st.integers(0, 999))
def test_merged_parts_are_the_aggregate_of_their_union(days: list[JobDay], seed: int) -> None:
    rng = random.Random(seed)
    pieces: list[Totals] = [Totals() for _ in range(rng.randint(1, 4))]
    for d in days:
        rng.choice(pieces).add(d)
    merged = Totals()
    for piece in pieces:
        merged.merge(piece)
    assert merged.figures() == aggregate(days)
    assert merged.effective_gpu_us == sum(d.components_us[EFFECTIVE] * d.gpus for d in days)


@settings(max_examples=80, deadline=None)
@given(days=fleets, gpus=st.integers(1, 64))
def test_with_equal_gpus_it_is_the_seconds_weighting(days: list[JobDay], gpus: int) -> None:
    same = [dataclasses.replace(d, gpus=gpus) for d in days]
    fleet = aggregate(same)
    e2e = sum(d.e2e_us for d in days)
    if e2e == 0:
        assert fleet.ett_pct is None
        return
    for c in COMPONENTS:
        seconds = 100.0 * sum(d.components_us[c] for d in days) / e2e
        assert fleet.shares_pct[c] == pytest.approx(seconds, rel=1e-12, abs=1e-12)
    effective = sum(d.components_us[EFFECTIVE] for d in days)
    assert fleet.ett_pct == pytest.approx(100.0 * effective / e2e, rel=1e-12)
    for w in what_ifs(same, cut_pct=50.0, start_s=60.0):
        saved = round(w.e2e_s_saved * 1_000_000)
        after = 100.0 * effective / (e2e - saved) if e2e > saved else 0.0
        assert w.ett_pct_after == pytest.approx(after, rel=1e-12, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(days=fleets.filter(bool), n=st.integers(2, 8))
def test_a_job_on_n_gpus_weighs_as_n_jobs_on_one(days: list[JobDay], n: int) -> None:
    """64 GPUs for an hour is 64 GPU-hours of the fleet's capacity: a job on `n` GPUs
    weighs exactly as `n` copies of it on 1 GPU."""
    first, rest = days[0], days[1:]
    wide = aggregate([dataclasses.replace(first, gpus=n * first.gpus), *rest])
    copies = aggregate([*(dataclasses.replace(first, job=f"{first.job}-{i}")
                          for i in range(n)), *rest])
    assert (wide.ett_pct, wide.shares_pct, wide.gpu_hours) == (
        copies.ett_pct, copies.shares_pct, copies.gpu_hours)


def test_issue_22s_day_by_hand() -> None:
    """Its report said "GPU-h 64.53, lost 12.30" (19% of the GPU time lost) and headlined
    ETT% 74.0, the seconds' figure; by GPU time it is 80.9 (tests/rollup/scenarios.py)."""
    window = dataclasses.replace(WINDOW, day=dt.date(2026, 11, 29))
    rollup = rollup_day(window, issue_day_jobs(), load_components(), computed_at=1.0)
    fleet = rollup.fleet
    assert round(fleet.gpu_hours * US_PER_H) == 232_308 * 10**6  # 64.53 GPU-h
    assert round(fleet.gpu_hours_lost * US_PER_H) == 44_280 * 10**6  # 12.30 GPU-h
    assert fleet.ett_pct == 100.0 * 188_028 / 232_308 == pytest.approx(80.94, abs=0.005)
    assert 100.0 * fleet.effective_s / fleet.e2e_s == pytest.approx(74.0, abs=0.005)
    # X: 8 x 3,000 GPU-s of waste, Y: 4,000 of compilation, of 232,308
    assert fleet.shares_pct["wasted_training"] == pytest.approx(100 * 24_000 / 232_308)
    assert fleet.shares_pct["compilation"] == pytest.approx(100 * 4_000 / 232_308)
    assert rollup.tenants["big"].ett_pct == pytest.approx(100 * 22_283 / 27_000)
    gains = {(w.kind, w.component): w for w in rollup.what_if}
    # half of X's waste: 8 x 1,500 GPU-s
    assert gains["cut", "wasted_training"].ett_pct_after == pytest.approx(
        100 * 188_028 / (232_308 - 12_000))
