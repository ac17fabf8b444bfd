"""The versioned event format: the one contract between whatever trains and the ETT model.

An event is a JSON object, one per line (JSON Lines). `docs/events.md` is the reader's
version of this module; keep the two in step. Design choices worth knowing:

- Every event carries an `id` chosen by its producer. The store and the model dedupe on
  it, so replaying a spool or re-sending after a timeout never counts anything twice.
- Times are Unix seconds (float) or ISO-8601 strings with a zone; both become float
  seconds here. The model turns them into integer microseconds so that its partitions
  are exact.
- Unknown fields are ignored, so producers may add their own; an unknown `type` or a
  `v` this reader does not know is an error, since its meaning cannot be guessed.
- Versions: a new optional field that an older reader could ignore safely keeps `v`; one
  that an older reader would misread if it ignored it raises `v` for the events that
  carry it, so that those readers drop them instead. `rank` is such a field: an event
  of rank > 0 is written with `v: 2` (a version-1 reader would take it for rank 0's,
  which leads the job's timeline); every other event stays `v: 1`.
- Parsing never throws away good lines because of a bad one: it returns the events it
  could read and an error per line it could not, naming the line, field and value.
- Every value must be one both store backends can hold the same way (`check_string`,
  `check_time`, `Int64`): an identifier with NUL or a lone surrogate is an error, free
  text has those escaped; times lie in [TS_MIN, TS_MAX); integers fit 64 bits signed.
  Python-built events (the emitter's) go through the same rules by `validate_event`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, BinaryIO, ClassVar, Final, Literal

import msgspec

from airflow_ett._untrusted import open_regular
from airflow_ett.ett.phases import COMPONENTS, PHASES

FORMAT_VERSION: Final = 1
"""The version of every event a rank other than 0 did not send: readers of version 1
read it all."""
RANK_FORMAT_VERSION: Final = 2
"""The version of an event with `rank` > 0 (see the module docstring)."""
FORMAT_VERSIONS: Final = (FORMAT_VERSION, RANK_FORMAT_VERSION)

TS_MIN: Final = 946_684_800.0
"""2000-01-01T00:00:00Z: no event time is earlier (a smaller value is a relative or
monotonic clock read by mistake)."""
TS_MAX: Final = 4_102_444_800.0
"""2100-01-01T00:00:00Z: no event time is this late or later (a larger value is usually
milliseconds, microseconds or nanoseconds; it would also break date arithmetic)."""
MAX_DURATION_S: Final = TS_MAX - TS_MIN
"""No duration (checkpoint seconds) can exceed the whole window times may lie in."""
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: The most GPUs (trainer processes) one job may report: a bound, so a typo cannot turn one
#: job into most of the fleet's GPU-hours.
MAX_WORLD_SIZE: Final = 1 << 20

Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
"""An integer both backends (SQLite INTEGER, PostgreSQL BIGINT) and JSON readers hold."""

FailureCause = Literal["preemption", "infra", "application", "unknown"]
FAILURE_CAUSES: Final[tuple[str, ...]] = ("preemption", "infra", "application", "unknown")
AttemptStatus = Literal["success", "failed"]
JobStatus = Literal["success", "failed", "cancelled"]
TaskSource = Literal["worker", "scheduler", "api"]
ComponentName = Literal[
    "scheduling",
    "initialization",
    "compilation",
    "effective_training",
    "wasted_training",
    "shutdown",
]


class _Base(msgspec.Struct, kw_only=True, frozen=True, tag_field="type", omit_defaults=True):
    """Fields every event has. `rank`: the trainer process (torch.distributed rank) that
    sent it; 0 (left out) for rank 0, the operators and listeners, and every producer
    that has one process. Rank 0 leads the job's timeline; see `docs/events.md`."""

    id: str
    job: str
    ts: float
    v: int = FORMAT_VERSION
    rank: int = 0

    TIME_FIELDS: ClassVar[tuple[str, ...]] = ("ts",)
    FREE_TEXT_FIELDS: ClassVar[frozenset[str]] = frozenset()
    """String fields that are prose, not identifiers: escaped (see `check_string`)."""


