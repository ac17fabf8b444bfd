"""The fleet simulation (airflow_ett/scheduling/fleet_sim.py): one-GPU fleets whose every
time is worked out by hand (who waits, who is preempted when, what it costs, that the
victim still does all its work), then properties over random small fleets (work and GPU
conservation, nothing lost without preemption, every preemption a decision of
`victims.choose`, what each loss is made of), the synthetic workload, determinism."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.scheduling.fleet_sim import (
    POLICIES,
    RESTART_SHARE,
    FleetSimError,
    JobArrival,
    LostGpuSeconds,
    Policy,
    SimulationResult,
    simulate,
    summarise,
)
from airflow_ett.scheduling.fleet_workload import (
    MAX_JOB_GPUS,
    TenantShare,
    derived_shares,
    synthetic_arrivals,
)
from airflow_ett.scheduling.model import MAX_WAIT_PRICE, TenantPolicy, VictimOrder
from airflow_ett.scheduling.victims import choose

HI = TenantPolicy("hi", priority=10, quota_gpus=1)
LO = TenantPolicy("lo", priority=1, quota_gpus=0, borrow_limit_gpus=1, min_run_s=600.0,
                  grace_s=120.0)


def tenants(**lo: Any) -> dict[str, TenantPolicy]:
    return {"hi": HI, "lo": dataclasses.replace(LO, **lo)}


def job(name: str, tenant: str, arrival: float, work_s: float, startup_s: float,
        **kw: Any) -> JobArrival:
    fields: dict[str, Any] = {"checkpoint_interval_s": 1000.0, "checkpoint_save_s": 10.0}
    fields.update(kw)
    priority = HI.priority if tenant == "hi" else LO.priority
    return JobArrival(job=name, tenant=tenant, priority=priority, gpus=1, arrival=arrival,
                      work_s=work_s, startup_s=startup_s, **fields)


#: The low job: starts at 0 (100 s), trains 3000 s with a checkpoint every 1000 s (10 s
#: each; its exit save takes 10 s too), a restart costs 60 s (60% of its start).
LOW = job("low", "lo", 0.0, 3000.0, 100.0)


def high(arrival: float) -> JobArrival:
    return job("high", "hi", arrival, 200.0, 50.0)


def run(arrivals: Sequence[JobArrival], policy: Policy, **lo: Any) -> SimulationResult:
    return simulate(arrivals, tenants(**lo), 1, policy, resume_after_s=30.0,
                    keep_rounds=True)


def outcome(result: SimulationResult, name: str) -> Any:
    [found] = [j for j in result.jobs if j.job == name]
    return found


# -- one GPU, worked out by hand -----------------------------------------------------------

def test_without_preemption_the_high_job_waits_for_the_low_one_to_finish() -> None:
    result = run([LOW, high(500.0)], "none")
    # low: start 0-100, train to 1000 at 1100, save to 1110, 2000 at 2110, save to 2120,
    # done at 3120; high starts then, 50 s of start and 200 s of training
    low, hi = outcome(result, "low"), outcome(result, "high")
    assert (low.finished_at, hi.first_start, hi.finished_at) == (3120.0, 3120.0, 3370.0)
    assert hi.first_wait_s == 2620.0
    assert result.preemptions == () and result.rounds == ()
    assert result.lost_to_preemption == LostGpuSeconds()


def test_stage_aware_preempts_once_the_minimum_run_allows_and_the_victim_still_finishes() -> None:
    result = run([LOW, high(500.0)], "stage_aware")
    # at 500 the low job has run 500 s of its tenant's 600 s minimum: high waits; at 600 it
    # is asked to leave, saves for 10 s, and high starts at 610 and is done at 860
    [p] = result.preemptions
    assert (p.at, p.victim, p.for_job, p.stage, p.saving, p.exit) == (
        600.0, "low", "high", "training", False, "checkpointed")
    assert (p.unsaved_gpu_s, p.wasted_gpu_s, p.save_gpu_s) == (0.0, 0.0, 10.0)
    hi = outcome(result, "high")
    assert (hi.first_start, hi.finished_at, hi.first_wait_s) == (610.0, 860.0, 110.0)
    # low resumes at 860 (its 30 s pause is over), restarts (60 s), trains from its exit
    # checkpoint at 500: checkpoints at 1500 and 2500, done at 3440 with all its work done
    low = outcome(result, "low")
    assert (low.finished_at, low.preemptions, low.new_s, low.replay_s) == (
        3440.0, 1, 3000.0, 0.0)
    assert low.waited_s == 860.0 - 610.0
    assert low.held_s == 610.0 + (3440.0 - 860.0)
    assert low.held_s == low.new_s + low.startup_s + low.save_s  # 3000 + 160 + 30
    assert result.lost_to_preemption == LostGpuSeconds(unsaved=0.0, restart=60.0, save=10.0)
    # ETT% is GPU-seconds over GPU-seconds, E2E from arrival: low 0 -> 3440, high 500 -> 860
    assert (low.e2e_s, hi.e2e_s) == (3440.0, 360.0)
    assert result.e2e_gpu_s == 3440.0 + 360.0
    assert result.ett_pct == pytest.approx(100.0 * (3000.0 + 200.0) / (3440.0 + 360.0))


def test_fleet_ett_weighs_each_job_by_its_gpus_and_counts_its_wait() -> None:
    """A 1-GPU job trains 900 of its 1000 s; a 4-GPU one, arriving with it, waits 1000 s
    for the fleet's 4 GPUs and trains 500 of its 2000 s. Seconds over seconds would say
    1400 / 3000, GPU-seconds over the GPU-seconds held 2900 / 5000 (the wait left out);
    the fleet's ETT% is GPU-seconds over E2E GPU-seconds: 2900 / 9000."""
    one = job("one", "hi", 0.0, 900.0, 100.0, checkpoint_interval_s=5000.0)
    wide = dataclasses.replace(job("wide", "hi", 0.0, 500.0, 500.0,
                                   checkpoint_interval_s=5000.0), gpus=4)
    hi = dataclasses.replace(HI, quota_gpus=4)
    result = simulate([one, wide], {"hi": hi, "lo": LO}, 4, "none")
    assert [(j.job, j.e2e_s, j.new_s, j.held_s) for j in result.jobs] == [
        ("one", 1000.0, 900.0, 1000.0), ("wide", 2000.0, 500.0, 1000.0)]
    assert (result.new_gpu_s, result.held_gpu_s, result.e2e_gpu_s) == (2900.0, 5000.0, 9000.0)
    assert result.ett_pct == pytest.approx(100.0 * 2900.0 / 9000.0)
    assert summarise([result, result], high_priority=10).ett_pct == pytest.approx(
        100.0 * 2900.0 / 9000.0)


