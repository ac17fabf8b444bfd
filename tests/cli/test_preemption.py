"""The preemption controller's acting part (`airflow_ett.plugin.controller`) on real job
directories: requests written in the decision's mode, yielding victims kept out of the
next decision, withdrawals and escalations, and what `airflow-ett preemption run` prints.
Airflow's metadata database and the store are not needed: the train tasks are given."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ett.cli.preemption import _print_tick
from airflow_ett.plugin.controller import Tick, act, settle_requests
from airflow_ett.protocol.request import LEAVE_BY_MARGIN_S, read_request
from airflow_ett.scheduling.live import LiveState
from airflow_ett.scheduling.model import TenantPolicy
from airflow_ett.scheduling.snapshot import OVERDUE_MARGIN_S, TrainTask, fleet_state
from airflow_ett.scheduling.tenants import TenantsConfig
from airflow_ett.scheduling.victims import choose

NOW = 1_800_000_000.0
TENANTS = {"ads": TenantPolicy(name="ads", priority=10, quota_gpus=2),
           "batch": TenantPolicy(name="batch", priority=1, quota_gpus=0, borrow_limit_gpus=2,
                                 min_run_s=0, grace_s=60.0)}
CONFIG = TenantsConfig(tenants=TENANTS, source="test", digest="0", capacity_gpus=2,
                       preemption=True, resume_after_s=5.0)


def task(job: str, state: str, pool: str) -> TrainTask:
    return TrainTask(job=job, dag_id=job, run_id="r", state=state,  # type: ignore[arg-type]
                     pool=pool, pool_slots=2, since=NOW - 600)


def live(job: str, next_checkpoint_in_s: float | None) -> LiveState:
    return LiveState(job=job, tenant="batch", model="m", attempt="1.1", stage="training",
                     saving=False, run_s=500.0, since_checkpoint_s=40.0, preemptions_today=0,
                     restart_s=60.0, admitted_at=NOW - 500, last_event_at=NOW - 1,
                     next_checkpoint_in_s=next_checkpoint_in_s, exit_save_s=10.0)


def job_dir(work: Path, job: str) -> Path:
    from airflow_ett.operators.job import job_paths

    return job_paths(work, job, "r").job_dir


def look(work: Path, tasks: list[TrainTask], lives: dict[str, LiveState | None], *,
         now: float = NOW, config: TenantsConfig = CONFIG) -> Tick:
    """One tick as `tick_once` does it, with the tasks and live states given."""
    for t in tasks:  # a running task's job directory exists
        job_dir(work, t.job).mkdir(parents=True, exist_ok=True)
    yielding, tick = settle_requests(tasks, config, work, now=now)
    state = fleet_state(tasks, {k: v for k, v in lives.items() if k not in yielding},
                        config.tenants, capacity_gpus=config.fleet_gpus, now=now,
                        wait_price=config.checkpoint_wait_price, yielding=yielding)
    return act(state, choose(state), tasks, config, work, now=now, tick=tick)


TASKS = [task("b1", "running", "ett_tenant_batch"), task("a1", "scheduled", "ett_tenant_ads")]


def test_a_victim_near_its_checkpoint_is_asked_to_yield_there_once(tmp_path: Path) -> None:
    tick = look(tmp_path, TASKS, {"b1": live("b1", 45.0)})
    assert tick.requested == ["b1"]
    request = read_request(job_dir(tmp_path, "b1"))
    assert request is not None
    assert (request.mode, request.for_job, request.requested_at, request.grace_s) == (
        "at_checkpoint", "a1", NOW, 60.0)
    assert request.leave_by == NOW + 45.0 + LEAVE_BY_MARGIN_S
    # the next look: b1 yields, a1 holds the GPUs promised; nobody else is asked
    again = look(tmp_path, TASKS, {"b1": live("b1", 35.0)}, now=NOW + 10)
    assert again.requested == [] and again.pending == ["b1"]
    assert again.state is not None and again.state.waiting == ()
    assert [r.job for r in again.state.running] == ["a1"]
    assert read_request(job_dir(tmp_path, "b1")) == request  # untouched


def test_a_victim_without_a_known_checkpoint_is_asked_to_yield_now(tmp_path: Path) -> None:
    look(tmp_path, TASKS, {"b1": live("b1", None)})
    request = read_request(job_dir(tmp_path, "b1"))
    assert request is not None and request.mode == "now" and request.leave_by == NOW


def test_a_request_whose_job_got_gpus_otherwise_is_withdrawn(tmp_path: Path) -> None:
    look(tmp_path, TASKS, {"b1": live("b1", 45.0)})
    started = [TASKS[0], task("a1", "running", "ett_tenant_ads")]
    tick = look(tmp_path, started, {"b1": live("b1", 35.0), "a1": None}, now=NOW + 10)
    assert tick.withdrawn == ["b1"] and tick.pending == [] and tick.requested == []
    assert read_request(job_dir(tmp_path, "b1")) is None
    (aside,) = job_dir(tmp_path, "b1").glob("preempt_request.*.withdrawn.json")
    assert '"mode":"at_checkpoint"' in aside.read_text()
    # its task gone altogether: the same
    look(tmp_path, TASKS, {"b1": live("b1", 45.0)}, now=NOW + 20)
    assert look(tmp_path, TASKS[:1], {"b1": live("b1", 35.0)}, now=NOW + 30
                ).withdrawn == ["b1"]


def test_a_checkpoint_that_never_came_is_escalated_to_now_then_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    look(tmp_path, TASKS, {"b1": live("b1", 45.0)})
    past = NOW + 45.0 + LEAVE_BY_MARGIN_S + 60.0 + OVERDUE_MARGIN_S + 1
    tick = look(tmp_path, TASKS, {"b1": live("b1", 0.0)}, now=past)
    assert tick.escalated == ["b1"] and tick.overdue == [] and tick.requested == []
    request = read_request(job_dir(tmp_path, "b1"))
    assert request is not None and (request.mode, request.leave_by) == ("now", past)
    assert "did not yield at its checkpoint" in caplog.text
    later = look(tmp_path, TASKS, {"b1": live("b1", 0.0)}, now=past + 60 + OVERDUE_MARGIN_S + 1)
    assert later.overdue == ["b1"] and later.escalated == [] and later.pending == ["b1"]
    assert "has not been acted on" in caplog.text


def test_with_preemption_off_nothing_is_written_or_escalated(tmp_path: Path) -> None:
    from dataclasses import replace

    off = replace(CONFIG, preemption=False)
    tick = look(tmp_path, TASKS, {"b1": live("b1", 45.0)}, config=off)
    assert tick.requested == [] and read_request(job_dir(tmp_path, "b1")) is None
    assert [p.victim for d in tick.decisions for p in d.preemptions] == ["b1"]


def test_the_printout_says_who_yields_and_what_was_withdrawn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _print_tick(look(tmp_path, TASKS, {"b1": live("b1", 45.0)}))
    out = capsys.readouterr().out
    assert "1 running, 1 waiting" in out and "yields at its next checkpoint" in out
    assert "[asked to yield]" in out
    _print_tick(look(tmp_path, TASKS, {"b1": live("b1", 35.0)}, now=NOW + 10))
    assert "yielding: b1" in capsys.readouterr().out
    started = [TASKS[0], task("a1", "running", "ett_tenant_ads")]
    _print_tick(look(tmp_path, started, {"b1": live("b1", 35.0), "a1": None}, now=NOW + 20))
    assert "request withdrawn: b1" in capsys.readouterr().out


def test_a_victim_whose_exit_save_cannot_fit_its_grace_is_asked_to_skip_it(
        tmp_path: Path) -> None:
    from dataclasses import replace

    too_slow = replace(live("b1", None), exit_save_s=120.0)  # grace 60 s
    look(tmp_path, TASKS, {"b1": too_slow})
    request = read_request(job_dir(tmp_path, "b1"))
    assert request is not None and (request.mode, request.skip_save) == ("now", True)
    look(tmp_path, TASKS, {"b1": None}, now=NOW + 1)  # pending: nothing rewritten
    assert read_request(job_dir(tmp_path, "b1")) == request
    # a save that fits: saved
    other = tmp_path / "other"
    look(other, TASKS, {"b1": live("b1", None)})
    fits = read_request(job_dir(other, "b1"))
    assert fits is not None and (fits.mode, fits.skip_save) == ("now", False)


def test_an_escalated_request_saves(tmp_path: Path) -> None:
    look(tmp_path, TASKS, {"b1": live("b1", 45.0)})
    past = NOW + 45.0 + LEAVE_BY_MARGIN_S + 60.0 + OVERDUE_MARGIN_S + 1
    look(tmp_path, TASKS, {"b1": live("b1", 0.0)}, now=past)
    request = read_request(job_dir(tmp_path, "b1"))
    assert request is not None and (request.mode, request.skip_save) == ("now", False)


def test_a_claimed_request_is_yielding_never_withdrawn_nor_escalated(
        tmp_path: Path) -> None:
    from airflow_ett.protocol.request import claim_request, read_claimed

    look(tmp_path, TASKS, {"b1": live("b1", 45.0)})
    asked = read_request(job_dir(tmp_path, "b1"))
    assert claim_request(job_dir(tmp_path, "b1"), since=0.0) == asked  # the trainer took it
    again = look(tmp_path, TASKS, {"b1": live("b1", 35.0)}, now=NOW + 10)
    assert again.pending == ["b1"] and again.requested == []
    assert again.state is not None and [r.job for r in again.state.running] == ["a1"]
    started = [TASKS[0], task("a1", "running", "ett_tenant_ads")]
    kept = look(tmp_path, started, {"b1": live("b1", 35.0), "a1": None}, now=NOW + 20)
    assert kept.withdrawn == [] and kept.pending == ["b1"]
    assert read_claimed(job_dir(tmp_path, "b1")) == asked
    past = NOW + 45.0 + LEAVE_BY_MARGIN_S + 60.0 + OVERDUE_MARGIN_S + 1
    late = look(tmp_path, TASKS, {"b1": live("b1", 0.0)}, now=past)
    assert late.escalated == [] and late.overdue == ["b1"] and late.pending == ["b1"]
    assert read_request(job_dir(tmp_path, "b1")) is None  # nothing written over the claim


def test_a_withdrawal_the_trainers_claim_beat_keeps_the_victim_yielding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The race: the controller read the request pending, the trainer claimed it before
    the controller's rename; that withdrawal finds nothing, and the request stands."""
    import airflow_ett.plugin.controller as controller
    from airflow_ett.protocol.request import claim_request, read_claimed

    look(tmp_path, TASKS, {"b1": live("b1", 45.0)})
    asked = read_request(job_dir(tmp_path, "b1"))
    real = controller.pending_requests

    def claimed_right_after_the_look(tasks: list[TrainTask], work: Path) -> object:
        found = real(tasks, work)  # still pending as read...
        claim_request(job_dir(tmp_path, "b1"), since=0.0)  # ...then the trainer claims
        return found

    monkeypatch.setattr(controller, "pending_requests", claimed_right_after_the_look)
    started = [TASKS[0], task("a1", "running", "ett_tenant_ads")]
    tick = look(tmp_path, started, {"b1": live("b1", 35.0), "a1": None}, now=NOW + 10)
    assert tick.withdrawn == [] and tick.pending == ["b1"]
    assert "its trainer claimed the request meanwhile" in caplog.text
    assert read_claimed(job_dir(tmp_path, "b1")) == asked
    assert not list(job_dir(tmp_path, "b1").glob("*.withdrawn.json"))
