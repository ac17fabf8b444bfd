"""Attribution: a job's events in, its ETT% with the Level-1 and Level-2 breakdown out.

The job's wall time (submission -> GPUs released) is cut into labelled segments that
cover it exactly once; both levels are read off those segments, so they describe one
timeline. The work is a pipeline of stages, one module each, every handoff a frozen
dataclass (docs/decisions/0007-attribution-stages.md):

1. `collect`: the events, sorted by kind; one `AttemptReport` per attempt named.
2. `window`: the job's `[submit, end)`, whether it still runs, its attempts in order.
3. `attempts`: every attempt closed (an end and a status, inferred where missing), clipped
   so that attempts never overlap and stay inside the window.
4. `implied`: the timeline from progress (effective or replay, by the cursor's high-water
   mark) and the shape of the attempts alone.
5. `explicit`: the reported phases and checkpoint saves as clipped intervals.
6. `precedence`: the explicit intervals laid over the implied timeline, by the rule of
   docs/decisions/0002-attribution-precedence.md (waste, compilation, progress,
   initialization, shutdown, scheduling, then the implied labels).
7. `level2`: the timeline summed per phase and per component.
8. `level1`: TTS, each failure's TTR, in-loop waste and shutdown.
9. `assemble`: all of it, with the attempt rows and checkpoint totals, as `JobAttribution`.

After the stages, `window_clip` keeps only a job's time inside `[lo, hi)` (the nightly
rollup's days), cut from the final timeline so that a partition of time sums exactly;
`last_windows` cuts a job's last minutes the same way (a running job's rolling windows).

A running job attributed again and again (its page, its gauges) is kept by
`IncrementalAttribution` (`incremental`, with `live` and `live_ranks`): its events added
as they arrive, each pass resuming where the last one stopped, to the same result as
`attribute_job` over all of them (decision 0034).

The entry points (`attribute`, `attribute_job`, `dedupe`) are in `pipeline`; import every
public name from this package, not from a stage module.
"""

from airflow_ett.ett.attribution.implied import EFFECTIVE_LABEL, IMPLIED_LABELS, REPLAY_LABEL
from airflow_ett.ett.attribution.incremental import IncrementalAttribution
from airflow_ett.ett.attribution.pipeline import attribute, attribute_job, dedupe
from airflow_ett.ett.attribution.result import (
    AttributionError,
    FailureSummary,
    JobAttribution,
)
from airflow_ett.ett.attribution.window_clip import (
    WindowAttribution,
    attribute_window,
    clip_to_window,
    last_windows,
)

__all__ = [
    "EFFECTIVE_LABEL",
    "IMPLIED_LABELS",
    "REPLAY_LABEL",
    "AttributionError",
    "FailureSummary",
    "IncrementalAttribution",
    "JobAttribution",
    "WindowAttribution",
    "attribute",
    "attribute_job",
    "attribute_window",
    "clip_to_window",
    "dedupe",
    "last_windows",
]
