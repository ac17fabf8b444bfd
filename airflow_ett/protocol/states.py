"""The preemption request's life, as one typed state machine.

Three parties touch a request, each through the job directory (`request.py` holds the
file operations): the **controller** asks (`now` or `at_checkpoint`), escalates an
`at_checkpoint` request to `now`, or withdraws it; the **trainer** claims an
`at_checkpoint` request at a periodic save (a rename, so a claim and a withdrawal cannot
both win); the **task** acts on a `now` request (SIGTERM), archives what was acted on,
and puts aside what an earlier execution left. What the job directory holds at any time
is a `RequestState`: the pending file's mode (or none) and whether a claimed file is
there. `TRANSITIONS` is every move, `apply` its one reading; the file operations are
its implementation (a property test drives both with the same random moves and compares
them, tests/protocol/test_states.py).

`watch` is the task's decision while its trainer runs (the operator's watcher is glue
around it), `leave_at_save` and `on_sigterm` the trainer's: pure functions of what the
files said, so every trainer (ours, a command, an adapter) decides the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final, Literal

from airflow_ett.protocol.request import PreemptRequest
from airflow_ett.scheduling.model import YieldMode

Actor = Literal["controller", "trainer", "task"]


class Move(StrEnum):
    """What a party does to the job directory's request files."""

    ASK_NOW = "ask_now"  # controller: write a `now` request (replaces a pending one)
    ASK_AT_CHECKPOINT = "ask_at_checkpoint"  # controller: write an `at_checkpoint` one
    ESCALATE = "escalate"  # controller: a pending `at_checkpoint` one rewritten as `now`
    WITHDRAW = "withdraw"  # controller: take a pending request back (a rename)
    CLAIM = "claim"  # trainer, at a periodic save: take a pending `at_checkpoint` one
    ARCHIVE = "archive"  # task: the pending request acted on (or stale): set aside
    TAKE_CLAIMED = "take_claimed"  # task: the claimed request archived (left on, or stale)


ACTOR: Final[dict[Move, Actor]] = {
    Move.ASK_NOW: "controller", Move.ASK_AT_CHECKPOINT: "controller",
    Move.ESCALATE: "controller", Move.WITHDRAW: "controller",
    Move.CLAIM: "trainer", Move.ARCHIVE: "task", Move.TAKE_CLAIMED: "task",
}


@dataclass(frozen=True, slots=True)
class RequestState:
    """The job directory's request files: the pending request's mode (None: no
    `preempt_request.json`) and whether `preempt_request.claimed.json` is there."""

    pending: YieldMode | None = None
    claimed: bool = False


def _pending(mode: YieldMode | None) -> tuple[RequestState, ...]:
    return (RequestState(mode, False), RequestState(mode, True))


ALL_STATES: Final = (*_pending(None), *_pending("now"), *_pending("at_checkpoint"))


def _transitions() -> dict[tuple[RequestState, Move], RequestState]:
    """Each legal move from each state, and where it leads. A move that is not here
    changes nothing (`apply` returns None): a withdrawal that finds nothing to rename,
    a claim of a `now` request. A claim while an older claim stands replaces it (the
    task archives a claim once its trainer left, and puts aside an earlier execution's
    before its trainer starts, so only a stale one can be there)."""
    table: dict[tuple[RequestState, Move], RequestState] = {}
    for state in ALL_STATES:
        table[state, Move.ASK_NOW] = replace(state, pending="now")
        table[state, Move.ASK_AT_CHECKPOINT] = replace(state, pending="at_checkpoint")
        if state.pending == "at_checkpoint":
            table[state, Move.ESCALATE] = replace(state, pending="now")
            table[state, Move.CLAIM] = RequestState(None, True)
        if state.pending is not None:
            table[state, Move.WITHDRAW] = replace(state, pending=None)
            table[state, Move.ARCHIVE] = replace(state, pending=None)
        if state.claimed:
            table[state, Move.TAKE_CLAIMED] = replace(state, claimed=False)
    return table


TRANSITIONS: Final = _transitions()


def apply(state: RequestState, move: Move) -> RequestState | None:
    """The state after `move`, or None when the move finds nothing to act on."""
    return TRANSITIONS.get((state, move))


# -- the task's watch -------------------------------------------------------------------

WatchAction = Literal["none", "stale", "hold", "act", "release"]


@dataclass(frozen=True, slots=True)
class Watch:
    """What the task does after one look: `none` (nothing new), `stale` (archive the
    pending request: it predates this execution), `hold` (an `at_checkpoint` request:
    no restart in place; the trainer leaves at its next save), `act` (SIGTERM now:
    `why` says for what), `release` (the held request was withdrawn: restarts in place
    are allowed again). `held` is the request the task holds after it."""

    action: WatchAction
    held: PreemptRequest | None
    why: str = ""


def watch(held: PreemptRequest | None, pending: PreemptRequest | None,
          claimed: PreemptRequest | None, *, began: float, now: float) -> Watch:
    """The task's decision from one look at the job directory while its trainer runs.

    With nothing held: a `now` request is acted on; an `at_checkpoint` one (pending, or
    already claimed by the trainer between two looks) is held; one made before this
    execution `began` is stale. With one held: rewritten as `now` (escalated) or past its
    `leave_by`, act; gone and claimed (the claimed file names its `requested_at`), the
    trainer is leaving on it: hold on; gone and not claimed, it was withdrawn: release."""
    if held is None:
        if pending is None:
            return Watch("hold", claimed) if claimed is not None else Watch("none", None)
        if pending.requested_at < began:
            return Watch("stale", None)
        if pending.mode == "now":
            return Watch("act", pending, "preemption request")
        return Watch("hold", pending)
    if pending is None:
        if claimed is None or claimed.requested_at != held.requested_at:
            return Watch("release", None)
        pending = held  # claimed: it stands
    if pending.mode == "now":
        return Watch("act", pending, "preemption request escalated to now")
    if now >= pending.leave_by:
        return Watch("act", pending, "no checkpoint by the request's leave_by")
    return Watch("none", pending)


# -- the trainer's decisions -------------------------------------------------------------

TrainerAction = Literal["go_on", "leave_after_save", "save_and_leave", "leave_unsaved"]


def leave_at_save(claimed: PreemptRequest | None) -> TrainerAction:
    """At a periodic save: with a request claimed, the attempt leaves once this save has
    committed (no exit save: this one is it); without one, it goes on."""
    return "go_on" if claimed is None else "leave_after_save"


def on_sigterm(pending: PreemptRequest | None) -> TrainerAction:
    """On SIGTERM: checkpoint within the grace and leave, unless the pending request says
    `skip_save` (its save would not fit the grace): then leave at once, unsaved."""
    if pending is not None and pending.mode == "now" and pending.skip_save:
        return "leave_unsaved"
    return "save_and_leave"
