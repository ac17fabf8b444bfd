"""The scheduling plugin's vocabulary: a tenant's policy, and the fleet state a preemption
decision is a pure function of (`victims.choose`).

Everything here is plain data, built by the glue (the tenants file loader, the
controller reading Airflow and the ETT store, the fleet simulation) and read by the
decisions. Times are Unix seconds or durations in seconds; GPUs are whole slots (one pool
slot per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

#: Where a running job is in its attempt, as far as preemption cares:
#: - `startup`: the attempt began and has not yet trained on new data (scheduling,
#:   initialization, compilation): preempting it throws away the whole start;
#: - `recovery`: restored from a checkpoint, replaying up to its high-water mark;
#: - `training`: consuming new data (the only stage a victim may be taken from);
#: - `publishing` / `shutdown`: finishing; preempting gains little and loses the end.
Stage = Literal["startup", "recovery", "training", "publishing", "shutdown"]
STAGES: Final[tuple[Stage, ...]] = ("startup", "recovery", "training", "publishing",
                                   "shutdown")

#: Victim orders: ours (stage-aware: least unsaved work, cheapest restart) and the
#: classic Kueue-like order (borrowing first, lowest priority, most recently admitted),
#: which the fleet simulation compares it with.
VictimOrder = Literal["stage_aware", "classic"]

#: How a victim yields: `now` (stop after the current step, save, leave: the tenant's
#: grace bounds it) or `at_checkpoint` (keep training until its next periodic checkpoint
#: is committed, then leave without saving again: nothing unsaved, no exit save, at the
#: price of the waiting job's wait until then).
YieldMode = Literal["now", "at_checkpoint"]
YIELD_MODES: Final[tuple[YieldMode, ...]] = ("now", "at_checkpoint")


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """One tenant's knobs (the tenants file; docs/decisions/0013-tenants-file.md).

    `quota_gpus` is the guarantee (Kueue's nominal quota, Volcano's guarantee): GPUs the
    tenant gets whenever it asks, and below which it is never preempted.
    `borrow_limit_gpus` is how far above it the tenant may run on idle GPUs (Kueue's
    borrowingLimit); those borrowed GPUs are what preemption takes back first.
    `min_run_s` is Slurm's PreemptExemptTime (no preemption in an attempt's first
    `min_run_s`), `grace_s` Slurm's GraceTime (SIGTERM, the trainer checkpoints and
    leaves, SIGKILL at the end of it), `max_preemptions_per_day` a cap per job per day.
    `max_tts_s` bounds a job's time to start: a job still without its first effective
    step that long after it was queued is flagged while it waits (`plugin/tts_watch.py`).
    """

    name: str
    priority: int
    quota_gpus: int
    borrow_limit_gpus: int = 0
    preemptible: bool = True
    min_run_s: float = 600.0
    grace_s: float = 120.0
    max_preemptions_per_day: int = 2
    max_tts_s: float | None = None

    @property
    def pool(self) -> str:
        """The Airflow pool that implements the quota (`airflow-ett tenants sync`)."""
        return pool_name(self.name)

    @property
    def limit_gpus(self) -> int:
        """The most GPUs the tenant may hold at once: its quota plus what it may borrow."""
        return self.quota_gpus + self.borrow_limit_gpus


POOL_PREFIX: Final = "ett_tenant_"


def pool_name(tenant: str) -> str:
    return f"{POOL_PREFIX}{tenant}"


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """A job that wants GPUs now (its train task is queued or scheduled)."""

    job: str
    tenant: str
    priority: int
    gpus: int
    waiting_since: float


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds GPUs now.

    `since_checkpoint_s` is the training time since its last committed checkpoint (None:
    none committed in this attempt, so all of its training is unsaved); `saving` is a
    checkpoint save in progress; `run_s` the time since this attempt started;
    `restart_s` what a restart is expected to cost before it trains again (scheduling,
    initialization, compilation: less with a warm compile cache); `admitted_at` when
    this attempt got its GPUs (the classic order takes the most recent first).
    `next_checkpoint_in_s` is when its next periodic checkpoint is expected to be
    committed, from now (None: not known, e.g. neither the job nor its tenant saved
    lately, or neither the trainer's word nor two saves of one attempt tell when; then it
    can only yield `now`);
    `exit_save_s` how long a whole save to leave is expected to take (its saves' measured
    total; None: not known). `commit_wait_s` how long its next checkpoint holds its GPUs
    past the loop's blocking part, until the commit: a victim leaving at that checkpoint
    waits for it without training (None: not known, counted as nothing). Before a job's
    first save, all three come from its tenant's recent saves (`live.py`).
    """

    job: str
    tenant: str
    priority: int
    gpus: int
    stage: Stage
    run_s: float
    since_checkpoint_s: float | None
    saving: bool
    preemptions_today: int
    restart_s: float
    admitted_at: float
    next_checkpoint_in_s: float | None = None
    exit_save_s: float | None = None
    commit_wait_s: float | None = None

    @property
    def unsaved_s(self) -> float:
        """Training time a preemption now would lose if the final checkpoint failed."""
        if self.since_checkpoint_s is None:
            return self.run_s
        return self.since_checkpoint_s

    @property
    def unsaved_gpu_s(self) -> float:
        return self.unsaved_s * self.gpus


