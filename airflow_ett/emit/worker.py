"""The background path: a bounded queue, a drain thread that batches, a sink thread.

Callers only append to a deque (no lock, no wait). Two daemon threads do the rest:

- the **drain thread** owns the queue: it lingers briefly to make batches, validates
  them, hands each to the sink thread and waits at most `write_timeout`. A batch the sink
  refuses or does not finish in time goes to the spool, and while a timed-out call is
  still running, or while a failed store is backing off, later batches go straight to
  the spool. So the queue keeps draining, to disk if need be, whatever the store does.
- the **sink thread** is the only one that touches the sink (a sink call cannot be
  interrupted in Python, so it gets a thread of its own to hang in). Between live batches
  it replays spool files, at start and again after the store comes back.

`flush`/`close` wait at most their timeout for the store; what is still queued or in
flight then is spooled by the waiting thread itself ("rescue"). Batches are claimed under
a lock so a batch is spooled at most once by us; a timed-out write that completes later
leaves the batch both in the store and in the spool, which the idempotent insert absorbs
on replay. A batch the drain thread has already claimed for the spool is its to write:
`close` waits for that local write (at least `SPILL_GRACE_S`), since the process may exit
right after and take the daemon thread, and the batch, with it.

Processes: an atexit hook closes every writer with its timeout; after `os.fork` the
child drops the parent's queue (the parent delivers those events), threads, spool file
and id prefix, and starts afresh on its next event.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from airflow_ett.emit._log import logger, rate_limited
from airflow_ett.emit.ids import IdSource
from airflow_ett.emit.sinks import EventSink
from airflow_ett.emit.spool import ReplayProgress, SpoolWriter, iter_replay, write_rejected
from airflow_ett.ett.events import Event, event_to_json, validate_event

DEFAULT_BATCH_SIZE: Final = 500
DEFAULT_LINGER: Final = 0.5
"""How long the writer gathers a batch. At training rates (a few events per step) the
cost per batch (a transaction) dominates the cost per event, so fewer, bigger batches
keep the background CPU, and the GIL it holds, far below the 0.5 % budget. `flush` and
exit skip the wait; only a SIGKILL loses what gathered meanwhile."""
DEFAULT_QUEUE_SIZE: Final = 10_000
_IDLE_WAIT: Final = 5.0  # a safety net only: every enqueue onto an empty queue wakes us
_BACKOFF_BASE: Final = 0.5
_BACKOFF_MAX: Final = 30.0
_HEAL_INTERVAL: Final = 5.0

_PENDING, _DONE, _SPOOLED = 0, 1, 2

#: How long `close` waits at least for a batch the drain thread is writing to the spool.
SPILL_GRACE_S: Final = 5.0


class _Marker:
    """A flush request travelling through the queue: done once all before it is handled."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class _Batch:
    __slots__ = ("events", "state")

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.state = _PENDING


class _Call:
    __slots__ = ("done", "error", "events")

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = events
        self.done = threading.Event()
        self.error: BaseException | None = None


@dataclass(slots=True)
class EmitterStats:
    """Counts since start (or since fork) of this process's writer."""

    written: int = 0
    spooled: int = 0
    overflowed: int = 0
    rejected: int = 0
    dropped: int = 0
    replayed: int = 0
    write_failures: int = 0
    write_timeouts: int = 0


class _LazySink:
    """Builds the real sink on first use, on whichever thread writes: the sink thread."""

    def __init__(self, factory: Callable[[], EventSink]) -> None:
        self._factory = factory
        self.sink: EventSink | None = None

    def write(self, events: Sequence[Event]) -> None:
        if self.sink is None:
            self.sink = self._factory()
        self.sink.write(events)

    def close(self) -> None:
        closer = getattr(self.sink, "close", None)
        if callable(closer):
            closer()


ReplayJob = Callable[[EventSink], Generator[None, None, None]]


