"""The hang watchdog's rule, with short timeouts: it fires once, only after the beats
stop, and never before the first beat (startup and compilation do not count)."""

from __future__ import annotations

import threading
import time

import pytest

from airflow_ett.trainer.watchdog import HangWatchdog


def test_fires_once_when_the_beats_stop() -> None:
    fired: list[tuple[float, float]] = []
    done = threading.Event()

    def on_hang(last: float, now: float) -> None:
        fired.append((last, now))
        done.set()

    dog = HangWatchdog(0.3, on_hang)
    for _ in range(8):  # beating every 0.1 s for 0.8 s: alive
        dog.beat()
        time.sleep(0.1)
    assert not fired
    last_beat = time.time()
    assert done.wait(5.0)
    time.sleep(0.5)
    assert len(fired) == 1
    last, now = fired[0]
    assert last <= last_beat and now - last >= 0.3


def test_silent_before_the_first_beat_and_after_stop() -> None:
    fired: list[float] = []
    dog = HangWatchdog(0.1, lambda last, now: fired.append(now))
    time.sleep(0.4)  # no beat yet: startup, however long, is not a hang
    dog.beat()
    dog.stop()
    time.sleep(0.4)
    assert fired == []


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s = 0"):
        HangWatchdog(0, lambda last, now: None)
