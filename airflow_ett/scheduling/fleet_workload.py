"""A synthetic congested fleet for the preemption simulation (`fleet_sim`): job arrivals
whose phases, checkpoint costs, restores and tenant habits are the synthetic fleet
generator's (`rollup.simulate`, "shaped like the measured demo runs"), on fewer GPUs,
arriving as a Poisson process until each tenant has offered its share of the load.
bench/preemption.py runs every policy on these, for any tenants file (`derived_shares`);
a recorded fleet comes in through `recorded` instead. Pure and deterministic by seed.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from airflow_ett.ett.synthetic import JobSpec
from airflow_ett.rollup.simulate import TENANTS as SIMULATED_TENANTS
from airflow_ett.rollup.simulate import fleet_job
from airflow_ett.scheduling.fleet_sim import FleetSimError, JobArrival
from airflow_ett.scheduling.model import TenantPolicy


@dataclass(frozen=True, slots=True)
class TenantShare:
    """A tenant's share of the offered load (GPU-seconds asked of the fleet), and the
    synthetic fleet's tenants (`rollup.simulate.TENANTS`) whose jobs it runs."""

    tenant: str
    load_share: float
    sources: tuple[str, ...]


#: simulate.py's jobs run on 8-256 GPUs; here on 1/8 of them (at most `MAX_JOB_GPUS`, and
#: at most what the tenant may hold and the fleet has).
GPU_SCALE: Final = 8
MAX_JOB_GPUS: Final = 16
#: simulate.py's infra failure rate (1 per 1,200 GPU-hours), here per GPU of the job.
INFRA_FAILURES_PER_GPU_HOUR: Final = 1 / 1200
#: simulate.py's warm compile: 10% of its cold median of 480 s x model size.
WARM_COMPILE_S: Final = 48.0
_SYNTHETIC_DAY: Final = dt.date(2026, 1, 1)
_MAX_DRAWS: Final = 2_000_000
_SYNTHETIC: Final[tuple[str, ...]] = tuple(t.name for t in SIMULATED_TENANTS)


def derived_shares(tenants: Mapping[str, TenantPolicy]) -> tuple[TenantShare, ...]:
    """Each tenant's share of the load and the jobs it runs, from a tenants file alone, so
    that any valid file makes a fleet:

    - its share is its guarantee plus half of what it may borrow (`quota_gpus +
      borrow_limit_gpus / 2`, over the sum of those): the example file's four tenants get
      0.35, 0.26, 0.17, 0.22 of the load (ads-ranking, feed-recs, foundation-models,
      ml-platform-ci), the shares an earlier version of this bench chose by hand within
      0.03; a tenant that may hold no GPU offers none;
    - a tenant named like a synthetic tenant runs that tenant's jobs (their sizes, lengths
      and habits); the synthetic tenants no tenant is named after run in the tenants named
      otherwise, or, when every tenant is named like one, in the lowest-priority tenant
      (the example's CI tenant then also runs the search and integrity jobs: the fleet's
      batch work). Tenants named otherwise, when no synthetic tenant is left for them,
      share the whole synthetic mix.
    """
    able = [p for p in tenants.values() if p.limit_gpus > 0]
    if not able:
        raise FleetSimError("tenants: none may hold a GPU (quota_gpus + borrow_limit_gpus is "
                            "0 for every tenant): no load to offer")
    named = {p.name for p in able if p.name in _SYNTHETIC}
    left = tuple(s for s in _SYNTHETIC if s not in named)
    others = [p for p in able if p.name not in named]
    lowest = min(able, key=lambda p: p.priority).name
    total = sum(p.quota_gpus + p.borrow_limit_gpus / 2 for p in able)
    shares = []
    for p in able:
        if p.name in named:
            sources = (p.name, *(left if p.name == lowest and not others else ()))
        else:
            sources = left or _SYNTHETIC
        shares.append(TenantShare(p.name, (p.quota_gpus + p.borrow_limit_gpus / 2) / total,
                                  sources))
    return tuple(shares)


def synthetic_arrivals(tenants: Mapping[str, TenantPolicy], *, seed: int, capacity_gpus: int,
                       horizon_s: float, load: float = 1.0,
                       shares: Sequence[TenantShare] | None = None, work_scale: float = 1.0,
                       infra_failures_per_gpu_hour: float = INFRA_FAILURES_PER_GPU_HOUR,
                       ) -> list[JobArrival]:
    """A congested fleet's arrivals over `[0, horizon_s)`: each tenant's jobs until they
    offer its share of `load` x capacity x horizon GPU-seconds, arriving as a Poisson
    process (given their number, arrival times are independent and uniform). `shares`
    None: `derived_shares(tenants)`.

    The jobs are the synthetic fleet's (`rollup.simulate.fleet_job`, the distributions
    "shaped like the measured demo runs": its phases, checkpoint interval and costs,
    restore, training length and tenant habits), on 1/8 of their GPUs (1-16, at most the
    tenant's limit and the fleet), taken in its order: a job of a synthetic tenant goes to
    the tenant running it that is furthest below its share (others are skipped). Their
    training is `work_scale` times the drawn one (a fleet of longer or shorter jobs; the
    checkpoint interval stays). From each: `startup_s` its startup phases (the longest
    with parallel init, else their sum, as simulate.py bounds them); `restart_s` the same
    with a warm compile cache (compile at most `WARM_COMPILE_S` x model size) plus its
    checkpoint restore; the periodic save is its blocking time, a preempted job's exit
    save its checkpoint's total time. Infra failures: a Poisson process at
    `infra_failures_per_gpu_hour` over its training.
    """
    shares = derived_shares(tenants) if shares is None else shares
    budgets = _budgets(tenants, shares, capacity_gpus=capacity_gpus, horizon_s=horizon_s,
                       load=load, seed=seed)
    if not (math.isfinite(infra_failures_per_gpu_hour) and infra_failures_per_gpu_hour >= 0):
        raise FleetSimError(f"infra_failures_per_gpu_hour: {infra_failures_per_gpu_hour!r} "
                            "is not a rate >= 0")
    if not (math.isfinite(work_scale) and work_scale > 0):
        raise FleetSimError(f"work_scale: {work_scale!r} is not a number > 0")
    runs_in: dict[str, list[str]] = {}
    for share in shares:
        for source in share.sources:
            runs_in.setdefault(source, []).append(share.tenant)
    offered = dict.fromkeys(budgets, 0.0)
    arrivals: list[JobArrival] = []
    n = 0
    while any(offered[t] < budgets[t] for t in budgets):
        if n >= _MAX_DRAWS:
            raise FleetSimError(f"shares: {list(shares)!r} needs more than {_MAX_DRAWS} jobs")
        spec = fleet_job(seed, _SYNTHETIC_DAY, "UTC", n)
        n += 1
        open_ = [t for t in runs_in.get(spec.tenant, ()) if offered[t] < budgets[t]]
        if not open_:
            continue
        tenant = min(open_, key=lambda t: offered[t] / budgets[t])
        arrival = _arrival_of(spec, tenants[tenant], seed=seed, horizon_s=horizon_s,
                              failure_rate=infra_failures_per_gpu_hour,
                              max_gpus=min(MAX_JOB_GPUS, capacity_gpus),
                              work_scale=work_scale)
        offered[tenant] += arrival.offered_gpu_s
        arrivals.append(arrival)
    return sorted(arrivals, key=lambda a: (a.arrival, a.job))