def test_classic_ignores_the_minimum_run() -> None:
    result = run([LOW, high(500.0)], "classic")
    [p] = result.preemptions
    assert (p.at, p.exit) == (500.0, "checkpointed")
    assert outcome(result, "high").first_start == 510.0
    low = outcome(result, "low")
    assert (low.finished_at, low.new_s) == (3440.0, 3000.0)  # resumed from 400 at 760


def test_classic_throws_away_a_start_stage_aware_waits_for_the_training() -> None:
    """The high job arrives 50 s into the low job's start (minimum run off)."""
    classic = run([LOW, high(50.0)], "classic", min_run_s=0.0)
    [p] = classic.preemptions
    # it cannot checkpoint: it runs on until the kill at the end of its 120 s grace
    assert (p.at, p.stage, p.exit) == (50.0, "startup", "killed")
    assert (p.unsaved_gpu_s, p.wasted_gpu_s, p.save_gpu_s) == (0.0, 50.0 + 120.0, 0.0)
    assert outcome(classic, "high").first_start == 170.0
    assert classic.lost_to_preemption == LostGpuSeconds(unsaved=170.0, restart=60.0)
    low = outcome(classic, "low")
    assert (low.killed_s, low.new_s) == (120.0, 3000.0)

    ours = run([LOW, high(50.0)], "stage_aware", min_run_s=0.0)
    [p] = ours.preemptions
    assert (p.at, p.stage, p.exit) == (100.0, "training", "checkpointed")  # start over
    assert outcome(ours, "high").first_start == 110.0
    assert ours.lost_to_preemption == LostGpuSeconds(restart=60.0, save=10.0)


