"""The request's state machine against the files that implement it, and the decisions."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.protocol.request import (
    PreemptRequest,
    archive_claimed,
    archive_request,
    claim_request,
    claimed_path,
    read_request,
    request_path,
    withdraw_request,
    write_request,
)
from airflow_ett.protocol.states import (
    ACTOR,
    ALL_STATES,
    TRANSITIONS,
    Move,
    RequestState,
    apply,
    leave_at_save,
    on_sigterm,
    watch,
)

NOW = 1_800_000_000.0


def _request(mode: str, at: float = NOW, *, skip_save: bool = False,
             leave_in: float = 600.0) -> PreemptRequest:
    return PreemptRequest(victim="v", for_job="w", reason="r", requested_at=at, grace_s=30.0,
                          mode=mode,  # type: ignore[arg-type]
                          leave_by=at + leave_in if mode == "at_checkpoint" else at,
                          skip_save=skip_save)


def _state_of(job_dir: Path) -> RequestState:
    pending = read_request(job_dir)
    return RequestState(None if pending is None else pending.mode,
                        claimed_path(job_dir).exists())


def _do(job_dir: Path, move: Move) -> bool:
    """The move on the files, as its party does it; False when it found nothing."""
    if move is Move.ASK_NOW:
        write_request(job_dir, _request("now"))
    elif move is Move.ASK_AT_CHECKPOINT:
        write_request(job_dir, _request("at_checkpoint"))
    elif move is Move.ESCALATE:  # the controller rewrites a pending at_checkpoint one
        pending = read_request(job_dir)
        if pending is None or pending.mode != "at_checkpoint":
            return False
        write_request(job_dir, _request("now"))
    elif move is Move.WITHDRAW:
        return withdraw_request(job_dir) is not None
    elif move is Move.CLAIM:
        return claim_request(job_dir, since=0.0) is not None
    elif move is Move.ARCHIVE:
        return archive_request(job_dir) is not None
    elif move is Move.TAKE_CLAIMED:
        return archive_claimed(job_dir) is not None
    return True


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(list(Move)), max_size=25))
def test_the_files_follow_the_state_machine(tmp_path_factory: pytest.TempPathFactory,
                                            moves: list[Move]) -> None:
    job_dir = tmp_path_factory.mktemp("job")
    state = RequestState()
    for move in moves:
        expected = apply(state, move)
        acted = _do(job_dir, move)
        assert acted == (expected is not None), (state, move)
        state = expected if expected is not None else state
        assert _state_of(job_dir) == state, (move, state)


def test_every_move_has_one_party_and_every_state_is_reachable() -> None:
    assert set(ACTOR) == set(Move)
    reached = {RequestState()}
    frontier = [RequestState()]
    while frontier:
        state = frontier.pop()
        for move in Move:
            after = apply(state, move)
            if after is not None and after not in reached:
                reached.add(after)
                frontier.append(after)
    assert reached == set(ALL_STATES)
    # only the controller asks; only the trainer claims; only the task archives
    assert {ACTOR[m] for (_, m) in TRANSITIONS if m is Move.CLAIM} == {"trainer"}
    assert apply(RequestState("now"), Move.CLAIM) is None  # a `now` one is the task's
    assert apply(RequestState(None, True), Move.WITHDRAW) is None  # a claim wins


def test_the_task_watch_decides_each_case() -> None:
    began = NOW - 10
    now_req, at_req = _request("now"), _request("at_checkpoint")
    assert watch(None, None, None, began=began, now=NOW).action == "none"
    assert watch(None, _request("now", NOW - 60), None, began=began, now=NOW).action == "stale"
    got = watch(None, now_req, None, began=began, now=NOW)
    assert (got.action, got.held, got.why) == ("act", now_req, "preemption request")
    assert watch(None, at_req, None, began=began, now=NOW) .action == "hold"
    assert watch(None, None, at_req, began=began, now=NOW).action == "hold"  # claimed first
    assert watch(at_req, at_req, None, began=began, now=NOW).action == "none"
    assert watch(at_req, None, at_req, began=began, now=NOW).action == "none"  # it stands
    assert watch(at_req, None, None, began=began, now=NOW).action == "release"
    assert watch(at_req, None, _request("at_checkpoint", NOW - 1), began=began,
                 now=NOW).action == "release"  # another claim is not this one's
    escalated = watch(at_req, now_req, None, began=began, now=NOW)
    assert (escalated.action, escalated.why) == ("act", "preemption request escalated to now")
    late = watch(at_req, None, at_req, began=began, now=at_req.leave_by)
    assert (late.action, late.why) == ("act", "no checkpoint by the request's leave_by")


def test_the_trainer_decisions() -> None:
    assert leave_at_save(None) == "go_on"
    assert leave_at_save(_request("at_checkpoint")) == "leave_after_save"
    assert on_sigterm(None) == "save_and_leave"
    assert on_sigterm(_request("now")) == "save_and_leave"
    assert on_sigterm(_request("now", skip_save=True)) == "leave_unsaved"


def test_a_claim_is_a_rename_the_withdrawal_then_misses(tmp_path: Path) -> None:
    write_request(tmp_path, _request("at_checkpoint", time.time()))
    assert claim_request(tmp_path, since=0.0) is not None
    assert not request_path(tmp_path).exists() and withdraw_request(tmp_path) is None
