"""Invariants of the rollup over simulated jobs: splitting time into days never changes a
job's totals, and the groups of a day add up to its fleet."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.ett.synthetic import simulate
from airflow_ett.ett.timeline import to_us
from airflow_ett.rollup import DayWindow, job_day, load_components, rollup_day
from airflow_ett.rollup.figures import US_PER_H
from tests.ett.strategies import specs

S = 1_780_000_000.0  # the simulator's default submission time


def _windows(cuts: list[float]) -> list[DayWindow]:
    """Windows `[S - 1, cut_1), [cut_1, cut_2), ..., [cut_n, S + 10**5)`: a partition of
    time that covers every simulated job."""
    bounds = [S - 1, *sorted(set(cuts)), S + 100_000]
    return [DayWindow(day=dt.date(2026, 1, 1) + dt.timedelta(days=i), tz="UTC", lo=lo, hi=hi)
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]


@settings(max_examples=60, deadline=None)
@given(spec=specs, cuts=st.lists(st.floats(S, S + 400, allow_nan=False), max_size=6),
       gpus=st.integers(1, 16))
def test_days_of_a_partition_add_up_to_the_job(spec: object, cuts: list[float],
                                               gpus: int) -> None:
    attribution = attribute_job(simulate(spec))  # type: ignore[arg-type]
    parts = [job_day(attribution, w, gpus=gpus) for w in _windows(cuts)]
    days = [p for p in parts if p is not None]
    assert sum(d.e2e_us for d in days) == attribution.e2e_us
    for c in COMPONENTS:
        assert sum(d.components_us[c] for d in days) == attribution.components_us[c]
    assert sum(len(d.failures) for d in days) == len(attribution.failures)
    assert sorted(f.ttr_us or -1 for d in days for f in d.failures) == sorted(
        f.ttr_us or -1 for f in attribution.failures)
    assert sum(d.attempts for d in days) == len(attribution.attempts)
    counted_tts = [d.tts_us for d in days if d.tts_us is not None]
    assert counted_tts == ([attribution.tts_us] if attribution.started else [])
    assert sum(d.gpu_us for d in days) == attribution.e2e_us * gpus


tenants = st.sampled_from(["ads", "feed", "search"])
models = st.sampled_from(["dlrm", "dcn"])


@settings(max_examples=40, deadline=None)
@given(jobs=st.lists(st.tuples(specs, tenants, models, st.integers(1, 8),
                               st.floats(-300, 300, allow_nan=False)), min_size=1, max_size=6),
       cut=st.floats(S - 100, S + 300, allow_nan=False))
def test_the_groups_of_a_day_add_up_to_its_fleet(jobs: list[tuple], cut: float) -> None:
    window = DayWindow(day=dt.date(2026, 1, 1), tz="UTC", lo=cut, hi=cut + 250)
    days = []
    for i, (spec, tenant, model, gpus, shift) in enumerate(jobs):
        spec = dataclasses.replace(spec, job=f"j{i}", tenant=tenant, model=model,
                                   submit_ts=S + shift, world_size=gpus)
        attribution = attribute_job(simulate(spec))
        assert attribution.world_size == gpus
        day = job_day(attribution, window, gpus=attribution.world_size)
        if day is not None:
            days.append(day)
    rollup = rollup_day(window, days, load_components(), computed_at=cut)
    fleet = rollup.fleet
    exact_gpu_us = sum(d.gpu_us for d in days)
    for groups in (rollup.tenants, rollup.models):
        assert sum(g.jobs for g in groups.values()) == fleet.jobs
        # exact in integer GPU-microseconds; each float is that integer / US_PER_H
        assert round(sum(g.gpu_hours for g in groups.values()) * US_PER_H) == exact_gpu_us
        assert sum(g.nof["total"] for g in groups.values()) == fleet.nof["total"]
        assert sum(g.attempts for g in groups.values()) == fleet.attempts
    assert round(fleet.gpu_hours * US_PER_H) == exact_gpu_us
    lost_gpu_us = sum(d.lost_gpu_us for d in days)
    assert round(sum(t.gpu_hours_lost for t in rollup.teams) * US_PER_H) == lost_gpu_us
    assert round(fleet.gpu_hours_lost * US_PER_H) == lost_gpu_us
    if exact_gpu_us == 0:  # no GPU time: no ETT%, no share, no verdict
        assert fleet.ett_pct is None and {t.share_pct for t in rollup.teams} == {None}
    else:
        shares = [s for s in fleet.shares_pct.values() if s is not None]
        assert len(shares) == len(COMPONENTS) and abs(sum(shares) - 100.0) < 1e-9
        # every component has one owner: the teams' shares are the fleet's GPU time once
        assert abs(sum(t.share_pct or 0.0 for t in rollup.teams) - 100.0) < 1e-9
    assert to_us(fleet.e2e_s) == sum(d.e2e_us for d in days)
