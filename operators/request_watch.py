"""The train task's watch for a preemption request while its trainer runs.

Glue around `airflow_ett.protocol.states.watch`, the decision: this thread reads the
job directory every `REQUEST_POLL_S`, asks the decision, and calls the operator back:
`act(request, why)` (SIGTERM the trainer now; the watch ends), `hold(request)` (an
`at_checkpoint` request: no restart in place, the trainer leaves by itself at its next
checkpoint), `release(request)` (the held request was withdrawn: restarts in place are
allowed again; a later request is watched for). A request made before this execution
began is stale and put aside, as is a claimed one an earlier execution left (its task
ended before archiving it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from airflow_ett.protocol.request import (
    PreemptRequest,
    archive_claimed,
    archive_request,
    read_claimed,
    read_request,
)
from airflow_ett.protocol.states import watch

#: How often the task looks for a preemption request while its trainer runs.
REQUEST_POLL_S: Final = 1.0

Act = Callable[[PreemptRequest, str], None]
Notify = Callable[[PreemptRequest], None]


def _nothing(request: PreemptRequest) -> None:
    """No callback for this transition."""


class RequestWatcher:
    """Polls `job_dir` for a preemption request while the trainer runs (a context
    manager: the watch runs inside the `with`)."""

    def __init__(self, job_dir: Path, act: Act, hold: Notify | None = None,
                 release: Notify | None = None, poll_s: float = REQUEST_POLL_S) -> None:
        self.job_dir, self._act, self._poll_s = Path(job_dir), act, poll_s
        self._hold = hold or _nothing
        self._release = release or _nothing
        self.began = time.time()
        self.request: PreemptRequest | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ett-preempt-watch",
                                        daemon=True)

    def __enter__(self) -> RequestWatcher:
        archive_claimed(self.job_dir)  # this execution's trainer has not started yet
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5.0)

    def final_request(self) -> PreemptRequest | None:
        """Once the trainer has exited: the request it ran under, or one it claimed and
        left on between two looks (the claim is this execution's: see `__enter__`)."""
        return self.request if self.request is not None else read_claimed(self.job_dir)

    def _run(self) -> None:
        while not self._done.wait(self._poll_s):
            if self.look(time.time()):
                return

    def look(self, now: float) -> bool:
        """One look and what follows from it; True: the watch is over (acted on)."""
        pending = read_request(self.job_dir)
        claimed = read_claimed(self.job_dir) if pending is None else None
        held = self.request
        seen = watch(held, pending, claimed, began=self.began, now=now)
        self.request = seen.held
        if seen.action == "stale":
            archive_request(self.job_dir)
        elif seen.action == "hold" and seen.held is not None:
            self._hold(seen.held)
        elif seen.action == "release" and held is not None:
            self._release(held)
        elif seen.action == "act" and seen.held is not None:
            self._act(seen.held, seen.why)
            return True
        return False
