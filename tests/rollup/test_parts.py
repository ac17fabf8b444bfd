"""A day's parts (`airflow_ett.rollup.parts`): the fleet of any set of DAGs is the merge of
their parts, exactly as if it had been rolled up from their job-days; and the one-pass
sums equal the figures' definitions, written out here the slow way."""

from __future__ import annotations

import datetime as dt
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.events import FAILURE_CAUSES
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE, WASTED
from airflow_ett.rollup import (
    DayPart,
    DayWindow,
    FailureInDay,
    JobDay,
    Savings,
    day_parts,
    load_components,
    rollup_day,
    rollup_of_parts,
    what_ifs,
)
from airflow_ett.rollup.whatif import START_COMPONENTS

WINDOW = DayWindow(day=dt.date(2026, 11, 27), tz="UTC", lo=1_795_737_600.0,
                   hi=1_795_824_000.0)
DAGS = ("ads_a", "ads_b", "feed_a", None)
US = 1_000_000


@st.composite
def job_days(draw: st.DrawFn, i: int) -> JobDay:
    components = {c: draw(st.integers(0, 20_000 * US)) for c in COMPONENTS}
    attempts = draw(st.integers(0, 3))
    # slow steps inside the effective time; None (a row stored before them) now and then
    slow = draw(st.integers(0, components[EFFECTIVE])) if draw(st.integers(0, 9)) else None
    failures = tuple(FailureInDay(draw(st.sampled_from([*FAILURE_CAUSES, "a_future_cause"])),
                                  draw(st.none() | st.integers(0, 3_000 * US)))
                     for _ in range(draw(st.integers(0, 3))))
    return JobDay(job=f"j{i:03d}", tenant=draw(st.sampled_from(["ads", "feed"])),
                  model=draw(st.sampled_from(["dlrm", "", "dcn"])),
                  dag_id=draw(st.sampled_from(DAGS)), run_id=f"r{i}",
                  gpus=draw(st.integers(1, 64)), provisional=draw(st.booleans()),
                  synthetic=draw(st.booleans()), e2e_us=sum(components.values()),
                  components_us=components,
                  tts_us=draw(st.none() | st.integers(0, 5_000 * US)), failures=failures,
                  attempts=attempts,
                  preempted_attempts=draw(st.integers(0, attempts)), slow_steps_us=slow)


fleets = st.integers(0, 14).flatmap(
    lambda n: st.tuples(*(job_days(i) for i in range(n))).map(list))


@settings(max_examples=80, deadline=None)
@given(days=fleets, readable=st.sets(st.sampled_from(DAGS)), seed=st.integers(0, 99),
       top=st.integers(1, 4))
def test_the_parts_of_any_dags_roll_up_as_their_job_days(
        days: list[JobDay], readable: set[str | None], seed: int, top: int) -> None:
    components = load_components()
    parts = day_parts(days, cut_pct=30.0, start_s=45.0, top=top)
    chosen = [p for p in parts if p.dag_id in readable]
    random.Random(seed).shuffle(chosen)  # the order parts are merged in does not matter
    merged = rollup_of_parts(WINDOW, chosen, components, computed_at=1.0, cut_pct=30.0,
                             start_s=45.0, top=top)
    direct = rollup_day(WINDOW, [d for d in days if d.dag_id in readable], components,
                        computed_at=1.0, cut_pct=30.0, start_s=45.0, top=top)
    assert merged == direct
    # merging left every part as it was: they can be merged again, to the same
    assert rollup_of_parts(WINDOW, chosen, components, computed_at=1.0, cut_pct=30.0,
                           start_s=45.0, top=top) == merged


