"""A synthetic fleet: many days of realistic training jobs, so that the rollup, the reports
and the pages can be seen and benchmarked on a fleet before a real one has reported.

Each job is a `JobSpec` for the one-job simulator (`airflow_ett/ett/synthetic.py`), whose
events attribute like a real trainer's. Nothing here is measured: every job's
`job_submitted` carries `attrs={"synthetic": true}` (the rollup counts them as
`synthetic_jobs`, `JobSummary.synthetic` says it), its id starts with `sim-<seed>-` and its
DAG id with `sim_`, so synthetic data can never pass for a measurement nor be mistaken for
a real run. Pure logic (no Airflow, SQL or torch): `airflow-ett fleet simulate` writes it.

The shapes are the measured demo runs' (README's `make demo`, `EXAMPLE_SPEC`, and
bench/RESULTS.md: time to start, compile cache, the job with two failures), scaled from a
25-minute one-host job to fleet jobs of hours on 8..256 GPUs. Each duration is drawn from
a lognormal around its median (spread `sigma`), so a day has a long tail as a fleet does:

  =====================  ==========================  ======================================
  what                   demo (measured)             fleet median (sigma)
  =====================  ==========================  ======================================
  queue                  42 s                        180 s x sqrt(GPUs / 8)  (1.0), <= 4 h
  hardware_setup         6 s                         30 s  (0.3)
  process_group_init     11 s                        15 s x (1 + log2(GPUs / 8))  (0.3)
  trainer_init           9 s (bench 2.5 s)           20 s  (0.3)
  data_pipeline_init     48 s (bench 8 s)            90 s  (0.5)
  model_creation         21 s                        45 s x model size  (0.4)
  compile, cold          96 s (bench 22 s)           480 s x model size  (0.4)
  compile, warm cache    bench 10% of cold           10% of the cold figure
  checkpoint_restore     14 s                        60 s x model size  (0.4)
  training               6000 steps of 0.25 s        per model: 0.3-12 h of 0.2-1.5 s steps
  checkpoint interval    every 1000 steps (~4 min)   ~30 min of training
  checkpoint blocking    4.5 s; bench: async 9% of  async 5 s, sync 60 s  (0.4)
                         a sync save
  checkpoint total       19 s                        120 s  (0.4)
  final checkpoint       12 s                        90 s  (0.4)
  teardown               7 s                         30 s  (0.4)
  preemption: detect,    2 s, 25 s, 180 s            5 s, 30 s, 900 s  (0.5, 0.4, 0.8)
    shutdown, reschedule
  infra: detect,         35 s, 8 s, 64 s             60 s (a quarter are hangs found by
    shutdown, reschedule                             the 30-min NCCL timeout), 60 s, 300 s
  application            (trainer raises)            2 s, 15 s, 120 s (the retry delay)
  unknown                -                           300 s, 60 s, 240 s
  =====================  ==========================  ======================================

A tenant's habits decide the rest: how many of its jobs start with parallel init, hit a
warm compile cache, save checkpoints asynchronously, or run preemptible on spare capacity.
Failures per job are Poisson: preemptions 0.15 per training hour for a preemptible job
(0.005 otherwise), infra 1 per 1,200 GPU-hours, application 0.04 per job + 0.01 per hour,
unknown 0.01 per job + 1 per 8,000 GPU-hours; at most 8.

Submissions follow a working day (60% around 13:30 local, 25% uniform, 15% in a nightly
retrain wave 21:00-24:00), so late jobs run across midnight, in the time zone given. Every
job is written whole, to its end: a store holds nothing that would go on writing the
rest, so a job cut where the fleet's last day ends stayed "running" for ever (its run
page's E2E growing with the clock, the rollup counting it as silent). Every E2E stays
under 22 hours (`MAX_E2E_S`), so the last day's jobs end by `fleet_end` at the latest,
and every day has all its jobs. Events carry progress about every 1/64 of a job's steps,
so a fleet job is about 100 events.

Deterministic: job n of a day depends only on the seed, the time zone, the day and n (a
`random.Random` seeded with the four), so the same arguments give the same events with
the same ids and the store (which dedupes on id) takes a rerun as nothing new; more jobs
per day or more days with the same seed only add jobs. Only the same seed in another time
zone reuses ids with other content (the CLI refuses to write into such a store).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from airflow_ett.ett.events import FailureCause
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec
from airflow_ett.rollup.calendar import DayWindow, check_tz, day_of, day_window

__all__ = ["MAX_DAYS", "MAX_JOBS_PER_DAY", "TENANTS", "Model", "SimulationError", "Tenant",
           "default_start", "e2e_bound", "fleet_end", "fleet_horizon", "fleet_job",
           "fleet_specs"]

#: Bounds on a simulation: a year of days, and 5x the benchmark's 20,000 jobs a day.
MAX_DAYS: Final = 366
MAX_JOBS_PER_DAY: Final = 100_000
MAX_SEED: Final = 2**63 - 1
#: Every job's E2E stays under this, so that a fleet's jobs have all ended this long after
#: its last day (`fleet_end`).
MAX_E2E_S: Final = 22 * 3600.0
#: Progress events per job (about): a fleet job is then ~100 events, 20,000 jobs ~2M.
PROGRESS_EVENTS: Final = 64
CHECKPOINT_INTERVAL_S: Final = 1800.0
#: The earliest and latest days whose events stay inside the event format's time bounds.
FIRST_DAY: Final = dt.date(2000, 1, 2)
LAST_DAY: Final = dt.date(2099, 12, 30)


T = TypeVar("T")


class SimulationError(ValueError):
    """An argument the simulation cannot take; the message names it and its value."""


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    gpus: tuple[tuple[int, int], ...]  # (world size, weight)
    train_hours: float  # median hours of training (steps x step time)
    step_s: float  # median step time
    batch: int  # global batch: cursor units per step
    size: float = 1.0  # scales model creation, compile and checkpoint restore


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    weight: int  # relative share of the fleet's jobs
    models: tuple[Model, ...]
    parallel_init: float  # share of its jobs starting with parallel init
    warm_cache: float  # share whose compile cache hits
    async_checkpoint: float  # share saving checkpoints asynchronously
    preemptible: float  # share running at low priority (they get preempted)


TENANTS: Final[tuple[Tenant, ...]] = (
    Tenant("ads-ranking", 34, (
        Model("dlrm_small", ((8, 5), (16, 3), (32, 1)), 2.0, 0.25, 4096),
        Model("dlrm_large", ((32, 3), (64, 3), (128, 1)), 6.0, 0.6, 16384, size=2.0),
        Model("dcn_v2", ((16, 2), (32, 2), (64, 1)), 4.0, 0.4, 8192, size=1.5),
    ), parallel_init=0.6, warm_cache=0.7, async_checkpoint=0.8, preemptible=0.15),
    Tenant("feed-recs", 26, (
        Model("two_tower_retrieval", ((8, 3), (16, 3), (32, 2)), 3.0, 0.3, 8192),
        Model("mtml_ranker", ((32, 2), (64, 3), (128, 2)), 8.0, 0.8, 16384, size=2.0),
    ), parallel_init=0.3, warm_cache=0.4, async_checkpoint=0.5, preemptible=0.3),
    Tenant("search", 16, (
        Model("bert_ranker", ((8, 4), (16, 3), (32, 1)), 2.5, 0.5, 2048),
        Model("query_tower", ((8, 5), (16, 2)), 1.5, 0.2, 4096),
    ), parallel_init=0.2, warm_cache=0.3, async_checkpoint=0.3, preemptible=0.2),
    Tenant("integrity", 10, (
        Model("spam_classifier", ((8, 6), (16, 2)), 1.0, 0.2, 2048, size=0.5),
    ), parallel_init=0.1, warm_cache=0.2, async_checkpoint=0.3, preemptible=0.5),
    Tenant("foundation-models", 8, (
        Model("hstu_pretrain", ((128, 3), (256, 2)), 12.0, 1.5, 65536, size=4.0),
        Model("hstu_finetune", ((64, 3), (128, 2)), 5.0, 1.0, 32768, size=3.0),
    ), parallel_init=0.8, warm_cache=0.8, async_checkpoint=0.9, preemptible=0.0),
    Tenant("ml-platform-ci", 6, (
        Model("dlrm_smoke", ((8, 1),), 0.3, 0.25, 4096, size=0.5),
    ), parallel_init=1.0, warm_cache=0.9, async_checkpoint=1.0, preemptible=0.9),
)
"""The simulated tenants, their models and habits (a platform team's own tenants and
sizes would differ; these give every report a plausible shape)."""

# cause -> (detection, shutdown, reschedule): (median s, sigma) each.
_FAILURE_TIMES: Final[dict[str, tuple[tuple[float, float], ...]]] = {
    "preemption": ((5.0, 0.5), (30.0, 0.4), (900.0, 0.8)),
    "infra": ((60.0, 0.6), (60.0, 0.4), (300.0, 0.6)),
    "application": ((2.0, 0.5), (15.0, 0.4), (120.0, 0.3)),
    "unknown": ((300.0, 0.6), (60.0, 0.4), (240.0, 0.5)),
}
_HANG_SHARE: Final = 0.25  # of infra failures: a hang, found by the NCCL timeout
_NCCL_TIMEOUT_S: Final = 1800.0


def _check_int(name: str, value: int, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SimulationError(f"{name}: {value!r} is not a whole number in [{lo}, {hi}]")
    return value


def fleet_horizon(start_day: dt.date, days: int, tz: str) -> DayWindow:
    """The fleet's last day: no job is submitted after its `hi`."""
    return day_window(start_day + dt.timedelta(days=days - 1), tz)