#: The default price of a waiting job's wait for a victim's checkpoint (the tenants file's
#: `[scheduling] checkpoint_wait_price`; `FleetState.wait_price`), chosen with
#: bench/preemption.py on three fleets (docs/decisions/0015-preemption.md).
DEFAULT_WAIT_PRICE: Final = 0.25
#: The highest price the tenants file takes: far above any fleet's break-even (a waiting
#: GPU-second worth a million GPU-seconds of a victim's work: victims never wait).
MAX_WAIT_PRICE: Final = 1e6


@dataclass(frozen=True, slots=True)
class FleetState:
    """What a decision sees: the GPUs, the tenants' policies, who waits and who runs.

    `wait_price` prices a waiting job's wait for a victim's next periodic checkpoint (the
    tenants file's `[scheduling] checkpoint_wait_price`): a victim yields `at_checkpoint`
    only when the work that saves (GPU-seconds) is at least `wait_price` x the waiting
    job's GPUs x the longer wait x its priority's weight (`victims.yield_plan`); 0: every
    victim whose next checkpoint is known waits for it, `MAX_WAIT_PRICE`: none does."""

    now: float
    capacity_gpus: int
    tenants: dict[str, TenantPolicy]
    waiting: tuple[WaitingJob, ...] = ()
    running: tuple[RunningJob, ...] = ()
    wait_price: float = DEFAULT_WAIT_PRICE

    @property
    def free_gpus(self) -> int:
        return self.capacity_gpus - sum(r.gpus for r in self.running)

    def held_gpus(self, tenant: str) -> int:
        return sum(r.gpus for r in self.running if r.tenant == tenant)


@dataclass(frozen=True, slots=True)
class Preemption:
    """One victim: `victim` yields its GPUs to `for_job`; `reason` says why, for a person
    ("preempted ranking_ctr_v7: tenant batch over its guarantee by 2 GPUs, checkpointed
    40 s ago, unsaved work 40 s x 8 GPUs"). `mode` is how it yields, `yield_in_s` when
    its GPUs are expected to be free, from the decision (`at_checkpoint`: its next
    checkpoint's commit; `now`: its exit save). `skip_save`: a `now` victim whose exit
    save is known not to fit its tenant's grace leaves without saving (the kill at the end
    of the grace would throw the save away, and hold the GPUs until then)."""

    victim: str
    victim_tenant: str
    for_job: str
    gpus: int
    unsaved_gpu_s: float
    restart_gpu_s: float
    reason: str
    mode: YieldMode = "now"
    yield_in_s: float = 0.0
    skip_save: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """A waiting job's outcome: the victims that free its GPUs (empty when it fits or
    nothing may be taken), and why, for a person."""

    for_job: str
    preemptions: tuple[Preemption, ...] = ()
    reason: str = ""
    notes: tuple[str, ...] = field(default=())
