"""Hypothesis strategies for the ETT model's property tests: simulated jobs (`specs`) and
arbitrary valid event soups of one job (`soups`), shared by tests/ett/test_properties.py and
tests/ett/test_window.py."""

from __future__ import annotations

from hypothesis import strategies as st

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
from airflow_ett.ett.phases import COMPONENTS, PHASES
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec

NOW = 1_000.0
REPORTABLE = sorted(name for name, p in PHASES.items() if not p.derived)

durations = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 7.5])
failure = st.builds(
    InjectedFailure,
    at_step=st.integers(1, 40),
    cause=st.sampled_from(["preemption", "infra", "application", "unknown"]),
    detection_s=durations,
    shutdown_s=durations,
    reschedule_s=durations,
)
specs = st.builds(
    JobSpec,
    queue_s=durations,
    parallel_init=st.booleans(),
    restore_s=durations,
    steps=st.integers(1, 40),
    step_s=st.sampled_from([0.25, 0.5, 1.0]),
    progress_every=st.integers(1, 7),
    checkpoint_every=st.integers(0, 12),
    checkpoint_blocking_s=durations,
    final_checkpoint_s=durations,
    teardown_s=durations,
    failures=st.lists(failure, max_size=3).map(tuple),
)


@st.composite
def soups(draw: st.DrawFn) -> list[Event]:
    """Arbitrary valid events of one job: times on a coarse grid so that ties happen."""
    times = st.integers(0, 60).map(float)
    attempts = st.sampled_from(["1", "2", "3"])
    n = 0

    def ident() -> str:
        nonlocal n
        n += 1
        return f"e{n}"

    events: list[Event] = []
    if draw(st.booleans()):
        events.append(JobSubmitted(id=ident(), job="j", ts=draw(times)))
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.integers(0, 6))
        a = draw(attempts)
        t = draw(times)
        if kind == 0:
            events.append(AttemptStarted(id=ident(), job="j", ts=t, attempt=a))
        elif kind == 1:
            status = draw(st.sampled_from(["success", "failed"]))
            cause = draw(st.sampled_from(["preemption", "infra", "application", "unknown"]))
            detected = draw(st.one_of(st.none(), st.integers(0, int(t)).map(float)))
            events.append(AttemptEnded(
                id=ident(), job="j", ts=t, attempt=a, status=status,  # type: ignore[arg-type]
                cause=cause if status == "failed" else None,  # type: ignore[arg-type]
                detected_ts=detected if status == "failed" else None,
            ))
        elif kind in (2, 3):
            phase = draw(st.sampled_from([*REPORTABLE, "custom_thing"]))
            comp = draw(st.sampled_from([c for c in COMPONENTS if c != "effective_training"]))
            cls = PhaseStarted if kind == 2 else PhaseEnded
            events.append(cls(
                id=ident(), job="j", ts=t, phase=phase,
                attempt=draw(st.one_of(st.none(), attempts)),
                span=draw(st.sampled_from(["", "x"])),
                component=comp if phase == "custom_thing" else None,  # type: ignore[arg-type]
            ))
        elif kind == 4:
            c0 = draw(st.integers(0, 50))
            events.append(Progress(
                id=ident(), job="j", ts=t + draw(st.integers(0, 8)), start_ts=t, attempt=a,
                step_start=0, step_end=1, cursor_start=c0,
                cursor_end=c0 + draw(st.integers(0, 30)),
            ))
        elif kind == 5:
            events.append(CheckpointSaved(
                id=ident(), job="j", ts=t + 3, start_ts=t, attempt=a, step=1, cursor=1,
                blocking_s=float(draw(st.integers(0, 4))), total_s=3.0,
                final=draw(st.booleans()),
            ))
        else:
            events.append(JobEnded(id=ident(), job="j", ts=t,
                                   status=draw(st.sampled_from(["success", "failed"]))))
    return events