def fleet_end(start_day: dt.date, days: int, tz: str) -> float:
    """A bound on the fleet's latest event: its last day's end plus `MAX_E2E_S`."""
    return fleet_horizon(start_day, days, tz).hi + MAX_E2E_S


def default_start(days: int, now: float, tz: str) -> dt.date:
    """The first day of the `days`-day fleet whose last day is the latest one all of whose
    jobs have ended by `now` (`fleet_end <= now`): yesterday late in the day, else the
    day before. Nothing it writes then lies in the future."""
    last = day_of(now, tz)
    while day_window(last, tz).hi + MAX_E2E_S > now:
        last -= dt.timedelta(days=1)
    return last - dt.timedelta(days=days - 1)


def fleet_specs(days: int, jobs_per_day: int, seed: int, start_day: dt.date,
                tz: str) -> Iterator[JobSpec]:
    """The fleet's jobs, `jobs_per_day` submitted on each of `days` days from `start_day`
    (days in `tz`), day by day and by job number: `days * jobs_per_day` jobs, each whole
    (it ends by `fleet_end`). Arguments are checked here, before the first job is made:
    `SimulationError` (a ValueError) names the one that is wrong.
    """
    _check_int("days", days, 1, MAX_DAYS)
    _check_int("jobs_per_day", jobs_per_day, 1, MAX_JOBS_PER_DAY)
    _check_int("seed", seed, 0, MAX_SEED)
    if not isinstance(start_day, dt.date) or isinstance(start_day, dt.datetime):
        raise SimulationError(f"start_day: {start_day!r} is not a date")
    last = start_day + dt.timedelta(days=days - 1) if start_day <= LAST_DAY else start_day
    if start_day < FIRST_DAY or last > LAST_DAY:
        raise SimulationError(
            f"start_day: {start_day.isoformat()} with days: {days} leaves "
            f"{FIRST_DAY.isoformat()}..{LAST_DAY.isoformat()}, where event times can lie")
    try:
        check_tz(tz)
    except ValueError as exc:
        raise SimulationError(str(exc)) from None
    return _fleet(days, jobs_per_day, seed, start_day, tz)


