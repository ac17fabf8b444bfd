"""What attribution returns: one job's use of its wall time, and how it prints.

Durations are exact integer microseconds (`*_us`) so that the six components add up to
E2E to the microsecond. `summary()` is the typed `JobSummary` (seconds) every reader outside
the model gets (airflow_ett/ett/summary.py, which imports nothing of this module: it is
built here); `to_dict()` is its JSON form.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from airflow_ett.ett.attribution.slow_steps import SlowSteps
from airflow_ett.ett.attribution.stragglers import RankStepTimes
from airflow_ett.ett.events import FAILURE_CAUSES
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.ett.summary import (
    SUMMARY_VERSION,
    AttemptRow,
    CheckpointTotals,
    FailureRates,
    FailureRow,
    JobSummary,
    RankRow,
    RankStepsRow,
    SlowStepsRow,
    StragglerRow,
)
from airflow_ett.ett.timeline import Timeline, to_s, to_us


class AttributionError(ValueError):
    """Events that cannot describe one job (e.g. none at all, or several jobs mixed)."""


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
    attempts: tuple[AttemptRow, ...]  # already in seconds: the summary's own row
    checkpoint_saves: int
    final_checkpoint_saves: int
    csbt_us: int
    checkpoint_total_us: int
    checkpoint_bytes: int
    model_available_after_release_us: int | None
    warnings: tuple[str, ...]
    timeline: Timeline
    world_size: int = 1  # GPUs, from the submission: the weight of its GPU-hours
    synthetic: bool = False  # the submission's attrs say {"synthetic": true}
    #: The phases of ranks other than 0, each (rank, start us, end us, label), clipped to
    #: their attempts: per-rank rows for whoever renders them. They count in the timeline
    #: only where rank 0 showed nothing (see `precedence`).
    rank_phases: tuple[tuple[int, int, int, str], ...] = ()
    #: Level 3 inside effective training: the ideal step time and the time lost to steps
    #: slower than it (`slow_steps.py`); None without an effective step to measure.
    slow_steps: SlowSteps | None = None
    #: Each reporting rank's own step time and each attempt's straggler rank
    #: (`stragglers.py`); None when no rank reported its step times.
    rank_steps: RankStepTimes | None = None

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

    def summary(self) -> JobSummary:
        """The typed contract every reader outside the model gets (`ett/summary.py`)."""
        return _summary_of(self)

    def to_dict(self, *, include_timeline: bool = False) -> dict[str, Any]:
        """The JSON form of `summary()`, with the labelled timeline when asked."""
        out = self.summary().to_dict()
        if include_timeline:
            base = to_us(self.submitted_at)
            out["timeline"] = [
                [to_s(s - base), to_s(e - base), self.phase_components[label], label]
                for s, e, label in self.timeline.segments()
            ]
            if self.rank_phases:  # only a multi-rank job's
                out["rank_phases"] = [
                    [rank, to_s(s - base), to_s(e - base), self.phase_components[label],
                     label]
                    for rank, s, e, label in self.rank_phases
                ]
        return out


def _summary_of(result: JobAttribution) -> JobSummary:
    """`result` in seconds, as the `JobSummary` of the version this code writes."""
    return JobSummary(
        job=result.job,
        tenant=result.tenant,
        model=result.model,
        dag_id=result.dag_id,
        run_id=result.run_id,
        provisional=result.provisional,
        started=result.started,
        submitted_at=result.submitted_at,
        ended_at=result.ended_at,
        ett_pct=result.ett_pct,
        e2e_s=to_s(result.e2e_us),
        effective_s=to_s(result.effective_us),
        tts_s=to_s(result.tts_us),
        ttr_s=[to_s(v) for v in result.ttr_us],
        ttr_from_detection_s=[
            f.ttr_from_detection_s for f in result.failures if f.ttr_us is not None
        ],
        nof=result.nof,
        in_loop_waste_s=to_s(result.in_loop_waste_us),
        shutdown_s=to_s(result.shutdown_us),
        csbt_s=to_s(result.csbt_us),
        components={c: to_s(result.components_us[c]) for c in COMPONENTS},
        phases=_seconds(result.phases_us),
        phases_raw=_seconds(result.phases_raw_us),
        phase_components=dict(sorted(result.phase_components.items())),
        tts_phases=_seconds(result.tts_phases_us),
        failures=[_failure_row(f) for f in result.failures],
        attempts=list(result.attempts),
        rates=FailureRates(**result.failure_rates()),
        checkpoints=CheckpointTotals(
            saves=result.checkpoint_saves,
            final_saves=result.final_checkpoint_saves,
            blocking_s=to_s(result.csbt_us),
            total_s=to_s(result.checkpoint_total_us),
            bytes=result.checkpoint_bytes,
        ),
        model_available_after_release_s=(
            None if result.model_available_after_release_us is None
            else to_s(result.model_available_after_release_us)
        ),
        warnings=list(result.warnings),
        world_size=result.world_size,
        synthetic=result.synthetic,
        version=SUMMARY_VERSION,
        slow_steps=_slow_row(result.slow_steps),
        rank_steps=_ranks_row(result.rank_steps),
    )


def _ranks_row(r: RankStepTimes | None) -> RankStepsRow | None:
    if r is None:
        return None
    return RankStepsRow(
        ranks=[RankRow(rank=x.rank, reports=x.reports, steps=x.steps,
                       step_s=x.busy_step_us / 1e6, wait_step_s=x.wait_step_us / 1e6)
               for x in r.ranks],
        stragglers=[StragglerRow(attempt=s.attempt, rank=s.rank, step_s=s.busy_step_us / 1e6,
                                 others_step_s=s.others_step_us / 1e6,
                                 slowdown=(s.busy_step_us / s.others_step_us
                                           if s.others_step_us > 0 else None),
                                 slow_share=s.slow_share, lost_s=to_s(s.lost_us))
                    for s in r.stragglers])


def _slow_row(s: SlowSteps | None) -> SlowStepsRow | None:
    if s is None:
        return None
    return SlowStepsRow(ideal_step_s=s.ideal_step_us / 1e6, effective_steps=s.effective_steps,
                        steady_steps=s.steady_steps, spans=s.spans, slow_spans=s.slow_spans,
                        lost_s=to_s(s.lost_us),
                        lost_pct_of_effective=(100.0 * s.lost_us / s.effective_us
                                               if s.effective_us else 0.0))


def _seconds(values_us: dict[str, int]) -> dict[str, float]:
    return {k: to_s(v) for k, v in sorted(values_us.items())}


def _failure_row(f: FailureSummary) -> FailureRow:
    return FailureRow(attempt=f.attempt, cause=f.cause, at=f.at, during_tts=f.during_tts,
                      ttr_s=f.ttr_s, detection_s=to_s(f.detection_us),
                      ttr_from_detection_s=f.ttr_from_detection_s,
                      stages={k: to_s(v) for k, v in f.stages_us.items()},
                      phases={k: to_s(v) for k, v in f.phases_us.items()})
