"""What attribution returns: one job's use of its wall time, and how it prints.

Durations are exact integer microseconds (`*_us`) so that the six components add up to
E2E to the microsecond; `to_dict()` is the JSON form (seconds), whose keys the CLI's
`--json`, the store's summary cache and the operators read, so they only ever grow.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from airflow_ett.ett.events import FAILURE_CAUSES
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.ett.timeline import Timeline, to_s, to_us


class AttributionError(ValueError):
    """Events that cannot describe one job (e.g. none at all, or several jobs mixed)."""


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