def test_classic_breaks_into_a_save_stage_aware_waits_for_its_end() -> None:
    """The high job arrives at 1105, mid-way through the low job's first save."""
    classic = run([LOW, high(1105.0)], "classic", min_run_s=0.0)
    [p] = classic.preemptions
    assert (p.stage, p.saving, p.exit) == ("training", True, "killed")
    # the 1000 s since the start are lost, the 5 s of the save, and the grace
    assert (p.unsaved_gpu_s, p.wasted_gpu_s, p.save_gpu_s) == (1000.0, 120.0, 5.0)
    assert outcome(classic, "high").first_start == 1225.0
    low = outcome(classic, "low")
    assert (low.new_s, low.replay_s) == (3000.0, 1000.0)

    ours = run([LOW, high(1105.0)], "stage_aware", min_run_s=0.0)
    [p] = ours.preemptions
    assert (p.at, p.saving, p.exit, p.unsaved_gpu_s) == (1110.0, False, "checkpointed", 0.0)
    assert outcome(ours, "high").first_start == 1120.0
    assert outcome(ours, "low").replay_s == 0.0


def test_an_exit_save_longer_than_the_grace_is_cut_and_its_work_lost() -> None:
    slow = dataclasses.replace(LOW, exit_save_s=200.0)
    result = run([slow, high(500.0)], "stage_aware")
    [p] = result.preemptions
    assert (p.at, p.exit, p.unsaved_gpu_s, p.save_gpu_s) == (600.0, "cut_by_grace", 500.0,
                                                             120.0)
    assert outcome(result, "high").first_start == 720.0
    # low resumes at 970 from nothing: restart to 1030, replays its 500 s, then new data
    low = outcome(result, "low")
    assert (low.finished_at, low.new_s, low.replay_s) == (4050.0, 3000.0, 500.0)
    assert result.lost_to_preemption == LostGpuSeconds(unsaved=500.0, restart=60.0,
                                                       save=120.0)


def test_a_victim_that_saved_once_yields_at_its_next_checkpoint_once_it_commits() -> None:
    """The low job saved once (at 1000, 1100-1110); its exit save (200 s) does not fit its
    120-s grace. The high job arrives at 1500: the trainer's word says the next save
    begins at 2110 (1000 s of training after the last), and it commits 200 s later: the
    work it saves (390 s) is worth the wait past the grace at the default price, so the
    victim trains on and leaves at 2310, having held its GPU 190 s past the save's
    blocking part for the commit."""
    slow = dataclasses.replace(LOW, exit_save_s=200.0)
    result = run([slow, high(1500.0)], "stage_aware")
    [first] = [r for r in result.rounds if r.at == 1500.0]
    [victim] = first.state.running
    assert victim.next_checkpoint_in_s == pytest.approx(610.0 + 200.0)
    assert victim.commit_wait_s == 190.0  # what the decision counts is what it loses
    [p] = result.preemptions
    assert (p.at, p.exit, p.unsaved_gpu_s, p.save_gpu_s) == (1500.0, "at_checkpoint", 0.0,
                                                             190.0)
    assert outcome(result, "high").first_start == 2310.0
    assert result.lost_to_preemption == LostGpuSeconds(restart=60.0, save=190.0)
    low = outcome(result, "low")
    assert (low.new_s, low.replay_s) == (3000.0, 0.0)


