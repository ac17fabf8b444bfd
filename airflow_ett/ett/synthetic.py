"""A deterministic simulator of one training job's event stream.

It plays the lifecycle DESIGN describes (queue, startup phases, steps that advance the
cursor, periodic checkpoints, failures that restore from the last checkpoint and replay,
final checkpoint, teardown) and writes the events a well-behaved trainer would. Tests use
it for properties that need a *causal* model of a job (adding a failure must cost time),
the benchmarks use it for large logs, and `airflow_ett/examples/` is generated with it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    FailureCause,
    JobEnded,
    JobSubmitted,
    PhaseEnded,
    PhaseStarted,
    Progress,
)


@dataclass(frozen=True, slots=True)
class InjectedFailure:
    """The attempt fails right after step `at_step` completes, the first time it does."""

    at_step: int
    cause: FailureCause = "application"
    detection_s: float = 1.0  # last progress -> failure noticed (a hang makes this long)
    shutdown_s: float = 1.0  # noticed -> failed attempt gone
    reschedule_s: float = 5.0  # gone -> next attempt starts

    def __post_init__(self) -> None:
        # Step 0 never completes, so a failure there would never fire, and (the failures
        # being taken in step order) would keep every later one from firing either.
        if self.at_step < 1:
            raise ValueError(f"at_step: {self.at_step!r} is not a step >= 1")


@dataclass(frozen=True, slots=True)
class JobSpec:
    job: str = "job-1"
    tenant: str = "ads-ranking"
    model: str = "dlrm_small"
    dag_id: str | None = "ett_dlrm_demo"
    run_id: str | None = None  # default: manual__<job>
    submit_ts: float = 1_780_000_000.0
    queue_s: float = 10.0
    startup: tuple[tuple[str, float], ...] = (
        ("trainer_init", 2.0),
        ("data_pipeline_init", 4.0),
        ("model_creation", 3.0),
        ("compile", 8.0),
    )
    parallel_init: bool = False  # all startup phases at once (critical path = the longest)
    restore_s: float = 2.0  # checkpoint restore on every attempt that has one to load
    steps: int = 100
    step_s: float = 0.5
    batch: int = 256  # cursor units per step
    progress_every: int = 10  # steps per progress event
    checkpoint_every: int = 25  # steps; 0 = never (until the final save)
    checkpoint_blocking_s: float = 1.0
    checkpoint_total_s: float = 3.0
    final_checkpoint_s: float = 2.0
    teardown_s: float = 1.0
    failures: tuple[InjectedFailure, ...] = ()
    running_until_step: int | None = None  # stop emitting here: the job is still running
    extra: dict[str, object] = field(default_factory=dict)  # job_submitted.attrs
    world_size: int = 1

    def __post_init__(self) -> None:
        for name, minimum in (("steps", 1), ("progress_every", 1), ("checkpoint_every", 0),
                              ("batch", 1), ("world_size", 1)):
            value = getattr(self, name)
            if value < minimum:  # progress_every=0 would emit empty progress forever
                raise ValueError(f"{name}: {value!r} must be >= {minimum}")


def simulate(spec: JobSpec) -> list[Event]:
    return list(iter_simulate(spec))


def iter_simulate(spec: JobSpec) -> Iterator[Event]:
    counter = 0

    def next_id() -> str:
        nonlocal counter
        counter += 1
        return f"{spec.job}-{counter}"

    job = spec.job
    t = spec.submit_ts
    yield JobSubmitted(id=next_id(), job=job, ts=t, tenant=spec.tenant, model=spec.model,
                       dag_id=spec.dag_id, run_id=spec.run_id or f"manual__{job}",
                       attrs=dict(spec.extra), world_size=spec.world_size)
    t += spec.queue_s
    pending = sorted(spec.failures, key=lambda f: f.at_step)
    saved_step = 0
    attempt_no = 0
    while True:
        attempt_no += 1
        attempt = str(attempt_no)
        yield AttemptStarted(id=next_id(), job=job, ts=t, attempt=attempt, host="sim")
        t = yield from _startup_phases(spec, attempt, t, next_id)
        if saved_step > 0 and spec.restore_s > 0:
            t = yield from _restore_phase(spec, attempt, t, next_id)
        step = saved_step
        failure: InjectedFailure | None = None
        while step < spec.steps:
            if spec.running_until_step is not None and step >= spec.running_until_step:
                return
            n = _chunk(spec, step, pending)
            end = t + n * spec.step_s
            yield Progress(id=next_id(), job=job, ts=end, attempt=attempt, start_ts=t,
                           step_start=step, step_end=step + n, cursor_start=step * spec.batch,
                           cursor_end=(step + n) * spec.batch)
            t, step = end, step + n
            if pending and pending[0].at_step == step:
                failure = pending.pop(0)
                break
            if spec.checkpoint_every and step % spec.checkpoint_every == 0 and step < spec.steps:
                yield CheckpointSaved(id=next_id(), job=job, ts=t + spec.checkpoint_total_s,
                                      attempt=attempt, start_ts=t, step=step,
                                      cursor=step * spec.batch,
                                      blocking_s=spec.checkpoint_blocking_s,
                                      total_s=spec.checkpoint_total_s)
                t += spec.checkpoint_blocking_s
                saved_step = step
        if failure is not None:
            detected = t + failure.detection_s
            t = detected + failure.shutdown_s
            yield AttemptEnded(id=next_id(), job=job, ts=t, attempt=attempt, status="failed",
                               cause=failure.cause, detected_ts=detected,
                               exit_code=1 if failure.cause == "application" else -9)
            t += failure.reschedule_s
            continue
        yield from _finish(spec, attempt, t, step, next_id)
        return


def _chunk(spec: JobSpec, step: int, pending: list[InjectedFailure]) -> int:
    """Steps in the next progress event: it ends at a progress, checkpoint or failure step."""
    n = min(spec.progress_every, spec.steps - step)
    if spec.checkpoint_every:
        n = min(n, spec.checkpoint_every - step % spec.checkpoint_every)
    if pending and pending[0].at_step > step:
        n = min(n, pending[0].at_step - step)
    return n


def _restore_phase(spec: JobSpec, attempt: str, t: float,
                   next_id: Callable[[], str]) -> Generator[Event, None, float]:
    """The checkpoint restore of an attempt that has a checkpoint to load."""
    yield PhaseStarted(id=next_id(), job=spec.job, ts=t, attempt=attempt,
                       phase="checkpoint_restore")
    t += spec.restore_s
    yield PhaseEnded(id=next_id(), job=spec.job, ts=t, attempt=attempt,
                     phase="checkpoint_restore")
    return t


def _finish(spec: JobSpec, attempt: str, t: float, step: int,
            next_id: Callable[[], str]) -> Iterator[Event]:
    """A successful attempt's end: final checkpoint, teardown, attempt and job ended."""
    job = spec.job
    yield CheckpointSaved(id=next_id(), job=job, ts=t + spec.final_checkpoint_s,
                          attempt=attempt, start_ts=t, step=step,
                          cursor=step * spec.batch, blocking_s=spec.final_checkpoint_s,
                          total_s=spec.final_checkpoint_s, final=True)
    t += spec.final_checkpoint_s
    yield PhaseStarted(id=next_id(), job=job, ts=t, attempt=attempt, phase="teardown")
    t += spec.teardown_s
    yield PhaseEnded(id=next_id(), job=job, ts=t, attempt=attempt, phase="teardown")
    yield AttemptEnded(id=next_id(), job=job, ts=t, attempt=attempt, status="success",
                       exit_code=0)
    yield JobEnded(id=next_id(), job=job, ts=t, status="success")


