"""`airflow_ett._proc`: ending a process tree whose members run in sessions of their own
(as torchrun's ranks do), on small trees of `sleep` processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from airflow_ett._proc import ProcessTree, alive, as_process, descendants, run, terminate_tree
from airflow_ett.trainer.launcher import _wait_attempt
from tests.proc_tree import still_running

# A root that starts two children, each in a session of its own and deaf to SIGTERM, each
# with a child of its own (the background sleep): five processes, three levels. The root
# itself dies at once on SIGTERM, so its children are re-parented to init the moment it
# does: a walk made after the signal cannot find them.
TREE = """
import subprocess, time
kids = [subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & exec sleep 60"],
                         start_new_session=True) for _ in range(2)]
time.sleep(60)
"""


def start_tree() -> tuple[subprocess.Popen[bytes], dict[int, float]]:
    """The root and its 4 descendants, once all run: pid -> start time of the 4."""
    root = subprocess.Popen([sys.executable, "-c", TREE])
    deadline = time.monotonic() + 30
    while True:
        found = {p.pid: p.create_time() for p in psutil.Process(root.pid).children(True)
                 if p.name() == "sleep"}
        if len(found) == 4:
            return root, found
        assert time.monotonic() < deadline, f"the tree did not start: {found}"
        time.sleep(0.05)


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[bytes], dict[int, float]]]:
    root, kids = start_tree()
    yield root, kids
    for pid in still_running(kids):  # whatever a failing test left
        psutil.Process(pid).kill()
    root.kill()
    root.wait()


def test_killing_only_the_top_process_orphans_the_rest(
        tree: tuple[subprocess.Popen[bytes], dict[int, float]]) -> None:
    """The old behaviour (`proc.kill()`), and why it is a defect: the children live on."""
    root, kids = tree
    root.kill()
    root.wait()
    assert set(still_running(kids)) == set(kids)
    assert all(psutil.Process(pid).ppid() != root.pid for pid in kids)  # adopted


def test_terminate_tree_ends_every_process_even_after_the_root_died(
        tree: tuple[subprocess.Popen[bytes], dict[int, float]]) -> None:
    root, kids = tree
    ended = terminate_tree(root, grace_s=0.5)
    assert still_running(kids) == {}
    assert root.returncode == -signal.SIGTERM  # reaped, and it did get SIGTERM first
    assert set(ended.signalled) == {root.pid, *kids}
    assert set(ended.killed) == set(kids)  # they ignore SIGTERM: SIGKILL after the grace
    assert ended.left == ()


def test_sigterm_to_the_root_only_then_sigkill_to_the_tree(
        tree: tuple[subprocess.Popen[bytes], dict[int, float]]) -> None:
    """on_kill's path: the root is asked (torchrun forwards it), the tree is killed."""
    root, kids = tree
    ended = terminate_tree(root, grace_s=0.5, roots_only=True)
    assert ended.signalled == (root.pid,)
    assert set(ended.killed) == set(kids)
    assert still_running(kids) == {}


def test_sigkill_at_once(tree: tuple[subprocess.Popen[bytes], dict[int, float]]) -> None:
    root, kids = tree
    ended = terminate_tree(root, grace_s=30.0, sig=signal.SIGKILL)
    assert ended.signalled == ()
    assert set(ended.killed) == {root.pid, *kids}
    assert root.returncode == -signal.SIGKILL
    assert still_running(kids) == {}


def test_a_tree_remembers_processes_whose_parent_died() -> None:
    """Seen once, followed for ever: a grandchild whose parent exited is still killed."""
    root = subprocess.Popen(["sh", "-c", "sleep 60 & read line"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (kids := descendants(root)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        tree = ProcessTree(root)
        sleeper = kids[0]
        assert root.stdin is not None
        root.stdin.close()  # `read` returns: sh exits, the sleep is adopted by init
        root.wait()
        assert descendants(root) == [] and alive(sleeper)
        assert [p.pid for p in tree.refresh()] == [sleeper.pid]
        assert tree.kill() == [sleeper.pid]
        assert tree.wait(10.0) == []
    finally:
        root.kill()
        root.wait()


def test_process_groups_reach_members_that_left_the_tree() -> None:
    """What the embedded Airflow relies on: a component's group, not only its tree."""
    root = subprocess.Popen(["sh", "-c", "sleep 60 & exit 0"], start_new_session=True)
    root.wait()
    deadline = time.monotonic() + 30
    while not (members := descendants([], groups=[root.pid])):
        assert time.monotonic() < deadline, "the group member never appeared"
        time.sleep(0.05)
    try:
        assert descendants(root) == []  # the root is gone: no tree to walk
        assert [p.name() for p in members] == ["sleep"]
        ended = ProcessTree(root, groups=[root.pid]).terminate(grace_s=5.0)
        assert set(ended.signalled) == {members[0].pid}
        assert not alive(members[0])
    finally:
        for proc in members:
            if alive(proc):
                proc.kill()


def test_run_ends_the_whole_tree_on_timeout() -> None:
    """subprocess.run's timeout kills the command only: a child holding the pipe lives on
    (and keeps communicate() waiting). `run` ends the tree and returns the output."""
    script = "trap '' TERM; sleep 60 & echo $!; exec sleep 60"
    with pytest.raises(subprocess.TimeoutExpired) as err:
        run(["sh", "-c", script], timeout=1.0, grace_s=0.5)
    out = err.value.output
    assert isinstance(out, str) and out.strip().isdigit(), out
    assert not psutil.pid_exists(int(out)) or not alive(psutil.Process(int(out)))
    done = run(["sh", "-c", "echo hi; echo there >&2; exit 3"], timeout=30.0)
    assert (done.returncode, done.stdout, done.stderr) == (3, "hi\n", "there\n")


def test_gone_processes_are_no_error() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert as_process(proc) is None
    assert terminate_tree(proc, grace_s=0.1).signalled == ()
    assert ProcessTree(proc).kill() == []


def test_the_launcher_kills_an_attempts_tree_on_timeout(
        tree: tuple[subprocess.Popen[bytes], dict[int, float]]) -> None:
    root, kids = tree
    code = _wait_attempt(root, ProcessTree(root), timeout=0.5)
    assert code == -signal.SIGKILL
    assert still_running(kids) == {}


def test_the_launcher_kills_what_an_ended_attempt_left_behind() -> None:
    """torchrun killed from outside (the OOM killer) leaves its ranks: they must not hold
    the GPUs while the next attempt starts."""
    root = subprocess.Popen(["sh", "-c", "setsid sleep 60 & sleep 2; exit 0"])
    recorded: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 30
        while not recorded:
            recorded = {p.pid: p.create_time() for p in descendants(root)
                        if p.name() == "sleep" and p.cmdline()[-1] == "60"}
            assert time.monotonic() < deadline
            time.sleep(0.05)
        code = _wait_attempt(root, ProcessTree(root), timeout=None)
        assert code == 0
        assert still_running(recorded) == {}
    finally:
        for pid in still_running(recorded):
            psutil.Process(pid).kill()
