"""What a trainer's exit says: the exit codes, the exit record, and their meaning.

Exit codes are the contract with whoever restarts the trainer (the train task's launcher,
or torchrun's elastic agent): they say whether a restart can help and whether it should
spend the job's failure budget. `classify_exit` is their one reading. Under torchrun the
top process's code is torchrun's own (1 for any failed rank), so each rank also leaves an
exit record (`ExitRecord`, in `$ETT_EXIT_DIR`), which the launcher judges
(`trainer/rank_failures.py`); for a single process the record says whether the trainer
reported its own end, so the task reports it for a trainer that does not.

| code | meaning | retried | cause |
|---|---|---|---|
| 0 | done | - | - |
| 75 | left on a preemption request or SIGTERM, checkpointed | yes, no retry spent | preemption |
| 78 | bad configuration (model, data, arguments) | never | application |
| 70 | hung: no progress, a watchdog ended it | yes | infra |
| 1 | the training code raised | yes | application |
| killed by SIGKILL/SIGSEGV/SIGBUS/SIGABRT | a lost host, the OOM killer | yes | infra |
| killed by SIGTERM (no handler) | asked to leave | yes | preemption |
| anything else | - | yes | unknown |
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final, Literal

from airflow_ett.protocol.env import EXIT_DIR_ENV

if TYPE_CHECKING:
    from airflow_ett.ett.events import FailureCause

log = logging.getLogger("airflow_ett.protocol")

EXIT_OK: Final = 0
EXIT_APPLICATION: Final = 1  # the training code raised: a restart may or may not help
EXIT_HUNG: Final = 70  # EX_SOFTWARE: no progress for hang_timeout_s; the watchdog ended it
EXIT_PREEMPTED: Final = 75  # EX_TEMPFAIL: asked to leave (SIGTERM), checkpointed: resume for free
EXIT_BAD_CONFIG: Final = 78  # EX_CONFIG: will not heal by retrying: fail fast


class ExitRecord:
    """This rank's exit record: how it ended, for the launcher to find the root cause of a
    multi-rank attempt (`trainer/rank_failures.py` reads and judges it).

    Written as `running` when the process starts, then rewritten when it gets SIGTERM
    (`sigterm_at`) and once more when its exit path runs (`exited`, with the exit code
    and when it failed). A rank killed without warning leaves `running`: that silence is
    the record of a SIGKILL. Each write replaces the file atomically (a rename), so a
    reader sees a whole record or the previous one. Without `ETT_EXIT_DIR` (a single
    process, or a launcher that does not ask) it writes nothing; a write that fails is
    logged, never raised: the record is an aid to the launcher, not the attempt's job.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self.fields: dict[str, object] = {}

    def start(self, directory: str | None = None) -> None:
        directory = directory if directory is not None else os.environ.get(EXIT_DIR_ENV)
        if not directory:
            return
        rank = os.environ.get("RANK", "0")
        if not rank.isdigit():
            log.warning("exit record: RANK=%r is not a rank: none written", rank)
            return
        self.path = Path(directory) / f"rank{int(rank)}.json"
        self.fields = {"v": 1, "state": "running", "rank": int(rank),
                       "host": socket.gethostname(), "pid": os.getpid(),
                       "started_at": time.time()}
        self._write()

    @property
    def active(self) -> bool:
        return self.path is not None

    @property
    def exited(self) -> bool:
        return self.fields.get("state") == "exited"

    def sigterm(self, at: float) -> None:
        if self.path is not None and self.fields.get("sigterm_at") is None:
            self.fields["sigterm_at"] = at
            self._write()

    def failed(self, at: float, error: str | None = None) -> None:
        """The moment this rank's failure happened (the first call wins), before its
        exit path, which may take a while (teardown, waiting for a dead peer)."""
        self.fields.setdefault("failed_at", at)
        if error is not None:
            self.fields.setdefault("error", error[:500])

    def reported(self, cause: str | None) -> None:
        """The cause this rank's own attempt_ended event gave (None: success)."""
        self.fields["reported_cause"] = cause

    def exit(self, code: int, error: str | None = None) -> None:
        if self.path is None or self.exited:
            return
        if code != 0:
            self.failed(time.time(), error)
        self.fields.update(state="exited", exit_code=code, exited_at=time.time())
        self._write()

    def _write(self) -> None:
        assert self.path is not None
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.fields), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("exit record %s not written: %s", self.path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()


#: This process's exit record (one per process: the rank).
exit_record = ExitRecord()


def die_on_sigterm_recorded() -> None:
    """Until the trainer installs its own handler (`PreemptionFlag`), SIGTERM kills the
    process as it always did, but noted first in the exit record: torchrun SIGTERMs the
    ranks still starting when one fails, and those must not read as killed silently."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        exit_record.sigterm(time.time())
        exit_record.exit(-signal.SIGTERM, "SIGTERM before the trainer loop started")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


@dataclass(frozen=True, slots=True)
class ExitClass:
    status: Literal["success", "failed"]
    cause: FailureCause | None
    retryable: bool
    reported_by_child: bool  # whether the trainer itself emitted attempt_ended
    description: str


def classify_exit(code: int) -> ExitClass:
    """What an attempt's exit code means. Negative codes are signals (subprocess's
    convention); 128+N is a shell's or torchrun's way of saying the same."""
    if code == EXIT_OK:
        return ExitClass("success", None, False, True, "finished")
    if code == EXIT_PREEMPTED:
        return ExitClass("failed", "preemption", True, True, "preempted, checkpointed")
    if code == EXIT_BAD_CONFIG:
        return ExitClass("failed", "application", False, True,
                         "bad configuration: a retry cannot help")
    if code == EXIT_APPLICATION:
        return ExitClass("failed", "application", True, True, "the training code raised")
    if code == EXIT_HUNG:
        return ExitClass("failed", "infra", True, True,
                         "hung: no progress within hang_timeout_s, its watchdog ended it")
    signum = -code if code < 0 else code - 128 if code > 128 else None
    if signum in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
        name = signal.Signals(signum).name
        return ExitClass("failed", "infra", True, False, f"killed by {name}")
    if signum == signal.SIGTERM:
        return ExitClass("failed", "preemption", True, False, "terminated (SIGTERM)")
    return ExitClass("failed", "unknown", True, False, f"exit code {code}")
