"""A preemption request: the file the controller leaves in a victim's job directory, and
the train task and the trainer read.

Why a file: the victim's train task runs on some GPU worker, the controller anywhere,
and the job directory (`[ett] work_dir/jobs/<dag>/<run>/`) is the one place both reach
(every worker mounts the work dir: the train task's retry restores from it). The train
task polls for the file while its trainer runs and, once the trainer has left, hands the
GPUs back to the scheduler without spending a retry; the trainer puts the request's
reason in the `attempt_ended` it records. Asking the task first, rather than clearing it
through Airflow (RESTARTING: SIGTERM, then SIGKILL about 5 s later), gives the
checkpoint the tenant's whole grace period.

Two modes (`model.YieldMode`, version 2; a version 1 file is a `now` request):

- `now`: the task sends the trainer SIGTERM (its graceful path: finish the step,
  checkpoint, exit 75) at once; `leave_by` is `requested_at`;
- `at_checkpoint`: nobody signals; the trainer reads the file at each periodic save and
  leaves right after the save it finds it at has committed, saving nothing more (exit
  75). `leave_by` is when that is expected at the latest (`leave_by_for`: the decision's
  `yield_in_s` plus `LEAVE_BY_MARGIN_S`, never more than the fleet's
  `checkpoint_wait_s` plus the margin): past it, the task falls back to the `now` path,
  and past `leave_by + grace_s` the controller rewrites the request as a `now` one.

Under torchrun a rank's exit 75 reaches the task as torchrun's generic failure (1), so a
trainer that left on an `at_checkpoint` request also says so in the job directory
(`mark_left`, rank 0, `preempt_left.json`), and the task takes that as the yield
(`take_left_mark`).

A request the controller no longer wants (its `for_job` got GPUs otherwise, or is gone)
is withdrawn (`withdraw_request`: renamed aside, like an archived one); the task then
lets its trainer go on.

Written atomically (a reader never sees half a request), validated when read (the work
dir is trusted, docs/security.md, but a hand-made or truncated file must not crash the
task): a file that does not parse is reported and ignored.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, cast

from airflow_ett._fs import atomic_write
from airflow_ett.scheduling.model import YIELD_MODES, YieldMode

log = logging.getLogger(__name__)

REQUEST_FILE: Final = "preempt_request.json"
#: The trainer's note that it left on an `at_checkpoint` request (see the docstring).
LEFT_FILE: Final = "preempt_left.json"
VERSION: Final = 2
#: The versions `parse_request` reads (1: before `mode` and `leave_by`, always `now`).
VERSIONS: Final = (1, 2)
#: Slack on an `at_checkpoint` request's `leave_by` beyond the expected checkpoint: the
#: expectation is a typical gap between saves, and a step or a save may run long.
LEAVE_BY_MARGIN_S: Final = 60.0
_MAX_TEXT: Final = 2000


class RequestError(ValueError):
    """A request file that cannot be used; the message names the field and value."""


@dataclass(frozen=True, slots=True)
class PreemptRequest:
    """`victim` yields its GPUs to `for_job`; it may run again `resume_after_s` after it
    left (the waiting job is scheduled first meanwhile).

    `mode` `now`: checkpoint within `grace_s` of `requested_at`, then leave.
    `at_checkpoint`: leave right after the next periodic checkpoint commits, expected by
    `leave_by` (Unix seconds); past it, as `now` with the grace from then. `leave_by`
    left out (NaN) is `requested_at`, what it is for a `now` request."""

    victim: str
    for_job: str
    reason: str
    requested_at: float
    grace_s: float
    resume_after_s: float = 10.0
    mode: YieldMode = "now"
    leave_by: float = math.nan
    version: int = VERSION

    def __post_init__(self) -> None:
        if math.isnan(self.leave_by):  # frozen: the one place a default is filled in
            object.__setattr__(self, "leave_by", self.requested_at)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)


def leave_by_for(mode: YieldMode, requested_at: float, yield_in_s: float,
                 checkpoint_wait_s: float) -> float:
    """When a victim asked at `requested_at` is expected to have left at the latest: for
    `at_checkpoint`, the decision's `yield_in_s` plus `LEAVE_BY_MARGIN_S`, bounded by the
    fleet's `checkpoint_wait_s` plus the margin (a wrong estimate never makes the waiting
    job wait longer than the tenants file allows); for `now`, `requested_at` itself."""
    if mode == "now":
        return requested_at
    wait = min(max(0.0, yield_in_s), max(0.0, checkpoint_wait_s))
    return requested_at + wait + LEAVE_BY_MARGIN_S


def _text(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
        raise RequestError(f"{field}: {value!r} is not a non-empty text of at most "
                           f"{_MAX_TEXT} characters")
    return value


def _seconds(field: str, value: Any, *, lo: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or value < lo:
        raise RequestError(f"{field}: {value!r} is not a number of seconds >= {lo:g}")
    return float(value)


def parse_request(text: str) -> PreemptRequest:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise RequestError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise RequestError(f"not a JSON object: {type(raw).__name__}")
    version = raw.get("version")
    if isinstance(version, bool) or version not in VERSIONS:
        raise RequestError(f"version: {version!r} is not one of {list(VERSIONS)}")
    known = {"victim", "for_job", "reason", "requested_at", "grace_s", "resume_after_s",
             "version"}
    if version >= 2:
        known |= {"mode", "leave_by"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RequestError(f"unknown field(s) {unknown} in a version {version} request")
    requested_at = _seconds("requested_at", raw.get("requested_at"))
    mode = _mode(raw.get("mode", "now"))
    leave_by = requested_at
    if version >= 2:
        leave_by = _seconds("leave_by", raw.get("leave_by"))
        if leave_by < requested_at:
            raise RequestError(f"leave_by: {leave_by!r} is before requested_at "
                               f"{requested_at!r}")
    return PreemptRequest(
        victim=_text("victim", raw.get("victim")),
        for_job=_text("for_job", raw.get("for_job")),
        reason=_text("reason", raw.get("reason")),
        requested_at=requested_at,
        grace_s=_seconds("grace_s", raw.get("grace_s")),
        resume_after_s=_seconds("resume_after_s", raw.get("resume_after_s", 10.0)),
        mode=mode,
        leave_by=leave_by,
    )


def _mode(value: Any) -> YieldMode:
    if value not in YIELD_MODES:
        raise RequestError(f"mode: {value!r} is not one of {list(YIELD_MODES)}")
    return cast("YieldMode", value)


def request_path(job_dir: Path) -> Path:
    return Path(job_dir) / REQUEST_FILE


def write_request(job_dir: Path, request: PreemptRequest) -> Path:
    """Leave the request in the job directory (atomically; replaces an older one)."""
    path = request_path(job_dir)
    atomic_write(path, request.to_json().encode())
    return path


def read_request(job_dir: Path) -> PreemptRequest | None:
    """The pending request, or None (none, or one that cannot be used: logged)."""
    path = request_path(job_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("preemption request %s cannot be read: %s", path, exc)
        return None
    try:
        return parse_request(text)
    except RequestError as exc:
        log.warning("preemption request %s ignored: %s", path, exc)
        return None


def archive_request(job_dir: Path, *, now: float | None = None) -> Path | None:
    """Move the pending request aside once it has been acted on (so it is acted on once,
    and the job directory keeps the history of its preemptions)."""
    return _set_aside(job_dir, "done", now)


def withdraw_request(job_dir: Path, *, now: float | None = None) -> Path | None:
    """Take back a pending request nobody acted on (its waiting job no longer needs the
    GPUs): renamed aside as `preempt_request.<stamp>.withdrawn.json`, atomically, so the
    task sees it gone or whole and the job directory keeps the history. None: there was
    none (acted on, or withdrawn already)."""
    return _set_aside(job_dir, "withdrawn", now)


def _set_aside(job_dir: Path, kind: str, now: float | None) -> Path | None:
    path = request_path(job_dir)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    aside = path.with_name(f"preempt_request.{stamp}.{kind}.json")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"preempt_request.{stamp}-{n}.{kind}.json")
    try:
        path.rename(aside)
    except FileNotFoundError:
        return None
    return aside



def mark_left(job_dir: Path, request: PreemptRequest, *, step: int) -> None:
    """The trainer left on `request` after committing `step` (atomically written)."""
    note = {"requested_at": request.requested_at, "step": step, "left_at": time.time()}
    atomic_write(Path(job_dir) / LEFT_FILE, json.dumps(note).encode())


def take_left_mark(job_dir: Path, request: PreemptRequest) -> bool:
    """Whether the trainer noted it left on `request` (the note names its `requested_at`);
    the note is removed either way, so an old one never speaks for a later request."""
    path = Path(job_dir) / LEFT_FILE
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
        path.unlink()
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as exc:
        log.warning("%s ignored: %s", path, exc)
        path.unlink(missing_ok=True)
        return False
    return isinstance(note, dict) and note.get("requested_at") == request.requested_at
