"""The plausible range of every number the scheduling plugin reads from outside: the
tenants file and the preemption requests (docs/decisions/0023-plausible-ranges.md).

A number in range is one a real fleet could mean; one outside is a typo, a unit mistake
(milliseconds for seconds) or an attack, and is refused where it is read, with the field
and the value named. The bounds also keep every later use in plain arithmetic: a
`resume_after_s` of 1e12 makes `now + timedelta(seconds=...)` overflow, a grace of 1e308
a deadline that never comes. Each range is generous (several times what any fleet
sets) and its reason is next to it.

`Range.why(value)` is the one check: None for a value in range, else what the value must
be (`"a number of seconds in (0, 86400]"`), which each reader puts after the field and
the value in its own error. A bool is never a number (`true` is not 1 GPU), NaN and the
infinities never are, and a whole-number range refuses floats (`4.0` GPUs is a typo the
file's author should see).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from airflow_ett.ett.events import MAX_WORLD_SIZE, TS_MAX, TS_MIN
from airflow_ett.scheduling.model import MAX_WAIT_PRICE

DAY_S: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class Range:
    """`[lo, hi]` of `what` (`lo_open`/`hi_open`: that end excluded); `whole`: integers
    only."""

    what: str
    lo: float
    hi: float
    whole: bool = False
    lo_open: bool = False
    hi_open: bool = False

    def __str__(self) -> str:
        return (f"{self.what} in {'(' if self.lo_open else '['}{_num(self.lo)}, "
                f"{_num(self.hi)}{')' if self.hi_open else ']'}")

    def why(self, value: object) -> str | None:
        """None when `value` is in range, else this range described (for the error)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return str(self)
        if self.whole and not isinstance(value, int):
            return str(self)
        if isinstance(value, float) and not math.isfinite(value):
            return str(self)
        low_ok = value > self.lo if self.lo_open else value >= self.lo
        high_ok = value < self.hi if self.hi_open else value <= self.hi
        return None if low_ok and high_ok else str(self)

    def clamp(self, value: float) -> float:
        """`value` brought into `[lo, hi]`: for a use that must not overflow even when
        handed a value no reader checked (NaN becomes `lo`)."""
        if not value >= self.lo:
            return self.lo
        return min(value, self.hi)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


#: GPUs: a quota, a borrowing limit, the fleet's capacity. 2**20 (1,048,576) is several
#: times the largest GPU fleets built so far, and the bound events already put on a job's
#: world size (`airflow_ett.ett.events.MAX_WORLD_SIZE`); Airflow's pools hold 2**31 - 1.
MAX_GPUS: Final = MAX_WORLD_SIZE
QUOTA_GPUS: Final = Range("a whole number of GPUs", 0, MAX_GPUS, whole=True)
BORROW_LIMIT_GPUS: Final = QUOTA_GPUS
CAPACITY_GPUS: Final = Range("a whole number of GPUs", 1, MAX_GPUS, whole=True)
#: Airflow keeps priority weights in a 32-bit integer column.
PRIORITY: Final = Range("a whole number", -(2**31), 2**31 - 1, whole=True)
#: Slurm's PreemptExemptTime: minutes to hours in practice. A week's exemption is no
#: preemption at all (say `preemptible = false`).
MIN_RUN_S: Final = Range("a number of seconds", 0, 7 * DAY_S)
#: Slurm's GraceTime: the time a victim has to checkpoint and leave. The slowest whole
#: checkpoint saves measured on real fleets take tens of minutes; a victim that keeps its
#: GPUs a day after it was asked has not been preempted. 0 would be no time to save.
GRACE_S: Final = Range("a number of seconds", 0, DAY_S, lo_open=True)
#: A bound on a job's time to start (queued to its first effective step): the slowest
#: starts on real fleets take hours (a long queue, a cold compile); a bound past a week
#: flags nothing. 0 would flag every job at once.
MAX_TTS_S: Final = Range("a number of seconds", 0, 7 * DAY_S, lo_open=True)
#: A cap per job per day: at one preemption a minute, all day, every restart would be
#: thrown away; more than that means no cap.
PREEMPTIONS_PER_DAY: Final = Range("a whole number", 0, 1440, whole=True)
#: Priority points a waiting task gains per hour. The aged weight is clamped to a 32-bit
#: column at 100 units a point (`rules.aged_weight`), about 21 million points: at a
#: million points an hour arrival order alone decides within seconds of waiting.
AGING_PER_HOUR: Final = Range("a number of priority points per hour", 0, 1e6)
#: How long a preempted job waits before it may run again (`AirflowRescheduleException`'s
#: date: now + this, which overflows a datetime past year 9999). Airflow's own longest
#: retry delay defaults to a day (`[core] max_task_retry_delay`).
RESUME_AFTER_S: Final = Range("a number of seconds", 0, DAY_S)
#: The longest a waiting job is made to wait for a victim's next periodic checkpoint,
#: whatever the price: checkpoint intervals run minutes to an hour or two; a day is past
#: any (a victim whose next checkpoint lies further yields at once).
MAX_CHECKPOINT_WAIT_S: Final = DAY_S
#: GPU-seconds of a victim's work that one waiting GPU-second is worth (decision 0015):
#: 0 waits for every known checkpoint; at `MAX_WAIT_PRICE` no victim waits for one.
CHECKPOINT_WAIT_PRICE: Final = Range(
    "a number (GPU-seconds of a victim's work one waiting GPU-second is worth)", 0,
    MAX_WAIT_PRICE)
#: A request's times: Unix seconds in the window every event time lies in (2000 to 2100
#: UTC, `airflow_ett.ett.events`), so `leave_by + grace_s` and date formatting never
#: overflow.
REQUEST_TIME: Final = Range("a Unix time in seconds", TS_MIN, TS_MAX, hi_open=True)