class _SinkThread:
    """Runs sink calls one at a time; replay steps fill the gaps between live batches."""

    def __init__(self, factory: Callable[[], EventSink]) -> None:
        self.sink = _LazySink(factory)
        self._cv = threading.Condition(threading.Lock())
        self._call: _Call | None = None
        self._job: ReplayJob | None = None
        self._again = False
        self._stopping = False
        self._stop_deadline = 0.0
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A call is still running (a timed-out one counts until it returns)."""
        return self._call is not None

    def submit(self, events: Sequence[Event]) -> _Call:
        call = _Call(events)
        with self._cv:
            self._start_locked()
            self._call = call
            self._cv.notify()
        return call

    def start_replay(self, job: ReplayJob) -> None:
        with self._cv:
            if self._job is not None:
                self._again = True  # files rotated since it listed the directory
                return
            self._start_locked()
            self._job = job
            self._cv.notify()

    def start(self) -> None:
        with self._cv:
            self._start_locked()

    def stop(self, deadline: float) -> None:
        """Stop once the current call and any replay in progress are done, waiting for
        that until `deadline`: a replay cut short would keep its claimed file locked for
        as long as this process lives."""
        with self._cv:
            self._stopping = True
            self._stop_deadline = deadline
            self._cv.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ett-emit-sink",
                                            daemon=True)
            self._thread.start()

    # Kept whole (the noqa): this loop alone creates, advances and closes the replay
    # generator `steps`; its `finally` must see every one it made to release a claimed
    # spool file's lock, which a helper holding it could not promise on a BaseException.
    def _run(self) -> None:  # noqa: C901, PLR0912 (one loop owns the replay generator)
        steps: Generator[None, None, None] | None = None
        try:
            while True:
                with self._cv:
                    while self._call is None and self._job is None and not self._stopping:
                        self._cv.wait()
                    call, job = self._call, self._job
                    if call is None and self._stopping and (
                            job is None or time.monotonic() >= self._stop_deadline):
                        break
                if call is not None:
                    try:
                        self.sink.write(call.events)
                    except Exception as exc:
                        call.error = exc
                    with self._cv:
                        self._call = None
                    call.done.set()
                    continue
                assert job is not None
                finished = False
                try:
                    if steps is None:
                        steps = job(self.sink)
                    next(steps)
                except StopIteration:
                    finished = True
                except Exception as exc:
                    finished = True
                    rate_limited(logging.WARNING, "replay-crash",
                                 "ETT spool replay failed: %r", exc, exc_info=exc)
                if finished:
                    steps = None
                    with self._cv:
                        if self._again:
                            self._again = False
                        else:
                            self._job = None
        finally:
            if steps is not None:
                steps.close()  # releases a claimed file's lock
            try:
                self.sink.close()
            except Exception as exc:
                logger.debug("ETT emit: closing the sink failed: %r", exc)


def _validate(events: list[Event]) -> tuple[list[Event], list[dict[str, object]]]:
    """Each event through the reader's rules (`validate_event`), one by one.

    msgspec does not check types when a Struct is built in Python, so a wrong value
    (a tensor for `loss`, a failed attempt without cause, a NUL in a job id) would
    otherwise reach the store and fail the whole batch there, or the spool's encoder and
    lose it. The result is exactly what the store and the spool can write (free text
    escaped). Done here, off the caller's thread.
    """
    good: list[Event] = []
    bad: list[dict[str, object]] = []
    for event in events:
        try:
            good.append(validate_event(event))
        except Exception as exc:
            bad.append(_rejection(event, exc))
    return good, bad


def _rejection(event: Event, exc: BaseException) -> dict[str, object]:
    return {"error": str(exc) or repr(exc), "text": _as_text(event)}


def _as_text(event: Event) -> str:
    try:
        return event_to_json(event)
    except Exception:  # unencodable values (a tensor for a float, a surrogate): keep repr
        return repr(event)


class BackgroundWriter:
    """One process's path from `put` to the sink or the spool."""

    def __init__(
        self,
        sink_factory: Callable[[], EventSink],
        spool_dir: str | os.PathLike[str],
        *,
        emit_timeout: float,
        batch_size: int = DEFAULT_BATCH_SIZE,
        linger: float = DEFAULT_LINGER,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        write_timeout: float | None = None,
        replay_on_start: bool = True,
    ) -> None:
        self.spool_dir = Path(spool_dir)
        self.emit_timeout = emit_timeout
        self.ids = IdSource()
        self.stats = EmitterStats()
        self.last_replay: ReplayProgress | None = None
        self._sink_factory = sink_factory
        self._batch_size = max(1, batch_size)
        self._linger = linger
        self._queue_size = max(1, queue_size)
        self._write_timeout = emit_timeout if write_timeout is None else write_timeout
        self._spool = SpoolWriter(self.spool_dir)
        self._reset()
        self._closing = False
        self._replay_on_start = replay_on_start
        _WRITERS.add(self)
        self._ensure_started()

    def _reset(self) -> None:
        self._limit = self._queue_size
        self._queue: deque[Event | _Marker] = deque()
        self._lock = threading.Lock()
        #: Batches the drain thread has claimed for the spool and not yet written (under
        #: `_lock`): `end_close` waits for them, or a process leaving right after would
        #: take them down with the daemon thread (seen under load: all 1000 lost).
        self._spilling = 0
        self._spilled = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._urgent = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._inflight: _Batch | None = None
        self._sink = _SinkThread(self._sink_factory)
        self._failures = 0
        self._retry_at = 0.0
        self._needs_replay = False
        self._next_heal = 0.0
        self._reject_name = f"invalid-{os.getpid()}-{self.ids.prefix.rstrip('-')}.rejected"

    # -- the caller's side --------------------------------------------------------------

    def put(self, event: Event) -> None:
        """Enqueue without waiting; a full queue (or a closed writer) spools instead."""
        queue = self._queue
        size = len(queue)
        if size >= self._limit:
            self._overflow(event)
            return
        queue.append(event)
        if size == 0 or size + 1 >= self._batch_size:
            if self._thread is None:
                self._ensure_started()
            wake = self._wake
            if not wake.is_set():
                wake.set()

    def _overflow(self, event: Event) -> None:
        closed = self._closing
        try:
            event = validate_event(event)  # the spool holds only what replay can read
        except Exception as exc:
            self._reject([_rejection(event, exc)])
            return
        try:
            unwritable = self._spool.append([event], sync=closed)
            if unwritable:
                self._reject([_rejection(e, exc) for e, exc in unwritable])
                return
        except Exception as exc:
            self.stats.dropped += 1
            rate_limited(logging.ERROR, "spool-failed", "ETT spool %s is not writable (%r): "
                         "event lost", self.spool_dir, exc)
            return
        self.stats.overflowed += 1
        self._needs_replay = True
        if not closed:
            rate_limited(logging.WARNING, "overflow", "ETT emit queue is full (%d events): "
                         "spooling events directly until the writer catches up",
                         self._queue_size)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until all put so far is in the sink or fsync'd in the spool.

        Returns False when the timeout ran out; what was pending is spooled then.
        """
        timeout = self.emit_timeout if timeout is None else timeout
        if self._stopping:
            self._rescue()  # the writer is gone: spool anything that slipped in meanwhile
            return True
        return self._await(self._request_flush(), time.monotonic() + timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush, stop the threads and release the spool file. Idempotent."""
        timeout = self.emit_timeout if timeout is None else timeout
        marker = self.begin_close()
        if marker is None:
            return True
        return self.end_close(marker, time.monotonic() + timeout)

    def begin_close(self) -> _Marker | None:
        with self._lock:
            if self._closing:
                return None
            self._closing = True
        return self._request_flush()

    def end_close(self, marker: _Marker, deadline: float) -> bool:
        ok = self._await(marker, deadline, rescue=False)
        self._limit = 0  # anything emitted from now on goes straight to the spool
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                ok = False
        if not ok or self._queue:
            self._rescue()
        self._await_spills(deadline)
        self._sink.stop(deadline)
        self._spool.close()
        _WRITERS.discard(self)
        return ok

    def _request_flush(self) -> _Marker:
        marker = _Marker()
        if self._thread is None and not self._queue:
            # Nothing emitted since start or fork: do not start threads just to say so
            # (at interpreter exit that may not even be allowed).
            self._sync_spool()
            marker.done.set()
            return marker
        self._ensure_started()
        self._urgent = True
        self._queue.append(marker)
        self._wake.set()
        return marker

    def _await(self, marker: _Marker, deadline: float, *, rescue: bool = True) -> bool:
        if marker.done.wait(max(0.0, deadline - time.monotonic())):
            return True
        if rescue:
            self._rescue()
        return False

    def _rescue(self) -> None:
        """Spool what is still queued or in flight, on the waiting thread."""
        events: list[Event] = []
        with self._lock:
            batch = self._inflight
            if batch is not None and batch.state == _PENDING:
                batch.state = _SPOOLED
                events.extend(batch.events)
            self._inflight = None
            more, markers = self._pop_locked(limit=None, stop_at_marker=False)
            events.extend(more)
        if events:
            # Queued events (and a batch taken but not yet checked) are not validated:
            # the spool must hold only what replay can read.
            events, bad = _validate(events)
            if bad:
                self._reject(bad)
        if events:
            rate_limited(logging.WARNING, "rescue", "ETT emit: the writer did not finish in "
                         "time (%.1fs); spooling %d pending event(s)", self.emit_timeout,
                         len(events))
            self._spill_events(events)
        else:
            self._sync_spool()
        for marker in markers:
            marker.done.set()

    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None and not self._stopping:
                thread = threading.Thread(target=self._run, name="ett-emit", daemon=True)
                thread.start()
                self._thread = thread

    # -- the drain thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._replay_on_start:
                self._replay_on_start = False
                self._start_replay()
            self._sink.start()  # now, not lazily: late in interpreter exit it may not start
            while True:
                self._wake.wait(_IDLE_WAIT)
                self._wake.clear()
                if (not self._urgent and not self._stopping
                        and 0 < len(self._queue) < self._batch_size):
                    self._wake.wait(self._linger)  # let a batch build up
                    self._wake.clear()
                self._urgent = False
                self._drain()
                if self._stopping:
                    self._drain()
                    break
        except Exception as exc:  # a bug here must not take the process down
            rate_limited(logging.ERROR, "drain-crash", "ETT emit writer stopped: %r", exc,
                         exc_info=exc)

    def _drain(self) -> None:
        while True:
            batch, markers = self._take()
            if batch is not None:
                self._deliver(batch)
            if markers:
                self._sync_spool()
                for marker in markers:
                    marker.done.set()
            if batch is None and not markers:
                return

    def _pop_locked(self, *, limit: int | None, stop_at_marker: bool
                    ) -> tuple[list[Event], list[_Marker]]:
        """Pop events (up to `limit`) and flush markers off the queue; the caller holds
        the lock. One by one, since callers may be appending right now."""
        events: list[Event] = []
        markers: list[_Marker] = []
        queue = self._queue
        while limit is None or len(events) < limit:
            try:
                item = queue.popleft()
            except IndexError:
                break
            if isinstance(item, _Marker):
                markers.append(item)
                if stop_at_marker:
                    break
            else:
                events.append(item)
        return events, markers

    def _take(self) -> tuple[_Batch | None, list[_Marker]]:
        """Up to one batch, stopping at a flush marker so it is answered in order."""
        with self._lock:
            events, markers = self._pop_locked(limit=self._batch_size, stop_at_marker=True)
            batch = _Batch(events) if events else None
            self._inflight = batch
        return batch, markers

    def _deliver(self, batch: _Batch) -> None:
        good, bad = _validate(batch.events)
        if bad:
            self._reject(bad)
        if not good:
            self._settle(batch)
            return
        batch.events = good
        if time.monotonic() < self._retry_at or self._sink.busy:
            self._spill(batch)
            return
        call = self._sink.submit(good)
        if not call.done.wait(self._write_timeout):
            self.stats.write_timeouts += 1
            rate_limited(logging.WARNING, "write-timeout", "ETT store write took longer than "
                         "%.1fs; spooling %d event(s) and the batches behind them until it "
                         "returns", self._write_timeout, len(good))
            self._spill(batch)
            return
        if call.error is not None:
            self.stats.write_failures += 1
            self._failures += 1
            delay = min(_BACKOFF_MAX, _BACKOFF_BASE * 2 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay
            rate_limited(logging.WARNING, "write-failed", "ETT store write failed (%r); "
                         "spooling to %s, next try in %.1fs", call.error, self.spool_dir,
                         delay)
            self._spill(batch)
            return
        self._failures = 0
        if self._settle(batch):
            self.stats.written += len(good)
        if self._needs_replay and time.monotonic() >= self._next_heal:
            # The store takes events again: release our spool file and replay it with the
            # others. Not more often than every few seconds, so that a queue that keeps
            # overflowing does not turn every batch into a rotation.
            self._needs_replay = False
            self._next_heal = time.monotonic() + _HEAL_INTERVAL
            self._spool.rotate()
            self._start_replay()

    def _settle(self, batch: _Batch) -> bool:
        with self._lock:
            if self._inflight is batch:
                self._inflight = None
            if batch.state != _PENDING:
                return False
            batch.state = _DONE
            return True

    def _spill(self, batch: _Batch) -> None:
        with self._lock:
            if self._inflight is batch:
                self._inflight = None
            if batch.state != _PENDING:
                return  # a flush's rescue already spooled it
            batch.state = _SPOOLED
            self._spilling += 1
        try:
            self._spill_events(batch.events)
        finally:
            with self._lock:
                self._spilling -= 1
                self._spilled.notify_all()

    def _await_spills(self, deadline: float) -> None:
        """Until no claimed batch is still being written to the spool: until `deadline`,
        and at least `SPILL_GRACE_S` (a local write; the store is not waited for)."""
        wait = max(deadline - time.monotonic(), SPILL_GRACE_S)
        with self._lock:
            if not self._spilled.wait_for(lambda: self._spilling == 0, wait):
                rate_limited(logging.ERROR, "spill-late", "ETT emit: %d batch(es) still being "
                             "written to the spool %s after %.1fs at close", self._spilling,
                             self.spool_dir, wait)

    def _spill_events(self, events: list[Event]) -> None:
        try:
            # An event that cannot be encoded comes back alone: its batch-mates are
            # written, and the reason given is its own, not the spool's.
            unwritable = self._spool.append(events, sync=True)
        except Exception as exc:
            self.stats.dropped += len(events)
            rate_limited(logging.ERROR, "spool-failed", "ETT spool %s is not writable (%r): "
                         "%d event(s) lost", self.spool_dir, exc, len(events))
            return
        if unwritable:
            self._reject([_rejection(e, exc) for e, exc in unwritable])
        self.stats.spooled += len(events) - len(unwritable)
        self._needs_replay = True

    def _sync_spool(self) -> None:
        try:
            self._spool.sync()
        except Exception as exc:
            rate_limited(logging.ERROR, "spool-sync", "ETT spool fsync failed: %r", exc)

    def _reject(self, bad: list[dict[str, object]]) -> None:
        self.stats.rejected += len(bad)
        rate_limited(logging.ERROR, "invalid-event", "ETT emit: %d invalid event(s) kept in "
                     "%s, not sent; first: %s", len(bad), self.spool_dir / self._reject_name,
                     bad[0]["error"])
        try:
            write_rejected(self.spool_dir / self._reject_name, bad, replace=False)
        except Exception as exc:
            self.stats.dropped += len(bad)
            rate_limited(logging.ERROR, "reject-failed", "ETT emit: cannot keep invalid "
                         "events (%r)", exc)

    def _start_replay(self) -> None:
        def job(sink: EventSink) -> Generator[None, None, None]:
            progress = ReplayProgress()
            self.last_replay = progress
            before = 0
            for _ in iter_replay(sink, self.spool_dir, progress):
                self.stats.replayed += progress.replayed - before
                before = progress.replayed
                yield
            self.stats.replayed += progress.replayed - before
            if progress.files or progress.rejected:
                logger.info("ETT spool replay: %d event(s) from %d file(s), %d line(s) "
                            "rejected", progress.replayed, progress.files, progress.rejected)

        self._sink.start_replay(job)

    # -- process lifecycle -------------------------------------------------------------

    def after_fork(self) -> None:
        """In a forked child: nothing of the parent's threads, locks, queue or file."""
        self.ids.after_fork()
        self._spool.after_fork()
        self.stats = EmitterStats()
        self.last_replay = None
        closing = self._closing
        self._reset()
        if closing:
            self._limit = 0
            self._stopping = True


_WRITERS: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()


def close_all(timeout: float | None = None) -> None:
    """Close every writer in this process, together (the atexit hook).

    Flush requests go out to all writers first, so that N writers take one timeout, not N.
    """
    try:
        writers = list(_WRITERS)
        now = time.monotonic()
        pending = []
        for writer in writers:
            marker = writer.begin_close()
            if marker is not None:
                limit = writer.emit_timeout if timeout is None else timeout
                pending.append((writer, marker, now + limit))
        for writer, marker, deadline in pending:
            writer.end_close(marker, deadline)
    except Exception as exc:  # at exit, with half the interpreter gone, stay quiet
        logger.debug("ETT emit: closing at exit failed: %r", exc)


def _after_fork_in_child() -> None:
    rate_limited.after_fork()
    for writer in list(_WRITERS):
        writer.after_fork()


atexit.register(close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
