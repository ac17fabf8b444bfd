"""Process trees: find everything a process started, and end all of it.

Killing the direct child is not enough. torchrun starts each rank in a session of its own
(so a terminal's Ctrl-C or a group signal cannot reach it), Airflow gives each task runner
its own process group, and a trainer spawns data workers: when only the top process dies,
the rest are re-parented to init and keep running, holding GPUs, ports and memory, while
the ETT record says the job released them. Every place in the package that ends a process
it started goes through this module.

Two rules make it work:

- *Snapshot before signalling.* Once a parent dies its children move to init, and a walk
  from the dead parent finds nothing. `ProcessTree` walks first, remembers every process
  it has ever seen (pid plus start time, so a reused pid is never signalled), and keeps
  walking from the survivors while it waits.
- *Zombies are gone.* A zombie holds no resources; waiting for one (whose parent may never
  reap it) would only turn a clean stop into a timeout.

Only the standard library and psutil are imported: `airflow_ett.trainer` uses this module
and must not import Airflow.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

ProcLike = int | psutil.Process | subprocess.Popen[Any]

_POLL_S = 0.1
_FREEZE_ROUNDS = 20


def as_process(proc: ProcLike) -> psutil.Process | None:
    """A psutil handle for `proc`, or None when it no longer runs."""
    if isinstance(proc, psutil.Process):
        return proc
    pid = proc.pid if isinstance(proc, subprocess.Popen) else proc
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, ValueError):
        return None


def alive(proc: psutil.Process) -> bool:
    """True while `proc` (the very process, not a later one with its pid) runs and is no
    zombie. A process we may not inspect counts as running: it exists."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _children_map() -> tuple[dict[int, list[psutil.Process]], dict[int, psutil.Process]]:
    """One pass over every process: parent pid -> children, and pid -> process."""
    children: dict[int, list[psutil.Process]] = {}
    by_pid: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        try:
            ppid = proc.ppid()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        by_pid[proc.pid] = proc
        children.setdefault(ppid, []).append(proc)
    return children, by_pid


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def descendants(roots: ProcLike | Iterable[ProcLike], *,
                groups: Iterable[int] = ()) -> list[psutil.Process]:
    """Live descendants of `roots` (the roots excluded) and, with their descendants, the
    live members of the process groups `groups` (a group outlives a dead leader, and its
    members may have been re-parented out of the tree). Zombies are left out."""
    procs = [roots] if isinstance(roots, int | psutil.Process | subprocess.Popen) \
        else list(roots)
    handles = [p for p in (as_process(r) for r in procs) if p is not None]
    return _walk(handles, set(groups), exclude_roots=True)


def _walk(roots: Sequence[psutil.Process], groups: set[int], *,
          exclude_roots: bool) -> list[psutil.Process]:
    children, by_pid = _children_map()
    by_pid.pop(os.getpid(), None)  # never ourselves, e.g. through a group we share
    stack = [r for r in roots if alive(r)]
    if groups:
        stack.extend(p for pid, p in by_pid.items() if _group_of(pid) in groups)
    root_keys = {r.pid for r in roots} if exclude_roots else set()
    found: dict[int, psutil.Process] = {}
    while stack:
        proc = stack.pop()
        if proc.pid in found or proc.pid == os.getpid() or not alive(proc):
            continue
        found[proc.pid] = proc
        stack.extend(children.get(proc.pid, ()))
    return [p for pid, p in found.items() if pid not in root_keys]


@dataclass(frozen=True, slots=True)
class Ended:
    """What `ProcessTree.terminate` did, as pids.

    `signalled`: got the first signal; `killed`: still ran after the grace period and got
    SIGKILL; `left`: still running even after that (uninterruptible, or not ours to
    signal): a caller should say so loudly, since those keep their resources.
    """

    signalled: tuple[int, ...]
    killed: tuple[int, ...]
    left: tuple[int, ...]


