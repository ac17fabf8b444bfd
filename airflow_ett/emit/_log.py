"""Rate-limited logging for the background path.

A store that is down fails every batch; logging each failure would flood the task log
the emitter is meant to stay out of. One record per kind of problem per interval is
enough to notice and diagnose, and the suppressed count says how bad it was.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

LOGGER_NAME: Final = "airflow_ett.emit"
logger = logging.getLogger(LOGGER_NAME)


class RateLimitedLog:
    """At most one record per `key` per `interval` seconds."""

    def __init__(self, log: logging.Logger = logger, interval: float = 60.0) -> None:
        self._log = log
        self._interval = interval
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, int]] = {}

    def __call__(self, level: int, key: str, msg: str, *args: object,
                 exc_info: BaseException | None = None) -> None:
        # Never let logging itself raise into a caller: handlers can fail (closed streams
        # at interpreter exit) and this runs on error paths that must stay quiet.
        try:
            now = time.monotonic()
            with self._lock:
                last, suppressed = self._state.get(key, (float("-inf"), 0))
                if now - last < self._interval:
                    self._state[key] = (last, suppressed + 1)
                    return
                self._state[key] = (now, 0)
            if suppressed:
                msg = f"{msg} ({suppressed} similar message(s) suppressed)"
            self._log.log(level, msg, *args, exc_info=exc_info)
        except Exception:  # pragma: no cover - logging must never fail the caller
            pass

    def reset(self) -> None:
        with self._lock:
            self._state.clear()

    def after_fork(self) -> None:
        """The parent's lock may have been held by another thread at fork time."""
        self._lock = threading.Lock()


rate_limited = RateLimitedLog()