def _fleet(days: int, jobs_per_day: int, seed: int, start_day: dt.date,
           tz: str) -> Iterator[JobSpec]:
    for i in range(days):
        yield from _day(day_window(start_day + dt.timedelta(days=i), tz), jobs_per_day, seed)


def _day(window: DayWindow, jobs_per_day: int, seed: int) -> Iterator[JobSpec]:
    """One day's jobs, by number. Each job draws from its own generator, seeded with the
    seed, the zone, the day and its number: job n is the same whatever the jobs per day,
    so a bigger fleet of the same seed only adds jobs, never changes the ones stored."""
    run_ids: set[tuple[str, str]] = set()
    for n in range(jobs_per_day):
        yield _nth(window, seed, n, run_ids)


def fleet_job(seed: int, day: dt.date, tz: str, n: int = 0) -> JobSpec:
    """Job `n` of `day` as `fleet_specs` makes it, uncut: what a store holding this
    fleet has for that id (the CLI compares it to refuse a clash with another fleet).
    Its run id may differ from the fleet's in the rare case of a clash within the day."""
    return _nth(day_window(day, check_tz(tz)), seed, n, set())


def _nth(window: DayWindow, seed: int, n: int, run_ids: set[tuple[str, str]]) -> JobSpec:
    rng = random.Random(f"airflow-ett fleet {seed} {window.tz} {window.iso} {n}")
    length = window.hi - window.lo  # 23 or 25 hours on a daylight-saving change
    submit = round(window.lo + _hour_of_day(rng) / 24.0 * length, 3)
    return _job(rng, seed, window, n, submit, run_ids)