def _startup_phases(spec: JobSpec, attempt: str, t: float,
                    next_id: Callable[[], str]) -> Generator[Event, None, float]:
    """One attempt's startup phases from `t`, one after another or all at once
    (`parallel_init`); returns when the last one ends."""
    phase_end = t
    for name, seconds in spec.startup:
        start = t if spec.parallel_init else phase_end
        yield PhaseStarted(id=next_id(), job=spec.job, ts=start, attempt=attempt, phase=name)
        yield PhaseEnded(id=next_id(), job=spec.job, ts=start + seconds, attempt=attempt,
                         phase=name)
        phase_end = max(phase_end, start + seconds)
    return phase_end


EXAMPLE_SPEC = JobSpec(
    job="ranking_ctr_v7__manual__2026-11-28T09:00:00",
    tenant="ads-ranking",
    model="dlrm_small",
    dag_id="ranking_ctr_v7",
    run_id="manual__2026-11-28T09:00:00",
    submit_ts=1_795_856_400.0,  # 2026-11-28T09:00:00Z
    queue_s=42.0,
    startup=(
        ("hardware_setup", 6.0),
        ("process_group_init", 11.0),
        ("trainer_init", 9.0),
        ("data_pipeline_init", 48.0),
        ("model_creation", 21.0),
        ("compile", 96.0),
    ),
    restore_s=14.0,
    steps=6000,
    step_s=0.25,
    batch=4096,
    progress_every=50,
    checkpoint_every=1000,
    checkpoint_blocking_s=4.5,
    checkpoint_total_s=19.0,
    final_checkpoint_s=12.0,
    teardown_s=7.0,
    failures=(
        InjectedFailure(at_step=2600, cause="infra", detection_s=35.0, shutdown_s=8.0,
                        reschedule_s=64.0),
        InjectedFailure(at_step=4300, cause="preemption", detection_s=2.0, shutdown_s=25.0,
                        reschedule_s=180.0),
    ),
)
"""The bundled example log (`airflow_ett/examples/demo_job.jsonl`): a 25-minute DLRM job
with an infra failure and a preemption. A test keeps the file equal to this spec."""
