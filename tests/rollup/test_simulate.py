"""The synthetic fleet (`airflow_ett/rollup/simulate.py`): deterministic by seed, marked
synthetic, every tenant and failure cause present, jobs across midnight, every job of
every day written to its end (none left running for ever), and every job's events
attributing cleanly."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import statistics
from functools import cache

import pytest

from airflow_ett.ett.attribution import JobAttribution, attribute_job
from airflow_ett.ett.events import Event, JobEnded, JobSubmitted
from airflow_ett.ett.synthetic import JobSpec, iter_simulate
from airflow_ett.rollup import day_of, day_window
from airflow_ett.rollup.simulate import (
    MAX_DAYS,
    MAX_E2E_S,
    MAX_JOBS_PER_DAY,
    TENANTS,
    Model,
    SimulationError,
    Tenant,
    default_start,
    e2e_bound,
    fleet_end,
    fleet_horizon,
    fleet_job,
    fleet_specs,
)

START = dt.date(2026, 11, 25)
TZ = "America/Los_Angeles"
DAYS, JOBS, SEED = 3, 400, 11


@cache
def sample() -> tuple[tuple[JobSpec, tuple[Event, ...], JobAttribution], ...]:
    """A 3-day fleet of 400 jobs a day, each job with its events and attribution (at the
    end of the last day, as a rollup run right after it would see them)."""
    horizon = fleet_horizon(START, DAYS, TZ).hi
    out = []
    for spec in fleet_specs(DAYS, JOBS, SEED, START, TZ):
        events = tuple(iter_simulate(spec))
        out.append((spec, events, attribute_job(events, now=horizon)))
    return tuple(out)


def test_same_seed_same_fleet_other_seed_another() -> None:
    first = list(fleet_specs(2, 30, 5, START, "UTC"))
    assert first == list(fleet_specs(2, 30, 5, START, "UTC"))
    other = list(fleet_specs(2, 30, 6, START, "UTC"))
    # Not only the ids: what the jobs are differs.
    strip = [dataclasses.replace(s, job="", run_id="", extra={}) for s in first]
    assert strip != [dataclasses.replace(s, job="", run_id="", extra={}) for s in other]
    assert {s.submit_ts for s in first}.isdisjoint({s.submit_ts for s in other})


def test_a_job_does_not_depend_on_the_jobs_per_day_or_days() -> None:
    """Job n of a day is the same in a bigger fleet: growing a fleet only adds jobs."""
    small = [s for s in fleet_specs(2, 10, 5, START, "UTC")
             if s.job.startswith(f"sim-5-{START}")]
    big = list(fleet_specs(3, 50, 5, START, "UTC"))
    assert small == big[:10]
    assert fleet_job(5, START, "UTC", 3) == big[3]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"days": 0}, "days: 0 is not a whole number in [1, 366]"),
    ({"days": MAX_DAYS + 1}, f"days: {MAX_DAYS + 1} is not"),
    ({"days": True}, "days: True is not"),
    ({"jobs_per_day": 0}, "jobs_per_day: 0 is not a whole number in [1, 100000]"),
    ({"jobs_per_day": MAX_JOBS_PER_DAY + 1}, f"jobs_per_day: {MAX_JOBS_PER_DAY + 1} is not"),
    ({"jobs_per_day": 2.5}, "jobs_per_day: 2.5 is not"),
    ({"seed": -1}, "seed: -1 is not"),
    ({"start_day": dt.date(1999, 12, 31)}, "start_day: 1999-12-31 with days: 1 leaves"),
    ({"start_day": dt.date(2099, 12, 30), "days": 2}, "start_day: 2099-12-30 with days: 2"),
    ({"start_day": "2026-11-28"}, "start_day: '2026-11-28' is not a date"),
    ({"tz": "Mars/Olympus"}, "timezone: unknown time zone 'Mars/Olympus'"),
])
def test_bad_arguments_are_named_before_any_job(kwargs: dict[str, object],
                                                message: str) -> None:
    args: dict[str, object] = {"days": 1, "jobs_per_day": 1, "seed": 0, "start_day": START,
                               "tz": "UTC", **kwargs}
    with pytest.raises(SimulationError) as info:
        fleet_specs(**args)  # type: ignore[arg-type]  # not iterated: checked eagerly
    assert message in str(info.value)


def test_every_job_is_marked_synthetic() -> None:
    jobs = [s.job for s, _, _ in sample()]
    assert len(set(jobs)) == len(jobs)
    for spec, events, attribution in sample():
        assert spec.job.startswith(f"sim-{SEED}-")
        assert spec.dag_id is not None and spec.dag_id.startswith("sim_")
        submitted = events[0]
        assert isinstance(submitted, JobSubmitted)
        assert submitted.attrs["synthetic"] is True
        assert attribution.synthetic is True
        assert len({e.id for e in events}) == len(events)


def test_the_fleet_has_every_tenant_cause_and_size() -> None:
    specs = [s for s, _, _ in sample()]
    tenants = collections.Counter(s.tenant for s in specs)
    assert set(tenants) == {t.name for t in TENANTS}
    # Different sizes: the biggest tenant has several times the smallest's jobs.
    assert max(tenants.values()) > 3 * min(tenants.values())
    causes = collections.Counter(f.cause for s in specs for f in s.failures)
    assert set(causes) == {"preemption", "infra", "application", "unknown"}
    assert {s.world_size for s in specs} >= {8, 256}
    assert all(8 <= s.world_size <= 256 for s in specs)
    models = {(s.tenant, s.model) for s in specs}
    assert len(models) == sum(len(t.models) for t in TENANTS)
    # A preempted job resumes: its attribution counts the preemption and a recovery.
    preempted = [a for s, _, a in sample() if any(f.cause == "preemption" for f in s.failures)]
    assert preempted
    for a in preempted:
        assert any(f.cause == "preemption" for f in a.failures)
        assert a.attempts[-1].status == "success"


def test_jobs_are_hours_long_and_about_a_hundred_events() -> None:
    e2e_h = [a.e2e_us / 3.6e9 for _, _, a in sample()]
    assert 1.0 < statistics.median(e2e_h) < 8.0
    assert max(e2e_h) * 3600 < MAX_E2E_S
    per_job = statistics.mean(len(ev) for _, ev, _ in sample())
    assert 70 <= per_job <= 130  # what makes 20,000 jobs about 2M events


def test_the_e2e_bound_holds_and_stays_under_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes `fleet_end` a bound: every job ends within its bound, and the bound is
    under `MAX_E2E_S`, even for a tenant of 16-hour jobs on 256 preemptible GPUs
    whose failures push it over (its steps are cut, then failures dropped)."""
    from airflow_ett.rollup import simulate

    assert MAX_E2E_S < 23 * 3600  # the shortest local day: earlier days end before the last's
    for spec, events, _ in sample():
        assert max(e.ts for e in events) <= spec.submit_ts + e2e_bound(spec)
        assert e2e_bound(spec) <= MAX_E2E_S
    huge = Tenant("huge", 1, (Model("m", ((256, 1),), 400.0, 1.0, 1, size=4.0),),
                  parallel_init=0.0, warm_cache=0.0, async_checkpoint=0.0, preemptible=1.0)
    monkeypatch.setattr(simulate, "TENANTS", (huge,))
    specs = list(fleet_specs(2, 60, 3, START, "UTC"))
    cut = 0
    for spec in specs:
        assert e2e_bound(spec) <= MAX_E2E_S
        last = max(e.ts for e in iter_simulate(spec))
        assert last <= spec.submit_ts + e2e_bound(spec)
        cut += spec.steps * spec.step_s < 15.9 * 3600  # 400 h drawn, 16 h kept unless cut
    assert cut > 0
    # Failures that alone outlast the cap (6 h to reschedule each): the last are dropped.
    slow = {cause: (d, s, (1e6, 0.01)) for cause, (d, s, _) in simulate._FAILURE_TIMES.items()}
    monkeypatch.setattr(simulate, "_FAILURE_TIMES", slow)
    specs = list(fleet_specs(1, 40, 3, START, "UTC"))
    assert max(len(s.failures) for s in specs) == 3  # a 4th would need 24 h
    for spec in specs:
        assert e2e_bound(spec) <= MAX_E2E_S


