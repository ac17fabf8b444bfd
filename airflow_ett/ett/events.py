"""The versioned event format: the one contract between whatever trains and the ETT model.

An event is a JSON object, one per line (JSON Lines). `docs/events.md` is the reader's
version of this module; keep the two in step. Design choices worth knowing:

- Every event carries an `id` chosen by its producer. The store and the model dedupe on
  it, so replaying a spool or re-sending after a timeout never counts anything twice.
- Times are Unix seconds (float) or ISO-8601 strings with a zone; both become float
  seconds here. The model turns them into integer microseconds so that its partitions
  are exact.
- Unknown fields are ignored, so producers may add their own; an unknown `type` or a
  `v` other than 1 is an error, since its meaning cannot be guessed.
- Parsing never throws away good lines because of a bad one: it returns the events it
  could read and an error per line it could not, naming the line, field and value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Final, Literal

import msgspec

from airflow_ett.ett.phases import COMPONENTS, PHASES

FORMAT_VERSION: Final = 1

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
    """Fields every event has."""

    id: str
    job: str
    ts: float
    v: int = FORMAT_VERSION

    TIME_FIELDS: ClassVar[tuple[str, ...]] = ("ts",)


class JobSubmitted(_Base, tag="job_submitted", frozen=True):
    """The job (a DAG run) was submitted: the start of its E2E wall time."""

    tenant: str = "default"
    model: str = ""
    dag_id: str | None = None
    run_id: str | None = None
    attrs: dict[str, Any] = {}


class AttemptStarted(_Base, tag="attempt_started", frozen=True):
    """One start of the trainer process (an Airflow try, or an in-task restart)."""

    attempt: str
    host: str | None = None


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
    exit_code: int | None = None
    message: str | None = None

    TIME_FIELDS: ClassVar[tuple[str, ...]] = ("ts", "detected_ts")


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
    between `start_ts` and `ts`. Only one reporter per job (rank 0) sends these."""

    attempt: str
    start_ts: float
    step_start: int
    step_end: int
    cursor_start: int
    cursor_end: int
    loss: float | None = None

    TIME_FIELDS: ClassVar[tuple[str, ...]] = ("ts", "start_ts")


class CheckpointSaved(_Base, tag="checkpoint_saved", frozen=True):
    """A checkpoint was committed at `ts`. The train loop was blocked from `start_ts` for
    `blocking_s`; the save took `total_s` in all (the rest ran in the background).
    `final` marks the save after the last step, which belongs to shutdown."""

    attempt: str
    start_ts: float
    step: int
    cursor: int
    blocking_s: float
    total_s: float
    bytes: int = 0
    final: bool = False

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
    try_number: int = 0
    map_index: int = -1
    source: TaskSource = "worker"
    message: str | None = None


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
            what = f"field '{field}': " if value is MISSING else f"field '{field}' = {value!r}: "
        super().__init__(f"{where}{what}{message}")

    def at_line(self, line: int) -> EventError:
        return EventError(self.message, line=line, field=self.field, value=self.value)


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
        return parsed.timestamp()
    return value


def _field_of(message: str) -> str | None:
    """msgspec says `... - at `$.field``; pull the field path out for our error."""
    marker = "- at `$."
    start = message.rfind(marker)
    if start < 0:
        return None
    return message[start + len(marker):].rstrip("`")