def test_a_victim_that_never_saved_waits_for_its_checkpoint_on_its_tenants_saves() -> None:
    """Job a (tenant lo) runs first, saves once (blocking 10 s of a 200-s save) and ends at
    510; b, of the same tenant, has never saved when the high job arrives at 1200 (590 s
    into its training). The controller knows b's next save begins at 1610 (its word) and
    takes lo's saves for how long it takes: 200 s to the commit, 190 of it past the block,
    and its exit save (200 s) does not fit the grace. So b waits for its checkpoint; it
    commits after b's own save (100 s), at 1710, not when a's said."""
    a = job("a", "lo", 0.0, 400.0, 100.0, checkpoint_interval_s=300.0, exit_save_s=200.0)
    b = job("b", "lo", 1.0, 2000.0, 100.0, exit_save_s=100.0)
    result = run([a, b, high(1200.0)], "stage_aware")
    [first] = [r for r in result.rounds if r.at == 1200.0]
    [victim] = first.state.running
    assert (victim.job, victim.since_checkpoint_s) == ("b", None)
    assert (victim.next_checkpoint_in_s, victim.exit_save_s, victim.commit_wait_s) == (
        pytest.approx(410.0 + 200.0), 200.0, 190.0)
    [p] = result.preemptions
    assert (p.victim, p.exit, p.unsaved_gpu_s, p.save_gpu_s) == ("b", "at_checkpoint", 0.0,
                                                                 90.0)
    assert outcome(result, "high").first_start == 1710.0
    # a tenant that has not saved yet says nothing: b yields now, its save unknown
    alone = run([dataclasses.replace(b, arrival=510.0), high(1200.0)], "stage_aware")
    [first] = [r for r in alone.rounds if r.at == 1200.0]
    [victim] = first.state.running
    assert (victim.next_checkpoint_in_s, victim.exit_save_s, victim.commit_wait_s) == (
        None, None, None)
    assert [p.exit for p in alone.preemptions] == ["checkpointed"]


def test_a_failure_loses_the_work_since_the_checkpoint_and_restarts_in_place() -> None:
    failing = dataclasses.replace(LOW, failures_at_s=(1500.0,))
    for policy in POLICIES:
        result = run([failing], policy)
        # to 1000 at 1100, save to 1110, the failure at 1500 (1610), restart to 1670,
        # replay 1000..1500 to 2170, save at 2000 (2670..2680), done at 3680
        low = outcome(result, "low")
        assert (low.finished_at, low.failures, low.new_s, low.replay_s) == (
            3680.0, 1, 3000.0, 500.0)
        assert result.lost_to_failures == LostGpuSeconds(unsaved=500.0, restart=60.0)
        assert result.lost_to_preemption == LostGpuSeconds()


def test_a_restart_costs_a_share_of_the_start_unless_the_job_says() -> None:
    assert LOW.restart == 100.0 * RESTART_SHARE
    assert dataclasses.replace(LOW, restart_s=20.0).restart == 20.0
    assert LOW.exit_save == LOW.checkpoint_save_s


def test_a_job_may_not_run_while_its_tenant_is_at_its_limit() -> None:
    two = [job("a", "lo", 0.0, 100.0, 10.0), job("b", "lo", 0.0, 100.0, 10.0)]
    result = simulate(two, tenants(), 4, "none")
    a, b = outcome(result, "a"), outcome(result, "b")
    assert (a.first_start, b.first_start) == (0.0, a.finished_at)  # lo's limit is 1 GPU


def test_summaries_pool_runs_of_one_policy() -> None:
    first = run([LOW, high(500.0)], "stage_aware")
    second = run([LOW, high(50.0)], "stage_aware", min_run_s=0.0)
    summary = summarise([first, second], high_priority=10)
    assert (summary.runs, summary.jobs, summary.finished, summary.high_jobs) == (2, 4, 4, 2)
    assert (summary.high_wait_p50_s, summary.high_wait_p90_s) == (85.0, 105.0)  # 60, 110
    assert summary.lost_to_preemption == LostGpuSeconds(restart=120.0, save=20.0)
    assert (summary.preemptions, summary.preemptions_per_job, summary.max_preemptions) == (
        2, 0.5, 1)
    assert summary.exits == {"at_checkpoint": 0, "checkpointed": 2, "left_unsaved": 0,
                             "cut_by_grace": 0, "killed": 0,
                             "withdrawn": 0}
    with pytest.raises(FleetSimError, match=r"policies .* mixed"):
        summarise([first, run([LOW], "none")], high_priority=10)


