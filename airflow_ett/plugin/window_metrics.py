"""A running job's rolling windows as gauges, sent by its train task's process.

Per running job, every `[ett] rolling_metrics_interval_s`, for each of its `[ett]
rolling_windows` (minutes, `<N>m` in the name): ETT% and each Level-2 component's share of
the window, the job's time in it, and that time and its effective part in GPU-seconds, so
that a dashboard's fleet ETT% over the last N minutes is `sum(gpu_effective_s) /
sum(gpu_e2e_s)` across the running jobs, GPU time over GPU time as the rollup weighs it.
Names, units and tags: docs/metrics.md; who sends and why: decision 0030.

Who sends: the process of the train task (`ett_role = "train"`) on the worker, from one
daemon thread the listener starts when the try starts running and stops when it ends. It
exists exactly while the job holds its GPUs, one per job, wherever the fleet's workers
are; it can read the store (its emitter writes there); and Airflow set up its metrics
(the Task SDK's copy, `metrics.airflow_stats`). The scheduler sees no running job's
minutes pass, and a separate poller would be one more service to run.

Never slows or fails the task: the thread is a daemon (a store that hangs cannot keep the
process alive), reads and attributes off the task's threads, takes at most 2% of a core
(a long job's sends are spaced out: `next_wait`), catches everything and logs it
rate-limited; the hooks only start and stop it. A bad `[ett]` value costs the gauges,
with one log line naming it, nothing else.

Gauges keep their last value: when the try ends, the time gauges (`e2e_s`, `gpu_e2e_s`,
`gpu_effective_s`) are set to 0 so the job drops out of fleet sums at once; `ett_pct` and
the shares keep their last value (read them where `e2e_s > 0`).

`window_metrics` and `cleared` are pure (names and values, testable without Airflow).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from airflow_ett.emit._log import RateLimitedLog
from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.plugin import metrics
from airflow_ett.plugin.metrics import Metric, tag_value, with_tags_in_names
from airflow_ett.settings import RollingSettings

if TYPE_CHECKING:
    from airflow_ett.ett.attribution import JobAttribution

log = logging.getLogger("airflow_ett.metrics")
_rate_limited = RateLimitedLog(log)

WINDOW: Final = "ett.window"
#: The gauges set to 0 when the try ends: what a fleet sum adds up.
CLEARED: Final = ("e2e_s", "gpu_e2e_s", "gpu_effective_s")
#: The most of one core the sends may take: the first reads and attributes all of the
#: job's events (about half a second of CPU for a day-long job, bench/RESULTS.md), the
#: next ones what came since (`store.follow`, decision 0034); a send that still costs
#: more (a late event reads the job whole) spaces the next one out from
#: `[ett] rolling_metrics_interval_s`.
MAX_CPU_SHARE: Final = 0.02


def next_wait(interval_s: float, tick_cpu_s: float) -> float:
    """Seconds until the next send: the interval, or longer, so that the sends take at
    most `MAX_CPU_SHARE` of a core."""
    return max(interval_s, tick_cpu_s / MAX_CPU_SHARE)


def window_metrics(a: JobAttribution, minutes: Sequence[int]) -> list[Metric]:
    """The gauges of a running job's last `minutes` each (ascending, distinct); none for a
    finished job (its figures are final and `ett.job.*` says them)."""
    if not a.provisional or not minutes:
        return []
    from airflow_ett.ett.attribution import last_windows

    tags = {"dag_id": tag_value(a.dag_id), "tenant": tag_value(a.tenant),
            "model": tag_value(a.model)}
    out: list[Metric] = []
    for m, w in zip(minutes, last_windows(a, [60.0 * m for m in minutes]), strict=True):
        base = f"{WINDOW}.{m}m"
        e2e, e2e_us = w.e2e_in_window_s, w.e2e_in_window_us
        shares = {c: 100.0 * us / e2e_us if e2e_us > 0 else 0.0  # exact microseconds
                  for c, us in w.components_us.items()}
        out += [Metric(f"{base}.ett_pct", "gauge", w.ett_pct, tags),
                Metric(f"{base}.e2e_s", "gauge", e2e, tags),
                Metric(f"{base}.gpu_e2e_s", "gauge", e2e * a.world_size, tags),
                Metric(f"{base}.gpu_effective_s", "gauge",
                       w.components_s[EFFECTIVE] * a.world_size, tags)]
        out += [Metric(f"{base}.{c}_pct", "gauge", shares[c], tags) for c in COMPONENTS]
    return out


def cleared(sent: Sequence[Metric]) -> list[Metric]:
    """The time gauges of `sent` (plain or with tags in their names) at 0."""
    return [Metric(m.name, m.kind, 0.0, m.tags) for m in sent
            if m.name.startswith(f"{WINDOW}.") and m.name.split(".")[3] in CLEARED]


class WindowReporter:
    """One running job's rolling-window gauges, every `metrics_interval_s`, from a daemon
    thread, until `stop` (or the job is seen ended). `store` gives the process's store
    (read on the thread only); `settings` is read on the thread too, so a hook that
    starts a reporter does no I/O."""

    def __init__(self, job: str, store: Callable[[], Any],
                 settings: Callable[[], RollingSettings] = RollingSettings.load, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.job = job
        self._store = store
        self._settings = settings
        self._clock = clock
        self._minutes: tuple[int, ...] = ()
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # a send and the clearing never interleave
        self._sent: list[Metric] = []
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ett-windows", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            settings = self._settings()
        except Exception as exc:  # a bad [ett] value: no gauges, one line says why
            _rate_limited(logging.WARNING, f"window-settings-{type(exc).__name__}",
                          "ETT metrics: no rolling-window gauges for job %s: %s", self.job,
                          exc)
            return
        if not settings.sends_metrics or not metrics.backend_on():
            return  # off, or nowhere to send: no store reads, no attribution
        self._minutes = settings.windows_min
        wait = settings.metrics_interval_s
        while not self._stopped.wait(wait):
            began = time.thread_time()
            self.tick()
            wait = next_wait(settings.metrics_interval_s, time.thread_time() - began)

    def tick(self, minutes: Sequence[int] | None = None) -> int:
        """Read the job's events, attribute them up to now, send the gauges; how many
        went. Never raises."""
        try:
            return self._tick(self._minutes if minutes is None else tuple(minutes))
        except Exception as exc:
            _rate_limited(logging.WARNING, f"window-tick-{type(exc).__name__}",
                          "ETT metrics: job %s: rolling-window gauges not sent: %r",
                          self.job, exc)
            return 0

    def _tick(self, minutes: tuple[int, ...]) -> int:
        # The store keeps the job's events and attribution between ticks and reads only
        # what came since (`store.follow`, decision 0034).
        found = self._store().follow.attribution(self.job, now=self._clock())
        if found is None:  # its first events are not in the store yet
            return 0
        a = found.attribution
        if not a.provisional:  # it ended: its figures are final, nothing moves now
            self.stop()
            return 0
        found = window_metrics(a, minutes)
        if found and metrics.backend_drops_tags():
            found += with_tags_in_names(found)
        with self._lock:
            if self._stopped.is_set():
                return 0
            self._sent = found
            return metrics.send(found, metrics.airflow_stats())

    def stop(self) -> int:
        """No more sends; the time gauges sent last go to 0. How many zeros went. Quick
        (no store, no wait): it runs in a hook."""
        self._stopped.set()
        try:
            with self._lock:
                zeros, self._sent = cleared(self._sent), []
                return metrics.send(zeros, metrics.airflow_stats()) if zeros else 0
        except Exception as exc:
            _rate_limited(logging.WARNING, f"window-stop-{type(exc).__name__}",
                          "ETT metrics: job %s: rolling-window gauges not cleared: %r",
                          self.job, exc)
            return 0

    def join(self, timeout: float) -> bool:
        """Whether the thread has finished (within `timeout`); for tests and shutdown."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()
