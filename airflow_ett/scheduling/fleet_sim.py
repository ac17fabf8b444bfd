"""A discrete-event simulation of a congested GPU fleet, to compare preemption policies
(issue 11): no preemption, the classic Kueue-like order and our stage-aware rules, the two
preempting ones through the victim function the controller uses (`victims.choose`), so
that what is measured is what would run.

In: job arrivals (`JobArrival`: from the synthetic generator, `fleet_workload`, or from a
recorded fleet's history, `recorded`), the tenants' policies and the fleet's GPUs. Out:
`SimulationResult` per policy, and `summarise` for the figures of one or more runs. Pure
logic (no Airflow, SQL or torch) and deterministic: the same input gives the same result
(events of one instant are taken in the order they were scheduled), and the generator
gives the same arrivals for the same seed.

The scheduler
-------------
Time advances by events, kept in a heap: a job arrives; a stage, a checkpoint save or a
victim's exit ends; a preempted job may run again; a day begins (the daily caps); an
attempt reaches its tenant's minimum run (the stage-aware rules may allow it now). After
the events of an instant:

1. the jobs admitted for victims start, once their GPUs are free;
2. the waiting jobs that fit start, in service order (as `victims.service_order`:
   highest priority, then the first arrival, then the job id), each while its tenant stays within
   quota + borrow limit and the free GPUs, less those reserved for jobs admitted in 1,
   hold it. A job that does not fit does not hold back a smaller one behind it
   (backfill, as Airflow's pools do);
3. a preempting policy calls `choose(FleetState(...), order=...)` and applies each
   decision with preemptions: the waiting job is admitted (its GPUs reserved; it starts
   in 1 once its victims have left) and each victim is asked to leave. A decision without
   preemptions changes nothing: the job waits. Then 1-3 again, until a round applies no
   preemption.

What `choose` is given: the waiting jobs that may run now (a preempted job may run again
`resume_after_s` after it left, as the controller's `[scheduling] resume_after_s`), each
`waiting_since` its first arrival (a victim waits again ahead of later jobs of its
priority); the running jobs as the controller reads them (`live.py`): their stage, the
time since this attempt started, the training since this attempt's last checkpoint (None
before its first), whether a checkpoint save blocks them, their preemptions today (days
are UTC days of the arrival clock), `restart_s` (a restart's startup), `exit_save_s`
and `commit_wait_s` (how long its save holds it past the blocking part), the job's own
once it has saved, in any attempt, as the controller measures them, and before that its
tenant's (`save_times.save_prior` over the saves of the tenant's jobs committed in the
last `PRIOR_WINDOW_S`: what the store would hold, not the job's own figures), and
`next_checkpoint_in_s` (when its next checkpoint commits, or it finishes, whichever comes
first: the trainer reports when its next save begins on every progress span from the
loop's start, and the controller adds the typical save, the job's or its tenant's, as
above; infra failures to come are not foreseen); and the jobs
admitted for victims, as running jobs in startup (they own their GPUs already). Victims
on their way out are left out: their GPUs are the admitted jobs'. Only the waiting jobs
of a priority above the lowest running one are given: the others cannot preempt anybody
(rule 1) and come last in service order, so the decisions with preemptions are exactly
those for the whole queue, and a long queue of low-priority work does not slow the
simulation down.

A job's attempt
---------------
startup (`startup_s`: initialization and compilation, the scheduling excluded; a later
attempt `restart_s`, cheaper with a warm compile cache, by default `RESTART_SHARE` of the
first) -> recovery (replaying the training lost since the last checkpoint, up to the
job's high-water mark) -> training (new data; finished once `work_s` of it is done). A
checkpoint is saved every `checkpoint_interval_s` of training since the last one: the
training pauses `checkpoint_save_s` (the job is `saving`), and the checkpoint is
committed at its end (an asynchronous save's background write is not modelled). Infra
failures strike at given points of the job's new-data training (`failures_at_s`, the
same points whatever the policy): the job loses its training since the last checkpoint
and restarts where it is (restart, then recovery), keeping its GPUs.

A preemption, by where the victim is when asked:

- asked to yield `at_checkpoint` (the stage-aware order, when the work its next periodic
  checkpoint saves is worth the waiting job's wait at the fleet's price, `wait_price`:
  `victims.yield_plan`): it trains on, and leaves the moment that
  checkpoint commits (or it finishes): nothing lost but the restart and the wait for the
  commit. That save blocks the loop `checkpoint_save_s` as any other, but the trainer
  leaves only once it is committed (`exit_save_s`, the whole save), holding its GPUs
  meanwhile without training (counted as `save` lost). Its GPUs are promised
  to the waiting job meanwhile (it is left out of `choose`'s state, as a victim on its
  way out). If the waiting job starts before that on GPUs that freed up otherwise, the
  yield is withdrawn, unless that save has begun (the trainer claimed the request): the
  victim goes on as if never asked (counted in
  `withdrawn_yields`, not as a preemption; so is a victim that finishes before its
  checkpoint, whose GPUs go to the waiting job as promised). An infra failure while it
  yields makes it leave then (the failure's loss is the failure's);
- asked to yield `now`, training and not saving: it stops and saves (`exit_save_s`: a
  whole save to its commit, what the trainer's graceful path waits for before it exits),
  then leaves: nothing is lost but the save and the restart. Asked to `skip_save` (its
  exit save is known not to fit the grace), it leaves at once, losing its training since
  the last checkpoint. If the save takes longer than its tenant's
  `grace_s`, the job is killed when the grace ends (the trainer gives up at the deadline):
  the grace is spent and its training since the last checkpoint lost;
- startup, recovery or mid-save (only the classic order takes those: it knows no stages):
  no checkpoint can be taken. The job is killed when its grace ends (the trainer acts on
  the request only between steps, and the train task kills it at the end of the grace),
  holding its GPUs until then: it loses its training since the last checkpoint, the save
  under way, in startup the start so far, and the grace itself;
- admitted, its own victims not yet gone (classic only: it reads as a job in startup):
  the admission is withdrawn, nothing is lost; it counts as a preemption.

Every attempt after a preemption begins with a restart.

What is counted (GPU-seconds: seconds x the job's GPUs)
-------------------------------------------------------
- lost to preemption (`LostGpuSeconds`): `unsaved` (training thrown away, first starts
  cut short, and the grace a job that could not checkpoint held its GPUs until the kill),
  `restart` (the startups of attempts after a preemption, as far as they ran) and `save`
  (exit saves, periodic saves cut short, and a victim's wait for the commit of the
  checkpoint it leaves on beyond the save's blocking part);
- lost to failures: `unsaved` and `restart` likewise (no save: a failure saves nothing);
- held GPU-seconds (from a start to the finish or the exit), new-data training
  GPU-seconds and E2E GPU-seconds (arrival to the finish, or to the end for a job not
  finished: the wait included, as the ETT model's E2E runs from submission): fleet ETT% is
  new-data training over E2E, GPU-seconds over GPU-seconds, as every fleet figure
  (DESIGN.md section 1: a 16-GPU job weighs 16 times a 1-GPU one). Replay is not counted
  lost again: it redoes the training whose loss was counted when it was thrown away;
- waits: from the first arrival to the first start (`JobOutcome.first_wait_s`), and all
  the time spent waiting (`waited_s`, after preemptions too). A job not started when the
  simulation ends counts its wait so far.

Everything is measured up to the end (`until`, or the last event when every job finished).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Final, Literal, get_args

from airflow_ett.rollup.figures import percentile
from airflow_ett.scheduling.model import (
    DEFAULT_WAIT_PRICE,
    MAX_WAIT_PRICE,
    Decision,
    FleetState,
    Preemption,
    RunningJob,
    Stage,
    TenantPolicy,
    VictimOrder,
    WaitingJob,
)
from airflow_ett.scheduling.save_times import PRIOR_WINDOW_S, SavePrior, SaveTime, save_prior
from airflow_ett.scheduling.victims import choose

#: The policies compared: no preemption, and the two victim orders of `victims.choose`.
Policy = Literal["none", "classic", "stage_aware"]
POLICIES: Final[tuple[Policy, ...]] = get_args(Policy)
_ORDERS: Final[dict[Policy, VictimOrder | None]] = {
    "none": None, "classic": "classic", "stage_aware": "stage_aware"}

#: A restart's startup, as a share of the first when a job does not say (`restart_s`):
#: the compile cache is warm (simulate.py: a warm compile is 10% of a cold one, and the
#: cold compile is most of a start), the other initialization is paid again.
RESTART_SHARE: Final = 0.6
DAY_S: Final = 86_400.0
#: Preemption rounds at one instant before the simulation gives up (a bug, not a fleet).
MAX_ROUNDS_PER_INSTANT: Final = 1000

#: How a victim left: at its next periodic checkpoint's commit (an `at_checkpoint` yield);
#: it saved a checkpoint first; it left at once without saving (its exit save was known
#: not to fit its grace: `Preemption.skip_save`); its save outlasted the grace and it was
#: killed; it could not save (startup, recovery, mid-save) and was killed when the grace
#: ended; it was only admitted (withdrawn).
Exit = Literal["at_checkpoint", "checkpointed", "left_unsaved", "cut_by_grace", "killed",
               "withdrawn"]
EXITS: Final[tuple[Exit, ...]] = get_args(Exit)


class FleetSimError(ValueError):
    """An input the simulation cannot take; the message names the field and the value."""


@dataclass(frozen=True, slots=True)
class JobArrival:
    """One job as the simulation needs it: who, how big, when it arrives (seconds on any
    clock; Unix seconds for a recorded fleet), how much new data it trains on (`work_s`,
    in training seconds) and what its attempts cost.

    `failures_at_s` are points of its new-data training (seconds into `work_s`) where an
    infra failure strikes; `restart_s` is a later attempt's startup (None:
    `RESTART_SHARE` of `startup_s`); `exit_save_s` the save a preempted job makes before
    it leaves (None: `checkpoint_save_s`).
    """

    job: str
    tenant: str
    priority: int
    gpus: int
    arrival: float
    work_s: float
    startup_s: float
    checkpoint_interval_s: float
    checkpoint_save_s: float
    failures_at_s: tuple[float, ...] = ()
    restart_s: float | None = None
    exit_save_s: float | None = None

    @property
    def restart(self) -> float:
        return self.startup_s * RESTART_SHARE if self.restart_s is None else self.restart_s

    @property
    def exit_save(self) -> float:
        return self.checkpoint_save_s if self.exit_save_s is None else self.exit_save_s

    @property
    def offered_gpu_s(self) -> float:
        """What it asks of the fleet undisturbed: its start, training and periodic saves."""
        saves = (math.ceil(self.work_s / self.checkpoint_interval_s) - 1) \
            * self.checkpoint_save_s
        return self.gpus * (self.startup_s + self.work_s + saves)


@dataclass(frozen=True, slots=True)
class LostGpuSeconds:
    """GPU-seconds lost: `unsaved` training thrown away (with starts cut short and graces
    held until a kill), `restart` the startups paid again, `save` the saves made to leave
    (or cut short)."""

    unsaved: float = 0.0
    restart: float = 0.0
    save: float = 0.0

    @property
    def total(self) -> float:
        return self.unsaved + self.restart + self.save

    def __add__(self, other: LostGpuSeconds) -> LostGpuSeconds:
        return LostGpuSeconds(self.unsaved + other.unsaved, self.restart + other.restart,
                              self.save + other.save)


@dataclass(frozen=True, slots=True)
class AppliedPreemption:
    """A preemption the simulation applied (from a `choose` decision), and what leaving
    costs the victim: `unsaved_gpu_s` training thrown away, `wasted_gpu_s` a first start
    cut short and the grace held until the kill, `save_gpu_s` its exit save or the
    periodic save it cut (its restart is paid later, as it runs)."""

    at: float
    victim: str
    victim_tenant: str
    for_job: str
    gpus: int
    stage: Stage
    saving: bool
    exit: Exit
    unsaved_gpu_s: float
    wasted_gpu_s: float
    save_gpu_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class Round:
    """One call of `choose`: the state it was given and what it decided (kept on request,
    for tests and for a person tracing a run)."""

    at: float
    state: FleetState
    decisions: tuple[Decision, ...]


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One job at the end: when it first started and finished (None: not yet), its waits,
    preemptions, and where its held seconds went (`held_s` = `new_s` + `replay_s` +
    `startup_s` + `save_s` + `killed_s`, the last the graces it held its GPUs until a
    kill, unable to checkpoint)."""

    job: str
    tenant: str
    priority: int
    gpus: int
    arrival: float
    first_start: float | None
    finished_at: float | None
    first_wait_s: float
    waited_s: float
    preemptions: int
    failures: int
    held_s: float
    new_s: float
    replay_s: float
    startup_s: float
    save_s: float
    killed_s: float
    e2e_s: float = 0.0  # arrival to the finish (to the end when not finished)


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """One policy's run: every job that arrived by the end, every preemption applied, and
    the fleet's sums (GPU-seconds; `ett_pct` is new-data training over E2E)."""

    policy: Policy
    capacity_gpus: int
    start: float
    end: float
    jobs: tuple[JobOutcome, ...]
    preemptions: tuple[AppliedPreemption, ...]
    lost_to_preemption: LostGpuSeconds
    lost_to_failures: LostGpuSeconds
    held_gpu_s: float
    new_gpu_s: float
    e2e_gpu_s: float
    peak_gpus: int
    withdrawn_yields: int = 0
    rounds: tuple[Round, ...] = ()

    @property
    def ett_pct(self) -> float:
        return 100.0 * self.new_gpu_s / self.e2e_gpu_s if self.e2e_gpu_s > 0 else 0.0

    @property
    def finished(self) -> int:
        return sum(1 for j in self.jobs if j.finished_at is not None)


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """The figures the benchmark and the CLI report, over one or more runs of a policy
    (seeds, or days): sums, pooled percentiles. Waits are first waits (arrival to first
    start) of the jobs at or above `high_priority`, in seconds."""

    policy: Policy
    runs: int
    jobs: int
    finished: int
    lost_to_preemption: LostGpuSeconds
    lost_to_failures: LostGpuSeconds
    high_priority: int
    high_jobs: int
    high_not_started: int
    high_wait_p50_s: float | None
    high_wait_p90_s: float | None
    ett_pct: float
    preemptions: int
    preemptions_per_job: float
    max_preemptions: int
    exits: dict[Exit, int]
    withdrawn_yields: int = 0


