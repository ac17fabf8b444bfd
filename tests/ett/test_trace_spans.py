"""The trace spans of a job's events (airflow_ett/ett/trace_spans.py) against the ETT
breakdown of the same events: a phase's spans last what `phases_raw` counts for it, the
first effective step starts where TTS ends, a recovery's first effective step where its
TTR ends, a failure's detection span lasts its detection."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings

from airflow_ett.ett.attribution import JobAttribution, attribute_job
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobSubmitted,
    PhaseEnded,
    PhaseStarted,
    Progress,
    with_rank,
)
from airflow_ett.ett.synthetic import EXAMPLE_SPEC, JobSpec, simulate
from airflow_ett.ett.timeline import to_us
from airflow_ett.ett.trace_spans import (
    DETECTION_SPAN,
    FAILURE_NOTE,
    FIRST_EFFECTIVE_SPAN,
    PHASE_SPAN_PREFIX,
    REPLAY_SPAN,
    SAVE_SPAN,
    Closed,
    Finished,
    Opened,
    SpanAction,
    SpanBuilder,
    high_water_of,
)
from tests.ett.strategies import specs

T0 = 1_780_000_000.0


def build(events: list[Event], **kwargs: object) -> list[SpanAction]:
    builder = SpanBuilder(events[0].job, **kwargs)  # type: ignore[arg-type]
    out: list[SpanAction] = []
    for event in events:
        out += builder.add(event)
    return out + builder.finish(to_us(max(e.ts for e in events)))


def finished(actions: list[SpanAction], name: str) -> list[Finished]:
    return [a for a in actions if isinstance(a, Finished) and a.name == name]


def phase_totals(actions: list[SpanAction]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for a in actions:
        if isinstance(a, Finished) and a.name.startswith(PHASE_SPAN_PREFIX):
            assert a.attributes["ett.phase"] == a.name.removeprefix(PHASE_SPAN_PREFIX)
            totals[str(a.attributes["ett.phase"])] += a.end_us - a.start_us
    return dict(totals)


def check_tree(actions: list[SpanAction]) -> None:
    """Each attempt opens once, then its children, then it closes once."""
    opened: set[str] = set()
    closed: set[str] = set()
    for a in actions:
        if isinstance(a, Opened):
            assert a.attempt not in opened
            opened.add(a.attempt)
        elif isinstance(a, Finished):
            assert a.attempt is None or a.attempt in opened
            assert a.end_us >= a.start_us
        else:
            assert a.attempt in opened and a.attempt not in closed
            closed.add(a.attempt)
    assert opened == closed


def check_against(actions: list[SpanAction], result: JobAttribution) -> None:
    check_tree(actions)
    assert phase_totals(actions) == result.phases_raw_us
    firsts = [a.start_us for a in finished(actions, FIRST_EFFECTIVE_SPAN)]
    if result.started:
        assert firsts[0] == to_us(result.submitted_at) + result.tts_us
    else:
        assert firsts == []
    anchors = {to_us(f.at) for f in result.failures}
    detections = {a.attempt: a.end_us - a.start_us for a in finished(actions, DETECTION_SPAN)}
    for f in result.failures:
        if f.ttr_us is None:
            continue
        # a recovery ends at the next first effective step, the next failure or the end
        assert to_us(f.at) + f.ttr_us in {*firsts, *anchors, to_us(result.ended_at)}
        assert detections.get(f.attempt, 0) == f.detection_us


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_spans_of_a_simulated_job_agree_with_its_attribution(spec: JobSpec) -> None:
    events = simulate(spec)
    check_against(build(events), attribute_job(events))


def test_each_recovery_ends_at_the_next_attempt_s_first_effective_step() -> None:
    events = simulate(EXAMPLE_SPEC)
    result = attribute_job(events)
    actions = build(events)
    check_against(actions, result)
    firsts = {a.attempt: a.start_us for a in finished(actions, FIRST_EFFECTIVE_SPAN)}
    assert list(firsts) == ["1", "2", "3"]
    ttr_ends = [to_us(f.at) + f.ttr_us for f in result.failures if f.ttr_us is not None]
    assert ttr_ends == [firsts["2"], firsts["3"]]
    replays = {a.attempt: (a.start_us, a.end_us) for a in finished(actions, REPLAY_SPAN)}
    assert set(replays) == {"2", "3"}  # each recovery re-reads what its failure lost
    assert [end for _, end in replays.values()] == [firsts["2"], firsts["3"]]
    closed = [a for a in actions if isinstance(a, Closed)]
    assert [c.error for c in closed] == ["infra", "preemption", None]
    assert [n.name for c in closed for n in c.notes] == [FAILURE_NOTE, FAILURE_NOTE]


def _ev(cls: type, n: int, ts: float, **fields: object) -> Event:
    return cls(id=f"e{n}", job="j", ts=T0 + ts, **fields)  # type: ignore[no-any-return]


def _attempt(attempt: str, start: float, end: float, *, c0: int, c1: int,
             status: str = "success", n: int = 0) -> list[Event]:
    """An attempt: starts, a restore, one progress from start+2 to end-1 over [c0, c1)."""
    return [
        _ev(AttemptStarted, n + 1, start, attempt=attempt),
        _ev(PhaseStarted, n + 2, start, attempt=attempt, phase="checkpoint_restore"),
        _ev(PhaseEnded, n + 3, start + 2, attempt=attempt, phase="checkpoint_restore"),
        _ev(Progress, n + 4, end - 1, attempt=attempt, start_ts=T0 + start + 2, step_start=0,
            step_end=10, cursor_start=c0, cursor_end=c1),
        _ev(AttemptEnded, n + 5, end, attempt=attempt, status=status,
            cause="infra" if status == "failed" else None, detected_ts=T0 + end - 0.5
            if status == "failed" else None),
    ]


def test_a_recovery_in_its_own_process_cuts_the_first_step_by_the_earlier_mark() -> None:
    """The second attempt alone, as its process sees it, with the mark the first one left:
    the same first effective step as the whole job's attribution (the progress straddles
    the mark: cut in proportion to the cursor)."""
    before = [_ev(JobSubmitted, 0, 0.0),
              *_attempt("1", 1.0, 20.0, c0=0, c1=1000, status="failed", n=10)]
    after = _attempt("2", 25.0, 45.0, c0=500, c1=1500, n=20)
    result = attribute_job([*before, *after])
    mark = high_water_of(before)
    assert mark == 1000
    actions = build(after, high_water=mark)
    (first,) = finished(actions, FIRST_EFFECTIVE_SPAN)
    (failure,) = result.failures
    assert failure.ttr_us is not None
    assert first.start_us == to_us(failure.at) + failure.ttr_us
    # 27 s -> 44 s over cursor 500 -> 1500: the mark 1000 is crossed half way
    assert first.start_us == to_us(T0 + 35.5)
    (replay,) = finished(actions, REPLAY_SPAN)
    assert (replay.start_us, replay.end_us) == (to_us(T0 + 27.0), first.start_us)
    assert first.attributes["ett.high_water"] == 1000


def test_without_the_earlier_mark_no_first_effective_step_is_marked() -> None:
    events = _attempt("2", 25.0, 45.0, c0=500, c1=1500)
    builder = SpanBuilder("j", high_water_known=False)
    assert builder.needs_high_water
    builder.know_high_water(None, known=False)
    actions = [a for e in events for a in builder.add(e)]
    assert not finished(actions, FIRST_EFFECTIVE_SPAN) and not finished(actions, REPLAY_SPAN)
    assert phase_totals(actions) == {"checkpoint_restore": 2_000_000}


def test_a_save_inside_its_reported_phase_counts_once() -> None:
    """Our trainer's shape: `checkpoint_save_blocking` reported around the save, its
    `checkpoint_saved` coming inside the phase (a synchronous save) or after it (an async
    save's commit); a save no phase reports gets its blocking span from the event."""
    events = [
        _ev(JobSubmitted, 0, 0.0),
        _ev(AttemptStarted, 1, 1.0, attempt="1"),
        _ev(PhaseStarted, 2, 10.0, attempt="1", phase="checkpoint_save_blocking", span="s1"),
        _ev(CheckpointSaved, 3, 11.5, attempt="1", start_ts=T0 + 10.0, step=5, cursor=5,
            blocking_s=1.5, total_s=1.5),
        _ev(PhaseEnded, 4, 12.0, attempt="1", phase="checkpoint_save_blocking", span="s1"),
        _ev(PhaseStarted, 5, 20.0, attempt="1", phase="checkpoint_save_blocking", span="s2"),
        _ev(PhaseEnded, 6, 21.0, attempt="1", phase="checkpoint_save_blocking", span="s2"),
        _ev(CheckpointSaved, 7, 24.0, attempt="1", start_ts=T0 + 20.0, step=9, cursor=9,
            blocking_s=0.75, total_s=4.0),
        _ev(CheckpointSaved, 8, 31.0, attempt="1", start_ts=T0 + 30.0, step=12, cursor=12,
            blocking_s=0.5, total_s=1.0),
        _ev(PhaseStarted, 9, 40.0, attempt="1", phase="final_checkpoint"),
        _ev(CheckpointSaved, 10, 41.0, attempt="1", start_ts=T0 + 40.0, step=15, cursor=15,
            blocking_s=1.0, total_s=1.0, final=True),
        _ev(PhaseEnded, 11, 42.0, attempt="1", phase="final_checkpoint"),
        _ev(AttemptEnded, 12, 43.0, attempt="1", status="success"),
    ]
    result = attribute_job(events)
    actions = build(events)
    check_tree(actions)
    assert phase_totals(actions) == result.phases_raw_us == {
        "checkpoint_save_blocking": 3_500_000, "final_checkpoint": 2_000_000}
    blocking = finished(actions, PHASE_SPAN_PREFIX + "checkpoint_save_blocking")
    assert [(b.start_us, b.end_us) for b in blocking] == [
        (to_us(T0 + 10.0), to_us(T0 + 12.0)), (to_us(T0 + 20.0), to_us(T0 + 21.0)),
        (to_us(T0 + 30.0), to_us(T0 + 30.5))]
    saves = finished(actions, SAVE_SPAN)
    assert [(s.start_us, s.end_us) for s in saves][1] == (to_us(T0 + 20.0), to_us(T0 + 24.0))
    assert [s.attributes["ett.checkpoint.final"] for s in saves] == [False] * 3 + [True]


def test_a_phase_open_at_its_attempt_s_end_runs_to_it_and_an_unreported_attempt_closes(
        ) -> None:
    events = [
        _ev(JobSubmitted, 0, 0.0),
        _ev(AttemptStarted, 1, 1.0, attempt="1", host="h1"),
        # reported late, from before the attempt's start: clipped to it
        _ev(PhaseStarted, 7, 0.5, attempt="1", phase="hardware_setup"),
        _ev(PhaseEnded, 8, 1.5, attempt="1", phase="hardware_setup"),
        _ev(PhaseStarted, 2, 2.0, attempt="1", phase="teardown"),
        _ev(AttemptEnded, 3, 5.0, attempt="1", status="failed", cause="application",
            exit_code=1, message="boom"),
        _ev(PhaseEnded, 4, 6.0, attempt="1", phase="teardown"),  # after: not its span's
        _ev(AttemptStarted, 5, 8.0, attempt="2"),
        _ev(PhaseStarted, 6, 8.5, attempt="2", phase="model_creation"),
    ]
    builder = SpanBuilder("j", attempt_attributes={"ett.attempt_number": 7})
    actions = [a for e in events for a in builder.add(e)]
    actions += builder.finish(to_us(T0 + 10.0))
    check_tree(actions)
    assert phase_totals(actions) == {"hardware_setup": 500_000, "teardown": 3_000_000,
                                     "model_creation": 1_500_000}
    raw = attribute_job(events).phases_raw_us
    assert {k: raw[k] for k in ("hardware_setup", "teardown")} == {
        "hardware_setup": 500_000, "teardown": 3_000_000}
    opened = [a for a in actions if isinstance(a, Opened)]
    assert [o.attributes["ett.attempt_number"] for o in opened] == [7, 7]
    first, second = (a for a in actions if isinstance(a, Closed))
    assert first.error == "application: boom"
    assert first.attributes == {"ett.host": "h1", "ett.status": "failed", "ett.exit_code": 1,
                                "ett.cause": "application"}
    (note,) = first.notes
    assert note.at_us == to_us(T0 + 5.0) and note.attributes["ett.message"] == "boom"
    assert not finished(actions, DETECTION_SPAN)  # no progress: all start-up
    assert second.attributes["ett.status"] == "unreported" and second.error is None
    assert second.end_us == to_us(T0 + 10.0)


def test_other_ranks_are_not_the_attempt_s_word() -> None:
    events = [with_rank(e, 1) for e in _attempt("1", 1.0, 9.0, c0=0, c1=10)]
    assert build(events) == []
