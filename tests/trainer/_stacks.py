"""A trainer process run to its end, or, past its time, made to show where it stands.

A trainer test that times out has hung somewhere, and "timed out after 240 seconds"
says nothing of where. The trainer prints every thread's stack on SIGUSR1
(`trainer/__main__.py`), so before the processes are killed each trainer of the run
(torchrun's workers too) is asked for its stacks, and the failure carries them.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

import psutil

#: How long a trainer's stacks get to arrive once asked for; the test has already failed.
STACKS_S = 3.0
#: How much of the output the failure shows.
TAIL_CHARS = 20_000


def _trainers(pid: int) -> list[psutil.Process]:
    """The trainer processes under `pid` (itself included when it is one): those whose
    command runs `airflow_ett.trainer`, but not torchrun, whose own arguments name the
    module too (SIGUSR1 would end it). A data worker forked by a trainer is one too: it
    has the trainer's handler and shows its stack as well."""
    try:
        top = psutil.Process(pid)
        family = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in family:
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            launcher = "torch.distributed.run" in cmd or any(
                c.endswith("torchrun") for c in cmd)
            if "airflow_ett.trainer" in cmd and not launcher:
                found.append(proc)
    return found


def _kill_all(pid: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        top = psutil.Process(pid)
        for proc in [*top.children(recursive=True), top]:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def run_or_show_stacks(cmd: Sequence[str], *, timeout: float,
                       **popen: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)`, except that
    past `timeout` every trainer under it prints its stacks, all its processes are killed,
    and an AssertionError carries the end of what they wrote."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for trainer in _trainers(proc.pid):  # one at a time: their stacks not interleaved
            with contextlib.suppress(psutil.Error):
                trainer.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=STACKS_S)  # reads on; what it read is kept
        _kill_all(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(
            f"{' '.join(cmd[:6])} ... timed out after {timeout:.0f} s; the stacks of its "
            f"trainers and the end of its output:\n{(out or '')[-2000:]}\n"
            f"{(err or '')[-TAIL_CHARS:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