def summarise(results: Sequence[SimulationResult], *, high_priority: int) -> PolicySummary:
    """The figures of runs of one policy, pooled (sums, and percentiles over all jobs)."""
    if not results:
        raise FleetSimError("results: empty (nothing to summarise)")
    policies = {r.policy for r in results}
    if len(policies) > 1:
        raise FleetSimError(f"results: policies {sorted(policies)} mixed (one at a time)")
    jobs = [j for r in results for j in r.jobs]
    high = [j for j in jobs if j.priority >= high_priority]
    waits = [j.first_wait_s for j in high]
    e2e = sum(r.e2e_gpu_s for r in results)
    preemptions = [p for r in results for p in r.preemptions]
    return PolicySummary(
        policy=results[0].policy, runs=len(results), jobs=len(jobs),
        finished=sum(r.finished for r in results),
        lost_to_preemption=sum((r.lost_to_preemption for r in results), LostGpuSeconds()),
        lost_to_failures=sum((r.lost_to_failures for r in results), LostGpuSeconds()),
        high_priority=high_priority, high_jobs=len(high),
        high_not_started=sum(1 for j in high if j.first_start is None),
        high_wait_p50_s=percentile(waits, 50), high_wait_p90_s=percentile(waits, 90),
        ett_pct=100.0 * sum(r.new_gpu_s for r in results) / e2e if e2e > 0 else 0.0,
        preemptions=len(preemptions),
        preemptions_per_job=len(preemptions) / len(jobs) if jobs else 0.0,
        max_preemptions=max((j.preemptions for j in jobs), default=0),
        exits={e: sum(1 for p in preemptions if p.exit == e) for e in EXITS},
        withdrawn_yields=sum(r.withdrawn_yields for r in results),
    )