def _lookup(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.replace("[", ".").replace("]", "").split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return MISSING
    return cur


def event_from_dict(obj: Any) -> Event:
    """Validate one decoded JSON object and build its event, or raise `EventError`."""
    if not isinstance(obj, dict):
        raise EventError(f"an event must be a JSON object, got {type(obj).__name__}")
    etype = obj.get("type")
    cls = EVENT_TYPES.get(etype) if isinstance(etype, str) else None
    if cls is None:
        raise EventError(f"unknown event type; expected one of {sorted(EVENT_TYPES)}",
                         field="type", value=etype)
    version = obj.get("v", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise EventError(f"unsupported format version (this reader knows {FORMAT_VERSION})",
                         field="v", value=version)
    fields = dict(obj)
    for name in cls.TIME_FIELDS:
        if fields.get(name) is not None:
            fields[name] = _to_seconds(name, fields[name])
    try:
        event: Event = msgspec.convert(fields, cls, strict=True)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        field = _field_of(msg)
        if field is None and msg.startswith("Object missing required field"):
            field = msg.split("`")[1] if "`" in msg else None
            raise EventError("required field is missing", field=field) from None
        text = msg.split(" - at ")[0]
        raise EventError(text, field=field,
                         value=_lookup(obj, field) if field else MISSING) from None
    _check_semantics(event)
    return event


def _check_semantics(e: Event) -> None:
    """Rules a type system cannot say: ordering, signs, names."""
    if not e.id:
        raise EventError("must not be empty", field="id", value=e.id)
    if not e.job:
        raise EventError("must not be empty", field="job", value=e.job)
    for name in e.TIME_FIELDS:
        value = getattr(e, name)
        if value is not None and not math.isfinite(value):
            raise EventError("time must be finite", field=name, value=value)
    if isinstance(e, Progress):
        if e.step_end < e.step_start:
            raise EventError(f"must be >= step_start ({e.step_start})", field="step_end",
                             value=e.step_end)
        if e.cursor_end < e.cursor_start:
            raise EventError(f"must be >= cursor_start ({e.cursor_start})",
                             field="cursor_end", value=e.cursor_end)
        if e.cursor_start < 0:
            raise EventError("must be >= 0", field="cursor_start", value=e.cursor_start)
        if e.ts < e.start_ts:
            raise EventError(f"span ends before it starts (start_ts={e.start_ts})",
                             field="ts", value=e.ts)
    elif isinstance(e, CheckpointSaved):
        for name in ("blocking_s", "total_s"):
            value = getattr(e, name)
            if not (math.isfinite(value) and value >= 0):
                raise EventError("must be a finite number >= 0", field=name, value=value)
        if e.bytes < 0:
            raise EventError("must be >= 0", field="bytes", value=e.bytes)
    elif isinstance(e, AttemptEnded):
        if e.status == "failed" and e.cause is None:
            raise EventError("a failed attempt needs a cause, one of "
                             f"{list(FAILURE_CAUSES)}", field="cause")
        if e.status == "success" and e.cause is not None:
            raise EventError("only a failed attempt has a cause", field="cause", value=e.cause)
        if e.detected_ts is not None and e.detected_ts > e.ts:
            raise EventError(f"must not be after the attempt ended (ts={e.ts})",
                             field="detected_ts", value=e.detected_ts)
    elif isinstance(e, PhaseStarted | PhaseEnded):
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
    for name in ("v", "id", "job", "ts"):
        fields.pop(name, None)
    return head | fields


_ENCODER = msgspec.json.Encoder()


def event_to_json(event: Event) -> str:
    return _ENCODER.encode(event_to_dict(event)).decode()


def parse_line(text: str | bytes) -> Event:
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EventError(f"not valid JSON: {exc.msg if hasattr(exc, 'msg') else exc}") \
            from None
    return event_from_dict(obj)


def iter_parse(lines: Iterable[str | bytes]) -> Iterator[Event | EventError]:
    """One result per non-blank line, numbered from 1: an event, or the error for it."""
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            yield parse_line(raw)
        except EventError as exc:
            yield exc.at_line(number)


def parse_lines(lines: Iterable[str | bytes]) -> ParseResult:
    events: list[Event] = []
    errors: list[EventError] = []
    for item in iter_parse(lines):
        (errors if isinstance(item, EventError) else events).append(item)  # type: ignore[arg-type]
    return ParseResult(events, errors)


def read_events(path: str) -> ParseResult:
    with open(path, encoding="utf-8") as fh:
        return parse_lines(fh)
