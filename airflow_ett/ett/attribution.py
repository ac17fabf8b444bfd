"""Attribution: a job's events in, its ETT% with the Level-1 and Level-2 breakdown out.

The job's wall time (submission -> GPUs released) is cut into labelled segments that
cover it exactly once. How a moment gets its label, highest precedence first
(docs/decisions/0002-attribution-precedence.md says why):

1. explicit `wasted_training` phases (checkpoint blocking, data waits, stalls);
2. explicit `compilation` phases (a recompile inside a step is the compiler's);
3. progress: effective steps, or replay when the cursor is not past its high-water mark;
4. explicit `initialization`, then `shutdown`, then `scheduling` phases;
5. what the shape of the timeline implies where nobody reported anything: `queued`
   before the first attempt, `rescheduling` between attempts, `startup_other` before an
   attempt's first step, `loop_gap` between steps, `detection` from a failed attempt's
   last step to the moment its failure was noticed, then `failed_attempt_shutdown`,
   `shutdown_other` after a finished attempt's last step, `gpu_release` after the last
   attempt.

Within one component overlapping phases go to the innermost (the one that started
last). Level 1 is read off the same segments, so both levels describe one timeline.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_ett.ett.events import (
    FAILURE_CAUSES,
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobEnded,
    JobSubmitted,
    ModelPublished,
    PhaseEnded,
    PhaseStarted,
    Progress,
    event_to_json,
)
from airflow_ett.ett.phases import (
    COMPILATION,
    COMPONENT_ORDER,
    COMPONENTS,
    EFFECTIVE,
    INITIALIZATION,
    PHASE_ORDER,
    PHASES,
    SCHEDULING,
    SHUTDOWN,
    TTR_STAGES,
    WASTED,
    component_of,
    ttr_stage,
)
from airflow_ett.ett.timeline import US_PER_S, Timeline, paint, resolve_overlaps, to_s, to_us

EFFECTIVE_LABEL = "effective_steps"
REPLAY_LABEL = "replay"
# Labels the model infers where nobody reported anything; any explicit phase may replace them.
IMPLIED_LABELS = frozenset(
    {
        "queued",
        "rescheduling",
        "startup_other",
        "loop_gap",
        "detection",
        "failed_attempt_shutdown",
        "shutdown_other",
        "gpu_release",
    }
)
_ABOVE_PROGRESS = (WASTED, COMPILATION)
_BELOW_PROGRESS = (INITIALIZATION, SHUTDOWN, SCHEDULING)


@dataclass(slots=True)
class _Attempt:
    id: str
    start: int | None = None
    first_seen: int | None = None
    end: int | None = None
    end_key: tuple[int, str] | None = None
    status: str | None = None  # "success", "failed", or None while running
    cause: str | None = None
    detected: int | None = None
    exit_code: int | None = None
    message: str | None = None
    inferred: bool = False
    spans: list[tuple[int, int, int, int]] = field(default_factory=list)
    last_progress_end: int | None = None

    def seen(self, t: int) -> None:
        if self.first_seen is None or t < self.first_seen:
            self.first_seen = t


@dataclass(frozen=True, slots=True)
class AttemptSummary:
    attempt: str
    start: float
    end: float
    status: str  # success | failed | running
    cause: str | None
    exit_code: int | None
    inferred: bool
    effective_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "start": self.start,
            "end": self.end,
            "status": self.status,
            "cause": self.cause,
            "exit_code": self.exit_code,
            "inferred": self.inferred,
            "effective_s": self.effective_s,
        }


@dataclass(frozen=True, slots=True)
class FailureSummary:
    """One failure. `ttr_s` is None when it happened before the first effective step:
    its time is then part of TTS (it still counts in NoF)."""

    attempt: str
    cause: str
    at: float  # the failed attempt's last progress (its start if it made none)
    during_tts: bool
    ttr_us: int | None
    detection_us: int
    stages_us: dict[str, int]
    phases_us: dict[str, int]

    @property
    def ttr_s(self) -> float | None:
        return None if self.ttr_us is None else to_s(self.ttr_us)

    @property
    def ttr_from_detection_s(self) -> float | None:
        return None if self.ttr_us is None else to_s(self.ttr_us - self.detection_us)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "cause": self.cause,
            "at": self.at,
            "during_tts": self.during_tts,
            "ttr_s": self.ttr_s,
            "detection_s": to_s(self.detection_us),
            "ttr_from_detection_s": self.ttr_from_detection_s,
            "stages": {k: to_s(v) for k, v in self.stages_us.items()},
            "phases": {k: to_s(v) for k, v in self.phases_us.items()},
        }


@dataclass(frozen=True, slots=True)
class JobAttribution:
    """Everything known about one job's use of its wall time. Durations are exact
    integer microseconds (`*_us`); `to_dict()` gives seconds."""

    job: str
    tenant: str
    model: str
    dag_id: str | None
    run_id: str | None
    provisional: bool
    submitted_at: float
    ended_at: float
    e2e_us: int
    components_us: dict[str, int]
    phases_us: dict[str, int]
    phases_raw_us: dict[str, int]
    phase_components: dict[str, str]
    tts_us: int
    tts_phases_us: dict[str, int]
    failures: tuple[FailureSummary, ...]
    in_loop_waste_us: int
    shutdown_us: int
    attempts: tuple[AttemptSummary, ...]
    checkpoint_saves: int
    final_checkpoint_saves: int
    csbt_us: int
    checkpoint_total_us: int
    checkpoint_bytes: int
    model_available_after_release_us: int | None
    warnings: tuple[str, ...]
    timeline: Timeline

    @property
    def effective_us(self) -> int:
        return self.components_us[EFFECTIVE]

    @property
    def ett_pct(self) -> float:
        return 100.0 * self.effective_us / self.e2e_us if self.e2e_us > 0 else 0.0

    @property
    def started(self) -> bool:
        """Whether any effective step happened (TTS is then final)."""
        return self.effective_us > 0

    @property
    def ttr_us(self) -> list[int]:
        return [f.ttr_us for f in self.failures if f.ttr_us is not None]

    @property
    def nof(self) -> dict[str, int]:
        counts = Counter(f.cause for f in self.failures)
        out = {cause: counts.get(cause, 0) for cause in FAILURE_CAUSES}
        out["total"] = len(self.failures)
        return out

    def failure_rates(self) -> dict[str, float]:
        """Attempts and failures per attempt, with and without preemption: a raw failure
        count misleads when more attempts simply make more failures."""
        attempts = len(self.attempts)
        failures = len(self.failures)
        preempted = sum(1 for f in self.failures if f.cause == "preemption")
        return {
            "attempts": float(attempts),
            "attempts_without_preemption": float(attempts - preempted),
            "failures_per_attempt": failures / attempts if attempts else 0.0,
            "failures_per_attempt_without_preemption": (
                (failures - preempted) / (attempts - preempted) if attempts > preempted else 0.0
            ),
        }

    def to_dict(self, *, include_timeline: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "tenant": self.tenant,
            "model": self.model,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "provisional": self.provisional,
            "started": self.started,
            "submitted_at": self.submitted_at,
            "ended_at": self.ended_at,
            "ett_pct": self.ett_pct,
            "e2e_s": to_s(self.e2e_us),
            "effective_s": to_s(self.effective_us),
            "tts_s": to_s(self.tts_us),
            "ttr_s": [to_s(v) for v in self.ttr_us],
            "ttr_from_detection_s": [
                f.ttr_from_detection_s for f in self.failures if f.ttr_us is not None
            ],
            "nof": self.nof,
            "in_loop_waste_s": to_s(self.in_loop_waste_us),
            "shutdown_s": to_s(self.shutdown_us),
            "csbt_s": to_s(self.csbt_us),
            "components": {c: to_s(self.components_us[c]) for c in COMPONENTS},
            "phases": {k: to_s(v) for k, v in sorted(self.phases_us.items())},
            "phases_raw": {k: to_s(v) for k, v in sorted(self.phases_raw_us.items())},
            "phase_components": dict(sorted(self.phase_components.items())),
            "tts_phases": {k: to_s(v) for k, v in sorted(self.tts_phases_us.items())},
            "failures": [f.to_dict() for f in self.failures],
            "attempts": [a.to_dict() for a in self.attempts],
            "rates": self.failure_rates(),
            "checkpoints": {
                "saves": self.checkpoint_saves,
                "final_saves": self.final_checkpoint_saves,
                "blocking_s": to_s(self.csbt_us),
                "total_s": to_s(self.checkpoint_total_us),
                "bytes": self.checkpoint_bytes,
            },
            "model_available_after_release_s": (
                None
                if self.model_available_after_release_us is None
                else to_s(self.model_available_after_release_us)
            ),
            "warnings": list(self.warnings),
        }
        if include_timeline:
            base = to_us(self.submitted_at)
            out["timeline"] = [
                [to_s(s - base), to_s(e - base), self.phase_components[label], label]
                for s, e, label in self.timeline.segments()
            ]
        return out


class AttributionError(ValueError):
    """Events that cannot describe one job (e.g. none at all, or several jobs mixed)."""


def dedupe(events: Iterable[Event]) -> tuple[list[Event], int]:
    """One event per id. Two different events under one id are a producer bug; keep the
    one with the smaller JSON form so that the outcome does not depend on arrival order."""
    given = events if isinstance(events, list) else list(events)
    by_id = {event.id: event for event in given}
    if len(by_id) == len(given):  # the common case: no id seen twice
        return given, 0
    conflicts = 0
    for event in given:
        kept = by_id[event.id]
        if kept is not event and kept != event:
            conflicts += 1
            if event_to_json(event) < event_to_json(kept):
                by_id[event.id] = event
    return list(by_id.values()), conflicts


def attribute(events: Iterable[Event], now: float | None = None) -> dict[str, JobAttribution]:
    """Attribute every job found in `events`; keys are job ids, sorted."""
    unique, conflicts = dedupe(events)
    by_job: dict[str, list[Event]] = {}
    for event in unique:
        by_job.setdefault(event.job, []).append(event)
    return {
        job: _attribute_unique(job, by_job[job], now, conflicts=conflicts)
        for job in sorted(by_job)
    }


def attribute_job(events: Iterable[Event], now: float | None = None) -> JobAttribution:
    """Attribute the one job `events` describe."""
    unique, conflicts = dedupe(events)
    jobs = sorted({e.job for e in unique})
    if not jobs:
        raise AttributionError("no events: nothing to attribute")
    if len(jobs) > 1:
        raise AttributionError(f"events of {len(jobs)} jobs given, expected one: {jobs[:5]}")
    return _attribute_unique(jobs[0], unique, now, conflicts=conflicts)


def _attribute_unique(
    job: str, events: list[Event], now: float | None, *, conflicts: int = 0
) -> JobAttribution:
    warnings: list[str] = []
    if conflicts:
        warnings.append(f"{conflicts} event id(s) reused with different content")

    submitted: list[JobSubmitted] = []
    ended: list[JobEnded] = []
    published: list[ModelPublished] = []
    phase_marks: list[PhaseStarted | PhaseEnded] = []
    checkpoints: list[CheckpointSaved] = []
    attempts: dict[str, _Attempt] = {}
    earliest: int | None = None

    def attempt_of(attempt_id: str) -> _Attempt:
        found = attempts.get(attempt_id)
        if found is None:
            found = attempts[attempt_id] = _Attempt(attempt_id)
        return found

    # The hot loop: one pass, progress first (nearly every event is one), names local.
    us = US_PER_S
    rnd = round
    last_attempt: _Attempt | None = None
    for e in events:
        t = rnd(e.ts * us)
        if earliest is None or t < earliest:
            earliest = t
        if isinstance(e, Progress):
            if last_attempt is None or last_attempt.id != e.attempt:
                last_attempt = attempt_of(e.attempt)
            last_attempt.spans.append(
                (rnd(e.start_ts * us), t, e.cursor_start, e.cursor_end)
            )
        elif isinstance(e, PhaseStarted | PhaseEnded):
            phase_marks.append(e)
            if e.attempt is not None:
                attempt_of(e.attempt).seen(t)
        elif isinstance(e, CheckpointSaved):
            checkpoints.append(e)
            attempt_of(e.attempt).seen(to_us(e.start_ts))
        elif isinstance(e, AttemptStarted):
            a = attempt_of(e.attempt)
            a.start = t if a.start is None else min(a.start, t)
        elif isinstance(e, AttemptEnded):
            a = attempt_of(e.attempt)
            a.seen(t)
            # The latest word on an attempt wins (ties by id, so order never matters).
            if a.end_key is None or (t, e.id) > a.end_key:
                a.end_key = (t, e.id)
                a.end = t
                a.status = e.status
                a.cause = e.cause
                a.detected = None if e.detected_ts is None else to_us(e.detected_ts)
                a.exit_code = e.exit_code
                a.message = e.message
        elif isinstance(e, JobSubmitted):
            submitted.append(e)
        elif isinstance(e, JobEnded):
            ended.append(e)
        elif isinstance(e, ModelPublished):
            published.append(e)
    assert earliest is not None
    for a in attempts.values():
        if a.spans:
            a.spans.sort()
            a.seen(a.spans[0][0])

    # --- the job's window ---------------------------------------------------------
    meta = min(submitted, key=lambda s: (s.ts, s.id)) if submitted else None
    if meta is not None:
        submit = to_us(meta.ts)
    else:
        submit = earliest
        warnings.append("no job_submitted event: E2E starts at the earliest event")
    for a in sorted(attempts.values(), key=lambda a: a.id):
        if a.start is None:
            a.start = a.first_seen if a.first_seen is not None else submit
            warnings.append(f"attempt {a.id!r} has no attempt_started: starts at its first event")
    ordered = sorted(attempts.values(), key=lambda a: (a.start, a.id))

    last_end = max(ended, key=lambda x: (x.ts, x.id)) if ended else None
    provisional = False
    if last_end is not None:
        end = to_us(last_end.ts)
        job_status: str | None = last_end.status
    elif ordered and ordered[-1].status == "success" and ordered[-1].end is not None:
        end = ordered[-1].end
        job_status = "success"
    else:
        provisional = True
        end = to_us(time.time() if now is None else now)
        job_status = None
    if end < submit:
        warnings.append("the job ends before it was submitted: E2E is 0")
        end = submit

    # --- attempts: close, order and clip ----------------------------------------------
    for i, a in enumerate(ordered):
        assert a.start is not None
        nxt = ordered[i + 1].start if i + 1 < len(ordered) else None
        if a.end is None:
            if nxt is not None:
                a.end, a.status, a.cause, a.inferred = nxt, "failed", "unknown", True
                warnings.append(f"attempt {a.id!r} never reported its end: failed (unknown) "
                                "when the next attempt started")
            elif job_status is not None:
                a.end, a.inferred = end, True
                a.status = "success" if job_status == "success" else "failed"
                a.cause = None if job_status == "success" else "unknown"
            else:
                a.end = end  # still running
        a.start = min(max(a.start, submit), end)
        limit = end if nxt is None else min(max(nxt, submit), end)
        if a.end > limit:
            if nxt is not None and a.end > nxt:
                warnings.append(f"attempt {a.id!r} overlaps the next one: cut at its start")
            a.end = limit
        a.end = max(a.end, a.start)

    # --- the implied timeline: progress and what the gaps mean --------------------------
    base = Timeline()
    hwm: int | None = None
    t_prev = submit
    for i, a in enumerate(ordered):
        assert a.start is not None and a.end is not None
        base.add(t_prev, a.start, "queued" if i == 0 else "rescheduling")
        t = a.start
        had_progress = False
        a_end = a.end
        for span_start, span_end, c0, c1 in a.spans:
            lo = span_start if span_start > t else t
            if lo > a_end:
                lo = a_end
            hi = span_end if span_end > lo else lo
            if hi > a_end:
                hi = a_end
            if lo > t:
                base.add(t, lo, "loop_gap" if had_progress else "startup_other")
            if (hwm is not None and c1 <= hwm) or c1 == c0:
                base.add(lo, hi, REPLAY_LABEL)
            elif hwm is None or c0 >= hwm:
                base.add(lo, hi, EFFECTIVE_LABEL)
            else:  # straddles the high-water mark: split in proportion to the cursor
                cut = lo + (hi - lo) * (hwm - c0) // (c1 - c0)
                base.add(lo, cut, REPLAY_LABEL)
                base.add(cut, hi, EFFECTIVE_LABEL)
            if hwm is None or c1 > hwm:
                hwm = c1
            had_progress = True
            if hi > t:
                t = hi
        if had_progress:
            a.last_progress_end = t
        if a.status == "failed":
            lower = t
            detected = a.end if a.detected is None else min(max(a.detected, lower), a.end)
            base.add(t, detected, "detection" if had_progress else "startup_other")
            base.add(detected, a.end, "failed_attempt_shutdown")
        elif a.status == "success":
            base.add(t, a.end, "shutdown_other" if had_progress else "startup_other")
        else:
            base.add(t, a.end, "loop_gap" if had_progress else "startup_other")
        t_prev = a.end
    if not ordered:
        base.add(submit, end, "queued")
    elif provisional and ordered[-1].status == "failed":
        base.add(t_prev, end, "rescheduling")
    else:
        base.add(t_prev, end, "gpu_release")

    # --- explicit phases and checkpoint blocking ------------------------------------------
    window = {a.id: (a.start, a.end) for a in ordered}
    explicit, raw, label_component = _explicit_intervals(
        phase_marks, checkpoints, window, submit, end, warnings
    )
    above = [iv for iv in explicit if label_component[iv[2]] in _ABOVE_PROGRESS]
    below = [iv for iv in explicit if label_component[iv[2]] in _BELOW_PROGRESS]
    timeline = paint(base, _flatten(above, label_component, _ABOVE_PROGRESS), lambda _: True)
    timeline = paint(
        timeline, _flatten(below, label_component, _BELOW_PROGRESS), IMPLIED_LABELS.__contains__
    )

    # --- Level 2 ---------------------------------------------------------------------------
    for label in timeline.labels:
        if label not in label_component:
            label_component[label] = PHASES[label].component
    phases_us = timeline.totals()
    components_us = dict.fromkeys(COMPONENTS, 0)
    for label, us in phases_us.items():
        components_us[label_component[label]] += us

    # --- Level 1 ---------------------------------------------------------------------------
    first_eff = timeline.first_start(EFFECTIVE_LABEL)
    last_eff_end = _last_end(timeline, EFFECTIVE_LABEL)
    failed = [a for a in ordered if a.status == "failed"]
    anchors = [a.last_progress_end if a.last_progress_end is not None else a.start
               for a in failed]
    failures: list[FailureSummary] = []
    recoveries: list[tuple[int, int]] = []
    for i, a in enumerate(failed):
        anchor = anchors[i]
        assert anchor is not None and a.cause is not None
        if first_eff is None or anchor < first_eff:
            failures.append(FailureSummary(a.id, a.cause, to_s(anchor), True, None, 0, {}, {}))
            continue
        stop = end
        next_eff = timeline.first_start(EFFECTIVE_LABEL, anchor)
        if next_eff is not None:
            stop = min(stop, next_eff)
        if i + 1 < len(failed):
            next_anchor = anchors[i + 1]
            assert next_anchor is not None
            stop = min(stop, next_anchor)
        stop = max(stop, anchor)
        recoveries.append((anchor, stop))
        inside = timeline.totals(anchor, stop)
        stages = dict.fromkeys(TTR_STAGES, 0)
        for label, us in inside.items():
            stages[ttr_stage(label, label_component[label])] += us
        failures.append(FailureSummary(
            a.id, a.cause, to_s(anchor), False, stop - anchor,
            inside.get("detection", 0), stages, inside,
        ))

    tts_end = end if first_eff is None else first_eff
    shutdown_window: tuple[int, int] | None = None
    # While the job runs, time after its last step is still in the loop, not shutdown.
    if (not provisional and last_eff_end is not None
            and not any(lo >= last_eff_end for lo, _ in recoveries)):
        shutdown_window = (last_eff_end, end)
    in_loop = 0
    if first_eff is not None:
        claimed = sorted(recoveries + ([shutdown_window] if shutdown_window else []))
        cursor = first_eff
        for lo, hi in [*claimed, (end, end)]:
            if lo > cursor:
                gap = timeline.totals(cursor, lo)
                in_loop += sum(gap.values()) - gap.get(EFFECTIVE_LABEL, 0)
            cursor = max(cursor, hi)

    # --- checkpoints, publishing, attempts ---------------------------------------------------
    regular = [c for c in checkpoints if not c.final]
    pub_after = None
    if published and not provisional:
        pub_after = max(0, max(to_us(p.ts) for p in published) - end)
    attempt_rows = tuple(
        AttemptSummary(
            a.id, to_s(a.start or 0), to_s(a.end or 0), a.status or "running", a.cause,
            a.exit_code, a.inferred,
            to_s(timeline.totals(a.start, a.end).get(EFFECTIVE_LABEL, 0)),
        )
        for a in ordered
    )
    return JobAttribution(
        job=job,
        tenant=meta.tenant if meta else "default",
        model=meta.model if meta else "",
        dag_id=meta.dag_id if meta else None,
        run_id=meta.run_id if meta else None,
        provisional=provisional,
        submitted_at=to_s(submit),
        ended_at=to_s(end),
        e2e_us=end - submit,
        components_us=components_us,
        phases_us=phases_us,
        phases_raw_us=raw,
        phase_components={k: label_component[k] for k in set(phases_us) | set(raw)},
        tts_us=tts_end - submit,
        tts_phases_us=timeline.totals(submit, tts_end),
        failures=tuple(failures),
        in_loop_waste_us=in_loop,
        shutdown_us=0 if shutdown_window is None else shutdown_window[1] - shutdown_window[0],
        attempts=attempt_rows,
        checkpoint_saves=len(regular),
        final_checkpoint_saves=len(checkpoints) - len(regular),
        csbt_us=sum(to_us(c.blocking_s) for c in regular),
        checkpoint_total_us=sum(to_us(c.total_s) for c in checkpoints),
        checkpoint_bytes=sum(c.bytes for c in checkpoints),
        model_available_after_release_us=pub_after,
        warnings=tuple(warnings),
        timeline=timeline,
    )


def _explicit_intervals(
    marks: list[PhaseStarted | PhaseEnded],
    checkpoints: list[CheckpointSaved],
    window: dict[str, tuple[int | None, int | None]],
    submit: int,
    end: int,
    warnings: list[str],
) -> tuple[list[tuple[int, int, str]], dict[str, int], dict[str, str]]:
    """Pair phase starts with ends (innermost first), clip each to its attempt, and add
    the checkpoint saves' blocking time. Returns intervals, raw durations per phase
    (overlaps counted in full) and the component of every label seen."""
    intervals: list[tuple[int, int, str]] = []
    raw: dict[str, int] = {}
    label_component: dict[str, str] = {}

    def clip(attempt: str | None, s: int, e: int) -> tuple[int, int]:
        lo, hi = window.get(attempt, (submit, end)) if attempt is not None else (submit, end)
        lo = submit if lo is None else lo
        hi = end if hi is None else hi
        s2 = min(max(s, lo), hi)
        return s2, min(max(e, s2), hi)

    def keep(attempt: str | None, s: int, e: int, label: str, component: str) -> None:
        label_component[label] = component
        s, e = clip(attempt, s, e)
        raw[label] = raw.get(label, 0) + (e - s)
        if e > s:
            intervals.append((s, e, label))

    # A foreign phase name declared under two components stays two labels ("name@component"),
    # so neither declaration overrides the other whatever order the events came in.
    declared: dict[str, set[str]] = {}
    for m in marks:
        if m.phase not in PHASES and m.component is not None:
            declared.setdefault(m.phase, set()).add(m.component)
    ambiguous = sorted(name for name, comps in declared.items() if len(comps) > 1)
    if ambiguous:
        warnings.append(f"phase(s) {ambiguous} declared under several components: kept apart "
                        "as name@component")

    def label_of(phase: str, component: str) -> str:
        return f"{phase}@{component}" if phase in ambiguous else phase

    # Each start remembers its own component: the pair takes the start's declaration.
    open_marks: dict[tuple[str | None, str, str], list[tuple[int, str]]] = {}
    unmatched_ends = 0
    for mark in sorted(marks, key=lambda m: (m.ts, type(m) is PhaseEnded, m.id)):
        key = (mark.attempt, mark.phase, mark.span)
        if type(mark) is PhaseStarted:
            component = component_of(mark.phase, mark.component)
            open_marks.setdefault(key, []).append((to_us(mark.ts), component))
            continue
        stack = open_marks.get(key)
        if not stack:
            unmatched_ends += 1
            continue
        start, component = stack.pop()
        keep(mark.attempt, start, to_us(mark.ts), label_of(mark.phase, component), component)
    for (attempt, phase, _span), starts in sorted(open_marks.items(), key=lambda kv: str(kv[0])):
        for start, component in starts:  # still open: runs to its attempt's end (or the job's)
            keep(attempt, start, end, label_of(phase, component), component)
    if unmatched_ends:
        warnings.append(f"{unmatched_ends} phase_ended event(s) without a start were ignored")

    for c in checkpoints:
        s = to_us(c.start_ts)
        label = "final_checkpoint" if c.final else "checkpoint_save_blocking"
        keep(c.attempt, s, s + to_us(c.blocking_s), label, PHASES[label].component)
    return intervals, raw, label_component


def _flatten(
    intervals: list[tuple[int, int, str]],
    label_component: dict[str, str],
    precedence: tuple[str, ...],
) -> Timeline:
    order = {component: i for i, component in enumerate(precedence)}
    return resolve_overlaps(
        intervals,
        rank=lambda label: order[label_component[label]],
        tie=lambda label: PHASE_ORDER.get(label, len(PHASE_ORDER) + COMPONENT_ORDER[
            label_component[label]]),
    )


def _last_end(timeline: Timeline, label: str) -> int | None:
    for i in range(len(timeline) - 1, -1, -1):
        if timeline.labels[i] == label:
            return timeline.ends[i]
    return None