@pytest.mark.parametrize(("change", "message"), [
    ({"tenant": "nobody"}, "job 'low', field 'tenant': 'nobody' is not a known tenant "
                           r"\(known: hi, lo\)"),
    ({"gpus": 0}, "job 'low', field 'gpus': 0 is not a whole number >= 1"),
    ({"gpus": 2}, r"job 'low', field 'gpus': 2 is more than it can ever hold \(1: the "
                  "fleet's 4, tenant lo's limit 1\\)"),
    ({"work_s": 0.0}, "job 'low', field 'work_s': 0.0 is not a duration > 0"),
    ({"startup_s": -1.0}, "job 'low', field 'startup_s': -1.0 is not a duration >= 0"),
    ({"exit_save_s": math.nan}, "job 'low', field 'exit_save_s': nan is not a duration"),
    ({"failures_at_s": (3000.0,)}, r"field 'failures_at_s': 3000.0 is not inside its "
                                   r"training \(0, 3000.0\)"),
    ({"arrival": math.inf}, "job 'low', field 'arrival': inf is not a time"),
])
def test_a_job_the_simulation_cannot_run_is_refused(change: dict[str, Any],
                                                    message: str) -> None:
    with pytest.raises(FleetSimError, match=message):
        simulate([dataclasses.replace(LOW, **change)], tenants(), 4, "none")


def test_bad_run_arguments_are_refused() -> None:
    with pytest.raises(FleetSimError, match="job: 'low' arrives more than once"):
        simulate([LOW, LOW], tenants(), 1, "none")
    with pytest.raises(FleetSimError, match="policy: 'fifo' is not a policy"):
        simulate([LOW], tenants(), 1, "fifo")  # type: ignore[arg-type]
    with pytest.raises(FleetSimError, match="capacity_gpus: 0 is not a whole number"):
        simulate([LOW], tenants(), 0, "none")
    with pytest.raises(FleetSimError, match=r"resume_after_s: -1\.0 is not a duration"):
        simulate([LOW], tenants(), 1, "none", resume_after_s=-1.0)


# -- properties over random small fleets -----------------------------------------------------

@st.composite
def tenant_maps(draw: st.DrawFn) -> dict[str, TenantPolicy]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3,
                          unique=True))
    return {name: TenantPolicy(
        name=name, priority=draw(st.integers(0, 3)), quota_gpus=draw(st.integers(0, 2)),
        borrow_limit_gpus=draw(st.sampled_from([1, 2, 4, 8])),
        preemptible=draw(st.sampled_from([True] * 5 + [False])),
        min_run_s=draw(st.sampled_from([0.0, 0.0, 100.0, 600.0])),
        grace_s=draw(st.sampled_from([30.0, 120.0])),
        max_preemptions_per_day=draw(st.sampled_from([1, 2, 10])),
    ) for name in names}


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[JobArrival], dict[str, TenantPolicy], int]:
    """Up to 12 jobs on up to 8 GPUs, with times from small sets (ties happen), failures,
    exit saves longer than graces, and starts a restart makes dearer or free. A job's
    priority is its tenant's or above (a priority weight of its own), so that later,
    higher jobs often find lower ones to preempt in every stage."""
    tenants = draw(tenant_maps())
    capacity = draw(st.integers(1, 8))
    jobs = []
    for i in range(draw(st.integers(1, 12))):
        policy = tenants[draw(st.sampled_from(sorted(tenants)))]
        work = draw(st.sampled_from([50.0, 300.0, 1000.0, 2500.0]))
        jobs.append(JobArrival(
            job=f"j{i}", tenant=policy.name, priority=policy.priority + draw(st.integers(0, 3)),
            gpus=draw(st.integers(1, min(capacity, policy.limit_gpus))),
            arrival=draw(st.sampled_from([0.0, 0.0, 10.0, 50.0, 100.0, 700.0, 1130.0, 2000.0])),
            work_s=work, startup_s=draw(st.sampled_from([0.0, 20.0, 100.0, 400.0])),
            checkpoint_interval_s=draw(st.sampled_from([100.0, 300.0, 1000.0])),
            checkpoint_save_s=draw(st.sampled_from([0.0, 5.0, 60.0, 200.0])),
            failures_at_s=tuple(sorted(f * work for f in draw(
                st.lists(st.sampled_from([0.25, 0.5, 0.9]), max_size=2)))),
            restart_s=draw(st.sampled_from([None, 0.0, 30.0, 500.0])),
            exit_save_s=draw(st.sampled_from([None, 10.0, 200.0])),
        ))
    return jobs, tenants, capacity


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def check_conservation(result: SimulationResult, arrivals: Sequence[JobArrival]) -> None:
    asked = {a.job: a for a in arrivals}
    assert len(result.jobs) == len(arrivals)
    for j in result.jobs:
        assert j.finished_at is not None  # run to the end: every job finishes
        assert close(j.new_s, asked[j.job].work_s), j  # its work, all of it, once
        assert close(j.held_s, j.new_s + j.replay_s + j.startup_s + j.save_s + j.killed_s)
        assert j.first_start is not None and j.first_wait_s >= 0 and j.waited_s >= 0
    assert result.peak_gpus <= result.capacity_gpus
    assert result.held_gpu_s <= result.capacity_gpus * (result.end - result.start) + 1e-6
    # every training second thrown away (by a failure or a preemption) is replayed once
    replayed = sum(j.replay_s * j.gpus for j in result.jobs)
    thrown = result.lost_to_failures.unsaved + sum(p.unsaved_gpu_s for p in result.preemptions)
    assert close(replayed, thrown)
    # the preemption losses are exactly what the preemptions cost (restarts as they ran)
    lost = result.lost_to_preemption
    assert close(lost.unsaved, sum(p.unsaved_gpu_s + p.wasted_gpu_s
                                   for p in result.preemptions))
    assert close(lost.save, sum(p.save_gpu_s for p in result.preemptions))
    assert lost.restart <= sum(asked[p.victim].restart * p.gpus
                               for p in result.preemptions if p.exit != "withdrawn") + 1e-6


