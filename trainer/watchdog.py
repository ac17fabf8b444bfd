"""Hang detection: an attempt that stops making progress leaves by itself.

A hung rank (a collective that never completes, a stuck data worker, a wedged device)
holds its GPUs and makes no progress until someone notices; every second of that is
*detection* in the job's TTR. The watchdog is the someone: a daemon thread that expects
a heartbeat after every step (and checkpoint) and, after `timeout_s` without one, has
the attempt report itself failed (cause `infra`, with the moment it noticed) and exit
with `EXIT_HUNG`, which the launcher restarts like any other healable failure. It starts
after the first step, so startup and compilation (minutes on a big model) never count.

Set the timeout well above the slowest step and the slowest blocking checkpoint save;
a false alarm costs a restart. Steps finished in the last progress span (about a
second) before a hang may not be reported, so detection can read up to a second long.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from airflow_ett.protocol.exits import EXIT_HUNG, exit_record

if TYPE_CHECKING:
    from airflow_ett.emit import Emitter

log = logging.getLogger("airflow_ett.trainer")


class HangWatchdog:
    """`beat()` after each step; `on_hang(last_beat_wall, now_wall)` once if the beats stop.

    `on_hang` runs on the watchdog's thread and is expected not to return (it exits the
    process); if it does return, the watchdog stops.
    """

    def __init__(self, timeout_s: float, on_hang: Callable[[float, float], None]) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s = {timeout_s!r}: must be > 0")
        self.timeout_s = timeout_s
        self._on_hang = on_hang
        self._last = time.monotonic()
        self._last_wall = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self._last, self._last_wall = time.monotonic(), time.time()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="ett-hang-watchdog",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        poll = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(poll):
            if time.monotonic() - self._last > self.timeout_s:
                self._stop.set()
                self._on_hang(self._last_wall, time.time())
                return


def exit_hung(emitter: Emitter, timeout_s: float, step: int, last_beat: float,
              now: float) -> NoReturn:
    """The trainer's `on_hang`: no step finished for `timeout_s` after `step`: report the
    attempt failed (cause `infra`, noticed `now`) and leave with `EXIT_HUNG` at once."""
    log.error("hang: no step finished for %.1f s (since step %d): leaving with exit "
              "code %d so the launcher restarts the attempt", now - last_beat,
              step, EXIT_HUNG)
    emitter.attempt_ended("failed", cause="infra", detected_ts=now, exit_code=EXIT_HUNG,
                          message=f"hung: no step finished for {timeout_s:g} s after step "
                                  f"{step}")
    exit_record.reported("infra")
    exit_record.failed(now, f"hung after step {step}")
    exit_record.exit(EXIT_HUNG)
    emitter.flush(min(2.0, timeout_s))
    os._exit(EXIT_HUNG)  # the main thread is stuck: no orderly way out