# -- the simulation ----------------------------------------------------------------------

def simulate(arrivals: Iterable[JobArrival], tenants: Mapping[str, TenantPolicy],
             capacity_gpus: int, policy: Policy, *, until: float | None = None,
             resume_after_s: float = 30.0, wait_price: float = DEFAULT_WAIT_PRICE,
             keep_rounds: bool = False) -> SimulationResult:
    """Run the fleet under `policy` until `until` (None: until every job finished), from
    the first arrival. `wait_price` is `FleetState.wait_price` (`MAX_WAIT_PRICE`: every
    victim yields now). `keep_rounds` keeps every `choose` call (`SimulationResult.rounds`).
    Bad input raises `FleetSimError`, naming the job, the field and the value."""
    jobs = list(arrivals)
    _check_run(tenants, capacity_gpus, policy, until, resume_after_s)
    if not 0 <= wait_price <= MAX_WAIT_PRICE:
        raise FleetSimError(f"wait_price: {wait_price!r} is not a number in [0, "
                            f"{MAX_WAIT_PRICE:g}]")
    for job in jobs:
        check_arrival(job, tenants, capacity_gpus)
    names = [j.job for j in jobs]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise FleetSimError(f"job: {', '.join(map(repr, twice))} arrives more than once")
    return _Fleet(jobs, dict(tenants), capacity_gpus, policy, until=until,
                  resume_after_s=resume_after_s, wait_price=wait_price,
                  keep_rounds=keep_rounds).run()