def check_every_preemption_was_decided_by_choose(result: SimulationResult) -> None:
    order: VictimOrder = "classic" if result.policy == "classic" else "stage_aware"
    decided = []
    for r in result.rounds:
        assert choose(r.state, order=order) == list(r.decisions)  # the same call, again
        decided += [(r.at, p.victim, p.for_job, p.reason) for d in r.decisions
                    for p in d.preemptions]
    applied = [(p.at, p.victim, p.for_job, p.reason) for p in result.preemptions]
    # a yield at a checkpoint is applied when the victim leaves, unless it was withdrawn
    # (the waiting job started first, or the victim finished)
    yields = {(r.at, p.victim, p.for_job, p.reason) for r in result.rounds
              for d in r.decisions for p in d.preemptions if p.mode == "at_checkpoint"}
    assert Counter(decided) - Counter(applied) <= Counter(yields)
    assert not Counter(applied) - Counter(decided)
    assert sum((Counter(decided) - Counter(applied)).values()) == result.withdrawn_yields
    assert [a for a in applied if a not in yields] == [d for d in decided if d not in yields]


@settings(max_examples=200, deadline=None)
@given(fleet=fleets(), price=st.sampled_from([0.0, 0.25, 4.0, MAX_WAIT_PRICE]))
def test_work_and_gpus_are_conserved_and_every_preemption_is_a_choice(
        fleet: tuple[list[JobArrival], dict[str, TenantPolicy], int], price: float) -> None:
    arrivals, tenants, capacity = fleet
    for policy in POLICIES:
        result = simulate(arrivals, tenants, capacity, policy, resume_after_s=30.0,
                          wait_price=price, keep_rounds=True)
        check_conservation(result, arrivals)
        check_every_preemption_was_decided_by_choose(result)
        if policy == "none":
            assert result.preemptions == () and result.rounds == ()
            assert result.lost_to_preemption == LostGpuSeconds()
            assert all(j.waited_s == j.first_wait_s for j in result.jobs)
        if policy == "stage_aware":  # never a start, a replay or a save thrown away
            assert all(p.stage == "training" and not p.saving and p.exit in (
                "at_checkpoint", "checkpointed", "left_unsaved", "cut_by_grace")
                for p in result.preemptions)
            assert all(p.unsaved_gpu_s == 0.0 for p in result.preemptions
                       if p.exit == "at_checkpoint")
        else:
            assert result.withdrawn_yields == 0
            assert all(p.exit != "at_checkpoint" for p in result.preemptions)
        assert simulate(arrivals, tenants, capacity, policy, resume_after_s=30.0,
                        wait_price=price, keep_rounds=True) == result  # deterministic


