"""Stage 9, assemble: the stages' results, plus the per-attempt rows and the checkpoint and
publishing totals, into one `JobAttribution`.

Guarantees: CSBT and the save count take regular saves only (a final save is shutdown, and
is counted apart); total save time and bytes take every save; publishing is reported after
GPU release only once the job is over (`model_available_after_release_us`, never negative).
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_ett.ett.attribution.attempts import ClosedAttempt
from airflow_ett.ett.attribution.collect import Collected
from airflow_ett.ett.attribution.explicit import ExplicitPhases
from airflow_ett.ett.attribution.implied import EFFECTIVE_LABEL
from airflow_ett.ett.attribution.level1 import Level1
from airflow_ett.ett.attribution.level2 import Level2
from airflow_ett.ett.attribution.result import JobAttribution
from airflow_ett.ett.attribution.slow_steps import SlowSteps
from airflow_ett.ett.attribution.stragglers import RankStepTimes
from airflow_ett.ett.attribution.window import JobWindow
from airflow_ett.ett.summary import AttemptRow
from airflow_ett.ett.timeline import Timeline, to_s, to_us


def assemble(job: str, *, collected: Collected, window: JobWindow,
             attempts: Sequence[ClosedAttempt], explicit: ExplicitPhases, timeline: Timeline,
             l2: Level2, l1: Level1, warnings: Sequence[str],
             slow: SlowSteps | None = None,
             ranks: RankStepTimes | None = None) -> JobAttribution:
    meta = window.meta
    checkpoints = collected.checkpoints
    regular = [c for c in checkpoints if not c.final]
    pub_after = None
    if collected.published and not window.provisional:
        pub_after = max(0, max(to_us(p.ts) for p in collected.published) - window.end)
    return JobAttribution(
        job=job,
        tenant=meta.tenant if meta else "default",
        model=meta.model if meta else "",
        dag_id=meta.dag_id if meta else None,
        run_id=meta.run_id if meta else None,
        provisional=window.provisional,
        submitted_at=to_s(window.submit),
        ended_at=to_s(window.end),
        e2e_us=window.end - window.submit,
        components_us=l2.components_us,
        phases_us=l2.phases_us,
        phases_raw_us=explicit.raw_us,
        phase_components=l2.phase_components,
        tts_us=l1.tts_us,
        tts_phases_us=l1.tts_phases_us,
        failures=l1.failures,
        in_loop_waste_us=l1.in_loop_waste_us,
        shutdown_us=l1.shutdown_us,
        attempts=tuple(_attempt_row(timeline, a) for a in attempts),
        checkpoint_saves=len(regular),
        final_checkpoint_saves=len(checkpoints) - len(regular),
        csbt_us=sum(to_us(c.blocking_s) for c in regular),
        checkpoint_total_us=sum(to_us(c.total_s) for c in checkpoints),
        checkpoint_bytes=sum(c.bytes for c in checkpoints),
        model_available_after_release_us=pub_after,
        world_size=meta.world_size if meta else 1,
        synthetic=bool(meta and meta.attrs.get("synthetic") is True),
        warnings=tuple(warnings),
        timeline=timeline,
        rank_phases=explicit.rank_intervals,
        slow_steps=slow,
        rank_steps=ranks,
    )


def _attempt_row(timeline: Timeline, a: ClosedAttempt) -> AttemptRow:
    effective = timeline.totals(a.start, a.end).get(EFFECTIVE_LABEL, 0)
    return AttemptRow(attempt=a.id, start=to_s(a.start), end=to_s(a.end),
                      status=a.status or "running", cause=a.cause, exit_code=a.exit_code,
                      inferred=a.inferred, effective_s=to_s(effective), message=a.message)
