"""The preemption victim choice: which running jobs yield their GPUs to which waiting jobs,
a pure function of the fleet state (`model.FleetState`).

`choose(state)` serves the waiting jobs in service order (highest priority first, then the
longest waiting, then the job id) against a working copy of the state: GPUs that fit or
are freed for one waiting job are reserved for it (counted as held by its tenant: it will
run), and a victim chosen once is not chosen again. It returns one `Decision` per waiting
job that cannot simply start: a job absent from the result fits in the free GPUs (it is
served, nothing to do); a decision with preemptions is served once its victims leave; a
decision without preemptions keeps waiting (its tenant is at its limit, or not enough GPUs
may be taken), and its reason says why.

The rules. A waiting job W is served only if its tenant may hold its GPUs (held + wanted
<= quota + borrow limit). A running job R may be taken for W only if, in this order (the
first broken one is the reason given):

1. R's priority is strictly lower than W's (never an equal or higher priority);
2. R's tenant is preemptible;
3. R's tenant is over its guarantee *before the pick* (held > quota, reservations
   included): a tenant at or below its guarantee is never touched, but one pick may take
   it below (an 8-GPU job of a tenant 2 GPUs over its quota may go; the issue's own
   example). This is Kueue's reclaim rule: a workload of a borrowing cluster queue is a
   candidate while the queue is borrowing, whole workloads are removed, and the queue may
   end under its nominal quota, which it can claim back later. The other reading (a pick
   never takes a tenant below its quota) would make borrowed GPUs held by one large job
   impossible to take back. Two victims of one tenant: the second is taken only if the
   tenant is still over its quota after the first;
4. R was preempted fewer times today than its tenant's daily cap;
5. R is training (not in startup, recovery, publishing or shutdown: preempting those
   throws away a start, a replay or the end of the job);
6. R is not saving a checkpoint;
7. R has run at least its tenant's minimum run time (Slurm's PreemptExemptTime, Volcano's
   cooldown after start).

Rules 5-7 are what the stage-aware policy adds: the `classic` order (Kueue-like, which the
fleet simulation compares ours with) knows nothing of stages, so it applies rules 1-4 only.
The orders differ otherwise only in which eligible victims they prefer:

- `stage_aware`: the least expected loss in GPU-seconds (`yield_plan`: the restart it will
  pay, plus what leaving costs: its wait for the commit when it yields at its next
  checkpoint, its exit save when that fits its grace, else its unsaved work), plus the
  price of the
  waiting job's wait until the victim leaves (below); then the sooner it can leave, the
  least unsaved work, the lowest priority, the most recently admitted, the job id;
- `classic`: tenants that borrow (held > quota when W is considered) first, then the
  lowest priority, then the most recently admitted, then the job id.

How a victim yields (`Preemption.mode`), and the price of waiting. The stage-aware order
may ask a victim whose next periodic checkpoint is known to keep training until that
checkpoint commits and leave then (`at_checkpoint`): it loses no work and saves nothing
more, but the waiting job waits for it. That wait is a decision with a price, one knob
(`FleetState.wait_price`, the tenants file's `checkpoint_wait_price`): the victim waits for
its checkpoint when the work this saves (what yielding now would lose: its exit save, or
its unsaved work, less what waiting loses: the victim holds its GPUs without training
from the end of that save's blocking part to its commit, `commit_wait_s`; in GPU-seconds)
is at least

    wait_price x weight(W's priority) x W's GPUs x max(0, checkpoint's commit - leaving now)

that is, the waiting job's idle GPU-seconds, weighted by its priority's place among the
tenants' (1 for the highest priority, falling linearly to 0 at the lowest: the higher the
priority, the dearer its wait). "Leaving now" counts as the victim's grace at least: the
tenants file already lets any victim take its grace to leave (the classic order's victims
hold it until the kill), so a checkpoint within it is waited for unless it would lose
more than leaving now. Any other victim, and every victim of the classic order (which
knows no checkpoints, as Kueue), yields `now`: it stops, saves within its tenant's grace,
and leaves; a stage-aware victim whose exit save is known not to fit its grace leaves
without saving (`skip_save`). The
same price ranks the victim sets: a set costs its victims' expected losses plus
`wait_price x weight x W's GPUs x` the latest of their yields. Why a price and not a
bound on the wait: a bound makes every waiting job wait up to it whatever it saves (a
big high-priority job waits half an hour to save a 1-GPU job's minutes), and a priced wait
lets the operator trade GPU-hours lost against the high-priority waits
(bench/preemption.py prints the trade per fleet).

Which set (`victim_sets`): rule 3 holds for a set of one tenant's victims in some pick
order exactly when those other than its largest add up to less than what the tenant holds
over its guarantee (take the largest last). Among the allowed sets that free enough GPUs
for W (the free ones plus the freed), the stage-aware order takes the cheapest (a bounded
branch-and-bound; see `victim_sets` for why bounded), the classic order the first in its
preference order (greedy, and backtracking where greedy falls short: a tenant 4 over its
quota of 8 with jobs of 4 and 8 GPUs, preferring the 4, cannot yield both, but yields the 8
alone). A feasible set is always found when one exists; when none does, nobody is
preempted for W and the reason says what blocked: the rule each ineligible job breaks,
and the tenants whose guarantee lets only part of their eligible jobs go. Then, like
Kueue, the picks are walked back from the last to the first and any victim whose removal
still leaves enough is dropped: the set is minimal (dropping any one victim would not
suffice). The victims are reported in an order that takes each while its tenant is still
over its guarantee. A tenant at its limit is not helped by preempting its own jobs (no
swap within a tenant), and a job that waits reserves nothing: a later, smaller job may use
the free GPUs (backfill, as Airflow's pools would run it anyway).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

from airflow_ett.scheduling.limits import MAX_CHECKPOINT_WAIT_S
from airflow_ett.scheduling.model import (
    MAX_WAIT_PRICE,
    STAGES,
    Decision,
    FleetState,
    Preemption,
    RunningJob,
    TenantPolicy,
    VictimOrder,
    WaitingJob,
    YieldMode,
)
from airflow_ett.scheduling.victim_sets import (
    Candidate,
    minimise,
    most_freeable,
    pick_order,
    search,
)

#: The rules a running job can break for a waiting job (plus `taken`: already a victim of
#: another waiting job in the same choice), in the order they are checked.
Rule = Literal["taken", "priority", "not_preemptible", "guarantee", "daily_cap", "startup",
               "recovery", "publishing", "shutdown", "saving", "min_run"]
RULES: Final[tuple[Rule, ...]] = get_args(Rule)

#: How a waiting job's reason counts the running jobs that break each rule
#: ("2 in startup, 1 saving a checkpoint, 1 of an equal or higher priority").
RULE_COUNT_LABELS: Final[dict[Rule, str]] = {
    "taken": "already preempted for another job",
    "priority": "of an equal or higher priority",
    "not_preemptible": "of a tenant that is not preemptible",
    "guarantee": "of a tenant at or below its guarantee",
    "daily_cap": "at the daily preemption cap",
    "startup": "in startup",
    "recovery": "in recovery",
    "publishing": "publishing",
    "shutdown": "shutting down",
    "saving": "saving a checkpoint",
    "min_run": "under the minimum run time",
}

_ORDERS: Final[tuple[VictimOrder, ...]] = get_args(VictimOrder)


@dataclass(frozen=True, slots=True)
class RuleBreak:
    """The first rule a running job breaks for a waiting job, and the sentence for it."""

    rule: Rule
    text: str


def format_seconds(seconds: float) -> str:
    """A duration without false precision: two significant digits at most, in the largest
    unit that keeps the number at least 1 ("0.5 s", "40 s", "2.5 min", "1.5 h", "3 d")."""
    if not seconds >= 0 or math.isinf(seconds):
        raise ValueError(f"seconds: {seconds!r} is not a duration (a finite number >= 0)")
    for size, unit, limit in ((1.0, "s", 60.0), (60.0, "min", 60.0), (3600.0, "h", 24.0)):
        text = _two_digits(seconds / size)
        if float(text) < limit:
            return f"{text} {unit}"
    return f"{_two_digits(seconds / 86400.0)} d"


def _two_digits(value: float) -> str:
    text = f"{value:.1f}" if value < 9.95 else f"{value:.0f}"
    return text.removesuffix(".0")


@dataclass(frozen=True, slots=True)
class YieldPlan:
    """How a victim would yield, when its GPUs would be free (seconds from the decision),
    and the GPU-seconds it is expected to lose: the restart it pays later plus what
    leaving costs (`exit_s`: the exit save, or the grace held until a kill)."""

    mode: YieldMode
    yield_in_s: float
    restart_s: float
    exit_s: float
    unsaved_s: float  # training thrown away
    gpus: int
    skip_save: bool = False

    @property
    def lost_gpu_s(self) -> float:
        return (self.restart_s + self.exit_s + self.unsaved_s) * self.gpus


def yield_plan(state: FleetState, running: RunningJob, waiting: WaitingJob, *,
               order: VictimOrder = "stage_aware") -> YieldPlan:
    """How `running` would yield if taken for `waiting` now (see the module docstring),
    and its cost.

    `at_checkpoint` (stage-aware, its next checkpoint known): it costs its restart and its
    wait for that checkpoint's commit past the loop's blocking part (`commit_wait_s`: it
    holds its GPUs without training); taken when what it saves over yielding now (that
    plan's exit save or unsaved work, less the commit wait) is worth the waiting job's
    longer wait at the fleet's price (`wait_rate`); the wait within the victim's grace is
    free (the tenants file lets any victim take that long to leave), but a checkpoint
    that would lose more than leaving now is not waited for. `now`: an exit save known
    to fit the tenant's grace costs that save; one known not to fit would be cut by the
    kill at the end of the grace, so the victim skips it and leaves at once (`skip_save`),
    losing its unsaved work (the classic order knows no saves: its victim tries, holds the
    grace and is killed); an unknown exit save is taken to fit and to cost the grace at
    most, with the unsaved work as what is at risk."""
    now = _yield_now_plan(state, running, order)
    upcoming = running.next_checkpoint_in_s
    if order != "stage_aware" or upcoming is None or upcoming > MAX_CHECKPOINT_WAIT_S:
        return now
    at = YieldPlan("at_checkpoint", upcoming, running.restart_s, running.commit_wait_s or 0.0,
                   0.0, running.gpus)
    grace = state.tenants[running.tenant].grace_s
    longer = max(0.0, upcoming - max(now.yield_in_s, grace))
    saved = now.lost_gpu_s - at.lost_gpu_s  # what waiting saves (the restarts are equal)
    if saved >= wait_rate(state, waiting) * longer:
        return at
    return now


def _yield_now_plan(state: FleetState, running: RunningJob, order: VictimOrder) -> YieldPlan:
    grace = state.tenants[running.tenant].grace_s
    restart, gpus = running.restart_s, running.gpus
    save = running.exit_save_s
    if save is None:
        return YieldPlan("now", grace, restart, 0.0, running.unsaved_s, gpus)
    if save <= grace:
        return YieldPlan("now", save, restart, save, 0.0, gpus)
    if order == "classic":  # it knows no saves: the victim tries, and the kill cuts it
        return YieldPlan("now", grace, restart, grace, running.unsaved_s, gpus)
    return YieldPlan("now", 0.0, restart, 0.0, running.unsaved_s, gpus, skip_save=True)


def wait_rate(state: FleetState, waiting: WaitingJob) -> float:
    """What a second of `waiting`'s wait costs, in GPU-seconds of a victim's work:
    `wait_price` x its GPUs x its priority's weight, 1 at the tenants' highest priority
    falling linearly to 0 at their lowest (1 when they all have one priority)."""
    priorities = [t.priority for t in state.tenants.values()]
    low, high = min(priorities), max(priorities)
    weight = 1.0 if high == low else min(1.0, max(0.0, (waiting.priority - low) / (high - low)))
    if weight == 0.0 or state.wait_price == 0.0:
        return 0.0
    return state.wait_price * weight * waiting.gpus


def service_order(waiting: Iterable[WaitingJob]) -> list[WaitingJob]:
    """Who is served first: the highest priority, then the longest waiting, then job id."""
    return sorted(waiting, key=lambda w: (-w.priority, w.waiting_since, w.job))


def explain_ineligible(state: FleetState, waiting: WaitingJob, running: RunningJob, *,
                       order: VictimOrder = "stage_aware") -> str | None:
    """The rule `running` breaks as a victim for `waiting`, as a sentence for a person
    (None: it may be taken), judged on the state as given (no reservation or earlier
    victim of a `choose` round). With `order="classic"` the stage rules do not apply."""
    broken = _broken_rule(state.tenants[running.tenant], state.held_gpus(running.tenant),
                          waiting, running, order)
    return None if broken is None else broken.text


def _broken_rule(policy: TenantPolicy, held: int, waiting: WaitingJob, running: RunningJob,
                 order: VictimOrder) -> RuleBreak | None:
    broken = _policy_break(policy, held, waiting, running)
    if broken is None and order == "stage_aware":
        broken = _stage_break(policy, running)
    return broken


def _policy_break(policy: TenantPolicy, held: int, waiting: WaitingJob,
                  running: RunningJob) -> RuleBreak | None:
    """Rules 1-4, which both orders apply."""
    if running.priority >= waiting.priority:
        return RuleBreak("priority", f"priority {running.priority} is not below "
                                     f"{waiting.job}'s {waiting.priority}")
    if not policy.preemptible:
        return RuleBreak("not_preemptible", f"tenant {policy.name} is not preemptible")
    if held <= policy.quota_gpus:
        return RuleBreak("guarantee", f"tenant {policy.name} holds {_gpus(held)}, at or below "
                                      f"its guarantee of {policy.quota_gpus}")
    if running.preemptions_today >= policy.max_preemptions_per_day:
        return RuleBreak("daily_cap", f"preempted {_times(running.preemptions_today)} today, "
                                      f"tenant {policy.name}'s daily cap is "
                                      f"{policy.max_preemptions_per_day}")
    return None


def _stage_break(policy: TenantPolicy, running: RunningJob) -> RuleBreak | None:
    """Rules 5-7, the stage-aware ones."""
    if running.stage != "training":
        return RuleBreak(running.stage, RULE_COUNT_LABELS[running.stage])
    if running.saving:
        return RuleBreak("saving", RULE_COUNT_LABELS["saving"])
    if running.run_s < policy.min_run_s:
        return RuleBreak("min_run", f"ran {format_seconds(running.run_s)}, under tenant "
                                    f"{policy.name}'s minimum run of "
                                    f"{format_seconds(policy.min_run_s)}")
    return None


def choose(state: FleetState, *, order: VictimOrder = "stage_aware") -> list[Decision]:
    """The decisions for `state`'s waiting jobs, in service order (see the module's
    docstring for the rules): one per waiting job that does not fit in the free GPUs;
    the ones absent fit and start as they are."""
    validate_state(state)
    if order not in _ORDERS:
        raise ValueError(f"order: {order!r} is not a victim order (known: "
                         f"{', '.join(_ORDERS)})")
    fleet = _Working(free=state.free_gpus,
                     held={name: state.held_gpus(name) for name in state.tenants},
                     taken=set())
    decisions = []
    for waiting in service_order(state.waiting):
        decision = _decide(state, fleet, waiting, order)
        if decision is not None:
            decisions.append(decision)
    return decisions


@dataclass(slots=True)
class _Working:
    """The state as the round has changed it so far: GPUs free, held per tenant (with the
    reservations of the jobs served), the victims already chosen."""

    free: int
    held: dict[str, int]
    taken: set[str]


def _decide(state: FleetState, fleet: _Working, waiting: WaitingJob,
            order: VictimOrder) -> Decision | None:
    policy = state.tenants[waiting.tenant]
    held = fleet.held[waiting.tenant]
    if held + waiting.gpus > policy.limit_gpus:
        where = "at its limit" if held >= policy.limit_gpus else "would exceed its limit"
        return Decision(waiting.job, reason=(
            f"waits: tenant {policy.name} {where}: holds {_gpus(held)} of "
            f"{policy.limit_gpus} (quota {policy.quota_gpus} + borrow "
            f"{policy.borrow_limit_gpus}), wants {waiting.gpus} more"))
    if waiting.gpus <= fleet.free:
        _reserve(fleet, waiting, freed=0)
        return None
    if waiting.gpus > state.capacity_gpus:
        return Decision(waiting.job, reason=(
            f"waits: wants {_gpus(waiting.gpus)}, more than the fleet's "
            f"{state.capacity_gpus}"))
    lacking = waiting.gpus - fleet.free
    eligible, plans, broken = _candidates(state, fleet, waiting, order)
    over = {name: fleet.held[name] - p.quota_gpus for name, p in state.tenants.items()}
    most = most_freeable(eligible, over)
    if sum(c.gpus for group in most.values() for c in group) < lacking:
        return Decision(waiting.job, reason=_waits_reason(state, fleet, waiting, eligible,
                                                          most, broken))
    found, kept = _victim_set(eligible, over, most, lacking,
                              wait_rate(state, waiting) if order == "stage_aware" else None)
    notes = tuple(f"{c.job} was picked, then dropped: the other victims free enough"
                  for c in found if c not in kept)
    free_before = fleet.free
    by_job = {r.job: r for r in state.running}
    preemptions = _commit(state, fleet, waiting, [by_job[c.job] for c in kept], plans)
    freed = sum(c.gpus for c in kept)
    names = ", ".join(c.job for c in kept)
    return Decision(waiting.job, preemptions, notes=notes, reason=(
        f"frees {_gpus(freed)} for the {lacking} it lacks ({waiting.gpus} wanted, "
        f"{free_before} free), from {len(kept)} job{'s' if len(kept) > 1 else ''}: {names}"))


def _victim_set(eligible: Sequence[Candidate], over: dict[str, int],
                most: dict[str, list[Candidate]], lacking: int, rate: float | None
                ) -> tuple[list[Candidate], list[Candidate]]:
    """The set found (`victim_sets.search`; past its bound, the most each tenant can
    yield, known to suffice) and what stays of it once minimised, in pick order."""
    found = search(eligible, over, lacking, wait_rate=rate)
    if found is None:
        most_jobs = {c.job for group in most.values() for c in group}
        found = [c for c in eligible if c.job in most_jobs]
    return found, pick_order(minimise(found, lacking))


def _reserve(fleet: _Working, waiting: WaitingJob, *, freed: int) -> None:
    fleet.free += freed - waiting.gpus
    fleet.held[waiting.tenant] += waiting.gpus


def _candidates(state: FleetState, fleet: _Working, waiting: WaitingJob, order: VictimOrder
                ) -> tuple[list[Candidate], dict[str, YieldPlan], Counter[Rule]]:
    """The running jobs that may be taken for `waiting` as the round stands, most preferred
    first, how each would yield, and how many break each rule."""
    eligible: list[RunningJob] = []
    broken: Counter[Rule] = Counter()
    for running in state.running:
        if running.job in fleet.taken:
            broken["taken"] += 1
            continue
        rule = _broken_rule(state.tenants[running.tenant], fleet.held[running.tenant],
                            waiting, running, order)
        if rule is None:
            eligible.append(running)
        else:
            broken[rule.rule] += 1
    plans = {r.job: yield_plan(state, r, waiting, order=order) for r in eligible}
    if order == "stage_aware":
        rate = wait_rate(state, waiting)
        eligible.sort(key=lambda r: (
            plans[r.job].lost_gpu_s + rate * plans[r.job].yield_in_s, plans[r.job].yield_in_s,
            r.unsaved_gpu_s, r.priority, -r.admitted_at, r.job))
    else:
        borrowing = {t: fleet.held[t] > p.quota_gpus for t, p in state.tenants.items()}
        eligible.sort(key=lambda r: (not borrowing[r.tenant], r.priority, -r.admitted_at,
                                     r.job))
    return ([Candidate(r.job, r.tenant, r.gpus, plans[r.job].lost_gpu_s,
                       plans[r.job].yield_in_s) for r in eligible], plans, broken)


def _commit(state: FleetState, fleet: _Working, waiting: WaitingJob,
            victims: Sequence[RunningJob], plans: dict[str, YieldPlan]
            ) -> tuple[Preemption, ...]:
    """Apply the victims (in an order that takes each while its tenant is over its
    guarantee) and the reservation to the round's state; each victim's reason is written
    with its tenant's GPUs just before its pick."""
    preemptions = []
    for victim in victims:
        policy = state.tenants[victim.tenant]
        over = fleet.held[victim.tenant] - policy.quota_gpus
        fleet.held[victim.tenant] -= victim.gpus
        fleet.taken.add(victim.job)
        plan = plans[victim.job]
        preemptions.append(Preemption(
            victim=victim.job, victim_tenant=victim.tenant, for_job=waiting.job,
            gpus=victim.gpus, unsaved_gpu_s=plan.unsaved_s * victim.gpus,
            restart_gpu_s=victim.restart_s * victim.gpus,
            reason=_preemption_reason(victim, over, waiting, plan),
            mode=plan.mode, yield_in_s=plan.yield_in_s, skip_save=plan.skip_save))
    _reserve(fleet, waiting, freed=sum(v.gpus for v in victims))
    return tuple(preemptions)


