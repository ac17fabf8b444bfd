"""The component processes of an embedded Airflow: started, watched, ended.

Each component (`dag-processor`, `scheduler`, `triggerer`, `api-server`) is its own
`airflow` CLI process in its own session and process group, with its own log file;
`stop()` ends every process started here, and every descendant ever seen, by pid
(`airflow_ett._proc`: a psutil walk, remembered across walks).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from airflow_ett._proc import ProcessTree
from airflow_ett.embedded.errors import ComponentDied

DEFAULT_COMPONENTS: tuple[str, ...] = ("dag-processor", "scheduler", "triggerer", "api-server")
KNOWN_COMPONENTS = frozenset(DEFAULT_COMPONENTS)
LOG_TAIL_LINES = 40


def _set_parent_death_signal() -> None:
    """In the child, before exec: get SIGTERM if the parent dies (Linux only).

    A test runner killed with SIGKILL cannot run stop(); without this its scheduler and
    api-server would keep running, and keep the two cores busy, for ever.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)


#: The most of a log a tail reads: ample for `LOG_TAIL_LINES` lines.
_TAIL_BYTES = 256 << 10


def tail(path: Path, lines: int = LOG_TAIL_LINES, offset: int = 0) -> str:
    """The last `lines` of a log from byte `offset` on (this start's part of the file),
    reading at most its last `_TAIL_BYTES` (a day-long log is hundreds of MB)."""
    try:
        with path.open("rb") as fh:
            start = max(offset, os.fstat(fh.fileno()).st_size - _TAIL_BYTES)
            fh.seek(start)
            text = fh.read(_TAIL_BYTES).decode("utf-8", errors="replace")
            if start > offset:  # the first line is cut: drop it
                text = text.partition("\n")[2]
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror or exc})"
    kept = text.splitlines()[-lines:]
    return "\n".join(kept) if kept else "(empty)"


@dataclass(slots=True)
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int
    log_file: IO[bytes]
    started_at: float = field(default_factory=time.monotonic)


class Components:
    """The components started for one installation, each logging to `<log_dir>/<name>.log`."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._started: dict[str, _Component] = {}
        self._tree = ProcessTree()  # every component and descendant ever seen

    def __contains__(self, name: object) -> bool:
        return name in self._started

    def __iter__(self) -> Iterator[str]:
        return iter(self._started)

    def start(self, commands: Mapping[str, Sequence[str]], *, exe: str,
              env: Mapping[str, str], cwd: Path,
              env_of: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """Start each component of `commands` (name -> the `airflow` CLI arguments it runs)
        not running yet, as its own session and process group, with `env` and, for a
        component named in `env_of`, its own additions (a worker's log-server port).

        Call it from a thread that lives as long as the components (the main thread): on
        Linux they get SIGTERM when the thread that started them ends, so that a parent
        killed with SIGKILL leaves nothing running.
        """
        for name, args in commands.items():
            if name in self._started and self._started[name].process.poll() is None:
                continue
            self._forget(name)
            log_path = self.log_dir / f"{name}.log"
            log_file = log_path.open("ab")
            offset = log_file.tell()
            shown = " ".join(args)
            log_file.write(f"=== {datetime.now(UTC).isoformat()} airflow {shown} ===\n".encode())
            log_file.flush()
            process = subprocess.Popen(
                [exe, *args], env={**env, **(env_of or {}).get(name, {})}, cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT,
                # Own session and group: Ctrl-C in our terminal does not reach it (stop()
                # orders the shutdown), and the group can be signalled as a whole.
                start_new_session=True, preexec_fn=_set_parent_death_signal,
            )
            self._started[name] = _Component(name, process, log_path, offset, log_file)
            self._tree.add_root(process, group=True)

    def kill(self, name: str) -> list[int]:
        """SIGKILL one component and every process below it (a host lost: nothing gets to
        clean up); returns their pids. The component can be started again."""
        comp = self._started.get(name)
        if comp is None:
            raise KeyError(f"{name!r} was not started; started: {sorted(self._started)}")
        tree = ProcessTree()
        tree.add_root(comp.process, group=True)
        killed = tree.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            comp.process.wait(timeout=5.0)
        self._forget(name)
        return killed

    def _forget(self, name: str) -> None:
        comp = self._started.pop(name, None)
        if comp is not None:
            comp.log_file.close()

    @property
    def pids(self) -> dict[str, int]:
        """The pid of each started component (also its process-group id)."""
        return {name: c.process.pid for name, c in self._started.items()}

    def process_tree(self) -> dict[int, float]:
        """Every live process we started and its descendants: pid -> start time (epoch s).

        Task runners get their own process group from Airflow's supervisor, so a group
        signal alone does not reach them: the tree is walked, and the groups too (a
        member whose parent died has left the tree but not its group).
        """
        live = self._tree.refresh()
        seen = self._tree.pids
        return {p.pid: seen[p.pid] for p in live if p.pid in seen}

    def check_alive(self) -> None:
        """Raise ComponentDied, with the log tail, if a started component has exited."""
        for comp in self._started.values():
            code = comp.process.poll()
            if code is not None:
                raise ComponentDied(
                    f"airflow {comp.name} exited with status {code}; last lines of "
                    f"{comp.log_path}:\n{tail(comp.log_path, offset=comp.log_offset)}")

    def log_tail(self, component: str, lines: int = LOG_TAIL_LINES) -> str:
        comp = self._started.get(component)
        if comp is None:
            return f"({component} was not started)"
        return tail(comp.log_path, lines, comp.log_offset)

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM every group and descendant we started; SIGKILL what is left after `timeout`.

        Returns False when nothing had been started. Returns once none of them runs: the
        tree is re-walked while waiting, so a process whose parent exits first (and so
        leaves the tree) is still waited for.
        """
        if not self._started:
            return False
        ended = self._tree.terminate(grace_s=timeout)
        if ended.left:
            print(f"[embedded] still running after SIGKILL: {list(ended.left)}",
                  file=sys.stderr)
        for comp in self._started.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                comp.process.wait(timeout=1.0)
            comp.log_file.close()
        self._started.clear()
        self._tree = ProcessTree()
        return True