@settings(max_examples=40, deadline=None)
@given(fleet=fleets(), until=st.sampled_from([0.0, 150.0, 1000.0, 3000.0]))
def test_a_run_cut_short_counts_only_what_happened_by_then(
        fleet: tuple[list[JobArrival], dict[str, TenantPolicy], int], until: float) -> None:
    arrivals, tenants, capacity = fleet
    for policy in POLICIES:
        result = simulate(arrivals, tenants, capacity, policy, until=until)
        assert result.end == until
        assert {j.job for j in result.jobs} == {a.job for a in arrivals if a.arrival <= until}
        assert result.held_gpu_s <= capacity * (until - result.start) + 1e-6
        for j in result.jobs:
            assert j.held_s <= until - j.arrival + 1e-6
            assert close(j.held_s, j.new_s + j.replay_s + j.startup_s + j.save_s + j.killed_s)
            if j.first_start is None:  # still waiting: its wait so far
                assert (j.first_wait_s, j.waited_s, j.held_s) == (until - j.arrival,
                                                                  until - j.arrival, 0.0)
            else:
                assert j.first_wait_s == j.first_start - j.arrival


# -- the synthetic workload --------------------------------------------------------------------

EXAMPLE = {
    "ads-ranking": TenantPolicy("ads-ranking", 100, 24, 16, min_run_s=900.0, grace_s=60.0,
                                max_preemptions_per_day=1),
    "feed-recs": TenantPolicy("feed-recs", 80, 16, 16),
    "foundation-models": TenantPolicy("foundation-models", 50, 16, preemptible=False),
    "ml-platform-ci": TenantPolicy("ml-platform-ci", 10, 8, 24, min_run_s=0.0, grace_s=30.0,
                                   max_preemptions_per_day=10),
}
HOURS_6 = 6 * 3600.0


def test_a_synthetic_fleet_offers_its_load_in_each_tenants_share() -> None:
    arrivals = synthetic_arrivals(EXAMPLE, seed=3, capacity_gpus=16, horizon_s=HOURS_6,
                                  load=1.0)
    assert arrivals == synthetic_arrivals(EXAMPLE, seed=3, capacity_gpus=16,
                                          horizon_s=HOURS_6, load=1.0)
    assert arrivals != synthetic_arrivals(EXAMPLE, seed=4, capacity_gpus=16,
                                          horizon_s=HOURS_6, load=1.0)
    budget = 16 * HOURS_6
    for share in derived_shares(EXAMPLE):
        mine = [a for a in arrivals if a.tenant == share.tenant]
        offered = sum(a.offered_gpu_s for a in mine)
        largest = max(a.offered_gpu_s for a in mine)  # the last one may overshoot
        assert share.load_share * budget <= offered <= share.load_share * budget + largest
    for a in arrivals:
        assert 0 <= a.arrival < HOURS_6 and 1 <= a.gpus <= MAX_JOB_GPUS
        assert a.job.startswith("sim-3-") and a.priority == EXAMPLE[a.tenant].priority
        assert a.restart is not None and a.restart < a.startup_s + 600  # warm cache
        assert a.exit_save >= a.checkpoint_save_s and a.checkpoint_interval_s > 0
    # and a run of it is deterministic too
    for policy in POLICIES:
        assert simulate(arrivals, EXAMPLE, 16, policy, until=HOURS_6) == simulate(
            arrivals, EXAMPLE, 16, policy, until=HOURS_6)


