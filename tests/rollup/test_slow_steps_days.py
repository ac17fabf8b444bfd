"""Slow steps rolled up by day (decision 0035): a job's slow-step loss goes to the days it
ran in proportion to its effective training time in each, in GPU time; the days of a
partition add up to the job's loss, and the tenants and models of a day to its fleet,
exactly. By hand across midnight, then as properties over jobs whose spans vary."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import Event
from airflow_ett.ett.phases import EFFECTIVE
from airflow_ett.report.text import slow_steps_line
from airflow_ett.rollup import (
    DayWindow,
    Totals,
    day_parts,
    job_day,
    load_components,
    rollup_day,
    rollup_of_parts,
)
from airflow_ett.rollup.figures import US_PER_H
from tests.rollup.scenarios import LO, PREVIOUS, WINDOW, SlowJob, slow_job

US = 1_000_000


def test_a_jobs_slow_steps_go_to_its_days_by_effective_time() -> None:
    a = attribute_job(slow_job())
    assert a.slow_steps is not None and a.slow_steps.lost_us == 1000 * US
    assert a.effective_us == 6000 * US
    before, during = job_day(a, PREVIOUS, gpus=4), job_day(a, WINDOW, gpus=4)
    assert before is not None and during is not None
    assert (before.components_us[EFFECTIVE], during.components_us[EFFECTIVE]) == (
        2000 * US, 4000 * US)
    # the slow span ran after midnight, but the job's loss is its own figure (its ideal
    # is the whole job's): 1/3 and 2/3 of it, by effective time, to the microsecond
    assert before.slow_steps_us == 333_333_333  # floor(1e9 x 2000 / 6000)
    assert during.slow_steps_us == 666_666_667  # 1e9 - the day before's
    assert during.slow_steps_gpu_us == 4 * 666_666_667
    fleet = rollup_day(WINDOW, [during], load_components(), computed_at=LO + 86400).fleet
    assert fleet.gpu_hours_lost_to_slow_steps == pytest.approx(4 * 666.666667 / 3600)
    assert fleet.slow_steps_pct_of_effective == pytest.approx(100 * 666.666667 / 4000)
    # inside effective training: ETT% keeps its definition (1 s of shutdown after the
    # steps), and the GPU-hours lost are the lost components' alone
    assert fleet.ett_pct == pytest.approx(100 * 4000 / 4001)
    assert fleet.gpu_hours_lost == pytest.approx(4 * 1 / 3600)
    assert slow_steps_line(fleet) == ("slow steps: 0.74 GPU-h lost inside effective training "
                                      "(16.7% of it; in ETT%, not in lost)")


def test_a_day_without_the_figure_shows_a_dash() -> None:
    """A group holding a job-day whose slow steps are not known (a row stored before them)
    has none, never a partial sum: None, shown `-`."""
    a = attribute_job(slow_job())
    during = job_day(a, WINDOW, gpus=4)
    assert during is not None
    old = during.__class__(**{**{f: getattr(during, f) for f in during.__slots__},
                              "slow_steps_us": None})
    fleet = rollup_day(WINDOW, [during, old], load_components(), computed_at=1.0).fleet
    assert fleet.gpu_hours_lost_to_slow_steps is None
    assert fleet.slow_steps_pct_of_effective is None
    assert slow_steps_line(fleet).startswith("slow steps: - GPU-h lost inside effective "
                                             "training (- of it;")
    # a part stored before the figure decodes with none of its job-days known
    empty = Totals()
    assert empty.slow_steps_known and empty.figures().gpu_hours_lost_to_slow_steps == 0.0
    assert empty.figures().slow_steps_pct_of_effective is None  # no effective GPU time


S = LO - 1000.0  # around midnight


@st.composite
def slow_jobs(draw: st.DrawFn, i: int) -> list[Event]:
    """A job of one or two attempts whose spans take 5-60 s for 10 steps each (so some are
    slower than its ideal), submitted around midnight, on 1-16 GPUs; the second attempt
    restores a span back (replay, not measured)."""
    job = SlowJob(f"j{i}", S + draw(st.integers(-600, 600)),
               tenant=draw(st.sampled_from(["ads", "feed", "search"])),
               model=draw(st.sampled_from(["dlrm", "dcn"])), gpus=draw(st.integers(1, 16)))
    spans = st.lists(st.integers(5, 60).map(float), min_size=1, max_size=8)
    job.attempt("1", wait=float(draw(st.integers(0, 300))))
    for seconds in draw(spans):
        job.span(seconds)
    if draw(st.booleans()):
        job.end_attempt("failed", "infra")
        job.attempt("2", wait=float(draw(st.integers(1, 300))), step=max(0, job.step - 10))
        for seconds in draw(spans):
            job.span(seconds)
    job.end_attempt()
    return job.end()


def _windows(cuts: list[float]) -> list[DayWindow]:
    """A partition of time, `[S - 10**4, cut_1), ..., [cut_n, S + 10**5)`, covering every job."""
    bounds = [S - 10_000, *sorted(set(cuts)), S + 100_000]
    return [DayWindow(day=dt.date(2026, 1, 1) + dt.timedelta(days=k), tz="UTC", lo=lo, hi=hi)
            for k, (lo, hi) in enumerate(itertools.pairwise(bounds))]


@settings(max_examples=80, deadline=None)
@given(events=slow_jobs(0), cuts=st.lists(st.floats(S - 900, S + 1500, allow_nan=False),
                                          max_size=6))
def test_the_days_of_a_partition_add_up_to_the_jobs_slow_steps(events: list[Event],
                                                                cuts: list[float]) -> None:
    a = attribute_job(events)
    days = [d for d in (job_day(a, w, gpus=a.world_size) for w in _windows(cuts))
            if d is not None]
    lost = 0 if a.slow_steps is None else a.slow_steps.lost_us
    assert sum(d.slow_steps_us or 0 for d in days) == lost
    assert all(d.slow_steps_us is not None for d in days)
    for d in days:  # never more than the day's effective time, never negative
        assert 0 <= (d.slow_steps_us or 0) <= d.components_us[EFFECTIVE]
        assert d.slow_steps_gpu_us == (d.slow_steps_us or 0) * a.world_size
    # the days' effective time is the job's, and each day's share of the loss follows it
    total = a.effective_us
    for d in days:
        exact = lost * d.components_us[EFFECTIVE] / total if total else 0.0
        assert abs((d.slow_steps_us or 0) - exact) < 1.0


@settings(max_examples=50, deadline=None)
@given(fleet=st.integers(1, 6).flatmap(
    lambda n: st.tuples(*(slow_jobs(i) for i in range(n))).map(list)),
    cut=st.floats(S - 900, S + 900, allow_nan=False))
def test_the_tenants_and_models_slow_steps_add_up_to_the_fleets(
        fleet: list[list[Event]], cut: float) -> None:
    window = DayWindow(day=dt.date(2026, 1, 1), tz="UTC", lo=cut, hi=cut + 86400)
    days = []
    for events in fleet:
        a = attribute_job(events)
        d = job_day(a, window, gpus=a.world_size)
        if d is not None:
            days.append(d)
    rollup = rollup_day(window, days, load_components(), computed_at=cut)
    exact = sum(d.slow_steps_gpu_us or 0 for d in days)
    effective_gpu = sum(d.components_us[EFFECTIVE] * d.gpus for d in days)
    fleet_figures = rollup.fleet
    assert fleet_figures.gpu_hours_lost_to_slow_steps is not None
    assert round(fleet_figures.gpu_hours_lost_to_slow_steps * US_PER_H) == exact
    assert fleet_figures.slow_steps_pct_of_effective == (
        100.0 * exact / effective_gpu if effective_gpu else None)
    for groups in (rollup.tenants, rollup.models):
        # exact in integer GPU-microseconds; each float is that integer / US_PER_H
        hours = [g.gpu_hours_lost_to_slow_steps for g in groups.values()]
        assert None not in hours
        assert round(sum(h for h in hours if h is not None) * US_PER_H) == exact
    # the parts (per DAG, tenant and model) hold the exact integers, and add up to it too
    parts = day_parts(days, cut_pct=50.0, start_s=60.0)
    assert sum(p.totals.slow_steps_gpu_us for p in parts) == exact
    merged = rollup_of_parts(window, parts, load_components(), computed_at=cut)
    assert merged.fleet == fleet_figures
