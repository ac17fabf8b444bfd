"""`JobSummary`: the one typed contract for a job's ETT numbers, as every reader sees them.

The attribution (`JobAttribution`) is the model's full result, in exact microseconds, with
its timeline; a `JobSummary` is what leaves the model: what `airflow-ett compute --json`
and `runs show --json` print, what the store caches, what the model manifest carries and
what the trainer's checkpoint-interval policy reads. It is a msgspec Struct, as the events
are, so a reader gets attributes checked by mypy instead of string keys, and a stored row
is checked against the contract when it is read back (docs/decisions/0009-job-summary.md).
`JobAttribution.summary()` (`ett/attribution/result.py`) builds it: this module imports
nothing of the attribution, so the contract stands alone.

Compatibility rule: fields are only ever added (each with a default, so that older rows
still decode), never renamed, removed or changed in meaning; a change that cannot follow
that rule bumps `SUMMARY_VERSION`. A JSON form without `version` is version 1, and version
1 writes none, so that the JSON keys stay those `JobAttribution.to_dict()` always had.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

#: The version of the JSON form this code writes and the newest it reads.
SUMMARY_VERSION: Final = 1
#: What a JSON form without a `version` key is: every row written before the key existed.
FIRST_VERSION: Final = 1


class SummaryError(ValueError):
    """A JSON form that is not a `JobSummary` of a version this code reads."""


class _Part(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """A nested part of the summary; unknown keys (from a newer minor addition) are
    ignored rather than refused, by the compatibility rule."""


class AttemptRow(_Part, frozen=True):
    attempt: str
    start: float
    end: float
    status: str  # success | failed | running
    cause: str | None
    exit_code: int | None
    inferred: bool
    effective_s: float
    # what its `attempt_ended` said: a failure's message, a preemption's reason (added
    # after the first rows, hence the default)
    message: str | None = None


class FailureRow(_Part, frozen=True):
    """One failure; `ttr_s` is None when it happened before the first effective step."""

    attempt: str
    cause: str
    at: float
    during_tts: bool
    ttr_s: float | None
    detection_s: float
    ttr_from_detection_s: float | None
    stages: dict[str, float]
    phases: dict[str, float]


class FailureRates(_Part, frozen=True):
    attempts: float
    attempts_without_preemption: float
    failures_per_attempt: float
    failures_per_attempt_without_preemption: float


class CheckpointTotals(_Part, frozen=True):
    saves: int
    final_saves: int
    blocking_s: float
    total_s: float
    bytes: int


class SlowStepsRow(_Part, frozen=True):
    """Level 3 inside effective training (`ett/attribution/slow_steps.py`): the job's
    ideal step time (steps-weighted median of its steady spans) and the effective time
    lost to steps slower than it."""

    ideal_step_s: float
    effective_steps: float
    steady_steps: float
    spans: int
    slow_spans: int  # spans more than 10% slower than the ideal
    lost_s: float
    lost_pct_of_effective: float


class RankRow(_Part, frozen=True):
    """One rank's own step time (`ett/attribution/stragglers.py`): the steps-weighted
    median of its steady reports, and its mean wait per step for the other ranks."""

    rank: int
    reports: int
    steps: int
    step_s: float
    wait_step_s: float


class StragglerRow(_Part, frozen=True):
    """The rank of an attempt the others consistently waited for, and what it cost."""

    attempt: str
    rank: int
    step_s: float
    others_step_s: float
    slowdown: float | None  # step_s / others_step_s (None when the others' is 0)
    slow_share: float
    lost_s: float


class RankStepsRow(_Part, frozen=True):
    ranks: list[RankRow]
    stragglers: list[StragglerRow]


#: The keys of the compact form the model manifest carries (`JobSummary.compact`).
COMPACT_KEYS: Final = ("ett_pct", "e2e_s", "effective_s", "tts_s", "ttr_s", "nof", "csbt_s",
                       "shutdown_s", "components", "provisional")


class JobSummary(_Part, frozen=True):
    """One job's ETT numbers in seconds. The field order is the JSON key order."""

    job: str
    tenant: str
    model: str
    dag_id: str | None
    run_id: str | None
    provisional: bool
    started: bool
    submitted_at: float
    ended_at: float
    ett_pct: float
    e2e_s: float
    effective_s: float
    tts_s: float
    ttr_s: list[float]
    ttr_from_detection_s: list[float | None]
    nof: dict[str, int]
    in_loop_waste_s: float
    shutdown_s: float
    csbt_s: float
    components: dict[str, float]
    phases: dict[str, float]
    phases_raw: dict[str, float]
    phase_components: dict[str, str]
    tts_phases: dict[str, float]
    failures: list[FailureRow]
    attempts: list[AttemptRow]
    rates: FailureRates
    checkpoints: CheckpointTotals
    model_available_after_release_s: float | None
    warnings: list[str]
    world_size: int = 1
    synthetic: bool = False
    version: int = FIRST_VERSION
    # Level 3 inside effective training; None: no effective step to measure. Added after
    # the first rows (a cached row without the key is computed again: `lacks_row_fields`)
    slow_steps: SlowStepsRow | None = None
    # Each reporting rank's own step time and each attempt's straggler; None when no rank
    # reported step times (a single-process job, or a producer that does not send them).
    rank_steps: RankStepsRow | None = None

    @property
    def failure_count(self) -> int:
        """NoF, all causes together (`nof["total"]`)."""
        return len(self.failures)

    @property
    def blocking_per_save_s(self) -> float | None:
        """Mean blocking time of one checkpoint save; None before the first save."""
        saves = self.checkpoints.saves
        return self.csbt_s / saves if saves else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: plain dicts, lists and numbers, keys in field order."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        if self.version == FIRST_VERSION:  # version 1 is the form without the key
            del out["version"]
        return out

    def to_json(self) -> bytes:
        return msgspec.json.encode(self.to_dict())

    def compact(self) -> dict[str, Any]:
        """The headline numbers (`COMPACT_KEYS`), in the JSON form, for a model manifest."""
        full = self.to_dict()
        return {key: full[key] for key in COMPACT_KEYS}

    @classmethod
    def from_dict(cls, data: object) -> JobSummary:
        """The summary a JSON form holds; `SummaryError` naming the field and the value when
        it is not one (a row of a newer version, or one an older, laxer version left)."""
        if not isinstance(data, dict):
            raise SummaryError(f"a job summary is a JSON object, got {_short(data)}")
        version = data.get("version", FIRST_VERSION)
        if type(version) is not int or not FIRST_VERSION <= version <= SUMMARY_VERSION:
            raise SummaryError(f"job summary field 'version': {_short(version)} is not a "
                               f"version this code reads ({FIRST_VERSION}..{SUMMARY_VERSION})")
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise SummaryError(f"job summary of {_short(data.get('job'))}: {exc}"
                               f"{_value_at(data, str(exc))}") from None

    @classmethod
    def from_json(cls, payload: str | bytes) -> JobSummary:
        try:
            data = msgspec.json.decode(payload)
        except msgspec.DecodeError as exc:
            raise SummaryError(f"job summary is not JSON: {exc}") from None
        return cls.from_dict(data)


