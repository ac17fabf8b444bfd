"""The preemption victim choice (airflow_ett/scheduling/victims.py): hand-made cases for each
rule, each order's preference, free-just-enough and the minimal set, the reasons as a
person reads them; then properties over random fleet states, each rule checked here from
the state itself, not through the module's own eligibility code."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.scheduling import victim_sets
from airflow_ett.scheduling.model import (
    MAX_WAIT_PRICE,
    Decision,
    FleetState,
    RunningJob,
    TenantPolicy,
    VictimOrder,
    WaitingJob,
)
from airflow_ett.scheduling.victims import (
    choose,
    explain_ineligible,
    format_seconds,
    wait_rate,
    yield_plan,
)
from tests.scheduling.strategies import NOW, fleet_states

ORDERS: tuple[VictimOrder, ...] = ("stage_aware", "classic")


def tenant(name: str, **kw: Any) -> TenantPolicy:
    fields: dict[str, Any] = {"priority": 1, "quota_gpus": 0, "borrow_limit_gpus": 0,
                              "min_run_s": 600.0, "max_preemptions_per_day": 2}
    fields.update(kw)
    return TenantPolicy(name=name, **fields)


def running(job: str, tenant: str = "batch", **kw: Any) -> RunningJob:
    fields: dict[str, Any] = {"priority": 1, "gpus": 8, "stage": "training", "run_s": 3600.0,
                              "since_checkpoint_s": 40.0, "saving": False,
                              "preemptions_today": 0, "restart_s": 60.0}
    fields.update(kw)
    fields.setdefault("admitted_at", NOW - fields["run_s"])
    return RunningJob(job=job, tenant=tenant, **fields)


def waiting(job: str = "ads_ranker", tenant: str = "ads", **kw: Any) -> WaitingJob:
    fields: dict[str, Any] = {"priority": 10, "gpus": 8, "waiting_since": NOW - 60.0}
    fields.update(kw)
    return WaitingJob(job=job, tenant=tenant, **fields)


def fleet(run: Sequence[RunningJob], wait: Sequence[WaitingJob], *, capacity: int | None = None,
          batch: TenantPolicy | None = None, ads: TenantPolicy | None = None,
          more: Sequence[TenantPolicy] = ()) -> FleetState:
    """A fleet with tenants `ads` (the waiting side: priority 10, quota 16) and `batch` (the
    victims' side: quota 6, so 8 held is 2 over), full unless `capacity` says otherwise."""
    tenants = [ads or tenant("ads", priority=10, quota_gpus=16),
               batch or tenant("batch", quota_gpus=6, borrow_limit_gpus=10), *more]
    return FleetState(now=NOW, capacity_gpus=sum(r.gpus for r in run) if capacity is None
                      else capacity, tenants={t.name: t for t in tenants},
                      waiting=tuple(wait), running=tuple(run))


def victims(decisions: Sequence[Decision]) -> list[list[str]]:
    return [[p.victim for p in d.preemptions] for d in decisions]


# -- the issue's example, word for word ------------------------------------------------------

def test_the_issues_example_and_its_reasons() -> None:
    state = fleet([running("ranking_ctr_v7")], [waiting()])
    [decision] = choose(state)
    assert decision.for_job == "ads_ranker"
    [p] = decision.preemptions
    assert p.reason == ("preempted ranking_ctr_v7: tenant batch over its guarantee by 2 GPUs, "
                        "checkpointed 40 s ago, unsaved work 40 s x 8 GPUs, for ads_ranker "
                        "(priority 10 over 1); yields now (checkpoint within its grace)")
    assert (p.mode, p.yield_in_s, p.skip_save) == ("now", 120.0, False)
    assert (p.victim, p.victim_tenant, p.for_job, p.gpus) == ("ranking_ctr_v7", "batch",
                                                               "ads_ranker", 8)
    assert (p.unsaved_gpu_s, p.restart_gpu_s) == (320.0, 480.0)
    assert decision.reason == ("frees 8 GPUs for the 8 it lacks (8 wanted, 0 free), from 1 job: "
                               "ranking_ctr_v7")
    assert decision.notes == ()


def test_a_victim_never_checkpointed_loses_its_whole_run() -> None:
    state = fleet([running("v", since_checkpoint_s=None, run_s=5400.0, gpus=1)],
                  [waiting(gpus=1)], batch=tenant("batch", quota_gpus=0))
    [decision] = choose(state)
    assert decision.preemptions[0].reason == (
        "preempted v: tenant batch over its guarantee by 1 GPU, no checkpoint yet in this "
        "attempt, unsaved work 1.5 h x 1 GPU, for ads_ranker (priority 10 over 1); yields now "
        "(checkpoint within its grace)")


# -- how a victim yields ---------------------------------------------------------------------

def test_a_victim_waits_for_its_checkpoint_when_the_work_saved_is_worth_the_wait() -> None:
    """Yielding now, the victim's exit save (200 s) does not fit its grace (120 s): it
    would leave at once and lose 40 s x 8 GPUs = 320 GPU-s. Its checkpoint commits in
    300 s, 180 s past the grace. The waiting job (8 GPUs, the highest priority: weight 1)
    then waits 180 s more: worth it while 320 >= price x 8 x 180, up to a price of 2/9."""
    state = replace(fleet([running("v", next_checkpoint_in_s=300.0, exit_save_s=200.0)],
                          [waiting()]), wait_price=0.2)
    [p] = choose(state)[0].preemptions
    assert (p.mode, p.yield_in_s, p.skip_save, p.unsaved_gpu_s) == (
        "at_checkpoint", 300.0, False, 0.0)
    assert p.reason.endswith("; yields at its next checkpoint, in 5 min (nothing unsaved)")
    # the classic order knows no checkpoints: it yields now, and its save does not fit
    [c] = choose(state, order="classic")[0].preemptions
    assert (c.mode, c.skip_save, c.yield_in_s, c.unsaved_gpu_s) == ("now", False, 120.0, 320.0)
    assert c.reason.endswith("; yields now; its exit save of 3.3 min does not fit its grace: "
                             "the kill will cut it and the unsaved work is lost")
    # at a higher price the wait costs more than the work: it skips the save it cannot
    # finish and leaves at once
    [p] = choose(replace(state, wait_price=0.25))[0].preemptions
    assert (p.mode, p.skip_save, p.yield_in_s, p.unsaved_gpu_s) == ("now", True, 0.0, 320.0)
    assert p.reason.endswith("; yields now without saving: its exit save of 3.3 min does not "
                             "fit the tenant's grace, so the unsaved work is lost")
    # at 0 it waits however long; at the most, never beyond its grace
    far = replace(state.running[0], next_checkpoint_in_s=86_400.0)
    assert yield_plan(replace(state, wait_price=0.0), far, state.waiting[0]).mode \
        == "at_checkpoint"
    within = replace(state.running[0], next_checkpoint_in_s=120.0)  # the grace: free
    assert yield_plan(replace(state, wait_price=MAX_WAIT_PRICE), within,
                      state.waiting[0]).mode == "at_checkpoint"
    assert yield_plan(replace(state, wait_price=MAX_WAIT_PRICE), replace(
        within, next_checkpoint_in_s=121.0), state.waiting[0]).mode == "now"


def test_the_price_of_a_wait_follows_the_waiting_jobs_gpus_and_priority() -> None:
    """The same victim (320 GPU-s saved by a wait of 180 s past its grace) waits for a
    small or low-priority job, not for a big high-priority one."""
    victim = running("v", next_checkpoint_in_s=300.0, exit_save_s=200.0)
    mid = tenant("mid", priority=4, quota_gpus=0, borrow_limit_gpus=16)
    state = replace(fleet([victim], [waiting()], more=[mid]), wait_price=1.0)
    # ads (10, the highest of 1..10): weight 1; 8 GPUs: 1 x 8 x 180 = 1440 > 320
    assert yield_plan(state, victim, state.waiting[0]).mode == "now"
    assert wait_rate(state, state.waiting[0]) == 8.0
    # one GPU: 180 <= 320
    small = waiting(gpus=1)
    assert (wait_rate(state, small), yield_plan(state, victim, small).mode) == (
        1.0, "at_checkpoint")
    # tenant mid, priority 4 of 1..10: weight 1/3, 8 GPUs: 480 > 320; at 4 GPUs 240 <= 320
    low = waiting("low", "mid", priority=4, gpus=8)
    assert wait_rate(state, low) == pytest.approx(8 / 3)
    assert yield_plan(state, victim, low).mode == "now"
    assert yield_plan(state, victim, replace(low, gpus=4)).mode == "at_checkpoint"


def test_a_checkpoint_due_before_the_exit_save_ends_is_always_waited_for() -> None:
    job = running("v", next_checkpoint_in_s=30.0, exit_save_s=60.0)
    state = replace(fleet([job], [waiting()]), wait_price=MAX_WAIT_PRICE)
    [p] = choose(state)[0].preemptions
    assert (p.mode, p.yield_in_s) == ("at_checkpoint", 30.0)
    [p] = choose(replace(state, running=(replace(job, next_checkpoint_in_s=601.0),)))[
        0].preemptions
    assert (p.mode, p.yield_in_s, p.skip_save) == ("now", 60.0, False)
    assert p.reason.endswith("; yields now (exit save 1 min)")


def test_a_yield_at_checkpoint_costs_the_wait_for_that_saves_commit() -> None:
    """The victim leaving at its checkpoint holds its 8 GPUs from the end of the save's
    blocking part to its commit (`commit_wait_s`), not training: that is what it loses
    beside its restart. Leaving now, its exit save (200 s) does not fit its 120-s grace:
    it would lose its 40 s x 8 unsaved."""
    victim = running("v", next_checkpoint_in_s=300.0, exit_save_s=200.0, commit_wait_s=15.0)
    state = replace(fleet([victim], [waiting()]), wait_price=0.1)
    plan = yield_plan(state, victim, state.waiting[0])
    assert (plan.mode, plan.exit_s, plan.lost_gpu_s) == ("at_checkpoint", 15.0, (60 + 15) * 8)
    [p] = choose(state)[0].preemptions
    assert p.reason.endswith("; yields at its next checkpoint, in 5 min (nothing unsaved; the "
                             "last 15 s of it waiting for that save to commit)")
    # what waiting saves is 320 - 120 = 200 GPU-s; the wait past the grace, 180 s x 8 GPUs
    # at the price: waited for up to a price of 200 / 1440, no longer at 0.14 (without
    # the commit wait it would be, up to 320 / 1440)
    assert yield_plan(replace(state, wait_price=0.138), victim, state.waiting[0]).mode \
        == "at_checkpoint"
    assert yield_plan(replace(state, wait_price=0.14), victim, state.waiting[0]).mode == "now"
    # a checkpoint within the grace is free to wait for, unless its commit wait loses more
    # than leaving now: 50 s x 8 against the 40 s x 8 unsaved
    soon = replace(victim, next_checkpoint_in_s=100.0)
    assert yield_plan(state, soon, state.waiting[0]).mode == "at_checkpoint"
    assert yield_plan(state, replace(soon, commit_wait_s=50.0), state.waiting[0]).mode == "now"
    # unknown, it counts as nothing (as before the trainer reported it)
    assert yield_plan(state, replace(soon, commit_wait_s=None), state.waiting[0]).exit_s == 0


@pytest.mark.parametrize(("exit_save_s", "expected"), [
    (None, ("now", 120.0, 0.0, 40.0)),  # unknown: taken to fit, the unsaved work at risk
    (100.0, ("now", 100.0, 100.0, 0.0)),  # fits the grace of 120 s: costs the save
    (121.0, ("now", 0.0, 0.0, 40.0)),  # cannot fit: leaves at once, loses the unsaved work
])
def test_the_cost_of_yielding_now_follows_the_exit_save_and_the_grace(
        exit_save_s: float | None, expected: tuple[str, float, float, float]) -> None:
    state = fleet([running("v", exit_save_s=exit_save_s)], [waiting()])
    plan = yield_plan(state, state.running[0], state.waiting[0])
    assert (plan.mode, plan.yield_in_s, plan.exit_s, plan.unsaved_s) == expected
    assert plan.lost_gpu_s == (60.0 + plan.exit_s + plan.unsaved_s) * 8


def test_stage_aware_prefers_the_least_expected_loss_then_the_soonest_to_leave() -> None:
    batch = tenant("batch", quota_gpus=0)
    # unsaved 40 s x 8 at risk now, or nothing lost at a checkpoint 1000 s away (restarts
    # equal; the wait free at price 0): the checkpoint wins, though the other has less
    # unsaved work
    now_job = running("now_job", exit_save_s=None)
    later = running("later", since_checkpoint_s=900.0, next_checkpoint_in_s=1000.0)
    state = replace(fleet([now_job, later], [waiting()], batch=batch), wait_price=0.0)
    assert victims(choose(state)) == [["later"]]
    # priced, the waiting job's wait counts too: at 0.01 (0.08 GPU-s a second for its 8
    # GPUs) "later" costs 480 + 0.08 x 1000 against 800 + 0.08 x 120; at 0.05 (0.4 a
    # second), 880 against 848
    assert victims(choose(replace(state, wait_price=0.01))) == [["later"]]
    assert victims(choose(replace(state, wait_price=0.05))) == [["now_job"]]
    # a dearer restart outweighs it: 8 x (300 - 60) > 320 at risk
    state = replace(state, running=(now_job, replace(later, restart_s=300.0)))
    assert victims(choose(state)) == [["now_job"]]
    # two that lose nothing: the one leaving sooner goes, whatever its unsaved work
    soon = replace(later, job="soon", next_checkpoint_in_s=200.0, since_checkpoint_s=1500.0)
    state = replace(state, running=(later, soon))
    assert victims(choose(state)) == [["soon"]]


def test_a_bad_wait_price_or_estimate_is_refused_naming_it() -> None:
    state = fleet([running("v")], [waiting()])
    for bad in (-1.0, float("nan"), float("inf"), 2e6):
        with pytest.raises(ValueError, match=r"wait_price: .* is not a number in \[0, 1e\+06\]"):
            choose(replace(state, wait_price=bad))
    for name in ("next_checkpoint_in_s", "exit_save_s", "commit_wait_s"):
        bad_state = replace(state, running=(running("v", **{name: float("nan")}),))
        with pytest.raises(ValueError, match=rf"running job 'v', field '{name}': nan"):
            choose(bad_state)


# -- each rule alone makes a would-be victim ineligible --------------------------------------

#: (what breaks, the change that breaks it, the count in the waiting job's reason, the
#: sentence explain_ineligible gives, whether the classic order applies the rule too)
ONE_RULE = [
    ("equal priority", {"priority": 10}, "1 of an equal or higher priority",
     "priority 10 is not below ads_ranker's 10", True),
    ("higher priority", {"priority": 11}, "1 of an equal or higher priority",
     "priority 11 is not below ads_ranker's 10", True),
    ("not preemptible", {"tenant": tenant("batch", quota_gpus=6, preemptible=False)},
     "1 of a tenant that is not preemptible", "tenant batch is not preemptible", True),
    ("at its guarantee", {"tenant": tenant("batch", quota_gpus=8)},
     "1 of a tenant at or below its guarantee",
     "tenant batch holds 8 GPUs, at or below its guarantee of 8", True),
    ("below its guarantee", {"tenant": tenant("batch", quota_gpus=9)},
     "1 of a tenant at or below its guarantee",
     "tenant batch holds 8 GPUs, at or below its guarantee of 9", True),
    ("daily cap", {"preemptions_today": 2}, "1 at the daily preemption cap",
     "preempted 2 times today, tenant batch's daily cap is 2", True),
    ("no preemption allowed today", {"tenant": tenant("batch", quota_gpus=6,
                                                      max_preemptions_per_day=0)},
     "1 at the daily preemption cap", "preempted 0 times today, tenant batch's daily cap is 0",
     True),
    ("startup", {"stage": "startup"}, "1 in startup", "in startup", False),
    ("recovery", {"stage": "recovery"}, "1 in recovery", "in recovery", False),
    ("publishing", {"stage": "publishing"}, "1 publishing", "publishing", False),
    ("shutdown", {"stage": "shutdown"}, "1 shutting down", "shutting down", False),
    ("saving", {"saving": True}, "1 saving a checkpoint", "saving a checkpoint", False),
    ("minimum run", {"run_s": 599.0}, "1 under the minimum run time",
     "ran 10 min, under tenant batch's minimum run of 10 min", False),
]


def one_rule_state(change: dict[str, Any]) -> FleetState:
    change = dict(change)
    policy = change.pop("tenant", tenant("batch", quota_gpus=6))
    return fleet([running("v", **change)], [waiting()], batch=policy)


def test_the_unbroken_victim_is_taken_in_both_orders() -> None:
    """The base every ONE_RULE case changes in one field: without the change it goes."""
    state = one_rule_state({})
    for order in ORDERS:
        assert victims(choose(state, order=order)) == [["v"]]
    assert explain_ineligible(state, state.waiting[0], state.running[0]) is None


@pytest.mark.parametrize(("what", "change", "count", "text", "classic_too"), ONE_RULE,
                         ids=[case[0] for case in ONE_RULE])
def test_each_rule_alone_forbids_the_victim(what: str, change: dict[str, Any], count: str,
                                            text: str, classic_too: bool) -> None:
    state = one_rule_state(change)
    [decision] = choose(state)
    assert decision.preemptions == ()
    assert decision.reason == ("waits: lacks 8 GPUs (8 wanted, 0 free) and the jobs that may "
                               f"be preempted free only 0; not eligible: {count}")
    assert explain_ineligible(state, state.waiting[0], state.running[0]) == text
    # the classic (Kueue-like) order knows nothing of stages, saves or minimum runs
    [classic] = choose(state, order="classic")
    assert bool(classic.preemptions) is not classic_too
    expected = text if classic_too else None
    assert explain_ineligible(state, state.waiting[0], state.running[0],
                              order="classic") == expected


def test_the_minimum_run_is_inclusive() -> None:
    assert victims(choose(one_rule_state({"run_s": 600.0}))) == [["v"]]


def test_a_tenant_over_its_guarantee_by_less_than_a_job_still_yields_it_once() -> None:
    """Kueue's reclaim: the tenant is over its quota before the pick (8 > 6), so its 8-GPU
    job may go; a second job of the same tenant may not once it is at or below it."""
    state = fleet([running("a", gpus=4, since_checkpoint_s=10.0),
                   running("b", gpus=4, since_checkpoint_s=20.0)],
                  [waiting(gpus=8)], batch=tenant("batch", quota_gpus=2))
    for order in ORDERS:
        [decision] = choose(state, order=order)
        assert sorted(*victims([decision])) == ["a", "b"]  # 8 > 2, then 4 > 2
    state = replace(state, tenants={**state.tenants, "batch": tenant("batch", quota_gpus=4)})
    for order in ORDERS:
        [decision] = choose(state, order=order)
        assert decision.preemptions == ()  # 8 > 4 takes one, then 4 is not over 4
        assert decision.reason == (
            "waits: lacks 8 GPUs (8 wanted, 0 free) and the jobs that may be preempted free "
            "only 4; tenant batch's guarantee lets 4 of its eligible 8 GPUs go (it holds 8, "
            "4 over its quota of 4; jobs of 4 + 4 GPUs, each taken only while it is still "
            "over)")


@pytest.mark.parametrize("order", ORDERS)
def test_the_issues_example_a_feasible_set_is_found_where_greedy_falls_short(
        order: VictimOrder) -> None:
    """Tenant lo, over its quota of 8, holds 12 GPUs in a job of 8 and one of 4; a job
    needs 8. The 4-GPU job is preferred (less to lose; admitted last), but taking it
    leaves lo at its quota, so greedy could take nothing more and preempted nobody. The
    8-GPU job alone is allowed, and goes."""
    lo = tenant("lo", quota_gpus=8, borrow_limit_gpus=8)
    small = running("small", "lo", gpus=4, since_checkpoint_s=10.0, admitted_at=NOW - 600.0)
    big = running("big", "lo", gpus=8, since_checkpoint_s=600.0, admitted_at=NOW - 7200.0)
    state = fleet([small, big], [waiting(gpus=8)], more=[lo])
    [decision] = choose(state, order=order)
    [p] = decision.preemptions
    assert (p.victim, p.gpus) == ("big", 8)
    assert p.reason.startswith("preempted big: tenant lo over its guarantee by 4 GPUs, ")
    assert decision.reason == ("frees 8 GPUs for the 8 it lacks (8 wanted, 0 free), from 1 "
                               "job: big")
    # lo only 3 over (quota 9): still the 8-GPU job alone
    nine = replace(state, tenants={**state.tenants, "lo": tenant("lo", quota_gpus=9,
                                                                 borrow_limit_gpus=8)})
    assert victims(choose(nine, order=order)) == [["big"]]
    # at its quota (12), nothing may go
    state = replace(state, tenants={**state.tenants, "lo": tenant("lo", quota_gpus=12,
                                                                  borrow_limit_gpus=8)})
    [decision] = choose(state, order=order)
    assert decision.preemptions == ()
    assert decision.reason == ("waits: lacks 8 GPUs (8 wanted, 0 free) and the jobs that may "
                               "be preempted free only 0; not eligible: 2 of a tenant at or "
                               "below its guarantee")


def test_two_victims_of_one_tenant_go_the_largest_last() -> None:
    """3 over: a 2-GPU and an 8-GPU job may both go (2 first: still 1 over for the 8);
    their reasons say how far over the tenant was before each pick."""
    lo = tenant("lo", quota_gpus=7, borrow_limit_gpus=8)
    run = [running("eight", "lo", gpus=8, since_checkpoint_s=10.0),
           running("two", "lo", gpus=2, since_checkpoint_s=10.0)]
    state = fleet(run, [waiting(gpus=10)], more=[lo])
    for order in ORDERS:
        [decision] = choose(state, order=order)
        assert victims([decision]) == [["two", "eight"]]
        assert [p.reason.split(",")[0] for p in decision.preemptions] == [
            "preempted two: tenant lo over its guarantee by 3 GPUs",
            "preempted eight: tenant lo over its guarantee by 1 GPU"]


def test_stage_aware_takes_the_cheapest_set_not_the_greedy_one() -> None:
    """Two 4-GPU jobs cost 100 + 120 GPU-s to lose (restart 0, little unsaved), one 8-GPU
    job 160: greedy by cost each would take the two; the cheapest set is the one."""
    run = [running("a", gpus=4, since_checkpoint_s=25.0, restart_s=0.0),
           running("b", gpus=4, since_checkpoint_s=30.0, restart_s=0.0),
           running("c", gpus=8, since_checkpoint_s=20.0, restart_s=0.0)]
    state = fleet(run, [waiting(gpus=8)], batch=tenant("batch", quota_gpus=0))
    assert victims(choose(state)) == [["c"]]
    assert victims(choose(state, order="classic")) == [["a", "b"]]  # its own order: by id


def test_past_the_search_bound_the_most_each_tenant_can_yield_is_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A search stopped before it found a set (bounded: victim_sets.SEARCH_STEPS) still
    preempts: the most each tenant can yield covers the need, minimised."""
    monkeypatch.setattr(victim_sets, "SEARCH_STEPS", 0)
    lo = tenant("lo", quota_gpus=8, borrow_limit_gpus=8)
    run = [running("small", "lo", gpus=4, since_checkpoint_s=10.0),
           running("big", "lo", gpus=8, since_checkpoint_s=600.0),
           running("b1", gpus=2, since_checkpoint_s=10.0)]
    state = fleet(run, [waiting(gpus=8)], more=[lo], batch=tenant("batch", quota_gpus=0))
    for order in ORDERS:
        [decision] = choose(state, order=order)
        assert sorted(*victims([decision])) == ["big"]


def test_the_reason_counts_every_broken_rule() -> None:
    run = [running("s1", stage="startup", gpus=1), running("s2", stage="startup", gpus=1),
           running("sv", saving=True, gpus=1), running("hp", priority=10, gpus=1),
           running("ok", gpus=2)]
    state = fleet(run, [waiting(gpus=6)], batch=tenant("batch", quota_gpus=0))
    [decision] = choose(state)
    assert decision.preemptions == ()
    assert decision.reason == (
        "waits: lacks 6 GPUs (6 wanted, 0 free) and the jobs that may be preempted free only "
        "2; not eligible: 1 of an equal or higher priority, 2 in startup, 1 saving a checkpoint")


# -- which eligible victim each order prefers -----------------------------------------------

def test_stage_aware_prefers_the_least_unsaved_work_then_the_cheapest_restart() -> None:
    old = running("old", since_checkpoint_s=1200.0, admitted_at=NOW - 10.0)
    fresh = running("fresh", since_checkpoint_s=30.0, admitted_at=NOW - 7200.0)
    state = fleet([old, fresh], [waiting()], capacity=16,
                  batch=tenant("batch", quota_gpus=0))
    assert victims(choose(state)) == [["fresh"]]
    assert victims(choose(state, order="classic")) == [["old"]]  # most recently admitted
    cold = running("cold", since_checkpoint_s=30.0, restart_s=600.0, admitted_at=NOW)
    warm = running("warm", since_checkpoint_s=30.0, restart_s=20.0, admitted_at=NOW - 9000.0)
    state = fleet([cold, warm], [waiting()], capacity=16, batch=tenant("batch", quota_gpus=0))
    assert victims(choose(state)) == [["warm"]]


def test_stage_aware_compares_unsaved_work_in_gpu_seconds() -> None:
    small = running("small", gpus=2, since_checkpoint_s=300.0)  # 600 GPU-s
    big = running("big", gpus=8, since_checkpoint_s=100.0)  # 800 GPU-s
    state = fleet([small, big], [waiting(gpus=2)], batch=tenant("batch", quota_gpus=0))
    assert victims(choose(state)) == [["small"]]


def test_classic_takes_from_borrowing_tenants_first_then_the_lowest_priority() -> None:
    guaranteed = tenant("batch", quota_gpus=7)  # 8 held: borrowing 1
    own = tenant("research", quota_gpus=0)  # 8 held: borrowing 8
    low = running("low", "batch", priority=0, admitted_at=NOW)
    borrower = running("borrower", "research", priority=5, admitted_at=NOW - 9000.0)
    state = fleet([low, borrower], [waiting()], batch=guaranteed, more=[own])
    # both borrow, so the lowest priority goes first
    assert victims(choose(state, order="classic")) == [["low"]]
    state = replace(state, tenants={**state.tenants, "batch": tenant("batch", quota_gpus=8)})
    assert victims(choose(state, order="classic")) == [["borrower"]]


# -- free just enough ------------------------------------------------------------------------

def test_only_as_many_victims_as_the_missing_gpus() -> None:
    run = [running(f"v{i}", gpus=4, since_checkpoint_s=10.0 * (i + 1)) for i in range(3)]
    state = fleet(run, [waiting(gpus=6)], capacity=14, batch=tenant("batch", quota_gpus=0))
    [decision] = choose(state)  # 2 free, 4 lacking: one 4-GPU victim is enough
    assert victims([decision]) == [["v0"]]
    assert decision.reason == "frees 4 GPUs for the 4 it lacks (6 wanted, 2 free), from 1 job: v0"


def test_a_greedy_overshoot_is_minimised_from_the_last_pick_back() -> None:
    """The classic order takes 1 + 1 + 4 GPUs for 4 lacking (its order: by id here);
    walking back, the two small ones are not needed. The stage-aware search never takes
    them: the 4-GPU job alone is the cheapest set that frees 4."""
    run = [running("v1", gpus=1, since_checkpoint_s=40.0),  # 40 GPU-s
           running("v2", gpus=1, since_checkpoint_s=60.0),  # 60 GPU-s
           running("v3", gpus=4, since_checkpoint_s=30.0)]  # 120 GPU-s
    state = fleet(run, [waiting(gpus=4)], batch=tenant("batch", quota_gpus=0))
    [decision] = choose(state, order="classic")
    assert victims([decision]) == [["v3"]]
    assert decision.notes == ("v1 was picked, then dropped: the other victims free enough",
                              "v2 was picked, then dropped: the other victims free enough")
    [decision] = choose(state)
    assert (victims([decision]), decision.notes) == ([["v3"]], ())


def test_a_job_that_fits_needs_no_decision_and_reserves_its_gpus() -> None:
    run = [running("v", gpus=4, since_checkpoint_s=10.0)]
    first = waiting("first", gpus=4, waiting_since=NOW - 600.0)
    second = waiting("second", gpus=4, waiting_since=NOW - 60.0)
    state = fleet(run, [second, first], capacity=8, batch=tenant("batch", quota_gpus=0))
    [decision] = choose(state)  # first takes the 4 free GPUs; second needs the victim
    assert decision.for_job == "second"
    assert victims([decision]) == [["v"]]


def test_victims_are_not_chosen_twice_and_service_follows_priority() -> None:
    run = [running("v", gpus=8, since_checkpoint_s=10.0)]
    low = waiting("low", priority=5, waiting_since=NOW - 9000.0)
    high = waiting("high", priority=9, waiting_since=NOW)
    state = fleet(run, [low, high], batch=tenant("batch", quota_gpus=0))
    decisions = choose(state)
    assert [d.for_job for d in decisions] == ["high", "low"]
    assert victims(decisions) == [["v"], []]
    assert decisions[1].reason == (
        "waits: lacks 8 GPUs (8 wanted, 0 free) and the jobs that may be preempted free only "
        "0; not eligible: 1 already preempted for another job")


def test_a_job_that_cannot_be_helped_preempts_nobody() -> None:
    run = [running("a", gpus=4), running("b", gpus=4, stage="recovery")]
    state = fleet(run, [waiting(gpus=8)], batch=tenant("batch", quota_gpus=0))
    [decision] = choose(state)
    assert decision.preemptions == ()
    assert decision.reason == ("waits: lacks 8 GPUs (8 wanted, 0 free) and the jobs that may "
                               "be preempted free only 4; not eligible: 1 in recovery")


def test_a_job_bigger_than_the_fleet_waits() -> None:
    state = fleet([running("v")], [waiting(gpus=9)], batch=tenant("batch", quota_gpus=0))
    [decision] = choose(state)
    assert (decision.preemptions, decision.reason) == (
        (), "waits: wants 9 GPUs, more than the fleet's 8")


def test_a_tenant_at_its_limit_waits_even_with_free_gpus() -> None:
    ads = tenant("ads", priority=10, quota_gpus=4, borrow_limit_gpus=2)
    state = fleet([running("v", "ads", gpus=4)], [waiting(gpus=4)], capacity=16, ads=ads)
    [decision] = choose(state)
    assert (decision.preemptions, decision.reason) == (
        (), "waits: tenant ads would exceed its limit: holds 4 GPUs of 6 (quota 4 + borrow 2), "
            "wants 4 more")
    state = replace(state, running=(running("v", "ads", gpus=6),))
    [decision] = choose(state)
    assert decision.reason == ("waits: tenant ads at its limit: holds 6 GPUs of 6 (quota 4 + "
                               "borrow 2), wants 4 more")
    # reservations count: the first job fits, the second would take ads over its limit
    state = fleet([], [waiting("a", gpus=4, waiting_since=0.0), waiting("b", gpus=4)],
                  capacity=16, ads=ads)
    assert [d.for_job for d in choose(state)] == ["b"]


# -- the formatter and bad input ---------------------------------------------------------------

@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0 s"), (0.5, "0.5 s"), (2.04, "2 s"), (9.96, "10 s"), (40.0, "40 s"),
    (59.4, "59 s"), (59.6, "1 min"), (150.0, "2.5 min"), (600.0, "10 min"),
    (3599.0, "1 h"), (5400.0, "1.5 h"), (86_399.0, "1 d"), (3 * 86_400.0, "3 d"),
    (400 * 86_400.0, "400 d"),
])
def test_durations_read_without_false_precision(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_duration_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=r"seconds: .* is not a duration"):
        format_seconds(bad)


@pytest.mark.parametrize(("state", "message"), [
    (fleet([running("v", "nobody")], []),
     "running job 'v', field 'tenant': 'nobody' is not a known tenant \\(known: ads, batch\\)"),
    (fleet([], [waiting(gpus=0)]), "waiting job 'ads_ranker', field 'gpus': 0 is not at least 1"),
    (fleet([running("x")], [waiting("x")]), "job: 'x' appears more than once"),
    (fleet([running("v")], [], capacity=7),
     "capacity_gpus: 7 is less than the 8 GPUs the running jobs hold"),
    (fleet([running("v", run_s=-1.0)], []), "running job 'v', field 'run_s': -1.0 is negative"),
    (fleet([running("v", stage="paused")], []), "running job 'v', field 'stage': 'paused'"),
    (FleetState(now=NOW, capacity_gpus=0, tenants={"a": tenant("b")}),
     "tenants\\['a'\\].name: 'b' differs from its key"),
])
def test_a_state_the_rules_cannot_judge_is_refused(state: FleetState, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        choose(state)


def test_an_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="order: 'fifo' is not a victim order"):
        choose(fleet([], []), order="fifo")  # type: ignore[arg-type]


# -- properties over random fleets -----------------------------------------------------------

def rules_hold(state: FleetState, w: WaitingJob, r: RunningJob, held: dict[str, int],
               order: VictimOrder) -> bool:
    """The issue's rules, written out again from the state (held: the tenant's GPUs just
    before the pick, reservations included)."""
    policy = state.tenants[r.tenant]
    kept = (r.priority < w.priority and policy.preemptible
            and held[r.tenant] > policy.quota_gpus
            and r.preemptions_today < policy.max_preemptions_per_day)
    if order == "stage_aware":
        kept = kept and r.stage == "training" and not r.saving and r.run_s >= policy.min_run_s
    return kept


def replay(state: FleetState, decisions: list[Decision], order: VictimOrder) -> None:
    """Walk the waiting jobs in service order as the decisions say they go, and check every
    rule, every count, minimality, and that a job left waiting could not have been
    helped by any set of victims."""
    served_order = sorted(state.waiting, key=lambda w: (-w.priority, w.waiting_since, w.job))
    by_job = {d.for_job: d for d in decisions}
    assert len(by_job) == len(decisions)
    assert [d.for_job for d in decisions] == [w.job for w in served_order if w.job in by_job]
    runs = {r.job: r for r in state.running}
    held = {t: sum(r.gpus for r in state.running if r.tenant == t) for t in state.tenants}
    free = state.capacity_gpus - sum(held.values())
    taken: set[str] = set()
    for w in served_order:
        policy = state.tenants[w.tenant]
        decision = by_job.get(w.job, Decision(w.job))
        within_limit = held[w.tenant] + w.gpus <= policy.limit_gpus
        assert decision.reason or w.gpus <= free  # only a job that fits has no decision
        if decision.reason and not decision.preemptions:  # it waits
            assert not within_limit or w.gpus > free
            if within_limit and w.gpus <= state.capacity_gpus:
                assert not feasible_sets(state, w, held, taken, order, w.gpus - free)
            continue
        assert within_limit
        lacking = max(0, w.gpus - free)
        for p in decision.preemptions:
            r = runs[p.victim]
            assert rules_hold(state, w, r, held, order), p.reason
            assert p.victim not in taken
            assert (p.for_job, p.gpus, p.victim_tenant) == (w.job, r.gpus, r.tenant)
            over = held[r.tenant] - state.tenants[r.tenant].quota_gpus
            assert p.reason.startswith(f"preempted {r.job}: tenant {r.tenant} over its "
                                       f"guarantee by {over} GPU")
            held[r.tenant] -= r.gpus
            taken.add(p.victim)
        freed = sum(p.gpus for p in decision.preemptions)
        assert freed >= lacking
        assert all(freed - p.gpus < lacking for p in decision.preemptions)  # minimal
        free += freed - w.gpus
        held[w.tenant] += w.gpus
        assert free >= 0


def feasible_sets(state: FleetState, w: WaitingJob, held: dict[str, int], taken: set[str],
                  order: VictimOrder, lacking: int) -> list[tuple[RunningJob, ...]]:
    """Every set of running jobs that may be taken for `w` in some pick order (each one
    eligible with its tenant's GPUs just before its pick) and frees `lacking` GPUs: by
    brute force over the subsets and, per tenant, the orders of its victims."""
    eligible = [r for r in state.running
                if r.job not in taken and rules_hold(state, w, r, held, order)]
    found = []
    for n in range(1, len(eligible) + 1):
        for subset in itertools.combinations(eligible, n):
            if sum(r.gpus for r in subset) >= lacking and all(
                    some_order(state, w, held, order, [r for r in subset if r.tenant == t])
                    for t in {r.tenant for r in subset}):
                found.append(subset)
    return found


def some_order(state: FleetState, w: WaitingJob, held: dict[str, int], order: VictimOrder,
               own: list[RunningJob]) -> bool:
    for picks in itertools.permutations(own):
        now = dict(held)
        ok = True
        for r in picks:
            if not rules_hold(state, w, r, now, order):
                ok = False
                break
            now[r.tenant] -= r.gpus
        if ok:
            return True
    return False


def shuffled(state: FleetState, rng: random.Random) -> FleetState:
    tenants = list(state.tenants.items())
    rng.shuffle(tenants)
    return replace(state, tenants=dict(tenants),
                   waiting=tuple(rng.sample(state.waiting, len(state.waiting))),
                   running=tuple(rng.sample(state.running, len(state.running))))


@settings(max_examples=300, deadline=None)
@given(state=st.one_of(fleet_states(), fleet_states(contested=True)), rng=st.randoms())
def test_no_decision_breaks_a_rule_whatever_the_state(state: FleetState,
                                                      rng: random.Random) -> None:
    for order in ORDERS:
        decisions = choose(state, order=order)
        replay(state, decisions, order)
        check_yields(state, decisions, order)
        assert choose(shuffled(state, rng), order=order) == decisions  # deterministic


def check_yields(state: FleetState, decisions: list[Decision], order: VictimOrder) -> None:
    """Each victim yields as its state says: at its checkpoint only when the stage-aware
    order takes it and the work that saves is worth the waiting job's longer wait at the
    state's price (written out again here from the docstring's formula); without saving
    only when its exit save is known not to fit the grace; nothing unsaved is lost at a
    checkpoint."""
    runs = {r.job: r for r in state.running}
    waits = {w.job: w for w in state.waiting}
    priorities = [t.priority for t in state.tenants.values()]
    for d in decisions:
        w = waits[d.for_job]
        span = max(priorities) - min(priorities)
        weight = 1.0 if span == 0 else (w.priority - min(priorities)) / span
        for p in d.preemptions:
            r = runs[p.victim]
            grace = state.tenants[r.tenant].grace_s
            cut = r.exit_save_s is not None and r.exit_save_s > grace
            if r.exit_save_s is None:
                now_in, at_risk = grace, r.unsaved_gpu_s
            elif cut:
                now_in, at_risk = 0.0, r.unsaved_gpu_s
            else:
                now_in, at_risk = r.exit_save_s, r.exit_save_s * r.gpus
            waits_for_it = False
            if order == "stage_aware" and r.next_checkpoint_in_s is not None:
                longer = max(0.0, r.next_checkpoint_in_s - max(now_in, grace))
                rate = state.wait_price * max(0.0, min(1.0, weight)) * w.gpus
                commit = (r.commit_wait_s or 0.0) * r.gpus  # held for the commit
                waits_for_it = at_risk - commit >= rate * longer
            assert (p.mode == "at_checkpoint") == waits_for_it, (p, r, w)
            if p.mode == "at_checkpoint":
                assert (p.yield_in_s, p.unsaved_gpu_s, p.skip_save) == (
                    r.next_checkpoint_in_s, 0.0, False)
            else:
                assert p.skip_save == (cut and order == "stage_aware")
                assert p.unsaved_gpu_s == (0.0 if r.exit_save_s is not None and not cut
                                           else r.unsaved_gpu_s)
                assert 0.0 <= p.yield_in_s <= grace


@settings(max_examples=200, deadline=None)
@given(state=fleet_states(max_running=12, max_idle_gpus=2), order=st.sampled_from(ORDERS))
def test_explain_ineligible_says_why_exactly_when_a_rule_is_broken(
        state: FleetState, order: VictimOrder) -> None:
    held = {t: state.held_gpus(t) for t in state.tenants}
    for w in state.waiting:
        for r in state.running:
            text = explain_ineligible(state, w, r, order=order)
            assert (text is None) == rules_hold(state, w, r, held, order), text