@settings(max_examples=60, deadline=None)
@given(days=fleets)
def test_the_one_pass_figures_equal_their_definitions(days: list[JobDay]) -> None:
    got = rollup_day(WINDOW, days, load_components(), computed_at=1.0).fleet
    e2e = sum(d.e2e_us for d in days)
    gpu = sum(d.e2e_us * d.gpus for d in days)
    assert got.jobs == len(days)
    assert got.provisional_jobs == sum(1 for d in days if d.provisional)
    assert got.e2e_s == e2e / US
    for c in COMPONENTS:
        total = sum(d.components_us[c] for d in days)
        assert got.components_s[c] == total / US
        # by GPU time: each job's seconds times its GPUs; no GPU time, no share
        gpu_total = sum(d.components_us[c] * d.gpus for d in days)
        assert got.shares_pct[c] == (100.0 * gpu_total / gpu if gpu else None)
        if c != EFFECTIVE:
            assert got.gpu_hours_lost_by_component[c] == sum(
                d.components_us[c] * d.gpus for d in days) / (3600 * US)
    assert got.gpu_hours == gpu / (3600 * US)
    assert got.ett_pct == got.shares_pct[EFFECTIVE]
    failures = [f for d in days for f in d.failures]
    assert got.nof == {**{c: sum(1 for f in failures if f.cause == c) for c in FAILURE_CAUSES},
                       "total": len(failures)}  # an unknown cause counts in the total only
    attempts = sum(d.attempts for d in days)
    with_attempts = [d for d in days if d.attempts]
    assert got.attempts == attempts
    assert got.attempts_per_job == (attempts / len(with_attempts) if with_attempts else 0.0)
    assert got.failures_per_attempt == (len(failures) / attempts if attempts else 0.0)
    ttr = sorted(f.ttr_us / US for f in failures if f.ttr_us is not None)
    assert (got.ttr_p50_s is None) == (not ttr)
    if ttr:
        assert ttr[0] <= got.ttr_p50_s <= ttr[-1]
    # slow steps: GPU time inside effective training, over the effective GPU time; not
    # known when one job-day's is not
    slow = [d.slow_steps_gpu_us for d in days]
    if None in slow:
        assert got.gpu_hours_lost_to_slow_steps is None
        assert got.slow_steps_pct_of_effective is None
    else:
        slow_gpu = sum(s for s in slow if s is not None)
        effective_gpu = sum(d.components_us[EFFECTIVE] * d.gpus for d in days)
        assert got.gpu_hours_lost_to_slow_steps == slow_gpu / (3600 * US)
        assert got.slow_steps_pct_of_effective == (100.0 * slow_gpu / effective_gpu
                                                   if effective_gpu else None)


@settings(max_examples=60, deadline=None)
@given(days=fleets, cut_pct=st.floats(0, 100), start_s=st.floats(0, 10_000))
def test_the_one_pass_what_ifs_equal_their_definitions(days: list[JobDay], cut_pct: float,
                                                      start_s: float) -> None:
    got = {(w.kind, w.component): w for w in what_ifs(days, cut_pct=cut_pct, start_s=start_s)}
    gpu = sum(d.e2e_us * d.gpus for d in days)
    # no GPU time, no ETT% to gain on
    assert len(got) == (len(COMPONENTS) - 1 + len(START_COMPONENTS) if gpu else 0)
    effective = sum(d.components_us[EFFECTIVE] * d.gpus for d in days)
    per_start = round(start_s * US)
    for (kind, c), w in got.items():
        saved = [round(d.components_us[c] * cut_pct / 100) if kind == "cut"
                 else min(d.attempts * per_start, d.components_us[c]) for d in days]
        gpu_saved = sum(s * d.gpus for s, d in zip(saved, days, strict=True))
        before = 100.0 * effective / gpu
        after = 100.0 * effective / (gpu - gpu_saved) if gpu - gpu_saved > 0 else 0.0
        assert (w.ett_pct_before, w.ett_pct_after) == (before, after)
        assert w.gain_pts == after - before >= 0
        assert w.e2e_s_saved == sum(saved) / US
        assert w.gpu_hours_saved == gpu_saved / (3600 * US)
    gains = [w.gain_pts for w in what_ifs(days, cut_pct=cut_pct, start_s=start_s)]
    assert gains == sorted(gains, reverse=True)