def _hour_of_day(rng: random.Random) -> float:
    """A submission's local hour in [0, 24): a working day, background, a nightly wave."""
    kind = rng.random()
    if kind < 0.60:
        while True:
            hour = rng.gauss(13.5, 3.0)
            if 0.0 <= hour < 24.0:
                return hour
    if kind < 0.85:
        return rng.uniform(0.0, 24.0)
    return min(rng.uniform(21.0, 24.0), 23.9999)


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def _seconds(rng: random.Random, median: float, sigma: float, *, low: float = 0.1,
             high: float = 3600.0) -> float:
    """A duration around `median`, within [low, high], to the millisecond."""
    return round(min(max(_lognormal(rng, median, sigma), low), high), 3)


def _weighted(rng: random.Random, items: tuple[tuple[T, int], ...]) -> T:
    return rng.choices([item for item, _ in items], weights=[w for _, w in items])[0]


def _poisson(rng: random.Random, lam: float) -> int:
    """Knuth's method: fine for the small rates here."""
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def _job(rng: random.Random, seed: int, window: DayWindow, n: int, submit: float,
         run_ids: set[tuple[str, str]]) -> JobSpec:
    tenant = _weighted(rng, tuple((t, t.weight) for t in TENANTS))
    model = rng.choice(tenant.models)
    gpus = _weighted(rng, model.gpus)
    job = f"sim-{seed}-{window.iso}-{n:05d}"
    dag_id = f"sim_{tenant.name}_{model.name}".replace("-", "_")
    run_id = _run_id(submit, dag_id, run_ids, nightly=_local_hour(window, submit) >= 21.0)

    scale = math.sqrt(gpus / 8)
    startup = (
        ("hardware_setup", _seconds(rng, 30.0, 0.3)),
        ("process_group_init", _seconds(rng, 15.0 * (1 + math.log2(gpus / 8)), 0.3)),
        ("trainer_init", _seconds(rng, 20.0, 0.3)),
        ("data_pipeline_init", _seconds(rng, 90.0, 0.5)),
        ("model_creation", _seconds(rng, 45.0 * model.size, 0.4)),
        ("compile", _seconds(rng, 480.0 * model.size
                             * (0.1 if rng.random() < tenant.warm_cache else 1.0), 0.4)),
    )
    step_s = _seconds(rng, model.step_s, 0.15, low=0.05, high=10.0)
    train_s = _seconds(rng, model.train_hours * 3600.0, 0.7, low=0.2 * 3600, high=16 * 3600)
    blocking = _seconds(rng, 5.0 if rng.random() < tenant.async_checkpoint else 60.0, 0.4)
    total = max(blocking, _seconds(rng, 120.0, 0.4))
    preemptible = rng.random() < tenant.preemptible
    causes = _failure_causes(rng, train_s / 3600.0, gpus, preemptible)
    failures = tuple(_failure_times(rng, cause) for cause in causes)

    spec = JobSpec(
        job=job, tenant=tenant.name, model=model.name, dag_id=dag_id, run_id=run_id,
        submit_ts=submit,
        queue_s=_seconds(rng, 180.0 * scale, 1.0, low=5.0, high=4 * 3600.0),
        startup=startup,
        parallel_init=rng.random() < tenant.parallel_init,
        restore_s=_seconds(rng, 60.0 * model.size, 0.4),
        steps=1,  # set below, once the E2E bound is known
        step_s=step_s,
        batch=model.batch,
        checkpoint_blocking_s=blocking,
        checkpoint_total_s=total,
        final_checkpoint_s=_seconds(rng, 90.0, 0.4),
        teardown_s=_seconds(rng, 30.0, 0.4),
        extra={"synthetic": True, "sim_seed": seed},
        world_size=gpus,
    )
    return _with_steps(rng, spec, train_s, failures)


def _local_hour(window: DayWindow, ts: float) -> float:
    return (ts - window.lo) / (window.hi - window.lo) * 24.0


