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
  checkpoint, exit 75) at once; `leave_by` is `requested_at`. With `skip_save` (the
  victim's exit save is known not to fit its grace: the kill would cut it), the trainer
  saves nothing: it leaves after its current step, losing the work since its last
  checkpoint but freeing the GPUs at once instead of after the whole grace;
- `at_checkpoint`: nobody signals; the trainer looks for the file at each periodic save
  and leaves right after the save it finds it at has committed, saving nothing more
  (exit 75). `leave_by` is when that is expected at the latest (`leave_by_for`: the
  decision's `yield_in_s`, the wait it priced, plus `LEAVE_BY_MARGIN_S`): past it, the
  task falls back to the `now` path, and past `leave_by + grace_s` the controller
  rewrites it as a `now` request (one the trainer claimed it only reports: that trainer
  is leaving already).

The claim: the trainer that finds an `at_checkpoint` request takes it
(`claim_request`: renamed to `preempt_request.claimed.json`) before it decides to leave.
A request the controller no longer wants (its `for_job` got GPUs otherwise, or is gone)
is withdrawn (`withdraw_request`), also a rename of `preempt_request.json`: one rename
wins, so the trainer never leaves on a request its task saw withdrawn, and the controller
never takes back one the trainer is leaving on (its withdrawal finds nothing, and the
victim stays yielding). The claimed file is also how the task learns, once the trainer
has exited, that it left on the request (`take_claimed`; under torchrun a rank's exit 75
reaches the task as torchrun's generic failure, 1); the task then archives it as
`.done`, like any request acted on. A request withdrawn before any claim lets the trainer
go on (its task allows restarts in place again).

Written atomically (a reader never sees half a request), validated when read (the work
dir is trusted, docs/security.md, but a hand-made or truncated file must not crash the
task): a file that does not parse, or whose numbers lie outside their ranges (`limits`:
times from 2000 to 2100, an `at_checkpoint` `leave_by` at most a day and a minute after
`requested_at`,
`grace_s` and `resume_after_s` up to a day), is reported and ignored.
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
from airflow_ett._untrusted import MissingFileError, UntrustedFileError, parse_json, read_text
from airflow_ett.scheduling import limits
from airflow_ett.scheduling.limits import Range
from airflow_ett.scheduling.model import YIELD_MODES, YieldMode

log = logging.getLogger(__name__)

REQUEST_FILE: Final = "preempt_request.json"
#: An `at_checkpoint` request the trainer took to leave on (see the docstring).
CLAIMED_FILE: Final = "preempt_request.claimed.json"
VERSION: Final = 2
#: The versions `parse_request` reads (1: before `mode` and `leave_by`, always `now`;
#: a version 2 file without `skip_save` is one that saves).
VERSIONS: Final = (1, 2)
#: Slack on an `at_checkpoint` request's `leave_by` beyond the expected checkpoint: the
#: expectation is a typical gap between saves, and a step or a save may run long.
LEAVE_BY_MARGIN_S: Final = 60.0
_MAX_TEXT: Final = 2000
#: A request is a few hundred bytes (three texts of at most `_MAX_TEXT` characters and a
#: few numbers): a file past this is not one, and is not read further. The train task
#: looks every second and the trainer at every save: neither may hold a planted 200 MB.
MAX_REQUEST_BYTES: Final = 64 << 10
#: How much of a value an error message quotes (the log line stays one short line).
_SHOWN: Final = 60
#: A request is a flat object: anything nested is refused long before the parser's stack.
_MAX_DEPTH: Final = 4


class RequestError(ValueError):
    """A request file that cannot be used; the message names the field and value."""


def _shown(value: object) -> str:
    """`repr(value)`, cut to `_SHOWN` characters: an error quotes a value, never a file."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text):,} characters)"


@dataclass(frozen=True, slots=True)
class PreemptRequest:
    """`victim` yields its GPUs to `for_job`; it may run again `resume_after_s` after it
    left (the waiting job is scheduled first meanwhile).

    `mode` `now`: checkpoint within `grace_s` of `requested_at`, then leave.
    `at_checkpoint`: leave right after the next periodic checkpoint commits, expected by
    `leave_by` (Unix seconds); past it, as `now` with the grace from then. `leave_by`
    left out (NaN) is `requested_at`, what it is for a `now` request. `skip_save` (a `now`
    request only): leave after the current step without saving (the exit save would not
    fit the grace)."""

    victim: str
    for_job: str
    reason: str
    requested_at: float
    grace_s: float
    resume_after_s: float = 10.0
    mode: YieldMode = "now"
    leave_by: float = math.nan
    skip_save: bool = False
    version: int = VERSION

    def __post_init__(self) -> None:
        if math.isnan(self.leave_by):  # frozen: the one place a default is filled in
            object.__setattr__(self, "leave_by", self.requested_at)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)


def leave_by_for(mode: YieldMode, requested_at: float, yield_in_s: float) -> float:
    """When a victim asked at `requested_at` is expected to have left at the latest: for
    `at_checkpoint`, the decision's `yield_in_s` (the wait the decision priced against the
    work it saves: a checkpoint later than estimated makes the task fall back to leaving
    at once, so the waiting job never waits much longer than was priced) plus
    `LEAVE_BY_MARGIN_S`; for `now`, `requested_at` itself."""
    if mode == "now":
        return requested_at
    return requested_at + max(0.0, yield_in_s) + LEAVE_BY_MARGIN_S


def resume_after_s(request: PreemptRequest) -> float:
    """How long after the victim left it may run again: the request's `resume_after_s`
    within its range (`limits.RESUME_AFTER_S`, 0 to a day; NaN is 0). `parse_request`
    refuses a file outside it; a request built otherwise must not overflow a date."""
    return limits.RESUME_AFTER_S.clamp(request.resume_after_s)


def _text(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
        raise RequestError(f"{field}: {_shown(value)} is not a non-empty text of at most "
                           f"{_MAX_TEXT} characters")
    return value


#: A request's grace: the tenants file's (`limits.GRACE_S`), or 0 (leave at once).
_GRACE_S: Final = Range("a number of seconds", 0, limits.GRACE_S.hi)
#: The most an `at_checkpoint` request's `leave_by` may lie after its `requested_at`:
#: the longest wait for a checkpoint (`limits.MAX_CHECKPOINT_WAIT_S`) plus the margin
#: (`leave_by_for` never goes further). A `now` request's `leave_by` is when it was made
#: `now`: an escalated one's lies as late as the controller came to escalate it
#: (`snapshot.review_requests`), in the time window.
MAX_LEAVE_AFTER_S: Final = limits.MAX_CHECKPOINT_WAIT_S + LEAVE_BY_MARGIN_S


def _number(field: str, value: Any, rng: Range) -> float:
    """`value` as a float when `rng` holds it; `RequestError` naming field and value."""
    why = rng.why(value)
    if why is not None:
        raise RequestError(f"{field}: {_shown(value)} is not {why}")
    return float(value)


def parse_request(text: str) -> PreemptRequest:
    try:
        raw = parse_json(text, what="request", path="text", max_depth=_MAX_DEPTH)
    except UntrustedFileError as exc:  # not JSON, or nested past any request's depth
        raise RequestError(exc.reason) from None
    if not isinstance(raw, dict):
        raise RequestError(f"not a JSON object: {type(raw).__name__}")
    version = raw.get("version")
    if isinstance(version, bool) or version not in VERSIONS:
        raise RequestError(f"version: {_shown(version)} is not one of {list(VERSIONS)}")
    known = {"victim", "for_job", "reason", "requested_at", "grace_s", "resume_after_s",
             "version"}
    if version >= 2:
        known |= {"mode", "leave_by", "skip_save"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RequestError(f"unknown field(s) {_shown(unknown)} in a version {version} "
                           "request")
    requested_at = _number("requested_at", raw.get("requested_at"), limits.REQUEST_TIME)
    mode = _mode(raw.get("mode", "now"))
    leave_by = requested_at
    if version >= 2:
        leave_by = _number("leave_by", raw.get("leave_by"), limits.REQUEST_TIME)
        if leave_by < requested_at:
            raise RequestError(f"leave_by: {leave_by!r} is before requested_at "
                               f"{requested_at!r}")
        if mode == "at_checkpoint" and leave_by - requested_at > MAX_LEAVE_AFTER_S:
            raise RequestError(f"leave_by: {leave_by!r} is more than {MAX_LEAVE_AFTER_S:g} s "
                               f"after requested_at {requested_at!r} in an 'at_checkpoint' "
                               "request")
    return PreemptRequest(
        victim=_text("victim", raw.get("victim")),
        for_job=_text("for_job", raw.get("for_job")),
        reason=_text("reason", raw.get("reason")),
        requested_at=requested_at,
        grace_s=_number("grace_s", raw.get("grace_s"), _GRACE_S),
        resume_after_s=_number("resume_after_s", raw.get("resume_after_s", 10.0),
                               limits.RESUME_AFTER_S),
        mode=mode,
        leave_by=leave_by,
        skip_save=_skip_save(raw.get("skip_save", False), mode),
    )


def _skip_save(value: Any, mode: YieldMode) -> bool:
    """Leaving without a save is a `now` request's: an `at_checkpoint` one saves anyway."""
    if not isinstance(value, bool):
        raise RequestError(f"skip_save: {_shown(value)} is not true or false")
    if value and mode != "now":
        raise RequestError(f"skip_save: {_shown(value)} in a {mode!r} request (only a 'now' "
                           "request may leave without saving)")
    return value


def _mode(value: Any) -> YieldMode:
    if value not in YIELD_MODES:
        raise RequestError(f"mode: {_shown(value)} is not one of {list(YIELD_MODES)}")
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
    return _read(request_path(job_dir), "preemption request")


def _read(path: Path, what: str) -> PreemptRequest | None:
    text = _read_text(path, what)
    return None if text is None else _parsed(path, text, what)


def _read_text(path: Path, what: str) -> str | None:
    """The file's text, read bounded (a regular file of at most `MAX_REQUEST_BYTES`, UTF-8);
    None when there is none, or when it cannot be used (logged once: `_warn`). Never
    raises for what is in the file: a reader is a trainer at its periodic save or a task
    polling every second, and a planted file must not fail either."""
    try:
        return read_text(path, what=what, max_bytes=MAX_REQUEST_BYTES)
    except MissingFileError:
        return None
    except UntrustedFileError as exc:
        _warn(path, f"{exc}: ignored")
        return None


def archive_request(job_dir: Path, *, now: float | None = None) -> Path | None:
    """Move the pending request aside once it has been acted on (so it is acted on once,
    and the job directory keeps the history of its preemptions)."""
    return _set_aside(job_dir, "done", now)


def withdraw_request(job_dir: Path, *, now: float | None = None) -> Path | None:
    """Take back a pending request nobody acted on (its waiting job no longer needs the
    GPUs): renamed aside as `preempt_request.<stamp>.withdrawn.json`, atomically, so the
    task sees it gone or whole and the job directory keeps the history. None: there was
    none (claimed by the trainer meanwhile, acted on, or withdrawn already)."""
    return _set_aside(job_dir, "withdrawn", now)


def _set_aside(job_dir: Path, kind: str, now: float | None, *, source: Path | None = None
               ) -> Path | None:
    path = request_path(job_dir)
    source = source or path
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    aside = path.with_name(f"preempt_request.{stamp}.{kind}.json")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"preempt_request.{stamp}-{n}.{kind}.json")
    try:
        source.rename(aside)
    except FileNotFoundError:
        return None
    return aside


def claimed_path(job_dir: Path) -> Path:
    return Path(job_dir) / CLAIMED_FILE


def claim_request(job_dir: Path, *, since: float) -> PreemptRequest | None:
    """Take the pending `at_checkpoint` request made at or after `since` (the trainer, at
    a periodic save): renamed to `CLAIMED_FILE`, atomically, so that exactly one of this
    and a withdrawal wins. None: none to take (none, a `now` one, which is the task's to
    act on, an older one, or withdrawn meanwhile). A request replaced between the read and
    the rename is put back untaken: the next save looks again."""
    path = request_path(job_dir)
    text = _read_text(path, "preemption request")
    if text is None:
        return None
    request = _parsed(path, text, "preemption request")
    if request is None or request.mode != "at_checkpoint" or request.requested_at < since:
        return None
    claimed = claimed_path(job_dir)
    try:
        path.rename(claimed)
    except FileNotFoundError:
        log.info("preemption request %s withdrawn as it was claimed: none to leave on", path)
        return None
    if _read_text(claimed, "claimed preemption request") != text:
        if not path.exists():
            claimed.rename(path)
        return None
    return request


def read_claimed(job_dir: Path) -> PreemptRequest | None:
    """The request the trainer claimed to leave on, or None (none; unusable: logged)."""
    return _read(claimed_path(job_dir), "claimed preemption request")


def is_claimed(job_dir: Path, request: PreemptRequest) -> bool:
    """Whether the trainer claimed `request` (the claimed file names its `requested_at`)."""
    claimed = read_claimed(job_dir)
    return claimed is not None and claimed.requested_at == request.requested_at


def take_claimed(job_dir: Path, request: PreemptRequest, *, now: float | None = None
                 ) -> Path | None:
    """Once the trainer has exited: archive the claimed file as `.done` when it is
    `request`'s (the trainer left on it); None when it is not (nothing changed)."""
    if not is_claimed(job_dir, request):
        return None
    return _set_aside(job_dir, "done", now, source=claimed_path(job_dir))


def archive_claimed(job_dir: Path, *, now: float | None = None) -> Path | None:
    """Put aside (as `.done`) a claimed request left by an earlier execution of the task,
    whose trainer left on it but whose task ended before archiving it: it must not stand
    for a request of this execution."""
    return _set_aside(job_dir, "done", now, source=claimed_path(job_dir))


def _parsed(path: Path, text: str, what: str) -> PreemptRequest | None:
    try:
        return parse_request(text)
    except RequestError as exc:
        _warn(path, f"{what} {path} ignored: {exc}")
        return None


#: The last warning logged per file: a broken request is seen every second by the task's
#: watch and at every save by the trainer, and is logged once until what is wrong changes.
_warned: dict[str, str] = {}
_WARNED_MAX: Final = 4096


def _warn(path: Path, message: str) -> None:
    key = str(path)
    if _warned.get(key) == message:
        return
    if len(_warned) >= _WARNED_MAX:
        _warned.clear()
    _warned[key] = message
    log.warning("%s", message)