def test_bad_workload_arguments_are_refused() -> None:
    def arrivals(**kw: Any) -> list[JobArrival]:
        args: dict[str, Any] = {"seed": 1, "capacity_gpus": 16, "horizon_s": HOURS_6}
        args.update(kw)
        return synthetic_arrivals(EXAMPLE, **args)

    with pytest.raises(FleetSimError, match="seed: -1 is not a whole number"):
        arrivals(seed=-1)
    with pytest.raises(FleetSimError, match=r"load: 0\.0 is not a number > 0"):
        arrivals(load=0.0)
    with pytest.raises(FleetSimError, match="shares: tenant 'x' is not a tenant given"):
        arrivals(shares=(TenantShare("x", 1.0, ("search",)),))
    with pytest.raises(FleetSimError, match="sources \\['video'\\] are not synthetic"):
        arrivals(shares=(TenantShare("feed-recs", 1.0, ("video",)),))
    with pytest.raises(FleetSimError, match="names a tenant twice"):
        arrivals(shares=(TenantShare("feed-recs", 1.0, ("search",)),
                         TenantShare("feed-recs", 1.0, ("integrity",))))
    with pytest.raises(FleetSimError, match=r"work_scale: 0\.0 is not a number > 0"):
        arrivals(work_scale=0.0)
    with pytest.raises(FleetSimError, match="tenants: none may hold a GPU"):
        synthetic_arrivals({"a": TenantPolicy("a", 1, 0)}, seed=1, capacity_gpus=4,
                           horizon_s=HOURS_6)


def test_the_example_files_shares_are_derived_from_it() -> None:
    """Guarantee plus half the borrowing: 32, 24, 16, 20 of 92; each tenant runs the
    synthetic jobs of its name, the lowest-priority one also those no tenant is named
    after."""
    assert [(s.tenant, round(s.load_share, 3), s.sources) for s in derived_shares(EXAMPLE)] \
        == [("ads-ranking", 0.348, ("ads-ranking",)), ("feed-recs", 0.261, ("feed-recs",)),
            ("foundation-models", 0.174, ("foundation-models",)),
            ("ml-platform-ci", 0.217, ("ml-platform-ci", "search", "integrity"))]


@pytest.mark.parametrize("policies", [
    # two tenants named unlike the synthetic ones: both share the whole synthetic mix
    [TenantPolicy("prod", 9, 3, 1), TenantPolicy("dev", 1, 1, 3, grace_s=30.0)],
    # one named like a synthetic tenant, two not, one that may hold nothing
    [TenantPolicy("search", 5, 2), TenantPolicy("x", 9, 1, 1), TenantPolicy("y", 1, 0, 2),
     TenantPolicy("idle", 3, 0)],
    # a single tenant
    [TenantPolicy("only", 1, 6)],
])
def test_any_tenant_set_makes_a_fleet(policies: list[TenantPolicy]) -> None:
    """Shares and jobs come from any tenants file: every job fits its tenant's limit and
    the fleet, every tenant that may hold a GPU offers its share, and each policy runs."""
    tenants = {p.name: p for p in policies}
    shares = derived_shares(tenants)
    able = [p for p in policies if p.limit_gpus > 0]
    assert [s.tenant for s in shares] == [p.name for p in able]
    assert sum(s.load_share for s in shares) == pytest.approx(1.0)
    arrivals = synthetic_arrivals(tenants, seed=2, capacity_gpus=6, horizon_s=HOURS_6,
                                  load=1.2, work_scale=0.5)
    assert {a.tenant for a in arrivals} == {p.name for p in able}
    for a in arrivals:
        assert 1 <= a.gpus <= min(6, tenants[a.tenant].limit_gpus)
    for policy in POLICIES:
        result = simulate(arrivals, tenants, 6, policy, until=HOURS_6)
        assert result.policy == policy


def test_work_scale_scales_the_training_only() -> None:
    base = synthetic_arrivals(EXAMPLE, seed=5, capacity_gpus=16, horizon_s=HOURS_6)
    longer = synthetic_arrivals(EXAMPLE, seed=5, capacity_gpus=16, horizon_s=HOURS_6,
                                work_scale=2.0)
    first = {a.job: a for a in base}
    both = [(first[a.job], a) for a in longer if a.job in first]
    assert both and all(b.work_s == pytest.approx(2 * a.work_s)
                        and b.checkpoint_interval_s == a.checkpoint_interval_s
                        and b.startup_s == a.startup_s for a, b in both)
    # fewer jobs offer the same load
    assert len(longer) < len(base)