def _preemption_reason(victim: RunningJob, over: int, waiting: WaitingJob,
                       plan: YieldPlan) -> str:
    """"preempted ranking_ctr_v7: tenant batch over its guarantee by 2 GPUs, checkpointed
    40 s ago, unsaved work 40 s x 8 GPUs, for ads_ranker (priority 10 over 3); yields at
    its next checkpoint, in 2.5 min (nothing unsaved)"."""
    if victim.since_checkpoint_s is None:
        saved = "no checkpoint yet in this attempt"
    else:
        saved = f"checkpointed {format_seconds(victim.since_checkpoint_s)} ago"
    # Only the classic order takes a job that is not training or is saving: say so.
    caveats = "".join([
        f", in {victim.stage}" if victim.stage != "training" else "",
        ", saving a checkpoint" if victim.saving else "",
    ])
    return (f"preempted {victim.job}: tenant {victim.tenant} over its guarantee by "
            f"{_gpus(over)}, {saved}, unsaved work {format_seconds(victim.unsaved_s)} x "
            f"{_gpus(victim.gpus)}{caveats}, for {waiting.job} (priority {waiting.priority} "
            f"over {victim.priority}); {_how_it_yields(plan, victim)}")


def _how_it_yields(plan: YieldPlan, victim: RunningJob) -> str:
    if plan.mode == "at_checkpoint":
        commit = (f"; the last {format_seconds(plan.exit_s)} of it waiting for that save to "
                  "commit" if plan.exit_s > 0 else "")
        return (f"yields at its next checkpoint, in {format_seconds(plan.yield_in_s)} "
                f"(nothing unsaved{commit})")
    if victim.exit_save_s is None:
        return "yields now (checkpoint within its grace)"
    if plan.unsaved_s == 0:
        return f"yields now (exit save {format_seconds(victim.exit_save_s)})"
    save = format_seconds(victim.exit_save_s)
    if plan.skip_save:
        return (f"yields now without saving: its exit save of {save} does not fit the "
                "tenant's grace, so the unsaved work is lost")
    return (f"yields now; its exit save of {save} does not fit its grace: the kill will cut "
            "it and the unsaved work is lost")


