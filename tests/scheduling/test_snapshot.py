"""The fleet state the controller hands to `victims.choose`, from Airflow's train tasks
and the store's live states (`airflow_ett.scheduling.snapshot`)."""

from __future__ import annotations

from airflow_ett.protocol.request import PreemptRequest
from airflow_ett.scheduling.live import LiveState
from airflow_ett.scheduling.model import TenantPolicy
from airflow_ett.scheduling.snapshot import (
    DEFAULT_RESTART_S,
    OVERDUE_MARGIN_S,
    TrainTask,
    fleet_state,
    review_requests,
)
from airflow_ett.scheduling.victims import choose

NOW = 1_800_000_000.0
TENANTS = {"ads": TenantPolicy(name="ads", priority=10, quota_gpus=4),
           "batch": TenantPolicy(name="batch", priority=1, quota_gpus=0, borrow_limit_gpus=4,
                                 min_run_s=0)}


def task(job: str, state: str, pool: str, slots: int = 2, since: float = NOW - 600
         ) -> TrainTask:
    return TrainTask(job=job, dag_id=job, run_id="r", state=state,  # type: ignore[arg-type]
                     pool=pool, pool_slots=slots, since=since)


def live(job: str, tenant: str = "batch", stage: str = "training") -> LiveState:
    return LiveState(job=job, tenant=tenant, model="m", attempt="1.1",
                     stage=stage,  # type: ignore[arg-type]
                     saving=False, run_s=500.0, since_checkpoint_s=40.0,
                     preemptions_today=0, restart_s=120.0, admitted_at=NOW - 500,
                     last_event_at=NOW - 1)


def test_waiting_and_running_tasks_become_the_fleet_state() -> None:
    tasks = [task("b1", "running", "ett_tenant_batch", 4),
             task("a1", "scheduled", "ett_tenant_ads", 4, since=NOW - 30),
             task("a2", "queued", "ett_tenant_ads", 2, since=NOW - 10),
             task("x", "running", "default_pool", 1),  # not a tenant's train task
             task("gone", "running", "ett_tenant_retired", 1)]  # tenant no longer in file
    state = fleet_state(tasks, {"b1": live("b1")}, TENANTS, capacity_gpus=4, now=NOW)
    assert [(w.job, w.tenant, w.priority, w.gpus, w.waiting_since) for w in state.waiting] == [
        ("a1", "ads", 10, 4, NOW - 30), ("a2", "ads", 10, 2, NOW - 10)]
    (b1,) = state.running
    assert (b1.job, b1.tenant, b1.priority, b1.gpus, b1.stage, b1.since_checkpoint_s) == (
        "b1", "batch", 1, 4, "training", 40.0)
    assert state.free_gpus == 0
    decision = choose(state)[0]
    assert decision.for_job == "a1" and [p.victim for p in decision.preemptions] == ["b1"]


def test_a_running_job_nothing_has_reported_for_is_in_startup() -> None:
    tasks = [task("b1", "running", "ett_tenant_batch", 4, since=NOW - 90),
             task("a1", "scheduled", "ett_tenant_ads", 4)]
    state = fleet_state(tasks, {"b1": None}, TENANTS, capacity_gpus=4, now=NOW)
    (b1,) = state.running
    assert (b1.stage, b1.run_s, b1.restart_s, b1.admitted_at) == (
        "startup", 90.0, DEFAULT_RESTART_S, NOW - 90)
    (decision,) = choose(state)
    assert decision.preemptions == ()  # never a victim in startup
    assert "startup" in decision.reason


def test_the_pool_decides_the_tenant_and_capacity_covers_what_runs() -> None:
    # the store says another tenant (a renamed tag): the pool holds the slots, it wins
    state = fleet_state([task("b1", "running", "ett_tenant_batch", 4)],
                        {"b1": live("b1", tenant="ads")}, TENANTS, capacity_gpus=2, now=NOW)
    assert state.running[0].tenant == "batch" and state.running[0].priority == 1
    assert state.capacity_gpus == 4  # never less than what is held


# -- yielding victims and their requests -------------------------------------------------

def request(victim: str, for_job: str, *, mode: str = "at_checkpoint", at: float = NOW - 20,
            leave_in: float = 100.0, grace: float = 60.0) -> PreemptRequest:
    return PreemptRequest(victim=victim, for_job=for_job, reason="r", requested_at=at,
                          grace_s=grace, mode=mode,  # type: ignore[arg-type]
                          leave_by=at + (leave_in if mode == "at_checkpoint" else 0.0))


def test_a_yielding_victim_is_out_and_its_job_holds_the_gpus_promised() -> None:
    tasks = [task("b1", "running", "ett_tenant_batch", 4),
             task("a1", "scheduled", "ett_tenant_ads", 4, since=NOW - 30)]
    lives = {"b1": live("b1")}
    before = fleet_state(tasks, lives, TENANTS, capacity_gpus=4, now=NOW)
    (decision,) = choose(before)
    assert [p.victim for p in decision.preemptions] == ["b1"]
    state = fleet_state(tasks, lives, TENANTS, capacity_gpus=4, now=NOW,
                        wait_price=0.5, yielding={"b1": request("b1", "a1")})
    assert state.wait_price == 0.5 and state.waiting == ()
    (a1,) = state.running
    assert (a1.job, a1.tenant, a1.priority, a1.gpus, a1.stage, a1.admitted_at) == (
        "a1", "ads", 10, 4, "startup", NOW - 20)
    assert a1.run_s == 20 and state.free_gpus == 0
    assert choose(state) == []  # nobody waits: no second set of victims for a1