class JobSubmitted(_Base, tag="job_submitted", frozen=True):
    """The job (a DAG run) was submitted: the start of its E2E wall time."""

    tenant: str = "default"
    model: str = ""
    dag_id: str | None = None
    run_id: str | None = None
    attrs: dict[str, Any] = {}
    world_size: int = 1  # GPUs (trainer processes) the job holds: its GPU-hours weigh by it

    FREE_TEXT_FIELDS: ClassVar[frozenset[str]] = frozenset({"attrs"})


class AttemptStarted(_Base, tag="attempt_started", frozen=True):
    """One start of the trainer process (an Airflow try, or an in-task restart)."""

    attempt: str
    host: str | None = None

    FREE_TEXT_FIELDS: ClassVar[frozenset[str]] = frozenset({"host"})


class AttemptEnded(_Base, tag="attempt_ended", frozen=True):
    """The attempt is gone and holds nothing any more (`ts`).

    `detected_ts`, for a failure, is when the failure was noticed; the time from the
    attempt's last progress to it is detection (a hang lives there). Left out, the
    failure counts as detected at `ts`.
    """

    attempt: str
    status: AttemptStatus
    cause: FailureCause | None = None
    detected_ts: float | None = None
    exit_code: Int64 | None = None
    message: str | None = None

    TIME_FIELDS: ClassVar[tuple[str, ...]] = ("ts", "detected_ts")
    FREE_TEXT_FIELDS: ClassVar[frozenset[str]] = frozenset({"message"})


class PhaseStarted(_Base, tag="phase_started", frozen=True):
    """A Level-3 phase began. `span` tells apart two running phases of the same name."""

    phase: str
    attempt: str | None = None
    span: str = ""
    component: ComponentName | None = None


class PhaseEnded(_Base, tag="phase_ended", frozen=True):
    phase: str
    attempt: str | None = None
    span: str = ""
    component: ComponentName | None = None


class Progress(_Base, tag="progress", frozen=True):
    """Training steps `[step_start, step_end)` read data `[cursor_start, cursor_end)`
    between `start_ts` and `ts`. Only one reporter per job (rank 0) sends these.

    `next_save_ts` (optional, issue 22): when the producer expects its next checkpoint
    save to begin, by its own interval rule, as of `ts` (the preemption controller asks a
    victim to leave at that checkpoint instead of losing its unsaved work). Left out: not
    known; an older reader ignores it safely, so it keeps `v` 1."""

    attempt: str
    start_ts: float
    step_start: Int64
    step_end: Int64
    cursor_start: Int64
    cursor_end: Int64
    loss: float | None = None
    next_save_ts: float | None = None

    TIME_FIELDS: ClassVar[tuple[str, ...]] = ("ts", "start_ts", "next_save_ts")


class CheckpointSaved(_Base, tag="checkpoint_saved", frozen=True):
    """A checkpoint was committed at `ts`. The train loop was blocked from `start_ts` for
    `blocking_s`; the save took `total_s` in all (the rest ran in the background).
    `final` marks the save after the last step, which belongs to shutdown."""

    attempt: str
    start_ts: float
    step: Int64
    cursor: Int64
    blocking_s: float
    total_s: float
    bytes: Int64 = 0
    final: bool = False

    TIME_FIELDS: ClassVar[tuple[str, ...]] = ("ts", "start_ts")


class RankSteps(_Base, tag="rank_steps", frozen=True):
    """One rank's own share of steps `[step_start, step_end)`, taken between `start_ts`
    and `ts`: `busy_s` of that time was the rank's own work (its data, its host work, its
    compute), `wait_s` it spent waiting for the other ranks, as the producer measured the
    wait. Every rank sends these, rank 0 included (decision 0033): in a synchronous job
    every rank's step lasts as long as the slowest's, so only the time a rank did not
    spend waiting tells a straggler apart. Read by the straggler stage
    (`ett/attribution/stragglers.py`); never effective time, which comes from `progress`.
    A new type: a reader older than it reports each such line as an unknown type."""

    attempt: str
    start_ts: float
    step_start: Int64
    step_end: Int64
    busy_s: float
    wait_s: float = 0.0

    TIME_FIELDS: ClassVar[tuple[str, ...]] = ("ts", "start_ts")