def _waits_reason(state: FleetState, fleet: _Working, waiting: WaitingJob,
                  eligible: Sequence[Candidate], most: dict[str, list[Candidate]],
                  broken: Counter[Rule]) -> str:
    """Why no set of victims frees enough: how much the eligible jobs can free at most,
    the tenants whose guarantee lets only part of their eligible jobs go, and how many
    running jobs break each rule."""
    can = sum(c.gpus for group in most.values() for c in group)
    reason = (f"waits: lacks {waiting.gpus - fleet.free} GPUs ({waiting.gpus} wanted, "
              f"{fleet.free} free) and the jobs that may be preempted free only {can}")
    for name in sorted(most):
        own = sorted((c.gpus for c in eligible if c.tenant == name), reverse=True)
        if sum(own) > (allowed := sum(c.gpus for c in most[name])):
            quota = state.tenants[name].quota_gpus
            reason += (f"; tenant {name}'s guarantee lets {allowed} of its eligible "
                       f"{sum(own)} GPUs go (it holds {fleet.held[name]}, "
                       f"{fleet.held[name] - quota} over its quota of {quota}; jobs of "
                       f"{' + '.join(map(str, own))} GPUs, each taken only while it is "
                       "still over)")
    counts = [f"{broken[rule]} {RULE_COUNT_LABELS[rule]}" for rule in RULES if broken[rule]]
    return reason + (f"; not eligible: {', '.join(counts)}" if counts else "")


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def validate_state(state: FleetState) -> None:
    """Reject a state the rules cannot judge, naming the field and the value: a job of an
    unknown tenant, a job id twice, no GPUs, a negative duration or count, or running jobs
    holding more GPUs than the fleet has."""
    for key, policy in state.tenants.items():
        if key != policy.name:
            raise ValueError(f"tenants[{key!r}].name: {policy.name!r} differs from its key")
    if not 0 <= state.wait_price <= MAX_WAIT_PRICE:
        raise ValueError(f"wait_price: {state.wait_price!r} is not a number in [0, "
                         f"{MAX_WAIT_PRICE:g}]")
    jobs = Counter([r.job for r in state.running] + [w.job for w in state.waiting])
    twice = sorted(job for job, n in jobs.items() if n > 1)
    if twice:
        raise ValueError(f"job: {', '.join(map(repr, twice))} appears more than once in the "
                         "running and waiting jobs")
    for waiting in state.waiting:
        _check_job("waiting", waiting.job, waiting.tenant, waiting.gpus, state)
        if math.isnan(waiting.waiting_since):
            raise ValueError(f"waiting job {waiting.job!r}, field 'waiting_since': nan is not "
                             "a time")
    for running in state.running:
        _check_job("running", running.job, running.tenant, running.gpus, state)
        _check_running(running)
    held = sum(r.gpus for r in state.running)
    if not 0 <= held <= state.capacity_gpus:
        raise ValueError(f"capacity_gpus: {state.capacity_gpus} is less than the {held} GPUs "
                         "the running jobs hold")


def _check_job(kind: str, job: str, tenant: str, gpus: int, state: FleetState) -> None:
    if tenant not in state.tenants:
        raise ValueError(f"{kind} job {job!r}, field 'tenant': {tenant!r} is not a known "
                         f"tenant (known: {', '.join(sorted(state.tenants)) or 'none'})")
    if gpus < 1:
        raise ValueError(f"{kind} job {job!r}, field 'gpus': {gpus!r} is not at least 1")


def _check_running(running: RunningJob) -> None:
    if running.stage not in STAGES:
        raise ValueError(f"running job {running.job!r}, field 'stage': {running.stage!r} is "
                         f"not a stage (known: {', '.join(STAGES)})")
    if math.isnan(running.admitted_at):
        raise ValueError(f"running job {running.job!r}, field 'admitted_at': nan is not a time")
    for name in ("run_s", "since_checkpoint_s", "restart_s", "preemptions_today",
                 "next_checkpoint_in_s", "exit_save_s", "commit_wait_s"):
        value = getattr(running, name)
        if value is not None and not value >= 0:
            raise ValueError(f"running job {running.job!r}, field {name!r}: {value!r} is "
                             "negative or not a number")
