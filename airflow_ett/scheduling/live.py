"""One job's live state for the preemption victim choice: its ETT events in, where its
current attempt is (`model.Stage`), whether it is saving, how much work is unsaved and
what a restart would cost out.

This is what decides whether a job may be preempted (`victims.choose` takes victims only
from `training`, never while `saving`), so every rule errs on the side of *not*
preempting: a job wrongly called `training` while it starts, replays or saves loses a
start, a replay or a checkpoint; a job wrongly kept out only waits for the next round.

The rules, each read from the events alone (`live_state`):

- **The current attempt** is the attempt that started last: started at its earliest
  `attempt_started`, or at its earliest event without one (the format tolerates a missing
  start, as the attribution does), ties by id (the attribution's order).
- **Running**: the current attempt has no `attempt_ended` and no `job_ended` came at or
  after its start (a DAG run cleared and re-run starts a new attempt after an old
  `job_ended`). One exception: the train operator publishes in the GPU task *after* the
  last attempt ended (`publish_in_gpu`, a job-level phase, no attempt): while a job-level
  shutdown phase started since the attempt's start is open, the job still holds its GPUs,
  so it is running (`publishing`, or `shutdown` for another such phase).
- **Stage**, the first that applies:
  1. `publishing`: a `publish_in_gpu` phase is open (the attempt's or the job's);
  2. `shutdown`: the attempt has begun to shut down: a phase of the `shutdown` component
     (`final_checkpoint`, `teardown`, or a foreign phase declared so) started in it, open
     or closed, or it committed its final checkpoint (`checkpoint_saved` with `final`);
     or a job-level shutdown phase is open after the attempt ended. Shutdown is sticky:
     those phases come after the last step, and an attempt never trains again after them;
  3. `training`: a `progress` of the attempt read new data: its `cursor_end` passes the
     job's high-water mark (the largest `cursor_end` of every earlier span, this attempt's
     and the earlier attempts') and it read something (`cursor_end > cursor_start`): the
     attribution's own rule for effective steps (docs/events.md, the data cursor);
  4. `recovery`: the attempt made progress, all of it replay (a restore from an older
     checkpoint re-reads data up to the high-water mark);
  5. `startup`: no progress yet: scheduling, initialization, compilation, restore. A span
     is reported when it ends (about a second of steps in the reference trainer), so a
     job is `startup` or `recovery` until the first span on new data *has arrived*: it
     is never called `training` before the events say so.
- **Saving**: a save phase of the attempt is open (`checkpoint_save_blocking`, which a
  trainer may report, or `final_checkpoint`); or a `checkpoint_save_blocking` phase of
  the attempt began after the start of every `checkpoint_saved` it reported (the save it
  opened has not reported its commit yet: its background part is still being written),
  for at most the attempt's longest commit latency so far (`ts - start_ts` of its saves),
  or `UNREPORTED_COMMIT_S` before it has reported one (a producer that reports the phase
  but never a commit is not kept out of preemption for good); or one of its
  `checkpoint_saved` is not complete by `now`. A save is complete at
  `max(ts, start_ts + total_s)`: `ts` is its commit, `start_ts + total_s` when its
  background part ended; a producer that reports when the loop is unblocked (before the
  background part is done) is thus still saving. The reference trainer opens
  `checkpoint_save_blocking` as each periodic save begins, before it takes the save's
  start time, and reports `checkpoint_saved` at the commit; its final save is inside the
  `final_checkpoint` phase (saving, and `shutdown` anyway).
- **since_checkpoint_s**: the training time since the state of the attempt's last
  committed checkpoint (complete by `now`, as above), that is `now - (start_ts +
  blocking_s)`: the loop resumed at `start_ts + blocking_s` and everything trained since
  is not in that checkpoint, even the steps run while its background part was written. A
  preemption now would lose exactly that. None when no checkpoint of *this* attempt is
  complete: a previous attempt's checkpoint was restored, but the time this attempt spent
  since (startup, replay) is lost too. Kept within `[0, run_s]`.
- **preemptions_today**: attempts whose `attempt_ended` (the latest one for the attempt)
  has cause `preemption` and `ts >= day_start` (the tenant's daily cap counts them).
- **restart_s**: what a restart costs before the job trains new data again: the current
  attempt's own time from its start to its first new data (the start of the first span
  passing the high-water mark, or the point where it passes it, by its cursor, for a span
  that straddles it, as the attribution splits it) once it has trained; before that, the
  same figure of the latest earlier attempt that trained (a restart of this job, restore
  and replay included); else None (the caller's default stands).
- **run_s** and **admitted_at**: the current attempt's start, and `now` minus it (at
  least 0). **last_event_at**: the latest `ts` of any of the job's events.
- **exit_save_s**: what a whole save to leave is expected to take: the longest `total_s`
  of the job's `EXIT_SAVE_SAMPLE` latest non-final saves (any attempt; the final one
  belongs to shutdown). The longest, not a mean: an exit save has nothing to overlap
  with, and an estimate too short makes a decision count on a save the grace cuts off;
  with a handful of saves the longest is the high percentile. Before the job's first
  save, its tenant's (the `prior`, below); None without either.
- **commit_wait_s**: how long the job's next save holds its GPUs past the loop's
  blocking part, until the commit (a victim leaving at that checkpoint waits for it
  without training): the median, over the job's `CADENCE_SAMPLE` latest non-final saves,
  of each one's commit (its `ts`, or the end of its background part if later) less its
  start and its `blocking_s`. Before the job's first save, its tenant's; else None.
- **The prior** (`prior`, `save_times.save_prior`): a job that has not saved yet knows
  nothing of how long its saves take, so its tenant's recent saves stand in (the median
  whole save for the next checkpoint's commit, the p90 for the exit save, the median
  commit wait), until its own first save replaces them: a job that announced its first
  save can then be waited for.
- **next_checkpoint_in_s**: when the current attempt's next checkpoint is expected to be
  committed, from `now`, at least 0. The trainer's own word first: the latest `progress`
  span of the attempt carrying `next_save_ts` (when its interval rule expects the next
  save to begin, reported from the loop's first span on, so known before the attempt's
  first save) + the typical `total_s` (below). That word is spent once a save of the
  attempt began at or after the span's `ts` (a `checkpoint_saved` start or a
  `checkpoint_save_blocking` phase: the save it announced, or a later one), and doubted
  once the announced save is `LATE_SAVE_S` late without having begun (a paused loop, a
  hang). A spent or doubted word, or no span of the attempt carrying one (an older or
  another producer): the cadence of its saves decides, as follows (a spent word is the
  common case right after a save, until the next span reaches the store). Its latest non-final
  save's start + the typical gap + the typical `total_s` - `now`. The typical gap is the
  median of the
  job's `CADENCE_SAMPLE` latest gaps between the starts of consecutive non-final saves
  *of one attempt* (a gap across a restart is no interval); the last save of an attempt
  that ended preempted is left out of them (it may be an exit save, which comes early).
  The typical `total_s` is the median over the job's `CADENCE_SAMPLE` latest non-final
  saves (the prior's median before the job's first). So, without the trainer's word, it
  needs a save in the current attempt (an anchor: a restored attempt's first interval
  runs from its replay, which no event dates) and two saves of one attempt, this one or
  an earlier one; with it, a save of the job (any attempt) or the prior to know how long
  one takes. None otherwise, and None while the
  attempt is
  `saving`, in `shutdown`/`publishing`, or when the expected commit is more than a whole
  gap overdue (the cadence broke: a paused loop, a changed interval). Every doubt gives
  None, not a small number: a victim asked to yield at a checkpoint that does not come
  makes the waiting job wait (the request's `leave_by` bounds it).

Events are taken as given, in any order, each id once (`dedupe`, as the attribution);
an event stamped after `now` (a trainer host whose clock runs ahead) counts: ignoring a
save that has begun would be the costly mistake. Every such clock error leans the safe
way: a save complete after `now` is still in progress and not yet committed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Final

from airflow_ett.ett.attribution import dedupe
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobEnded,
    JobSubmitted,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from airflow_ett.ett.phases import PHASES, SHUTDOWN
from airflow_ett.scheduling.model import RunningJob, Stage
from airflow_ett.scheduling.save_times import SavePrior, SaveTime

#: How many of a job's latest non-final saves `exit_save_s` is the longest of.
EXIT_SAVE_SAMPLE: Final = 10
#: How many of a job's latest save gaps (and save durations) the cadence is the median of.
CADENCE_SAMPLE: Final = 5

#: How late an announced save (`Progress.next_save_ts`) may be without having begun before
#: the announcement says nothing any more: a save begins at the first step boundary after
#: it is due, and a step is seconds, not minutes.
LATE_SAVE_S: Final = 300.0

#: The phases that are a checkpoint save while they are open.
SAVE_PHASES: Final = frozenset({"checkpoint_save_blocking", "final_checkpoint"})
#: How long a save whose phase closed is taken to be committing, when its attempt has not
#: reported a commit yet to measure that by.
UNREPORTED_COMMIT_S: Final = 300.0
#: The phase of publishing while the GPUs are held (the train operator's, job-level).
PUBLISH_PHASE: Final = "publish_in_gpu"

# Below every cursor the event format allows (Int64): "no high-water mark yet".
_NO_MARK: Final = -(2**63) - 1


@dataclass(frozen=True, slots=True)
class LiveState:
    """A running job, as far as preemption cares (see the module docstring for each
    field's rule). Times are Unix seconds, durations seconds."""

    job: str
    tenant: str
    model: str
    attempt: str  # the current attempt's id
    stage: Stage
    saving: bool
    run_s: float
    since_checkpoint_s: float | None
    preemptions_today: int
    restart_s: float | None
    admitted_at: float
    last_event_at: float
    next_checkpoint_in_s: float | None = None
    exit_save_s: float | None = None
    commit_wait_s: float | None = None


@dataclass(slots=True)
class _Attempt:
    """One attempt's events, gathered (any order)."""

    id: str
    started: float | None = None  # earliest attempt_started
    first_seen: float = math.inf  # earliest time any of its events names
    end: AttemptEnded | None = None  # the latest attempt_ended
    spans: list[Progress] = field(default_factory=list)
    checkpoints: list[CheckpointSaved] = field(default_factory=list)
    marks: list[PhaseStarted | PhaseEnded] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.started if self.started is not None else self.first_seen

    def note(self, e: Progress | CheckpointSaved | PhaseStarted | PhaseEnded
             | AttemptStarted | AttemptEnded) -> None:
        """One event naming this attempt; a span or a save is seen from its start."""
        self.first_seen = min(self.first_seen,
                              e.start_ts if isinstance(e, Progress | CheckpointSaved) else e.ts)
        if isinstance(e, Progress):
            self.spans.append(e)
        elif isinstance(e, CheckpointSaved):
            self.checkpoints.append(e)
        elif isinstance(e, PhaseStarted | PhaseEnded):
            self.marks.append(e)
        elif isinstance(e, AttemptStarted):
            self.started = e.ts if self.started is None else min(self.started, e.ts)
        elif self.end is None or (e.ts, e.id) > (self.end.ts, self.end.id):
            self.end = e  # the latest attempt_ended wins (ties by id: order never matters)


@dataclass(frozen=True, slots=True)
class _OpenPhase:
    phase: str
    component: str | None
    ts: float


def live_state(events: Sequence[Event], *, now: float, day_start: float,
               prior: SavePrior | None = None) -> LiveState | None:
    """The live state of the one job `events` describe, or None when it does not run now
    (no attempt, its current attempt ended, or the job ended). See the module docstring;
    `prior`: its tenant's recent saves, for a job that has not saved yet.

    Raises ValueError for events of several jobs, or a `now`/`day_start` that is not a
    finite number of seconds."""
    _check_seconds("now", now)
    _check_seconds("day_start", day_start)
    unique, _ = dedupe(events)
    if not unique:
        return None
    jobs = sorted({e.job for e in unique})
    if len(jobs) > 1:
        raise ValueError(f"events: {len(jobs)} jobs given, expected one: {jobs[:5]}")
    attempts, job_marks = _gather(unique)
    if not attempts:
        return None
    ordered = sorted(attempts.values(), key=lambda a: (a.start, a.id))
    current = ordered[-1]
    start = current.start
    if any(isinstance(e, JobEnded) and e.ts >= start for e in unique):
        return None
    job_shutdown = [p for p in _open_phases(job_marks)
                    if p.component == SHUTDOWN and p.ts >= start]
    if current.end is not None and not job_shutdown:
        return None
    new_data_at = _first_new_data(ordered)
    run_s = max(0.0, now - start)
    meta = min((e for e in unique if isinstance(e, JobSubmitted)), key=lambda e: (e.ts, e.id),
               default=None)
    stage = _stage(current, new_data_at, job_shutdown)
    saving = _saving(current, now)
    return LiveState(
        job=jobs[0],
        tenant=meta.tenant if meta is not None else "default",
        model=meta.model if meta is not None else "",
        attempt=current.id,
        stage=stage,
        saving=saving,
        run_s=run_s,
        since_checkpoint_s=_since_checkpoint(current, now, run_s),
        preemptions_today=sum(1 for a in ordered if a.end is not None
                              and a.end.cause == "preemption" and a.end.ts >= day_start),
        restart_s=_restart_s(ordered, new_data_at),
        admitted_at=start,
        last_event_at=max(e.ts for e in unique),
        next_checkpoint_in_s=(_next_checkpoint_in(ordered, current, now, prior)
                              if stage in ("startup", "recovery", "training") and not saving
                              else None),
        exit_save_s=_exit_save_s(ordered, prior),
        commit_wait_s=_commit_wait_s(ordered, prior),
    )


def running_job(state: LiveState, *, priority: int, gpus: int,
                default_restart_s: float) -> RunningJob:
    """The victim choice's view of a live job; `priority` and `gpus` come from the
    scheduler (the task's priority weight, its pool slots), `default_restart_s` stands
    where the job has no measured restart yet (`restart_s` None)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus = {gpus!r}: must be a whole number of GPUs >= 1")
    if not (math.isfinite(default_restart_s) and default_restart_s >= 0):
        raise ValueError(f"default_restart_s = {default_restart_s!r}: must be a finite number "
                         "of seconds >= 0")
    return RunningJob(
        job=state.job,
        tenant=state.tenant,
        priority=priority,
        gpus=gpus,
        stage=state.stage,
        run_s=state.run_s,
        since_checkpoint_s=state.since_checkpoint_s,
        saving=state.saving,
        preemptions_today=state.preemptions_today,
        restart_s=state.restart_s if state.restart_s is not None else default_restart_s,
        admitted_at=state.admitted_at,
        next_checkpoint_in_s=state.next_checkpoint_in_s,
        exit_save_s=state.exit_save_s,
        commit_wait_s=state.commit_wait_s,
    )


def _check_seconds(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} = {value!r}: must be a finite number of Unix seconds")


def _gather(events: Sequence[Event]) -> tuple[dict[str, _Attempt],
                                              list[PhaseStarted | PhaseEnded]]:
    """Each attempt's events, and the phase marks of no attempt (the operator's)."""
    attempts: dict[str, _Attempt] = {}
    job_marks: list[PhaseStarted | PhaseEnded] = []
    for e in events:
        if e.rank:  # rank 0 leads a multi-rank job (docs/decisions/0017-multi-rank.md)
            continue
        if isinstance(e, PhaseStarted | PhaseEnded) and e.attempt is None:
            job_marks.append(e)
        elif isinstance(e, Progress | CheckpointSaved | PhaseStarted | PhaseEnded
                        | AttemptStarted | AttemptEnded):
            attempt_id = e.attempt
            assert attempt_id is not None  # a phase of no attempt went to job_marks
            found = attempts.get(attempt_id)
            if found is None:
                found = attempts[attempt_id] = _Attempt(attempt_id)
            found.note(e)
    return attempts, job_marks


def _component(mark: PhaseStarted | PhaseEnded) -> str | None:
    known = PHASES.get(mark.phase)
    return known.component if known is not None else mark.component


def _phases(marks: Sequence[PhaseStarted | PhaseEnded]
            ) -> tuple[list[_OpenPhase], list[_OpenPhase]]:
    """Every phase started, and those still open: starts paired with the next end of the
    same (phase, span), the latest open start first (the attribution's pairing)."""
    started: list[_OpenPhase] = []
    stacks: dict[tuple[str, str], list[_OpenPhase]] = {}
    for mark in sorted(marks, key=lambda m: (m.ts, type(m) is PhaseEnded, m.id)):
        stack = stacks.setdefault((mark.phase, mark.span), [])
        if type(mark) is PhaseStarted:
            phase = _OpenPhase(mark.phase, _component(mark), mark.ts)
            started.append(phase)
            stack.append(phase)
        elif stack:
            stack.pop()
    return started, [p for stack in stacks.values() for p in stack]


def _open_phases(marks: Sequence[PhaseStarted | PhaseEnded]) -> list[_OpenPhase]:
    return _phases(marks)[1]


def _first_new_data(ordered: Sequence[_Attempt]) -> dict[str, float]:
    """Per attempt that read new data, when it began to: the start of its first span past
    the high-water mark, or the point where a straddling span passes it (by the cursor)."""
    out: dict[str, float] = {}
    hwm = _NO_MARK
    for a in ordered:
        for span in sorted(a.spans, key=lambda p: (p.start_ts, p.ts, p.cursor_start,
                                                   p.cursor_end, p.id)):
            c0, c1 = span.cursor_start, span.cursor_end
            if a.id not in out and c1 > hwm and c1 > c0:
                lo = max(span.start_ts, a.start)
                hi = max(span.ts, lo)
                share = 0.0 if c0 >= hwm else (hwm - c0) / (c1 - c0)
                out[a.id] = lo + (hi - lo) * share
            hwm = max(hwm, c1)
    return out


def _stage(current: _Attempt, new_data_at: dict[str, float],
           job_shutdown: Sequence[_OpenPhase]) -> Stage:
    started, still_open = _phases(current.marks)
    if any(p.phase == PUBLISH_PHASE for p in [*still_open, *job_shutdown]):
        return "publishing"
    if (job_shutdown or any(p.component == SHUTDOWN for p in started)
            or any(c.final for c in current.checkpoints)):
        return "shutdown"
    if current.id in new_data_at:
        return "training"
    if current.spans:
        return "recovery"
    return "startup"


def _complete_at(c: CheckpointSaved) -> float:
    """When a save is complete: its commit, or the end of its background part if later."""
    return max(c.ts, c.start_ts + c.total_s)


def _saving(current: _Attempt, now: float) -> bool:
    started, still_open = _phases(current.marks)
    if any(p.phase in SAVE_PHASES for p in still_open):
        return True
    if any(_complete_at(c) > now for c in current.checkpoints):
        return True
    last_reported = max((c.start_ts for c in current.checkpoints), default=-math.inf)
    latency = max((c.ts - c.start_ts for c in current.checkpoints),
                  default=UNREPORTED_COMMIT_S)
    return any(p.phase == "checkpoint_save_blocking" and p.ts > last_reported
               and now < p.ts + latency for p in started)


def _since_checkpoint(current: _Attempt, now: float, run_s: float) -> float | None:
    resumed = [c.start_ts + c.blocking_s for c in current.checkpoints if _complete_at(c) <= now]
    if not resumed:
        return None
    return min(run_s, max(0.0, now - max(resumed)))


def _restart_s(ordered: Sequence[_Attempt], new_data_at: dict[str, float]) -> float | None:
    """The latest attempt's (the current one first) time from its start to new data."""
    for a in reversed(ordered):
        if a.id in new_data_at:
            return max(0.0, new_data_at[a.id] - a.start)
    return None


def _periodic(a: _Attempt) -> list[CheckpointSaved]:
    """An attempt's non-final saves, by start (ties by id: order never matters)."""
    return sorted((c for c in a.checkpoints if not c.final), key=lambda c: (c.start_ts, c.id))


def _saves(ordered: Sequence[_Attempt]) -> list[CheckpointSaved]:
    """The job's non-final saves, every attempt's, by start."""
    return sorted((c for a in ordered for c in _periodic(a)), key=lambda c: (c.start_ts, c.id))


def _exit_save_s(ordered: Sequence[_Attempt], prior: SavePrior | None) -> float | None:
    recent = _saves(ordered)[-EXIT_SAVE_SAMPLE:]
    if not recent:
        return prior.exit_s if prior is not None else None
    return max(_whole_s(c) for c in recent)


def _whole_s(c: CheckpointSaved) -> float:
    """A save from its start to its commit (or its background's end, if later): what an
    exit save holds the GPUs for, measured as `commit_wait_s` is, so that yielding now
    and yielding at the next checkpoint are priced on the same clock (the commit is
    stamped after `total_s` is taken: on a loaded host the two differ by more than a
    small model's whole save)."""
    return max(0.0, _complete_at(c) - c.start_ts)


def save_time(c: CheckpointSaved) -> SaveTime:
    """One save's figures for the prior (`save_times.SaveTime`): its whole time, start to
    commit (`_whole_s`), and its commit (its `ts`, or the end of its background part if
    later) past its start and its blocking part."""
    return SaveTime(total_s=_whole_s(c),
                    commit_wait_s=max(0.0, _complete_at(c) - c.start_ts - max(0.0, c.blocking_s)))


def _commit_wait_s(ordered: Sequence[_Attempt], prior: SavePrior | None) -> float | None:
    recent = _saves(ordered)[-CADENCE_SAMPLE:]
    if not recent:
        return prior.commit_wait_s if prior is not None else None
    return _median([save_time(c).commit_wait_s for c in recent])


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _typical_save_s(ordered: Sequence[_Attempt], prior: SavePrior | None) -> float | None:
    """The median `total_s` of the job's `CADENCE_SAMPLE` latest non-final saves; before
    its first, the prior's."""
    recent = _saves(ordered)[-CADENCE_SAMPLE:]
    if not recent:
        return prior.typical_s if prior is not None else None
    return _median([max(0.0, c.total_s) for c in recent])


def _announced_save(current: _Attempt, now: float) -> tuple[bool, float | None]:
    """Whether the trainer reports its schedule in this attempt (a span carrying
    `next_save_ts`; if not, the cadence decides), and when its latest word says the next
    save begins (None: spent or late; see the module docstring)."""
    said = [p for p in current.spans if p.next_save_ts is not None]
    if not said:
        return False, None
    latest = max(said, key=lambda p: (p.ts, p.id))
    begun = [c.start_ts for c in _periodic(current)]
    begun += [p.ts for p in _phases(current.marks)[0] if p.phase == "checkpoint_save_blocking"]
    if any(b >= latest.ts for b in begun):
        return True, None  # the save it announced (or a later one) began: the next word
    assert latest.next_save_ts is not None
    if now - latest.next_save_ts > LATE_SAVE_S:
        return True, None
    return True, latest.next_save_ts


def _next_checkpoint_in(ordered: Sequence[_Attempt], current: _Attempt,
                        now: float, prior: SavePrior | None) -> float | None:
    """See the module docstring (`next_checkpoint_in_s`); `ordered` by attempt start."""
    reported, announced = _announced_save(current, now)
    if reported and announced is not None:
        total = _typical_save_s(ordered, prior)
        return None if total is None else max(0.0, announced + total - now)
    # No word from the trainer, or its word is spent (the save it announced has begun,
    # and its next word has not reached the store yet: on a loaded host that gap is
    # seconds, right when a controller looks after a save) or late: the cadence decides
    mine = _periodic(current)
    if not mine:
        return None  # no anchor: when this attempt's interval began is unknown
    gaps: list[tuple[float, float]] = []  # (the later save's start, the gap)
    for a in ordered:
        periodic = _periodic(a)
        if a is not current and a.end is not None and a.end.cause == "preemption":
            periodic = periodic[:-1]  # maybe its exit save: not an interval
        gaps += [(b.start_ts, b.start_ts - p.start_ts) for p, b in pairwise(periodic)
                 if b.start_ts > p.start_ts]
    if not gaps:
        return None
    gap = _median([g for _, g in sorted(gaps)[-CADENCE_SAMPLE:]])
    total = _typical_save_s(ordered, prior)
    assert total is not None  # a gap means two saves
    due = mine[-1].start_ts + gap + total - now
    if due < -gap:
        return None  # a whole interval overdue: the cadence no longer says anything
    return max(0.0, due)