def _check_run(tenants: Mapping[str, TenantPolicy], capacity_gpus: int, policy: str,
               until: float | None, resume_after_s: float) -> None:
    for key, tenant in tenants.items():
        if key != tenant.name:
            raise FleetSimError(f"tenants[{key!r}].name: {tenant.name!r} differs from its key")
    if isinstance(capacity_gpus, bool) or not isinstance(capacity_gpus, int) \
            or capacity_gpus < 1:
        raise FleetSimError(f"capacity_gpus: {capacity_gpus!r} is not a whole number >= 1")
    if policy not in POLICIES:
        raise FleetSimError(f"policy: {policy!r} is not a policy (known: "
                            f"{', '.join(POLICIES)})")
    if until is not None and not math.isfinite(until):
        raise FleetSimError(f"until: {until!r} is not a time")
    if not (math.isfinite(resume_after_s) and resume_after_s >= 0):
        raise FleetSimError(f"resume_after_s: {resume_after_s!r} is not a duration >= 0")


def check_arrival(job: JobArrival, tenants: Mapping[str, TenantPolicy],
                  capacity_gpus: int) -> None:
    """Refuse a job the simulation cannot run, naming the job, the field and the value:
    an unknown tenant, a size no tenant limit or fleet can ever hold, a duration that is
    negative or not a number, a failure outside its training."""
    policy = tenants.get(job.tenant)
    if policy is None:
        raise _bad(job, "tenant", job.tenant, "is not a known tenant (known: "
                   f"{', '.join(sorted(tenants)) or 'none'})")
    if isinstance(job.gpus, bool) or not isinstance(job.gpus, int) or job.gpus < 1:
        raise _bad(job, "gpus", job.gpus, "is not a whole number >= 1")
    limit = min(capacity_gpus, policy.limit_gpus)
    if job.gpus > limit:
        raise _bad(job, "gpus", job.gpus, f"is more than it can ever hold ({limit}: the "
                   f"fleet's {capacity_gpus}, tenant {policy.name}'s limit "
                   f"{policy.limit_gpus})")
    if not math.isfinite(job.arrival):
        raise _bad(job, "arrival", job.arrival, "is not a time")
    _check_durations(job)