def _day(job: str, dag: str, lost_s: int, gpus: int = 1) -> JobDay:
    components = dict.fromkeys(COMPONENTS, 0)
    components[EFFECTIVE] = 100 * US
    components[WASTED] = lost_s * US
    return JobDay(job=job, tenant="t", model="m", dag_id=dag, run_id=job, gpus=gpus,
                  provisional=False, synthetic=False, e2e_us=sum(components.values()),
                  components_us=components, tts_us=None, failures=(), attempts=1,
                  preempted_attempts=0)


def test_the_worst_runs_of_the_merge_are_the_worst_of_all_jobs() -> None:
    days = [_day("a1", "a", 50), _day("a2", "a", 40), _day("a3", "a", 30),
            _day("b1", "b", 45), _day("b2", "b", 5, gpus=10), _day("b3", "b", 0)]
    parts = day_parts(days, cut_pct=50, start_s=60, top=2)
    assert [[w.run.job for w in p.worst] for p in parts] == [["a1", "a2"], ["b2", "b1"]]
    rollup = rollup_of_parts(WINDOW, parts, load_components(), computed_at=0, top=2)
    # b2 lost 5 s on 10 GPUs: 50 GPU-s, tied with a1 and ranked by job id
    assert [r.job for r in rollup.top_runs] == ["a1", "b2"]
    assert [p.key for p in parts] == [("a", "t", "m"), ("b", "t", "m")]
    assert parts[1].totals.jobs == 3 and parts[1].synthetic_jobs == 0


def test_a_part_survives_its_json_and_refuses_a_broken_one() -> None:
    parts = day_parts([_day("a1", "a", 50), _day("b1", "b", 5)], cut_pct=50, start_s=60)
    for part in parts:
        assert msgspec.json.decode(msgspec.json.encode(part), type=DayPart) == part
    raw = msgspec.to_builtins(parts[0])
    raw["savings"]["saved_us"] = [0, 1]
    with pytest.raises(msgspec.ValidationError, match="saved_us: 2 sums; one per what-if"):
        msgspec.convert(raw, DayPart)
    raw = msgspec.to_builtins(parts[0])
    raw["savings"]["cut_pct"] = 150
    with pytest.raises(msgspec.ValidationError, match="cut_pct: 150"):
        msgspec.convert(raw, DayPart)


def test_savings_of_other_amounts_do_not_add_up() -> None:
    with pytest.raises(ValueError, match=r"what-if amounts: cut_pct 20.0 / start_s 60.0 "
                                         r"differ from 50.0 / 60.0"):
        Savings(cut_pct=50.0, start_s=60.0).merge(Savings(cut_pct=20.0, start_s=60.0))
    parts = day_parts([_day("a1", "a", 50)], cut_pct=20, start_s=60)
    with pytest.raises(ValueError, match="what-if amounts"):
        rollup_of_parts(WINDOW, parts, load_components(), computed_at=0, cut_pct=50)
    with pytest.raises(ValueError, match="start_s: -1"):
        what_ifs([], cut_pct=50, start_s=-1)
    with pytest.raises(ValueError, match="cut_pct: nan"):
        what_ifs([], cut_pct=float("nan"), start_s=1)


def test_an_empty_day_has_no_parts_and_no_ett() -> None:
    assert day_parts([], cut_pct=50, start_s=60) == []
    rollup = rollup_of_parts(WINDOW, [], load_components(), computed_at=0)
    assert rollup.fleet.jobs == 0 and rollup.fleet.ett_pct is None and rollup.top_runs == []
    assert rollup == rollup_day(WINDOW, [], load_components(), computed_at=0)
    assert rollup.what_if == []  # no ETT% to gain on