class ProcessTree:
    """The processes under some roots, remembered across walks.

    Build it while the roots still run (before any signal): from then on, `refresh()`
    walks again from the roots and from every remembered survivor, so a process whose
    parent has exited (and which init has adopted) stays in the tree.
    """

    def __init__(self, *roots: ProcLike, groups: Iterable[int] = ()) -> None:
        self._roots: list[psutil.Process] = []
        self._groups = set(groups)
        self._seen: dict[tuple[int, float], psutil.Process] = {}
        for root in roots:
            self.add_root(root, refresh=False)
        self.refresh()

    def add_root(self, root: ProcLike, *, group: bool = False, refresh: bool = True) -> None:
        """Follow one more root (and, with `group`, its process group: pgid = its pid)."""
        proc = as_process(root)
        if proc is None:
            return
        self._roots.append(proc)
        if group:
            self._groups.add(proc.pid)
        self._remember([proc])
        if refresh:
            self.refresh()

    def _remember(self, procs: Iterable[psutil.Process]) -> None:
        for proc in procs:
            try:
                key = (proc.pid, proc.create_time())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self._seen.setdefault(key, proc)

    def refresh(self) -> list[psutil.Process]:
        """Walk again; returns every live process of the tree, roots included."""
        starts = [*self._roots, *(p for p in self._seen.values() if alive(p))]
        self._remember(_walk(starts, self._groups, exclude_roots=False))
        return self.alive()

    def alive(self) -> list[psutil.Process]:
        """The remembered processes that still run (no new walk)."""
        return [p for p in self._seen.values() if alive(p)]

    @property
    def pids(self) -> dict[int, float]:
        """Every process ever seen in the tree: pid -> start time (seconds since the epoch)."""
        return {pid: start for pid, start in self._seen}

    def send(self, sig: int, *, roots_only: bool = False) -> list[int]:
        """Send `sig` to every live process of the tree (walked first), or to the roots only;
        returns the pids it reached."""
        targets = [r for r in self._roots if alive(r)] if roots_only else self.refresh()
        reached = []
        for proc in targets:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.send_signal(sig)
                reached.append(proc.pid)
        return reached

    def wait(self, timeout: float) -> list[psutil.Process]:
        """Wait up to `timeout` seconds for the whole tree to be gone, walking again as it
        goes (a child started meanwhile is waited for too); returns what still runs."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            left = self.refresh()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(min(_POLL_S, max(deadline - time.monotonic(), 0.0)))

    def terminate(self, *, grace_s: float, sig: int = signal.SIGTERM,
                  roots_only: bool = False, kill_wait_s: float = 10.0) -> Ended:
        """`sig` to the tree (or to the roots only, for a root that forwards it, as
        torchrun does), up to `grace_s` for everything to exit, then SIGKILL to whatever
        of the tree still runs; waits up to `kill_wait_s` for those to be gone."""
        signalled = [] if sig == signal.SIGKILL else self.send(sig, roots_only=roots_only)
        left = self.wait(grace_s) if signalled else self.refresh()
        killed = self.kill() if left else []
        remaining = self.wait(kill_wait_s) if killed else []
        return Ended(tuple(signalled), tuple(killed), tuple(p.pid for p in remaining))

    def kill(self) -> list[int]:
        """SIGKILL every live process of the tree; returns the pids it reached.

        The tree is frozen first (SIGSTOP, which cannot be caught, walking again until no
        new process turns up): a parent killed while it forks would otherwise leave the
        new child to init, unseen."""
        frozen: set[int] = set()
        live = self.refresh()
        for _ in range(_FREEZE_ROUNDS):
            new = [p for p in live if p.pid not in frozen]
            if not new:
                break
            for proc in new:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    proc.send_signal(signal.SIGSTOP)
                frozen.add(proc.pid)
            live = self.refresh()
        reached = []
        for proc in live:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.send_signal(signal.SIGKILL)
                reached.append(proc.pid)
        return reached


def terminate_tree(root: ProcLike, *, grace_s: float, sig: int = signal.SIGTERM,
                   roots_only: bool = False) -> Ended:
    """End `root` and everything under it: `sig`, `grace_s` to leave, then SIGKILL.

    The tree is walked before the first signal. A `subprocess.Popen` root is reaped
    afterwards, so its `returncode` is set."""
    ended = ProcessTree(root).terminate(grace_s=grace_s, sig=sig, roots_only=roots_only)
    if isinstance(root, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            root.wait(timeout=1.0)
    return ended


def run(cmd: Sequence[str], *, timeout: float, grace_s: float = 5.0,
        **popen: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True, timeout=...)`, except that a
    timeout ends the command's whole tree (subprocess.run kills only the command itself),
    then raises `subprocess.TimeoutExpired` with the output gathered so far."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            terminate_tree(proc, grace_s=grace_s)
            # The pipes close when the last holder dies: the whole tree is gone by now.
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err)\
                from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