def _run_id(submit: float, dag_id: str, seen: set[tuple[str, str]], *, nightly: bool) -> str:
    """An Airflow-like run id, unique per DAG (a clash moves it by a microsecond)."""
    kind = "scheduled" if nightly else "manual"
    micros = round(submit * 1e6)
    while True:
        stamp = dt.datetime.fromtimestamp(micros / 1e6, dt.UTC).isoformat()
        run_id = f"{kind}__{stamp}"
        if (dag_id, run_id) not in seen:
            seen.add((dag_id, run_id))
            return run_id
        micros += 1


def _failure_causes(rng: random.Random, hours: float, gpus: int,
                    preemptible: bool) -> list[FailureCause]:
    gpu_hours = hours * gpus
    rates: tuple[tuple[FailureCause, float], ...] = (
        ("preemption", hours * (0.15 if preemptible else 0.005)),
        ("infra", gpu_hours / 1200.0),
        ("application", 0.04 + 0.01 * hours),
        ("unknown", 0.01 + gpu_hours / 8000.0),
    )
    causes: list[FailureCause] = [c for c, lam in rates for _ in range(_poisson(rng, lam))]
    rng.shuffle(causes)
    return causes[:8]


def _failure_times(rng: random.Random, cause: FailureCause) -> InjectedFailure:
    """A failure of `cause` with its times (its step is placed once the steps are known)."""
    (d, ds), (s, ss), (r, rs) = _FAILURE_TIMES[cause]
    detection = _seconds(rng, d, ds)
    if cause == "infra" and rng.random() < _HANG_SHARE:
        detection = _seconds(rng, _NCCL_TIMEOUT_S, 0.05)
    return InjectedFailure(at_step=1, cause=cause, detection_s=detection,
                           shutdown_s=_seconds(rng, s, ss),
                           reschedule_s=_seconds(rng, r, rs, high=6 * 3600.0))


def _with_steps(rng: random.Random, spec: JobSpec, train_s: float,
                failures: tuple[InjectedFailure, ...]) -> JobSpec:
    """`spec` with its steps, progress and checkpoint intervals, and its failures placed at
    distinct steps; the steps are cut (and, on an extreme draw, the last failures dropped)
    so that the E2E bound stays under `MAX_E2E_S`."""
    wanted = max(2, round(train_s / spec.step_s))
    progress_every = max(1, wanted // PROGRESS_EVENTS)
    checkpoint_every = progress_every * max(
        1, round(CHECKPOINT_INTERVAL_S / spec.step_s / progress_every))
    spec = dataclasses.replace(spec, progress_every=progress_every,
                               checkpoint_every=checkpoint_every)
    kept = list(failures)
    while True:
        fixed = e2e_bound(dataclasses.replace(spec, steps=1), kept) - _per_step(spec)
        steps = min(wanted, math.floor((MAX_E2E_S - fixed) / _per_step(spec)))
        if steps >= 2 or not kept:
            break
        kept.pop()
    steps = max(2, steps)
    at = sorted(rng.sample(range(1, steps), min(len(kept), steps - 1)))
    placed = tuple(dataclasses.replace(f, at_step=s) for f, s in zip(kept, at, strict=False))
    return dataclasses.replace(spec, steps=steps, failures=placed)


def _per_step(spec: JobSpec) -> float:
    """A step's time plus its share of the blocking checkpoint saves."""
    return spec.step_s + spec.checkpoint_blocking_s / spec.checkpoint_every


def e2e_bound(spec: JobSpec,
               failures: Sequence[InjectedFailure] | None = None) -> float:
    """An upper bound on the time from submission to the job's latest event: queue, every
    attempt's start and restore, the steps with their blocking saves, every failure's
    times, replay (at most a checkpoint interval) and extra save, the end, and one
    checkpoint's full time (a save's event is stamped when it completes)."""
    if failures is None:
        failures = spec.failures
    if spec.parallel_init:
        start = max(seconds for _, seconds in spec.startup)
    else:
        start = sum(seconds for _, seconds in spec.startup)
    replay_s = spec.checkpoint_every * spec.step_s
    return (spec.queue_s + (len(failures) + 1) * (start + spec.restore_s)
            + spec.steps * _per_step(spec)
            + sum(f.detection_s + f.shutdown_s + f.reschedule_s + replay_s
                  + spec.checkpoint_blocking_s for f in failures)
            + spec.checkpoint_blocking_s + spec.checkpoint_total_s
            + spec.final_checkpoint_s + spec.teardown_s)