class JobEnded(_Base, tag="job_ended", frozen=True):
    """The job stopped holding GPUs (`ts`): the end of its E2E wall time."""

    status: JobStatus


class TaskStateChanged(_Base, tag="task_state", frozen=True):
    """An Airflow task try of the job's DAG run changed state (`running`, `success`,
    `failed`, `up_for_retry`, ...), as a listener saw it: on the worker (`source`
    "worker"), in the scheduler for tasks killed from outside ("scheduler"), or in the API
    server for a state set by hand ("api"). Task-level boundaries for the record and the
    UI; the attribution reads time from the trainer's and operators' events."""

    dag_id: str
    task_id: str
    state: str
    try_number: Int64 = 0
    map_index: Int64 = -1
    source: TaskSource = "worker"
    message: str | None = None

    FREE_TEXT_FIELDS: ClassVar[frozenset[str]] = frozenset({"message"})


class ModelPublished(_Base, tag="model_published", frozen=True):
    """The trained model became available; reported apart from E2E when it is later."""

    uri: str | None = None


Event = (
    JobSubmitted
    | AttemptStarted
    | AttemptEnded
    | PhaseStarted
    | PhaseEnded
    | Progress
    | CheckpointSaved
    | RankSteps
    | JobEnded
    | TaskStateChanged
    | ModelPublished
)
_EVENT_CLASSES: Final[tuple[type[Any], ...]] = (
    JobSubmitted,
    AttemptStarted,
    AttemptEnded,
    PhaseStarted,
    PhaseEnded,
    Progress,
    CheckpointSaved,
    RankSteps,
    JobEnded,
    TaskStateChanged,
    ModelPublished,
)
EVENT_TYPES: Final[dict[str, type[Any]]] = {
    str(cls.__struct_config__.tag): cls for cls in _EVENT_CLASSES
}


MISSING: Final = object()
"""The value of a field that is not there at all (distinct from an explicit null)."""


class EventError(ValueError):
    """An event that cannot be read. `str()` names the line, field and offending value."""

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None,
                 value: Any = MISSING) -> None:
        self.message = message
        self.line = line
        self.field = field
        self.value = value
        where = f"line {line}: " if line is not None else ""
        what = ""
        if field is not None:
            what = (f"field '{field}': " if value is MISSING
                    else f"field '{field}' = {_short_repr(value)}: ")
        super().__init__(f"{where}{what}{message}")

    def at_line(self, line: int) -> EventError:
        return EventError(self.message, line=line, field=self.field, value=self.value)


