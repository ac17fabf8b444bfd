"""Flags on a job: something a person should know about a run while it goes on.

One kind so far, `time_to_start`: the job was still without its first effective step
when its tenant's bound on the time to start (`max_tts_s` of the tenants file) ran out
after it was queued. Raised once, at the bound, by Airflow's deadline alert on the DAG
run (`plugin/tts_watch.py`); kept when the job starts later, so the run page says both.
Pure: the decision and the typed record the store keeps (as JSON) and the pages read.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

FlagKind = Literal["time_to_start"]
TIME_TO_START: Final = "time_to_start"


class JobFlag(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    kind: FlagKind
    at: float  # when it was raised (Unix seconds)
    tenant: str
    bound_s: float
    waited_s: float  # queued -> `at`
    message: str

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> JobFlag:
        return msgspec.json.decode(data, type=cls)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.2f} h"


def time_to_start_flag(job: str, *, started: bool, tenant: str, bound_s: float,
                       queued_at: float, now: float) -> JobFlag | None:
    """The flag of a job still waiting for its first effective step at `now`, past its
    tenant's bound; None when it has started, or the bound has not run out yet (a clock
    that fired early)."""
    waited = now - queued_at
    if started or waited < bound_s:
        return None
    return JobFlag(job=job, kind="time_to_start", at=now, tenant=tenant, bound_s=bound_s,
                   waited_s=waited,
                   message=(f"no effective step {_minutes(waited)} after it was queued: "
                            f"past tenant {tenant}'s time-to-start bound of "
                            f"{_minutes(bound_s)} (max_tts_s)"))