def test_some_jobs_span_midnight_in_the_zone() -> None:
    spanning = [s for s, ev, _ in sample()
                if day_of(ev[0].ts, TZ) != day_of(max(e.ts for e in ev), TZ)]
    assert len(spanning) > JOBS * DAYS // 20
    # Submissions lie in their (local) day, the nightly wave included.
    for spec, _, _ in sample():
        day = dt.date.fromisoformat(spec.job.split("-", 2)[2][:10])
        window = day_window(day, TZ)
        assert window.lo <= spec.submit_ts < window.hi


def test_every_job_of_every_day_ends_by_the_fleets_end() -> None:
    """No job is left running: each one's events end with the job's end, so a store of the
    fleet has no job whose E2E grows with the clock; the last day's jobs, running past
    its end as late jobs do, end by `fleet_end`; every day has all its jobs."""
    last = fleet_horizon(START, DAYS, TZ)
    past_the_last_day = 0
    for spec, events, attribution in sample():
        assert spec.running_until_step is None
        assert isinstance(events[-1], JobEnded), spec.job
        assert not attribution.provisional, spec.job
        assert max(e.ts for e in events) <= fleet_end(START, DAYS, TZ)
        past_the_last_day += max(e.ts for e in events) > last.hi
    assert past_the_last_day > JOBS // 20  # the last day's late jobs run on into the next
    assert len(sample()) == JOBS * DAYS
    for i in range(DAYS):
        day = (START + dt.timedelta(days=i)).isoformat()
        assert sum(s.job.startswith(f"sim-{SEED}-{day}") for s, _, _ in sample()) == JOBS


@pytest.mark.parametrize("tz", ["UTC", "America/Los_Angeles", "Asia/Kolkata"])
def test_the_default_fleet_has_ended_by_now(tz: str) -> None:
    """The default last day is the latest whose jobs have all ended by now: nothing the
    fleet writes lies in the future, and a later day would."""
    for hour in range(0, 24, 5):
        now = day_window(dt.date(2026, 11, 28), tz).lo + hour * 3600 + 1234.5
        start = default_start(3, now, tz)
        assert fleet_end(start, 3, tz) <= now
        assert fleet_end(start + dt.timedelta(days=1), 3, tz) > now
        assert fleet_horizon(start, 3, tz).day < day_of(now, tz)


def test_every_job_attributes_without_warnings() -> None:
    for spec, _, attribution in sample():
        assert attribution.warnings == (), (spec.job, attribution.warnings)
        assert attribution.world_size == spec.world_size
        if spec.running_until_step is None:
            assert len(attribution.failures) == len(spec.failures)
            assert attribution.attempts[-1].status == "success"


def test_a_daylight_saving_day_spreads_over_its_25_hours() -> None:
    day = dt.date(2026, 10, 25)  # Europe/Berlin leaves summer time: 25 hours
    window = day_window(day, "Europe/Berlin")
    assert window.hours == 25
    specs = list(fleet_specs(2, 300, 1, day, "Europe/Berlin"))
    first = [s for s in specs if s.job.startswith(f"sim-1-{day}")]
    assert all(window.lo <= s.submit_ts < window.hi for s in first)
    assert max(s.submit_ts for s in first) > window.lo + 24 * 3600