def _check_durations(job: JobArrival) -> None:
    for name in ("work_s", "checkpoint_interval_s"):
        value = getattr(job, name)
        if not (math.isfinite(value) and value > 0):
            raise _bad(job, name, value, "is not a duration > 0")
    for name in ("startup_s", "checkpoint_save_s", "restart_s", "exit_save_s"):
        value = getattr(job, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise _bad(job, name, value, "is not a duration >= 0")
    for at in job.failures_at_s:
        if not (math.isfinite(at) and 0 < at < job.work_s):
            raise _bad(job, "failures_at_s", at,
                       f"is not inside its training (0, {job.work_s})")


def _bad(job: JobArrival, name: str, value: object, why: str) -> FleetSimError:
    return FleetSimError(f"job {job.job!r}, field {name!r}: {value!r} {why}")


#: Event tags beside a job's segment epochs (which count up from 1).
_ARRIVAL: Final = -1
_WAKE: Final = 0
_DAY: Final = -2

Segment = Literal["startup", "train", "save", "exit", "kill"]
Cause = Literal["first", "preemption", "failure"]
Status = Literal["future", "waiting", "pending", "running", "leaving", "done"]


@dataclass(slots=True, eq=False)
class _Job:
    """One job's mutable state in a run. Positions are in training seconds of its work:
    `position` now, `saved` at its last committed checkpoint, `high_water` the furthest
    ever trained (training below it is replay)."""

    spec: JobArrival
    policy: TenantPolicy
    failures: list[float]
    status: Status = "future"
    epoch: int = 0
    position: float = 0.0
    saved: float = 0.0
    high_water: float = 0.0
    failure_index: int = 0
    cause: Cause = "first"
    stage: Stage = "startup"
    attempt_start: float = 0.0
    attempt_checkpointed: bool = False
    segment: Segment = "startup"
    segment_start: float = 0.0
    segment_pos: float = 0.0
    segment_target: float = 0.0
    exit_commits: bool = False
    saves: int = 0  # checkpoints committed (periodic, or to leave), over all attempts
    yield_for: Preemption | None = None  # asked to yield at its next checkpoint
    yielding_to: str | None = None  # a victim: the admitted job its GPUs go to
    yield_asked_at: float = 0.0
    wait_since: float = 0.0
    not_before: float = 0.0
    admitted_at: float = 0.0
    preempted_at: list[float] = field(default_factory=list)
    first_start: float | None = None
    finished_at: float | None = None
    waited_s: float = 0.0
    held_since: float = 0.0
    held_s: float = 0.0
    new_s: float = 0.0
    replay_s: float = 0.0
    startup_s: float = 0.0
    save_s: float = 0.0
    killed_s: float = 0.0
    failed: int = 0

    @property
    def name(self) -> str:
        return self.spec.job

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def next_failure(self) -> float | None:
        if self.failure_index < len(self.failures):
            return self.failures[self.failure_index]
        return None

    def position_at(self, now: float) -> float:
        if self.segment != "train":
            return self.position
        return min(self.segment_target, self.segment_pos + (now - self.segment_start))


class _Lost:
    """A running sum of lost GPU-seconds."""

    __slots__ = ("restart", "save", "unsaved")

    def __init__(self) -> None:
        self.unsaved = 0.0
        self.restart = 0.0
        self.save = 0.0

    def frozen(self) -> LostGpuSeconds:
        return LostGpuSeconds(self.unsaved, self.restart, self.save)


class _Fleet:
    """The event loop and the scheduler of one run (see the module's docstring)."""

    def __init__(self, arrivals: Sequence[JobArrival], tenants: dict[str, TenantPolicy],
                 capacity: int, policy: Policy, *, until: float | None,
                 resume_after_s: float, wait_price: float, keep_rounds: bool) -> None:
        self.tenants = tenants
        self.capacity = capacity
        self.policy = policy
        self.order = _ORDERS[policy]
        self.until = until
        self.resume_after_s = resume_after_s
        self.wait_price = wait_price
        self.withdrawn_yields = 0
        self.keep_rounds = keep_rounds
        self.jobs = {a.job: _Job(a, tenants[a.tenant], sorted(a.failures_at_s))
                     for a in sorted(arrivals, key=lambda a: (a.arrival, a.job))}
        self.start = min([a.arrival for a in arrivals] + ([] if until is None else [until]),
                         default=0.0)
        self.now = self.start
        self.heap: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.busy = 0  # GPUs held: running and leaving jobs
        self.peak = 0
        self.waiting: dict[str, _Job] = {}
        self.pending: dict[str, _Job] = {}  # admitted for victims, in decision order
        # per admitted job: GPUs its victims have released to it, and those still to come
        self.reserved: dict[str, int] = {}
        self.outstanding: dict[str, int] = {}
        self.running: dict[str, _Job] = {}  # holding GPUs and not leaving
        self.lost = _Lost()
        self.lost_failures = _Lost()
        self.applied: list[AppliedPreemption] = []
        self.rounds: list[Round] = []
        # each tenant's saves committed in the last PRIOR_WINDOW_S (commit time, figures),
        # and its prior as last computed (with the count of saves recorded then)
        self.tenant_saves: dict[str, deque[tuple[float, SaveTime]]] = {
            t: deque() for t in tenants}
        self.recorded: dict[str, int] = dict.fromkeys(tenants, 0)
        self.priors: dict[str, tuple[int, int, SavePrior | None]] = {}
        self.unfinished = len(self.jobs)
        for job in self.jobs.values():
            self._push(job.spec.arrival, job.name)
        self._push((math.floor(self.start / DAY_S) + 1) * DAY_S, "", _DAY)

    # -- events ---------------------------------------------------------------------------

    def _push(self, at: float, name: str, epoch: int = _ARRIVAL) -> None:
        """An event at `at`: the arrival (`_ARRIVAL`) or the end of a segment (`epoch`:
        the job's epoch then) of job `name`; or, `name` empty, a wake-up for the scheduler
        (`_WAKE`) or the start of a day (`_DAY`)."""
        heapq.heappush(self.heap, (at, self.seq, name, epoch))
        self.seq += 1

    def run(self) -> SimulationResult:
        while self.heap and self.unfinished and (self.until is None
                                                 or self.heap[0][0] <= self.until):
            self.now = at = self.heap[0][0]
            while self.heap and self.heap[0][0] == at:
                _, _, name, epoch = heapq.heappop(self.heap)
                self._handle(name, epoch)
            self._settle()
        return self._result(self.until if self.until is not None else self.now)

    def _handle(self, name: str, epoch: int) -> None:
        if not name:
            if epoch == _DAY:
                self._push(self.now + DAY_S, "", _DAY)
            return
        job = self.jobs[name]
        if epoch == _ARRIVAL:
            self._arrive(job)
        elif epoch == job.epoch:  # else a segment a preemption ended early: stale
            self._segment_end(job)

    def _arrive(self, job: _Job) -> None:
        job.status = "waiting"
        job.wait_since = job.not_before = self.now
        self.waiting[job.name] = job

    def _segment(self, job: _Job, kind: Segment, duration: float,
                 target: float | None = None) -> None:
        job.segment = kind
        job.segment_start = self.now
        job.segment_pos = job.position
        job.segment_target = job.position if target is None else target
        job.epoch += 1
        self._push(self.now + duration, job.name, job.epoch)

    def _close(self, job: _Job, *, natural: bool = False) -> float:
        """Account the current segment up to now (a training segment moves the job's
        position), and return how long it ran."""
        elapsed = self.now - job.segment_start
        gpu_s = elapsed * job.gpus
        if job.segment == "train":
            end = job.segment_target if natural else job.position_at(self.now)
            replay = max(0.0, min(end, job.high_water) - job.segment_pos)
            job.replay_s += replay
            job.new_s += end - job.segment_pos - replay
            job.high_water = max(job.high_water, end)
            job.position = job.segment_pos = end
        elif job.segment == "startup":
            job.startup_s += elapsed
            if job.cause == "preemption":
                self.lost.restart += gpu_s
            elif job.cause == "failure":
                self.lost_failures.restart += gpu_s
        elif job.segment == "kill":
            job.killed_s += elapsed
            self.lost.unsaved += gpu_s
        else:
            job.save_s += elapsed
            if job.segment == "exit":
                self.lost.save += gpu_s
        job.segment_start = self.now
        return elapsed

    def _segment_end(self, job: _Job) -> None:
        if job.segment == "train":
            self._close(job, natural=True)
            self._boundary(job)
        elif job.segment in ("exit", "kill"):
            self._left(job)
        else:
            elapsed = self._close(job)
            if job.segment == "save":
                job.saved = job.position
                job.attempt_checkpointed = True
                self._committed(job)
                if job.yield_for is not None:  # it waited for the commit beyond the block
                    self._yield_now(job, max(0.0, elapsed - job.spec.checkpoint_save_s))
                    return
            self._train(job)

    def _train(self, job: _Job) -> None:
        """Train until the next thing that happens: the end of the work, the next
        checkpoint, the next failure, or (in recovery) the high-water mark."""
        job.stage = "recovery" if job.position < job.high_water else "training"
        limits = [job.spec.work_s, job.saved + job.spec.checkpoint_interval_s]
        if job.stage == "recovery":
            limits.append(job.high_water)
        failure = job.next_failure
        if failure is not None:
            limits.append(failure)
        target = min(limits)
        self._segment(job, "train", target - job.position, target)

    def _boundary(self, job: _Job) -> None:
        failure = job.next_failure
        if job.position >= job.spec.work_s:
            if job.yield_for is not None:  # finished first: its GPUs go as promised
                job.yield_for = None
                self.withdrawn_yields += 1  # the yield was not needed
                self._give_gpus(job)
            self._release(job)
            job.status = "done"
            job.finished_at = self.now
            self.unfinished -= 1
        elif failure is not None and job.position >= failure:
            self._fail(job)
        elif job.position >= job.saved + job.spec.checkpoint_interval_s:
            # a victim yielding at this checkpoint leaves only once it is committed
            self._segment(job, "save", job.spec.checkpoint_save_s if job.yield_for is None
                          else max(job.spec.checkpoint_save_s, job.spec.exit_save))
        else:  # recovery reached the high-water mark: new data from here
            self._train(job)

    def _fail(self, job: _Job) -> None:
        job.failure_index += 1
        job.failed += 1
        self.lost_failures.unsaved += (job.position - job.saved) * job.gpus
        job.position = job.saved
        if job.yield_for is not None:  # asked to yield: it leaves instead of restarting
            self._yield_now(job)
            return
        self._attempt(job, "failure")

    def _attempt(self, job: _Job, cause: Cause) -> None:
        job.cause = cause
        job.stage = "startup"
        job.attempt_start = self.now
        job.attempt_checkpointed = False
        self._segment(job, "startup", job.spec.startup_s if cause == "first"
                      else job.spec.restart)
        if self.order == "stage_aware" and job.policy.min_run_s > 0:
            self._push(self.now + job.policy.min_run_s, "", _WAKE)

    def _start(self, job: _Job) -> None:
        """Give `job` its GPUs (from waiting or admitted) and begin an attempt."""
        self.waiting.pop(job.name, None)
        self.pending.pop(job.name, None)
        job.waited_s += self.now - job.wait_since
        cause: Cause = "first" if job.first_start is None else "preemption"
        if job.first_start is None:
            job.first_start = self.now
        job.status = "running"
        job.held_since = self.now
        self.busy += job.gpus
        self.peak = max(self.peak, self.busy)
        self.running[job.name] = job
        self._attempt(job, cause)

    def _release(self, job: _Job) -> None:
        self.busy -= job.gpus
        job.held_s += self.now - job.held_since
        self.running.pop(job.name, None)

    # -- the scheduler --------------------------------------------------------------------

    def _settle(self) -> None:
        for _ in range(MAX_ROUNDS_PER_INSTANT):
            self._start_admitted()
            self._admit_waiting()
            if not self._preemption_round():
                return
        raise RuntimeError(f"at {self.now}: more than {MAX_ROUNDS_PER_INSTANT} preemption "
                           "rounds in one instant")

    def _pool(self) -> int:
        """GPUs free and not released to an admitted job by its victims."""
        return self.capacity - self.busy - sum(self.reserved.values())

    def _start_admitted(self) -> None:
        """Start each admitted job whose GPUs are there: those its victims released to it,
        and the rest from the pool (sooner than its victims, when GPUs freed up)."""
        for job in list(self.pending.values()):
            if job.gpus - self.reserved.get(job.name, 0) <= self._pool():
                self.reserved.pop(job.name, None)
                self._start(job)
                self._withdraw_yields(job.name)

    def _withdraw_yields(self, started: str) -> None:
        """`started` got its GPUs: the victims still yielding at a checkpoint for it need
        not, unless `choose` has meanwhile counted their GPUs as free for another job (the
        jobs it sees would then hold more than the fleet): those yield on, to the pool."""
        held = sum(j.gpus for j in chain(self.running.values(), self.pending.values())
                   if j.yield_for is None)
        for victim in self.running.values():
            if victim.yield_for is None or victim.yield_for.for_job != started:
                continue
            if victim.segment == "save":  # its save began: the trainer claimed the request
                continue
            if held + victim.gpus > self.capacity:
                continue
            held += victim.gpus
            victim.yield_for = None
            victim.yielding_to = None
            self.outstanding[started] -= victim.gpus
            self.withdrawn_yields += 1

    def _give_gpus(self, victim: _Job) -> None:
        """A victim leaves: its GPUs go to the job it yields to, if that still waits."""
        to, victim.yielding_to = victim.yielding_to, None
        if to is None:
            return
        self.outstanding[to] = self.outstanding.get(to, 0) - victim.gpus
        if to in self.pending:
            self.reserved[to] = self.reserved.get(to, 0) + victim.gpus

    def _held(self) -> dict[str, int]:
        """GPUs per tenant as `choose` counts them: running (not leaving) and admitted."""
        held = dict.fromkeys(self.tenants, 0)
        for job in chain(self.running.values(), self.pending.values()):
            held[job.spec.tenant] += job.gpus
        return held

    def _ready(self) -> list[_Job]:
        """The waiting jobs that may run now, in service order."""
        ready = [j for j in self.waiting.values() if j.not_before <= self.now]
        ready.sort(key=lambda j: (-j.priority, j.spec.arrival, j.name))
        return ready

    def _admit_waiting(self) -> None:
        free = self._pool() - sum(
            max(0, j.gpus - self.reserved.get(j.name, 0) - self.outstanding.get(j.name, 0))
            for j in self.pending.values())
        if free <= 0 or not self.waiting:
            return
        held = self._held()
        for job in self._ready():
            if job.gpus <= free and held[job.spec.tenant] + job.gpus <= job.policy.limit_gpus:
                self._start(job)
                free -= job.gpus
                held[job.spec.tenant] += job.gpus
                if free <= 0:
                    return

    def _preemption_round(self) -> bool:
        """Ask `choose` and apply its decisions with preemptions; True if any was."""
        if self.order is None or not self.waiting:
            return False
        owners = [j for j in chain(self.running.values(), self.pending.values())
                  if j.yield_for is None]  # a yielding victim's GPUs are promised
        lowest = min((j.priority for j in owners), default=None)
        if lowest is None:
            return False
        wanting = [j for j in self._ready() if j.priority > lowest]
        if not wanting:
            return False
        state = FleetState(now=self.now, capacity_gpus=self.capacity, tenants=self.tenants,
                           waiting=tuple(self._waiting_view(j) for j in wanting),
                           running=tuple(self._running_view(j) for j in owners),
                           wait_price=self.wait_price)
        decisions = choose(state, order=self.order)
        if self.keep_rounds:
            self.rounds.append(Round(self.now, state, tuple(decisions)))
        applied = False
        for decision in decisions:
            if decision.preemptions:
                admitted = self.waiting.pop(decision.for_job)
                admitted.status = "pending"
                admitted.admitted_at = self.now
                self.pending[admitted.name] = admitted
                for preemption in decision.preemptions:
                    self._preempt(self.jobs[preemption.victim], preemption)
                applied = True
        return applied

    def _waiting_view(self, job: _Job) -> WaitingJob:
        return WaitingJob(job=job.name, tenant=job.spec.tenant, priority=job.priority,
                          gpus=job.gpus, waiting_since=job.spec.arrival)

    def _running_view(self, job: _Job) -> RunningJob:
        today = math.floor(self.now / DAY_S)
        preempted_today = sum(1 for at in job.preempted_at if math.floor(at / DAY_S) == today)
        if job.status == "pending":
            return RunningJob(
                job=job.name, tenant=job.spec.tenant, priority=job.priority, gpus=job.gpus,
                stage="startup", run_s=0.0, since_checkpoint_s=None, saving=False,
                preemptions_today=preempted_today, admitted_at=job.admitted_at,
                restart_s=job.spec.startup_s if job.first_start is None
                else job.spec.restart)
        since = job.position_at(self.now) - job.saved if job.attempt_checkpointed else None
        own = _save_time(job.spec) if job.saves >= 1 else None
        prior = None if own is not None else self._prior(job.spec.tenant)
        return RunningJob(
            job=job.name, tenant=job.spec.tenant, priority=job.priority, gpus=job.gpus,
            stage=job.stage, run_s=self.now - job.attempt_start, since_checkpoint_s=since,
            saving=job.segment == "save", preemptions_today=preempted_today,
            restart_s=job.spec.restart, admitted_at=job.attempt_start,
            next_checkpoint_in_s=self._next_checkpoint_in(
                job, own.total_s if own is not None
                else prior.typical_s if prior is not None else None),
            exit_save_s=(job.spec.exit_save if own is not None
                         else prior.exit_s if prior is not None else None),
            commit_wait_s=(own.commit_wait_s if own is not None
                           else prior.commit_wait_s if prior is not None else None))

    def _next_checkpoint_in(self, job: _Job, save_s: float | None) -> float | None:
        """When the training job's next checkpoint commits or it finishes (what a yield at
        checkpoint waits for), as the controller knows it (`live.py`): the trainer's word
        on when its next save begins, from the loop's start, plus how long a save takes to
        its commit (`save_s`: the job's own once it has saved, before that its tenant's
        typical save; None: neither known); None while it saves; failures to come are not
        foreseen."""
        if save_s is None or job.stage != "training" or job.segment != "train":
            return None
        spec = job.spec
        position = job.position_at(self.now)
        due = job.saved + spec.checkpoint_interval_s
        if due >= spec.work_s:
            return spec.work_s - position
        return due - position + save_s

    def _committed(self, job: _Job) -> None:
        """A save of `job` committed: the job knows its own saves from now on, and its
        tenant's recent saves count it (the store's `checkpoint_saves`)."""
        job.saves += 1
        self.tenant_saves[job.spec.tenant].append((self.now, _save_time(job.spec)))
        self.recorded[job.spec.tenant] += 1

    def _prior(self, tenant: str) -> SavePrior | None:
        """The tenant's saves committed in the last `PRIOR_WINDOW_S`, as the controller's
        guess for a job that has not saved yet (`save_times.save_prior`); computed again
        only when a save was recorded or left the window."""
        saves = self.tenant_saves[tenant]
        while saves and saves[0][0] < self.now - PRIOR_WINDOW_S:
            saves.popleft()
        key = (self.recorded[tenant], len(saves))
        cached = self.priors.get(tenant)
        if cached is not None and cached[:2] == key:
            return cached[2]
        prior = save_prior([t for _, t in saves])
        self.priors[tenant] = (*key, prior)
        return prior

    # -- preemptions ----------------------------------------------------------------------

    def _preempt(self, job: _Job, preemption: Preemption) -> None:
        if job.status != "pending":
            job.yielding_to = preemption.for_job
            self.outstanding[preemption.for_job] = (
                self.outstanding.get(preemption.for_job, 0) + job.gpus)
        if preemption.mode == "at_checkpoint":
            job.yield_for, job.yield_asked_at = preemption, self.now
            return
        stage, saving = job.stage, job.segment == "save"
        job.preempted_at.append(self.now)
        if job.status == "pending":
            del self.pending[job.name]
            self.reserved.pop(job.name, None)
            job.status = "waiting"
            self.waiting[job.name] = job
            costs: tuple[Exit, float, float, float] = ("withdrawn", 0.0, 0.0, 0.0)
            stage, saving = "startup", False
        elif job.segment == "train" and job.stage == "training":
            costs = (self._leave_unsaved(job) if preemption.skip_save
                     else self._ask_to_checkpoint(job))
        else:
            costs = self._throw_out(job)
        exit_, unsaved, wasted, save = costs
        self.applied.append(AppliedPreemption(
            at=self.now, victim=job.name, victim_tenant=job.spec.tenant,
            for_job=preemption.for_job, gpus=job.gpus, stage=stage, saving=saving,
            exit=exit_, unsaved_gpu_s=unsaved, wasted_gpu_s=wasted, save_gpu_s=save,
            reason=preemption.reason))

    def _yield_now(self, job: _Job, commit_wait_s: float = 0.0) -> None:
        """A victim asked to yield at its checkpoint leaves: the checkpoint just committed,
        after `commit_wait_s` held beyond its blocking part (a `save` loss), or a failure
        struck (whose loss is counted as the failure's)."""
        preemption = job.yield_for
        assert preemption is not None
        job.yield_for = None
        job.preempted_at.append(job.yield_asked_at)
        self.lost.save += commit_wait_s * job.gpus
        self.applied.append(AppliedPreemption(
            at=job.yield_asked_at, victim=job.name, victim_tenant=job.spec.tenant,
            for_job=preemption.for_job, gpus=job.gpus, stage="training", saving=False,
            exit="at_checkpoint", unsaved_gpu_s=0.0, wasted_gpu_s=0.0,
            save_gpu_s=commit_wait_s * job.gpus, reason=preemption.reason))
        self.running.pop(job.name, None)
        self._give_gpus(job)
        self._release(job)
        self._wait_again(job)

    def _leave_unsaved(self, job: _Job) -> tuple[Exit, float, float, float]:
        """Its exit save cannot fit the grace: it stops and leaves at once, losing its
        training since the last checkpoint (which the kill would throw away anyway)."""
        self._close(job)
        unsaved = self._lose(job)
        del self.running[job.name]
        self._give_gpus(job)
        self._release(job)
        self._wait_again(job)
        return "left_unsaved", unsaved, 0.0, 0.0

    def _ask_to_checkpoint(self, job: _Job) -> tuple[Exit, float, float, float]:
        """The graceful path: stop, save (within the grace, or be killed at its end)."""
        self._close(job)
        job.exit_commits = job.spec.exit_save <= job.policy.grace_s
        took = job.spec.exit_save if job.exit_commits else job.policy.grace_s
        self._leave_in(job, "exit", took)
        unsaved = 0.0 if job.exit_commits else (job.position - job.saved) * job.gpus
        return ("checkpointed" if job.exit_commits else "cut_by_grace", unsaved, 0.0,
                took * job.gpus)

    def _throw_out(self, job: _Job) -> tuple[Exit, float, float, float]:
        """No checkpoint can be taken (startup, recovery, mid-save): what it did so far is
        lost, and it holds its GPUs until the kill at the end of the grace."""
        segment, cause = job.segment, job.cause
        elapsed_gpu_s = self._close(job) * job.gpus
        wasted = save = 0.0
        if segment == "save":
            save = elapsed_gpu_s
            self.lost.save += save
        elif segment == "startup" and cause == "first":  # a restart's is counted as restart
            wasted = elapsed_gpu_s
            self.lost.unsaved += wasted
        unsaved = self._lose(job)
        self._leave_in(job, "kill", job.policy.grace_s)
        return "killed", unsaved, wasted + job.policy.grace_s * job.gpus, save

    def _leave_in(self, job: _Job, segment: Segment, seconds: float) -> None:
        del self.running[job.name]
        job.status = "leaving"
        self._segment(job, segment, seconds)

    def _lose(self, job: _Job) -> float:
        lost = (job.position - job.saved) * job.gpus
        self.lost.unsaved += lost
        job.position = job.saved
        return lost

    def _left(self, job: _Job) -> None:
        """A victim's exit ends: its save committed, or the grace ran out (the kill)."""
        segment = job.segment
        self._close(job)
        if segment == "exit":
            if job.exit_commits:
                job.saved = job.position
                self._committed(job)
            else:
                self._lose(job)
        self._give_gpus(job)
        self._release(job)
        self._wait_again(job)

    def _wait_again(self, job: _Job) -> None:
        job.status = "waiting"
        job.epoch += 1  # nothing of the attempt left to happen
        job.wait_since = self.now
        job.not_before = self.now + self.resume_after_s
        self.waiting[job.name] = job
        if self.resume_after_s > 0:
            self._push(job.not_before, "", _WAKE)

    # -- the result -----------------------------------------------------------------------

    def _result(self, end: float) -> SimulationResult:
        self.now = end
        outcomes = []
        for job in self.jobs.values():
            if job.status == "future":
                continue
            if job.status in ("running", "leaving"):
                self._close(job)
                job.held_s += end - job.held_since
            elif job.status in ("waiting", "pending"):
                job.waited_s += end - job.wait_since
            outcomes.append(_outcome(job, end))
        return SimulationResult(
            policy=self.policy, capacity_gpus=self.capacity, start=self.start, end=end,
            jobs=tuple(outcomes), preemptions=tuple(self.applied),
            lost_to_preemption=self.lost.frozen(), lost_to_failures=self.lost_failures.frozen(),
            held_gpu_s=sum(o.held_s * o.gpus for o in outcomes),
            new_gpu_s=sum(o.new_s * o.gpus for o in outcomes),
            e2e_gpu_s=sum(o.e2e_s * o.gpus for o in outcomes), peak_gpus=self.peak,
            withdrawn_yields=self.withdrawn_yields, rounds=tuple(self.rounds))


def _save_time(spec: JobArrival) -> SaveTime:
    """A save of the job as its trainer reports it: the loop blocks `checkpoint_save_s`,
    the whole save (`exit_save`) runs to the commit."""
    total = max(spec.checkpoint_save_s, spec.exit_save)
    return SaveTime(total_s=total, commit_wait_s=total - spec.checkpoint_save_s)


def _outcome(job: _Job, end: float) -> JobOutcome:
    start = job.first_start
    return JobOutcome(
        job=job.name, tenant=job.spec.tenant, priority=job.priority, gpus=job.gpus,
        arrival=job.spec.arrival, first_start=start, finished_at=job.finished_at,
        first_wait_s=(end if start is None else start) - job.spec.arrival,
        waited_s=job.waited_s, preemptions=len(job.preempted_at), failures=job.failed,
        held_s=job.held_s, new_s=job.new_s, replay_s=job.replay_s, startup_s=job.startup_s,
        save_s=job.save_s, killed_s=job.killed_s,
        e2e_s=(end if job.finished_at is None else job.finished_at) - job.spec.arrival)
