"""A preemption request: the file the controller leaves in a victim's job directory, and
the train task and the trainer read.

Why a file: the victim's train task runs on some GPU worker, the controller anywhere,
and the job directory (`[ett] work_dir/jobs/<dag>/<run>/`) is the one place both reach
(every worker mounts the work dir: the train task's retry restores from it). The train
task polls for the file while its trainer runs, sends the trainer SIGTERM (its graceful
path: finish the step, checkpoint, exit 75) and, once it has left, hands the GPUs back
to the scheduler without spending a retry; the trainer puts the request's reason in
the `attempt_ended` it records. Asking the task first, rather than clearing it through
Airflow (RESTARTING: SIGTERM, then SIGKILL about 5 s later), gives the checkpoint the
tenant's whole grace period.

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
from typing import Any, Final

from airflow_ett._fs import atomic_write

log = logging.getLogger(__name__)

REQUEST_FILE: Final = "preempt_request.json"
VERSION: Final = 1
_MAX_TEXT: Final = 2000


class RequestError(ValueError):
    """A request file that cannot be used; the message names the field and value."""


@dataclass(frozen=True, slots=True)
class PreemptRequest:
    """`victim` yields its GPUs to `for_job`: checkpoint within `grace_s` of
    `requested_at`, then leave; it may run again `resume_after_s` after it left (the
    waiting job is scheduled first meanwhile)."""

    victim: str
    for_job: str
    reason: str
    requested_at: float
    grace_s: float
    resume_after_s: float = 10.0
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)


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
    if version != VERSION:
        raise RequestError(f"version: {version!r} is not {VERSION}")
    unknown = sorted(set(raw) - {"victim", "for_job", "reason", "requested_at", "grace_s",
                                 "resume_after_s", "version"})
    if unknown:
        raise RequestError(f"unknown field(s) {unknown}")
    return PreemptRequest(
        victim=_text("victim", raw.get("victim")),
        for_job=_text("for_job", raw.get("for_job")),
        reason=_text("reason", raw.get("reason")),
        requested_at=_seconds("requested_at", raw.get("requested_at")),
        grace_s=_seconds("grace_s", raw.get("grace_s")),
        resume_after_s=_seconds("resume_after_s", raw.get("resume_after_s", 10.0)),
    )


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
    path = request_path(job_dir)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    done = path.with_name(f"preempt_request.{stamp}.done.json")
    n = 1
    while done.exists():
        n += 1
        done = path.with_name(f"preempt_request.{stamp}-{n}.done.json")
    try:
        path.rename(done)
    except FileNotFoundError:
        return None
    return done
