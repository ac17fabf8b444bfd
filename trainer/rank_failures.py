"""Which rank's failure is a multi-rank attempt's root cause: a pure decision.

Under torchrun the launcher sees one exit code, torchrun's own: 1 whenever any rank
failed. Its error file does not tell more (measured: docs/decisions/0017-multi-rank.md):
a SIGKILLed rank, or one leaving with our exit codes, writes none, and its "root cause"
can be a survivor's consequence (peers fail in their next collective or are SIGTERMed).

So each rank leaves an exit record (`protocol.exits.ExitRecord`): its exit code,
when it failed, and when it got a SIGTERM, if it did. A rank that was killed without
warning (SIGKILL, the OOM killer, a segfault) cannot write one: its record still says
`running`, or there is none. From those records, `root_cause` picks the rank whose
failure the others followed, by tiers (the first non-empty tier decides):

1. a bad config (exit 78), not after a SIGTERM: no retry can help any rank;
2. a rank that died without a word (no exit ran, no SIGTERM noted): a silent death is
   not something a peer's failure causes in our trainer (a survivor raises or leaves on
   SIGTERM, and records it), so it comes before the reported failures, which may be its
   consequences;
3. a rank that failed on its own (an exit code, no SIGTERM before the failure): the
   earliest failure wins, since its peers' errors come after it;
4. ranks that failed after a SIGTERM: the attempt was asked to leave (a preemption, the
   task's on_kill); the earliest SIGTERM wins, and the cause is preemption whatever the
   rank's exit code (an error while leaving is part of leaving).

Within a tier, ties go to the lower rank (the verdict never depends on reading order).
Blind spot (decision 0017): a rank raising first, then a peer SIGKILLed after ignoring
torchrun's SIGTERM for 30 s, reads as tier 2 (infra); both are retried.

No torch, no Airflow, no files: the launcher reads the records (`parse_exit_record`
validates one) and decides here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from airflow_ett.protocol.exits import EXIT_BAD_CONFIG

EXIT_RECORD_VERSION: Final = 1
#: `running`: written as the rank started, never overwritten (it died without a word);
#: `exited`: its exit path ran.
RecordState = Literal["running", "exited"]

Tier = Literal["bad_config", "silent", "failed", "terminated"]
TIERS: Final[tuple[Tier, ...]] = ("bad_config", "silent", "failed", "terminated")


class ExitRecordError(ValueError):
    """An exit record that cannot be read; the message names the field and value."""


@dataclass(frozen=True, slots=True)
class RankOutcome:
    """How one rank of an attempt ended, as its exit record says.

    `exit_code` None: the rank's exit path never ran (killed without warning, or no
    record at all). `failed_at`: when its failure happened (the exception caught, the
    watchdog fired, the exit began), Unix seconds. `sigterm_at`: when it got SIGTERM,
    None if it never did. `rank`: the global rank, which names its record file."""

    rank: int
    exit_code: int | None = None
    failed_at: float | None = None
    sigterm_at: float | None = None
    error: str | None = None
    reported_cause: str | None = None  # the cause its own attempt_ended gave, if any
    #: whether it reported its attempt's end itself (a trainer that speaks the protocol;
    #: `reported_cause` None and `reported` True: it reported a success)
    reported: bool = False

    @property
    def failed(self) -> bool:
        return self.exit_code != 0

    @property
    def name(self) -> str:
        return f"rank {self.rank}"


def tier(outcome: RankOutcome) -> Tier | None:
    """The outcome's tier (see the module docstring); None for a rank that succeeded."""
    if not outcome.failed:
        return None
    terminated = outcome.sigterm_at is not None and (
        outcome.failed_at is None or outcome.sigterm_at <= outcome.failed_at)
    if terminated:
        return "terminated"
    if outcome.exit_code is None:
        return "silent"
    if outcome.exit_code == EXIT_BAD_CONFIG:
        return "bad_config"
    return "failed"


def _order(outcome: RankOutcome) -> tuple[float, int]:
    """Within a tier: the earliest (failure, or SIGTERM when terminated) first; unknown
    times last; then the lower rank."""
    when = outcome.sigterm_at if tier(outcome) == "terminated" else outcome.failed_at
    return (math.inf if when is None else when, outcome.rank)


def root_cause(outcomes: Iterable[RankOutcome]) -> RankOutcome | None:
    """The rank whose failure the attempt's end follows, or None when no rank failed."""
    by_tier: dict[Tier, list[RankOutcome]] = {}
    for outcome in outcomes:
        found = tier(outcome)
        if found is not None:
            by_tier.setdefault(found, []).append(outcome)
    for name in TIERS:
        if name in by_tier:
            return min(by_tier[name], key=_order)
    return None


def _number(record: Mapping[str, object], name: str, *, optional: bool = True) -> float | None:
    value = record.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or value < 0:
        raise ExitRecordError(f"exit record: {name} = {value!r}: must be Unix seconds (a "
                              "finite number >= 0)")
    return float(value)


def _integer(record: Mapping[str, object], name: str, *, minimum: int | None = None,
             optional: bool = True) -> int | None:
    value = record.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (
            minimum is not None and value < minimum) or not -(2**31) <= value < 2**31:
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ExitRecordError(f"exit record: {name} = {value!r}: must be an integer{bound}")
    return value


def _text(record: Mapping[str, object], name: str, limit: int = 500) -> str | None:
    value = record.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ExitRecordError(f"exit record: {name} = {value!r}: must be a string")
    return value[:limit]


def parse_exit_record(record: object, *, rank: int) -> RankOutcome:
    """A rank's exit record (decoded JSON) checked field by field, or `ExitRecordError`.

    It comes from another process, maybe killed half-way through writing it, maybe an
    older trainer's: every field is checked, nothing is coerced."""
    if not isinstance(record, Mapping):
        raise ExitRecordError(f"exit record: must be a JSON object, got {type(record).__name__}")
    version = record.get("v")
    if version != EXIT_RECORD_VERSION:
        raise ExitRecordError(f"exit record: v = {version!r}: this launcher reads version "
                              f"{EXIT_RECORD_VERSION}")
    state = record.get("state")
    if state not in ("running", "exited"):
        raise ExitRecordError(f"exit record: state = {state!r}: must be 'running' or 'exited'")
    recorded = _integer(record, "rank", minimum=0, optional=False)
    if recorded != rank:
        raise ExitRecordError(f"exit record: rank = {recorded!r}: its file is rank {rank}'s")
    sigterm_at = _number(record, "sigterm_at")
    if state == "running":  # its exit path never ran: whatever else it says is moot
        return RankOutcome(rank, None, None, sigterm_at)
    code = _integer(record, "exit_code", optional=False)
    return RankOutcome(rank, code, _number(record, "failed_at"), sigterm_at,
                       _text(record, "error"), _text(record, "reported_cause", 32),
                       "reported_cause" in record)