def lacks_row_fields(data: object) -> bool:
    """Whether a JSON form lacks a field this code writes: `slow_steps` or `rank_steps`,
    or one of its
    attempt or failure rows' (an attempt's `message`, say), in a form computed before the
    field was added. Its numbers
    still read (the field has a default), but a reader shown it would miss what the
    events say; the store computes such a cached form again (`EttStore.summary`)."""
    if not isinstance(data, dict):
        return False
    if "attempts" in data and not {"slow_steps", "rank_steps"} <= data.keys():
        return True  # a summary from before one of them
    for key, row_type in (("attempts", AttemptRow), ("failures", FailureRow)):
        rows = data.get(key)
        if isinstance(rows, list) and any(
                isinstance(row, dict) and not set(row_type.__struct_fields__) <= row.keys()
                for row in rows):
            return True
    return False


_PATH = re.compile(r" - at `\$((?:\.[^.\[`]+|\[\d+\]|\[\.\.\.\])*)`$")
_STEP = re.compile(r"\.([^.\[`]+)|\[(\d+)\]|(\[\.\.\.\])")


def _value_at(data: object, message: str) -> str:
    """`; value X` for the value at the path msgspec's message names (it names the type
    it expected, not the value found), or nothing when the path does not lead to one. A
    mapping's key is `[...]` in that path: the mapping is the value shown then."""
    match = _PATH.search(message)
    if match is None:
        return ""
    value = data
    for key, index, some_key in _STEP.findall(match.group(1)):
        if some_key:
            break
        if key and isinstance(value, dict) and key in value:
            value = value[key]
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return ""
    return f"; value {_short(value)}"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