def _budgets(tenants: Mapping[str, TenantPolicy], shares: Sequence[TenantShare], *,
             capacity_gpus: int, horizon_s: float, load: float,
             seed: int) -> dict[str, float]:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise FleetSimError(f"seed: {seed!r} is not a whole number >= 0")
    if isinstance(capacity_gpus, bool) or not isinstance(capacity_gpus, int) \
            or capacity_gpus < 1:
        raise FleetSimError(f"capacity_gpus: {capacity_gpus!r} is not a whole number >= 1")
    for name, value in (("horizon_s", horizon_s), ("load", load)):
        if not (math.isfinite(value) and value > 0):
            raise FleetSimError(f"{name}: {value!r} is not a number > 0")
    _check_shares(tenants, shares)
    total = sum(s.load_share for s in shares)
    return {s.tenant: s.load_share / total * load * capacity_gpus * horizon_s
            for s in shares}


def _check_shares(tenants: Mapping[str, TenantPolicy], shares: Sequence[TenantShare]) -> None:
    for share in shares:
        if share.tenant not in tenants:
            raise FleetSimError(f"shares: tenant {share.tenant!r} is not a tenant given "
                                f"({', '.join(sorted(tenants))})")
        if tenants[share.tenant].limit_gpus < 1:
            raise FleetSimError(f"shares: tenant {share.tenant!r} may hold no GPU (quota_gpus "
                                "+ borrow_limit_gpus is 0): it cannot offer load")
        if not (math.isfinite(share.load_share) and share.load_share > 0):
            raise FleetSimError(f"shares: tenant {share.tenant!r}'s load_share "
                                f"{share.load_share!r} is not a number > 0")
        unknown = [s for s in share.sources if s not in _SYNTHETIC]
        if unknown or not share.sources:
            raise FleetSimError(f"shares: tenant {share.tenant!r}'s sources {unknown or '()'} "
                                f"are not synthetic tenants ({', '.join(sorted(_SYNTHETIC))})")
    if not shares or len({s.tenant for s in shares}) < len(shares):
        raise FleetSimError(f"shares: {list(shares)!r} is empty, or names a tenant twice")


_MODEL_SIZES: Final[dict[str, float]] = {
    m.name: m.size for t in SIMULATED_TENANTS for m in t.models}


def _arrival_of(spec: JobSpec, policy: TenantPolicy, *, seed: int, horizon_s: float,
                failure_rate: float, max_gpus: int, work_scale: float) -> JobArrival:
    rng = random.Random(f"airflow-ett fleet_sim {seed} {spec.job}")
    gpus = min(max_gpus, policy.limit_gpus, max(1, spec.world_size // GPU_SCALE))
    work_s = spec.steps * spec.step_s * work_scale
    warm = WARM_COMPILE_S * _MODEL_SIZES[spec.model]
    restart = tuple((name, min(s, warm)) if name == "compile" else (name, s)
                    for name, s in spec.startup)
    failures: list[float] = []
    rate_per_s = gpus * failure_rate / 3600.0
    at = rng.expovariate(rate_per_s) if rate_per_s > 0 else math.inf
    while at < work_s:
        failures.append(round(at, 3))
        at += rng.expovariate(rate_per_s)
    return JobArrival(
        job=spec.job, tenant=policy.name, priority=policy.priority, gpus=gpus,
        arrival=round(rng.uniform(0.0, horizon_s), 3), work_s=work_s,
        startup_s=_startup(spec.startup, spec.parallel_init),
        checkpoint_interval_s=spec.checkpoint_every * spec.step_s,
        checkpoint_save_s=spec.checkpoint_blocking_s, exit_save_s=spec.checkpoint_total_s,
        failures_at_s=tuple(f for f in failures if 0 < f < work_s),
        restart_s=_startup(restart, spec.parallel_init) + spec.restore_s)


def _startup(phases: Sequence[tuple[str, float]], parallel: bool) -> float:
    seconds = [s for _, s in phases]
    return max(seconds) if parallel else sum(seconds)
