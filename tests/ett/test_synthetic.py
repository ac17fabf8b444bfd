"""The simulator's promises (airflow_ett/ett/synthetic.py): the property tests, the
benchmarks and the bundled example log all trust it to play a job's lifecycle the way a
well-behaved trainer reports it, so what it writes is checked here directly rather than
only through the attribution it feeds."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    FailureCause,
    JobSubmitted,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from tests.ett.strategies import specs

# The exit code a failed attempt reports: the trainer's own error exits 1, everything else
# (preemption, infra, unknown) is the process being killed (SIGKILL, -9).
EXIT_CODES: dict[FailureCause, int] = {
    "application": 1, "preemption": -9, "infra": -9, "unknown": -9,
}


def _by_attempt(events: list[Event]) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        attempt = getattr(e, "attempt", None)
        if attempt is not None:
            out[attempt].append(e)
    return out


def _restores(events: list[Event]) -> dict[str, float]:
    """Attempt -> the duration of its `checkpoint_restore` phase."""
    starts = {e.attempt: e.ts for e in events
              if isinstance(e, PhaseStarted) and e.phase == "checkpoint_restore"}
    return {e.attempt: e.ts - starts[e.attempt] for e in events
            if isinstance(e, PhaseEnded) and e.phase == "checkpoint_restore"
            and e.attempt is not None}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_a_simulated_job_is_a_well_formed_lifecycle(spec: JobSpec) -> None:
    events = simulate(spec)
    # ids number the events of the job in the order they are written
    assert [e.id for e in events] == [f"{spec.job}-{i}" for i in range(1, len(events) + 1)]
    # attempts are "1", "2", ... in order, one per failure that fires plus the last one
    started = [e for e in events if isinstance(e, AttemptStarted)]
    fired = sorted((f for f in spec.failures if f.at_step <= spec.steps),
                   key=lambda f: f.at_step)
    assert [e.attempt for e in started] == [str(i) for i in range(1, len(fired) + 2)]
    assert all(e.host == "sim" for e in started)
    # every failure fires once, in step order, with its cause and exit code
    ended = [e for e in events if isinstance(e, AttemptEnded)]
    assert [(e.status, e.cause, e.exit_code) for e in ended] == [
        *(("failed", f.cause, EXIT_CODES[f.cause]) for f in fired), ("success", None, 0)]
    # every event after the submission belongs to the attempt in flight (none unscoped)
    per_attempt = _by_attempt(events)
    assert sorted(per_attempt) == sorted(e.attempt for e in started)
    assert sum(map(len, per_attempt.values())) == len(events) - 2  # submitted, job ended
    # a save ends `total_s` after it starts, the final one blocks for all of it
    saves = [e for e in events if isinstance(e, CheckpointSaved)]
    assert all(e.ts == e.start_ts + e.total_s for e in saves)
    assert saves[-1].final and saves[-1].blocking_s == saves[-1].total_s
    assert saves[-1].step == spec.steps
    # a failed attempt restarts from its last checkpoint (and restores it, when that takes
    # time); one with nothing saved yet starts from step 0
    saved = 0
    for e in started:
        own = per_attempt[e.attempt]
        first = next(p for p in own if isinstance(p, Progress))
        assert first.step_start == saved
        restored = _restores(own)
        if saved and spec.restore_s > 0:
            assert restored == {e.attempt: spec.restore_s}
        else:
            assert restored == {}
        saved = max((c.step for c in own if isinstance(c, CheckpointSaved)), default=saved)


@pytest.mark.parametrize(("checkpoint_every", "at_step", "restore_s", "restored"), [
    (1, 2, 0.5, 0.5),  # one step saved: restored, even a restore shorter than a second
    (5, 7, 2.0, 2.0),
    (5, 7, 0.0, None),  # an instant restore is no phase
    (5, 3, 2.0, None),  # failed before the first save: nothing to restore
    (0, 7, 2.0, None),  # never saves
])
def test_the_retry_restores_only_a_saved_checkpoint(
        checkpoint_every: int, at_step: int, restore_s: float, restored: float | None) -> None:
    events = simulate(JobSpec(steps=10, checkpoint_every=checkpoint_every,
                              restore_s=restore_s, failures=(InjectedFailure(at_step),)))
    assert _restores(events) == ({} if restored is None else {"2": restored})


@pytest.mark.parametrize(("cause", "exit_code"), list(EXIT_CODES.items()))
def test_a_failed_attempt_exits_by_its_cause(cause: FailureCause, exit_code: int) -> None:
    events = simulate(JobSpec(steps=4, failures=(InjectedFailure(2, cause=cause),)))
    ended = [(e.attempt, e.status, e.cause, e.exit_code)
             for e in events if isinstance(e, AttemptEnded)]
    assert ended == [("1", "failed", cause, exit_code), ("2", "success", None, 0)]


@pytest.mark.parametrize(("dag_id", "run_id", "expected_run_id"), [
    ("ranking_v1", "scheduled__2026-01-01", "scheduled__2026-01-01"),
    (None, None, "manual__job-7"),  # no run id: the one a manual trigger would get
])
def test_the_submission_carries_the_spec(
        dag_id: str | None, run_id: str | None, expected_run_id: str) -> None:
    spec = JobSpec(job="job-7", tenant="search", model="two_tower", dag_id=dag_id,
                   run_id=run_id, submit_ts=1_795_856_000.0, steps=2,
                   extra={"team": "ranking"})
    first = simulate(spec)[0]
    assert first == JobSubmitted(id="job-7-1", job="job-7", ts=1_795_856_000.0,
                                 tenant="search", model="two_tower", dag_id=dag_id,
                                 run_id=expected_run_id, attrs={"team": "ranking"})


@pytest.mark.parametrize(("make", "message"), [
    (lambda: InjectedFailure(at_step=0), "at_step: 0 is not a step >= 1"),
    (lambda: JobSpec(progress_every=0), "progress_every: 0 must be >= 1"),
    (lambda: JobSpec(steps=0), "steps: 0 must be >= 1"),
    (lambda: JobSpec(world_size=0), "world_size: 0 must be >= 1"),
    (lambda: JobSpec(checkpoint_every=-1), "checkpoint_every: -1 must be >= 0"),
])
def test_specs_that_could_not_run_are_refused(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()