def test_gpus_promised_are_not_taken_again_for_another_job() -> None:
    """Two ads jobs wait; b1 yields to a1: a2 must not get b1's GPUs too, and b2 (the only
    other borrower) is its victim."""
    tasks = [task("b1", "running", "ett_tenant_batch", 2),
             task("b2", "running", "ett_tenant_batch", 2),
             task("a1", "scheduled", "ett_tenant_ads", 2, since=NOW - 30),
             task("a2", "scheduled", "ett_tenant_ads", 2, since=NOW - 10)]
    lives = {"b1": live("b1"), "b2": live("b2")}
    state = fleet_state(tasks, lives, TENANTS, capacity_gpus=4, now=NOW,
                        yielding={"b1": request("b1", "a1")})
    assert [w.job for w in state.waiting] == ["a2"]
    assert sorted(r.job for r in state.running) == ["a1", "b2"]
    (decision,) = choose(state)
    assert decision.for_job == "a2" and [p.victim for p in decision.preemptions] == ["b2"]


def test_the_next_checkpoint_reaches_the_decision_through_the_snapshot() -> None:
    from dataclasses import replace

    tasks = [task("b1", "running", "ett_tenant_batch", 4),
             task("a1", "scheduled", "ett_tenant_ads", 4)]
    soon = replace(live("b1"), next_checkpoint_in_s=45.0, exit_save_s=20.0)
    state = fleet_state(tasks, {"b1": soon}, TENANTS, capacity_gpus=4, now=NOW,
                        wait_price=0.25)
    assert (state.running[0].next_checkpoint_in_s, state.running[0].exit_save_s) == (45, 20)
    (p,) = choose(state)[0].preemptions
    assert (p.mode, p.yield_in_s) == ("at_checkpoint", 45.0)


def test_review_withdraws_an_at_checkpoint_request_whose_job_no_longer_waits() -> None:
    waiting = [task("a1", "scheduled", "ett_tenant_ads"), task("b1", "running", "x"),
               task("b2", "running", "x"), task("b3", "running", "x"),
               task("a3", "running", "ett_tenant_ads")]
    pending = {"b1": request("b1", "a1"),  # a1 waits: kept
               "b2": request("b2", "gone"),  # its job's task is gone: withdrawn
               "b3": request("b3", "a3"),  # a3 got GPUs otherwise: withdrawn
               "b4": request("b4", "gone", mode="now")}  # a `now` one is never withdrawn
    review = review_requests(pending, waiting, now=NOW)
    assert sorted(review.yielding) == ["b1", "b4"]
    assert sorted(review.withdraw) == ["b2", "b3"]
    assert review.escalate == {} and review.overdue == {}
    # past its leave_by the task is already making it leave: kept, not withdrawn
    late = review_requests({"b2": request("b2", "gone", leave_in=10.0)}, waiting, now=NOW)
    assert list(late.yielding) == ["b2"] and late.withdraw == {}


def test_review_escalates_a_checkpoint_that_never_came_and_reports_a_late_now() -> None:
    tasks = [task("a1", "scheduled", "ett_tenant_ads")]
    at = NOW - 1000
    checkpoint = request("b1", "a1", at=at, leave_in=100.0, grace=60.0)
    due = at + 100 + 60 + OVERDUE_MARGIN_S
    assert review_requests({"b1": checkpoint}, tasks, now=due).escalate == {}
    review = review_requests({"b1": checkpoint}, tasks, now=due + 1)
    escalated = review.escalate["b1"]
    assert (escalated.mode, escalated.leave_by, escalated.requested_at) == ("now", due + 1, at)
    assert review.yielding == {"b1": escalated} and review.overdue == {}
    # the escalated request, still pending a grace and a margin later, is overdue
    assert review_requests({"b1": escalated}, tasks, now=due + 1 + 60 + OVERDUE_MARGIN_S
                           ).overdue == {}
    later = review_requests({"b1": escalated}, tasks, now=due + 2 + 60 + OVERDUE_MARGIN_S)
    assert later.overdue == {"b1": escalated} and later.yielding == {"b1": escalated}
    assert later.escalate == {}  # escalated once only


def test_review_keeps_a_claimed_request_yielding_and_only_reports_it_late() -> None:
    """The trainer claimed it (it is leaving on it): its waiting job gone is no reason to
    withdraw it, and past the bound it is overdue, not escalated (no second request)."""
    at = NOW - 1000
    claimed = request("b1", "gone", at=at, leave_in=100.0, grace=60.0)
    due = at + 100 + 60 + OVERDUE_MARGIN_S
    early = review_requests({"b1": claimed}, [], now=at + 10, claimed={"b1"})
    assert early.yielding == {"b1": claimed} and early.withdraw == {}
    late = review_requests({"b1": claimed}, [], now=due + 1, claimed={"b1"})
    assert late.yielding == {"b1": claimed} and late.overdue == {"b1": claimed}
    assert late.escalate == {} and late.withdraw == {}
    # the same request unclaimed: withdrawn early
    assert review_requests({"b1": claimed}, [], now=at + 10).withdraw == {"b1": claimed}