def _short_repr(value: Any, limit: int = 120) -> str:
    """`repr` (ASCII-safe for NUL and surrogates), cut so an error stays one short line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 5]}...{text[-2:]}"


def _text_flaw(value: str) -> str | None:
    """What makes `value` unstorable, or None. PostgreSQL text cannot hold NUL, and a lone
    surrogate is not UTF-8 at all (no driver or JSON encoder can write it)."""
    if "\x00" in value:
        return "contains a NUL character (\\x00)"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate (not valid Unicode text)"
    return None


def escape_text(value: str) -> str:
    """Free text made storable: a lone surrogate becomes its backslash form (`\\udcff`), a
    NUL becomes `\\x00`. Text that is already fine comes back unchanged (the same object)."""
    if _text_flaw(value) is None:
        return value
    return (value.encode("utf-8", "backslashreplace").decode("utf-8")
            .replace("\x00", "\\x00"))


def check_string(field: str, value: str, *, free_text: bool = False) -> str:
    """The one rule for every string of an event, on every path (parse, emitter, store).

    Identifiers (ids, names, states, URIs) with a NUL or a lone surrogate are rejected: a
    changed identifier would silently split or merge jobs, and the backends disagree on
    them (SQLite stores NUL, PostgreSQL refuses it). Free text (`message`, `host`, `attrs`)
    is escaped instead, since losing a whole event over a log message would be worse.
    """
    if free_text:
        return escape_text(value)
    flaw = _text_flaw(value)
    if flaw is not None:
        raise EventError(flaw, field=field, value=value)
    return value


#: The deepest nesting a free-form value (`attrs`) may have: far beyond any real use, and
#: far below what would exhaust the interpreter's stack while it is checked or stored.
MAX_NESTING: Final = 64


def _escape_nested(value: Any, field: str, depth: int = 0) -> Any:
    """`escape_text` on every string inside a JSON value, dictionary keys included."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict | list | tuple) and depth >= MAX_NESTING:
        raise EventError(f"nested deeper than {MAX_NESTING} levels", field=field)
    if isinstance(value, dict):
        return {escape_text(k) if isinstance(k, str) else k: _escape_nested(v, field, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escape_nested(v, field, depth + 1) for v in value]
    return value


def _time_hint(seconds: float) -> str:
    for unit, scale in (("milliseconds", 1000), ("microseconds", 10**6),
                        ("nanoseconds", 10**9)):
        if TS_MIN <= seconds / scale < TS_MAX:
            return f"; it looks like {unit} (divide by {scale}): Unix seconds are expected"
    if 0 <= seconds < 1e8:  # under three years: seconds since boot, or since the start
        return ("; it looks like a relative or monotonic clock: Unix seconds (time.time()) "
                "are expected")
    return ""


def check_time(field: str, value: Any, seconds: float) -> None:
    """Event times must lie in [TS_MIN, TS_MAX): anything else cannot be a real training
    job's time, and a year past 9999 breaks every date conversion downstream."""
    if math.isnan(seconds) or (math.isinf(seconds) and isinstance(value, float)):
        raise EventError("time must be finite", field=field, value=value)
    if not TS_MIN <= seconds < TS_MAX:
        raise EventError(
            f"time out of range: Unix seconds must be in [{TS_MIN:.0f}, {TS_MAX:.0f}) "
            f"(2000-01-01 to 2100-01-01 UTC){_time_hint(seconds)}", field=field, value=value)


@dataclass(frozen=True, slots=True)
class ParseResult:
    events: list[Event]
    errors: list[EventError]


def _to_seconds(field: str, value: Any) -> Any:
    """ISO-8601 strings become Unix seconds; other values pass through to type checking."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise EventError("not an ISO-8601 time or Unix seconds", field=field,
                             value=value) from None
        if parsed.tzinfo is None:
            raise EventError("ISO-8601 time needs a zone (e.g. 'Z' or '+00:00')",
                             field=field, value=value)
        # Cannot fail: an aware datetime's timestamp is a timedelta subtraction (no
        # mktime), exact for every year 1..9999 and offset; check_time judges the range.
        return parsed.timestamp()
    return value


def _field_of(message: str) -> str | None:
    """msgspec says `... - at `$.field``; pull the field path out for our error."""
    marker = "- at `$."
    start = message.rfind(marker)
    if start < 0:
        return None
    return message[start + len(marker):].rstrip("`")


def _event_class(obj: Any) -> type[Any]:
    """The event type named by `type`, once `v` says this reader knows the format."""
    if not isinstance(obj, dict):
        raise EventError(f"an event must be a JSON object, got {type(obj).__name__}")
    etype = obj.get("type")
    cls = EVENT_TYPES.get(etype) if isinstance(etype, str) else None
    if cls is None:
        raise EventError(f"unknown event type; expected one of {sorted(EVENT_TYPES)}",
                         field="type", value=etype)
    version = obj.get("v", FORMAT_VERSION)
    if isinstance(version, bool) or version not in FORMAT_VERSIONS:
        raise EventError(f"unsupported format version (this reader knows "
                         f"{' and '.join(map(str, FORMAT_VERSIONS))})", field="v", value=version)
    return cls


def _checked_fields(cls: type[_Base], obj: dict[str, Any]) -> dict[str, Any]:
    """The type's own fields, strings checked (free text escaped) and times made seconds."""
    # Only the fields of the type: unknown ones are ignored anyway, so they are not checked.
    # `type` is not among them: _event_class has checked it, and msgspec.convert to one
    # class needs no tag.
    fields = {name: obj[name] for name in cls.__struct_fields__ if name in obj}
    free = cls.FREE_TEXT_FIELDS
    for name, value in fields.items():
        if isinstance(value, str):
            fields[name] = check_string(name, value, free_text=name in free)
        elif name in free and isinstance(value, dict | list):
            fields[name] = _escape_nested(value, name)
    for name in cls.TIME_FIELDS:
        raw = fields.get(name)
        if raw is not None:
            fields[name] = _checked_seconds(name, raw)
    return fields


def _checked_seconds(name: str, raw: Any) -> Any:
    """A time field as float seconds, range-checked; a wrong type is left to msgspec."""
    seconds = _to_seconds(name, raw)
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        try:
            seconds = float(seconds)
        except OverflowError:  # an integer too big for any float
            seconds = math.inf
        check_time(name, raw, seconds)
    return seconds


def _convert(fields: dict[str, Any], cls: type[Any], obj: dict[str, Any]) -> Event:
    """msgspec's strict typing, its error reworded to name the field and the sent value."""
    try:
        event: Event = msgspec.convert(fields, cls, strict=True)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        field = _field_of(msg)
        if field is None and msg.startswith("Object missing required field"):
            field = msg.split("`")[1]  # "Object missing required field `name`"
            raise EventError("required field is missing", field=field) from None
        text = msg.split(" - at ")[0]
        if text.startswith(("Expected `int` <=", "Expected `int` >=")):
            text = (f"integer out of range: must fit 64 bits signed "
                    f"[{INT64_MIN}, {INT64_MAX}]")
        # The field is a top-level key of `fields`, so of `obj` (the value as sent): no type
        # of this format has a field whose parts msgspec checks (attrs' values are Any).
        raise EventError(text, field=field, value=obj[field] if field else MISSING) from None
    return event


def event_from_dict(obj: Any) -> Event:
    """Validate one decoded JSON object and build its event, or raise `EventError`."""
    cls = _event_class(obj)
    event = _convert(_checked_fields(cls, obj), cls, obj)
    _check_semantics(event)
    return event


def _check_semantics(e: Event) -> None:
    """Rules a type system cannot say: ordering, signs, names."""
    if not e.id:
        raise EventError("must not be empty", field="id", value=e.id)
    if not e.job:
        raise EventError("must not be empty", field="job", value=e.job)
    _check_rank(e)
    # Times need no check here: every one sent went through check_time (_checked_fields).
    if isinstance(e, Progress):
        _check_progress(e)
    elif isinstance(e, CheckpointSaved):
        _check_checkpoint_saved(e)
    elif isinstance(e, RankSteps):
        _check_rank_steps(e)
    elif isinstance(e, AttemptEnded):
        _check_attempt_ended(e)
    elif isinstance(e, PhaseStarted | PhaseEnded):
        _check_phase(e)
    elif isinstance(e, JobSubmitted) and not 1 <= e.world_size <= MAX_WORLD_SIZE:
        raise EventError(f"must be a GPU count in [1, {MAX_WORLD_SIZE}]", field="world_size",
                         value=e.world_size)
    elif isinstance(e, TaskStateChanged):
        _at_least(e.try_number, 0, "try_number")
        _at_least(e.map_index, -1, "map_index")


def _at_least(value: int, lowest: int, field: str) -> None:
    """Counts and positions (steps, cursors, tries) start at 0 (a map index at -1)."""
    if value < lowest:
        raise EventError(f"must be >= {lowest}", field=field, value=value)


def _check_rank(e: Event) -> None:
    """A rank is a process index of the job; one other than 0 comes with version 2."""
    if not 0 <= e.rank < MAX_WORLD_SIZE:
        raise EventError(f"must be a rank in [0, {MAX_WORLD_SIZE})", field="rank",
                         value=e.rank)
    if e.rank and e.v < RANK_FORMAT_VERSION:
        raise EventError(f"an event of rank > 0 needs format version {RANK_FORMAT_VERSION} "
                         "(a version-1 reader would take it for rank 0's)", field="v",
                         value=e.v)


def with_rank(event: Event, rank: int) -> Event:
    """`event` as rank `rank` sent it (version 2 when the rank is not 0)."""
    if rank == 0:
        return event
    return msgspec.structs.replace(event, rank=rank, v=RANK_FORMAT_VERSION)


def _check_progress(e: Progress) -> None:
    if e.step_end < e.step_start:
        raise EventError(f"must be >= step_start ({e.step_start})", field="step_end",
                         value=e.step_end)
    if e.cursor_end < e.cursor_start:
        raise EventError(f"must be >= cursor_start ({e.cursor_start})",
                         field="cursor_end", value=e.cursor_end)
    _at_least(e.step_start, 0, "step_start")
    _at_least(e.cursor_start, 0, "cursor_start")
    if e.ts < e.start_ts:
        raise EventError(f"span ends before it starts (start_ts={e.start_ts})",
                         field="ts", value=e.ts)


def _check_checkpoint_saved(e: CheckpointSaved) -> None:
    for name in ("blocking_s", "total_s"):
        value = getattr(e, name)
        if not (math.isfinite(value) and 0 <= value <= MAX_DURATION_S):
            raise EventError(f"must be a number of seconds in [0, {MAX_DURATION_S:.0f}]",
                             field=name, value=value)
    _at_least(e.step, 0, "step")
    _at_least(e.cursor, 0, "cursor")
    _at_least(e.bytes, 0, "bytes")


def _check_rank_steps(e: RankSteps) -> None:
    if e.step_end <= e.step_start:
        raise EventError(f"must be > step_start ({e.step_start}): a report holds steps",
                         field="step_end", value=e.step_end)
    _at_least(e.step_start, 0, "step_start")
    if e.ts < e.start_ts:
        raise EventError(f"span ends before it starts (start_ts={e.start_ts})",
                         field="ts", value=e.ts)
    for name in ("busy_s", "wait_s"):
        value = getattr(e, name)
        if not (math.isfinite(value) and 0 <= value <= MAX_DURATION_S):
            raise EventError(f"must be a number of seconds in [0, {MAX_DURATION_S:.0f}]",
                             field=name, value=value)


def _check_attempt_ended(e: AttemptEnded) -> None:
    if e.status == "failed" and e.cause is None:
        raise EventError("a failed attempt needs a cause, one of "
                         f"{list(FAILURE_CAUSES)}", field="cause")
    if e.status == "success" and e.cause is not None:
        raise EventError("only a failed attempt has a cause", field="cause", value=e.cause)
    if e.detected_ts is not None and e.detected_ts > e.ts:
        raise EventError(f"must not be after the attempt ended (ts={e.ts})",
                         field="detected_ts", value=e.detected_ts)


def _check_phase(e: PhaseStarted | PhaseEnded) -> None:
    """A phase is registered (and not derived) or declares its component; never effective."""
    known = PHASES.get(e.phase)
    if e.component == "effective_training":
        raise EventError("effective time comes only from progress events, not phases",
                         field="component", value=e.component)
    if known is None:
        if e.component is None:
            raise EventError("unknown phase; name a registered phase or declare its "
                             f"'component' (one of {list(COMPONENTS)})",
                             field="phase", value=e.phase)
    elif known.derived:
        raise EventError("this phase is derived by the ETT model and cannot be reported",
                         field="phase", value=e.phase)
    elif e.component is not None and e.component != known.component:
        raise EventError(f"phase '{e.phase}' belongs to '{known.component}'",
                         field="component", value=e.component)


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON-ready form, with `type` first and empty optional fields left out."""
    fields: dict[str, Any] = msgspec.to_builtins(event)
    head = {"type": fields.pop("type"), "v": event.v, "id": event.id, "job": event.job,
            "ts": event.ts}
    if event.rank:
        head["rank"] = event.rank
    return head | fields  # a key of both keeps head's place (and has the same value)


_ENCODER = msgspec.json.Encoder()


def event_to_json(event: Event) -> str:
    return _ENCODER.encode(event_to_dict(event)).decode()


def validate_event(event: Event) -> Event:
    """A Python-built event checked by the very rules a reader applies, or `EventError`.

    msgspec checks nothing when a Struct is built in Python, so the emitter sends its
    events through here: the result is what a reader of its JSON would get (free text
    escaped), so it can always be encoded, spooled and stored.
    """
    try:
        obj = msgspec.to_builtins(event)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EventError(f"a value cannot be written as JSON: {exc}") from None
    return event_from_dict(obj)


def parse_line(text: str | bytes) -> Event:
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EventError(f"not valid JSON: {exc.msg if hasattr(exc, 'msg') else exc}") \
            from None
    except RecursionError:
        raise EventError("not valid JSON: nested too deeply") from None
    return event_from_dict(obj)


def iter_parse(lines: Iterable[str | bytes | EventError]) -> Iterator[Event | EventError]:
    """One result per non-blank line, numbered from 1: an event, or the error for it (a
    line that `bounded_lines` already refused comes as its error)."""
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, EventError):
            yield raw.at_line(number)
            continue
        if not raw.strip():
            continue
        try:
            yield parse_line(raw)
        except EventError as exc:
            yield exc.at_line(number)


#: An event is a few hundred bytes, the longest we write (an attempt's error text, cut to
#: 500 characters) under 2 KB; a line past this is not one, and is skipped as one bad line
#: without being held in memory.
MAX_LINE_BYTES: Final = 1 << 20
_SKIP_CHUNK: Final = 1 << 20


def bounded_lines(fh: BinaryIO, *, max_bytes: int = MAX_LINE_BYTES
                  ) -> Iterator[tuple[int, bytes | EventError]]:
    """(byte offset, line) for each line of a binary stream; a line longer than
    `max_bytes` comes as its `EventError` instead, read past in chunks (a file with no
    newline at all costs `max_bytes` of memory, not its size)."""
    offset = 0
    while line := fh.readline(max_bytes + 1):
        start, length = offset, len(line)
        if length > max_bytes and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = fh.readline(_SKIP_CHUNK)
                length += len(line)
            offset += length
            yield start, EventError(f"line longer than {max_bytes:,} bytes ({length:,})")
            continue
        offset += length
        yield start, line


_STORED: Final = msgspec.json.Decoder(Event)


def decode_stored(payload: str | bytes) -> Event:
    """An event as the store keeps it: its canonical JSON, checked by `parse_line`'s rules
    before it was written. Decoded by its type alone (about ten times faster than
    `parse_line`, which matters when a nightly rollup reads millions), with its times
    checked against today's bounds; a payload that does not decode cleanly or breaks the
    bounds (a row an older, laxer version wrote) goes through `parse_line`, whose
    `EventError` names what is wrong, so a reader can skip it as it would any bad line."""
    try:
        event: Event = _STORED.decode(payload)
    except msgspec.DecodeError:  # ValidationError is one
        return parse_line(payload)
    for name in event.TIME_FIELDS:
        value = getattr(event, name)
        if value is not None and not TS_MIN <= value < TS_MAX:
            return parse_line(payload)
    return event


def stored_event_id(payload: str | bytes) -> object:
    """The id of a stored event that no longer decodes (`decode_stored` refused it), for
    the message that names it; "?" when even that cannot be read."""
    try:
        return json.loads(payload).get("id", "?")
    except (ValueError, AttributeError):
        return "?"


def parse_lines(lines: Iterable[str | bytes | EventError]) -> ParseResult:
    events: list[Event] = []
    errors: list[EventError] = []
    for item in iter_parse(lines):
        (errors if isinstance(item, EventError) else events).append(item)  # type: ignore[arg-type]
    return ParseResult(events, errors)


def read_events(path: str) -> ParseResult:
    """A whole events file parsed in memory (for a job's own file, in tests and benches;
    the CLI streams instead: `airflow_ett.cli.events_file`). Opened as untrusted input:
    a regular file only (`UntrustedFileError` otherwise), each line bounded."""
    # Bytes, not text: a line that is not UTF-8 is then that line's error, not the file's.
    with open_regular(path, what="events file") as fh:
        return parse_lines(line for _, line in bounded_lines(fh))
