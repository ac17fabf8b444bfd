"""Watch a process tree from a test: record every process that ever runs under a root, so
that after a kill the test can say whether any of them still runs.

The check is independent of `airflow_ett._proc`: it asks the kernel about each recorded
pid (`psutil.pid_exists`), and counts a pid as the same process only if its start time
matches (a reused pid is someone else's process), and a zombie as gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from types import TracebackType
from typing import Any

import psutil


def _start(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def still_running(recorded: dict[int, float]) -> dict[int, str]:
    """The recorded processes that run now: pid -> command line."""
    left = {}
    for pid, start in recorded.items():
        if not psutil.pid_exists(pid):
            continue
        try:
            proc = psutil.Process(pid)
            if proc.create_time() != start or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            left[pid] = " ".join(proc.cmdline())[:200]
        except psutil.NoSuchProcess:
            continue
    return left


class TreeRecorder:
    """A thread that walks `root`'s tree every `period` seconds while it runs.

    `processes` maps pid -> (start time, session id, command line) of everything seen.
    """

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self.processes: dict[int, tuple[float, int, str]] = {}
        self._roots: list[psutil.Process] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-recorder", daemon=True)

    def watch(self, root: subprocess.Popen[Any] | int) -> None:
        pid = root if isinstance(root, int) else root.pid
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return
        with self._lock:
            self._roots.append(proc)
        self._record([proc])

    def _record(self, procs: list[psutil.Process]) -> None:
        for proc in procs:
            try:
                info = (proc.create_time(), os.getsid(proc.pid), " ".join(proc.cmdline()))
            except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                continue
            with self._lock:
                self.processes.setdefault(proc.pid, info)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            with self._lock:
                roots = list(self._roots)
            for root in roots:
                try:
                    if root.is_running():
                        self._record(root.children(recursive=True))
                except psutil.NoSuchProcess:
                    continue

    @property
    def starts(self) -> dict[int, float]:
        with self._lock:
            return {pid: info[0] for pid, info in self.processes.items()}

    def matching(self, needle: str) -> dict[int, tuple[float, int, str]]:
        with self._lock:
            return {pid: info for pid, info in self.processes.items() if needle in info[2]}

    def clean_up(self) -> None:
        """SIGKILL whatever recorded process still runs: a failed test must not leave
        hung trainers on the shared cores."""
        for pid in still_running(self.starts):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> TreeRecorder:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.clean_up()

