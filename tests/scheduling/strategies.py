"""Hypothesis strategies for the scheduling decisions: tenants with random policies and
fleet states (running and waiting jobs in random stages, with random times and GPUs), for
the victim choice's properties (tests/scheduling/test_victims.py) and the fleet simulation.

Values are drawn from small sets on purpose: priorities, times and GPU counts collide
often, so ties in every ordering key happen, and the rules' bounds (a run exactly at the
minimum, a tenant exactly at its quota, a job exactly at the daily cap) are hit.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from airflow_ett.scheduling.model import (
    STAGES,
    FleetState,
    RunningJob,
    TenantPolicy,
    WaitingJob,
)

NOW = 100_000.0
TENANT_NAMES = ("ads", "batch", "research", "search", "video")

priorities = st.integers(0, 4)
#: Waiting jobs lean higher than running ones, so that many have someone to preempt.
waiting_priorities = st.sampled_from([4, 5, 6, 0, 1, 2, 3])
job_gpus = st.sampled_from([1, 2, 4, 8, 3])
#: Mostly the preemptible case (a training job, not saving, not yet preempted today) so
#: that many states have victims; every other value stays frequent enough to matter.
stages = st.sampled_from((*STAGES, "training", "training", "training", "training"))
mostly_false = st.sampled_from([False, False, False, True])
mostly_true = mostly_false.map(lambda b: not b)
counts = st.sampled_from([0, 0, 0, 1, 2, 3])
#: Durations in seconds, with the tenants' minimum runs among them (bounds are hit).
durations = st.sampled_from([0.0, 30.0, 40.0, 120.0, 300.0, 600.0, 900.0, 3600.0, 7200.0])


def tenant_policies(name: str) -> st.SearchStrategy[TenantPolicy]:
    return st.builds(
        TenantPolicy,
        name=st.just(name),
        priority=priorities,
        quota_gpus=st.integers(0, 10),
        borrow_limit_gpus=st.sampled_from([0, 2, 4, 8, 64, 64, 64, 64]),
        preemptible=mostly_true,
        min_run_s=st.sampled_from([0.0, 300.0, 600.0, 900.0]),
        grace_s=st.sampled_from([30.0, 120.0]),
        max_preemptions_per_day=st.sampled_from([2, 0, 1, 2, 3]),
    )


@st.composite
def tenant_maps(draw: st.DrawFn, *, max_tenants: int = 4) -> dict[str, TenantPolicy]:
    """One to `max_tenants` (at most 5) tenants, keyed by name."""
    names = draw(st.lists(st.sampled_from(TENANT_NAMES), min_size=1,
                          max_size=max_tenants, unique=True))
    return {name: draw(tenant_policies(name)) for name in names}


@st.composite
def running_jobs(draw: st.DrawFn, job: str, tenants: list[str]) -> RunningJob:
    """A running job: `since_checkpoint_s` is at most its run time (None: no checkpoint
    yet), admitted when its attempt started."""
    run_s = draw(st.one_of(durations, st.sampled_from([3600.0, 7200.0, 36_000.0])))
    checkpoint = draw(st.one_of(st.none(), durations.filter(lambda s: s <= run_s)))
    return RunningJob(
        job=job,
        tenant=draw(st.sampled_from(tenants)),
        priority=draw(priorities),
        gpus=draw(job_gpus),
        stage=draw(stages),
        run_s=run_s,
        since_checkpoint_s=checkpoint,
        saving=draw(mostly_false),
        preemptions_today=draw(counts),
        restart_s=draw(st.sampled_from([20.0, 60.0, 300.0])),
        admitted_at=NOW - run_s,
        next_checkpoint_in_s=draw(st.one_of(st.none(), durations)),
        exit_save_s=draw(st.one_of(st.none(), st.sampled_from([5.0, 60.0, 200.0]))),
        commit_wait_s=draw(st.one_of(st.none(), st.sampled_from([0.0, 4.0, 40.0, 150.0]))),
    )


@st.composite
def waiting_jobs(draw: st.DrawFn, job: str, tenants: list[str]) -> WaitingJob:
    return WaitingJob(
        job=job,
        tenant=draw(st.sampled_from(tenants)),
        priority=draw(waiting_priorities),
        gpus=draw(st.integers(1, 10)),
        waiting_since=NOW - draw(durations),
    )


@st.composite
def fleet_states(draw: st.DrawFn, *, max_tenants: int = 4, max_running: int = 10,
                 max_waiting: int = 5, max_idle_gpus: int = 8,
                 contested: bool = False) -> FleetState:
    """A fleet: capacity is what the running jobs hold plus up to `max_idle_gpus` free.
    Mostly every tenant holds at most its limit; sometimes one holds more (a policy
    tightened while its jobs ran). `contested`: most running jobs are would-be victims
    (training, not saving, long running, not preempted today, of preemptible tenants), so
    that decisions often need several victims, from one tenant or more."""
    tenants = draw(tenant_maps(max_tenants=max_tenants))
    if contested:
        tenants = {name: replace(policy, preemptible=True, max_preemptions_per_day=2)
                   if draw(mostly_true) else policy for name, policy in tenants.items()}
    names = sorted(tenants)
    n_running = draw(st.integers(0, max_running))
    n_waiting = draw(st.integers(0, max_waiting))
    running = tuple(draw(running_jobs(f"r{i}", names)) for i in range(n_running))
    if contested:
        running = tuple(replace(r, stage="training", saving=False, preemptions_today=0,
                                run_s=36_000.0, admitted_at=NOW - 36_000.0)
                        if draw(mostly_true) else r for r in running)
    waiting = tuple(draw(waiting_jobs(f"w{i}", names)) for i in range(n_waiting))
    if draw(mostly_true):  # as the pools keep it: no tenant holds more than its limit
        tenants = {name: _within_limit(policy, running) for name, policy in tenants.items()}
    held = sum(r.gpus for r in running)
    return FleetState(now=NOW, capacity_gpus=held + draw(st.integers(0, max_idle_gpus)),
                      tenants=tenants, waiting=waiting, running=running,
                      wait_price=draw(st.sampled_from([0.0, 0.5, 1.0, 4.0, 1e6])))


def _within_limit(policy: TenantPolicy, running: tuple[RunningJob, ...]) -> TenantPolicy:
    held = sum(r.gpus for r in running if r.tenant == policy.name)
    return replace(policy, borrow_limit_gpus=max(policy.borrow_limit_gpus,
                                                 held - policy.quota_gpus))
