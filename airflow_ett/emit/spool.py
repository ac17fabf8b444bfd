"""The local spool: where events wait, append-only, while the store cannot take them.

Safety scheme (no event lost, none counted twice, no two parties on one file):

- **One writer per file, for the file's whole life.** Each emitter (each process, and
  again after a fork) writes only its own file, `spool-<pid>-<token>.jsonl`, with a fresh
  random token, so a name is never reused. The writer holds an exclusive `flock` on the
  file for as long as it has it open. The file is created under a name replay ignores
  (`.spool-<pid>-<token>.part`), locked, and only then renamed to its public name, so no
  replayer can ever see it unlocked while its writer lives. A writer that rotates closes
  the file (dropping the lock) and never opens that name again.
- **Liveness is the lock, not the pid.** `flock` belongs to the open file, and the kernel
  drops it when the process dies however it dies (SIGKILL included); pids are reused and
  differ between containers. A replayer skips any file it cannot lock without waiting,
  which covers live writers, including one in its own process (`flock` locks conflict
  between two opens in one process, unlike POSIX record locks).
- **Claim by atomic rename.** A replayer locks the file, then renames it to
  `<name>.replaying-<pid>-<token>`; of two replayers only one can lock it, and the rename
  fails for anyone holding a stale descriptor. The claim keeps its lock while it replays.
  If the replayer dies, the lock goes with it and the next replayer claims the
  `.replaying-` file the same way.
- **Remove only after the store has it.** Events are inserted (in chunks) and the claimed
  file is unlinked afterwards. A crash in between replays the whole file again, which the
  store's idempotent insert by id absorbs; so does the case where a timed-out write
  completed after its batch was spooled.
- **Never drop a line silently.** A line that does not parse (a torn last line from a
  killed writer, a hand-edited file) goes to `spool-<pid>-<token>.rejected` with its line
  number and error, written whole by rename so that replaying the same file again gives
  the same file, not duplicates. So does a line the sink refuses for its data (a value
  the store cannot hold): the chunk is split until that line stands alone, so one bad
  line never blocks its file or the files behind it. Events the emitter itself finds
  invalid are kept in `invalid-<pid>-<token>.rejected` the same way.

Orphaned `.part` files (a crash between create and rename) are empty and ignored.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import stat
import threading
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from airflow_ett._fs import atomic_write, fsync_dir, write_all
from airflow_ett.emit._log import logger, rate_limited
from airflow_ett.emit.sinks import EventSink, StoreSink
from airflow_ett.ett.events import (
    Event,
    EventError,
    bounded_lines,
    event_to_json,
    parse_line,
)

SPOOL_NAME: Final = re.compile(
    r"^(?P<stem>spool-(?P<pid>\d+)-(?P<token>[0-9a-f]+))\.jsonl"
    r"(?:\.replaying-(?P<rpid>\d+)-(?P<rtoken>[0-9a-f]+))?$"
)
DEFAULT_CHUNK: Final = 1000


def _token() -> str:
    return secrets.token_hex(6)


def encode_lines(events: Iterable[Event]) -> bytes:
    return "".join([event_to_json(event) + "\n" for event in events]).encode()


def encode_each(events: Iterable[Event]
                ) -> tuple[bytes, list[tuple[Event, Exception]]]:
    """The spool lines of the events that can be encoded, and those that cannot (with
    why), so that one bad event never costs the others their place in the spool."""
    lines: list[str] = []
    failed: list[tuple[Event, Exception]] = []
    for event in events:
        try:
            lines.append(event_to_json(event) + "\n")
        except Exception as exc:
            failed.append((event, exc))
    return "".join(lines).encode(), failed


class SpoolWriter:
    """This process's own spool file: opened on first use, locked while open.

    Appends are one `write` each on an `O_APPEND` descriptor. A lock serializes them with
    open, rotate and fsync, since the background thread and callers whose queue was full
    may append at once.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._path: Path | None = None
        self._dirty = False

    @property
    def path(self) -> Path | None:
        """The file being written now, if any."""
        return self._path

    def append(self, events: Sequence[Event], *, sync: bool
               ) -> list[tuple[Event, Exception]]:
        """Add events; with `sync`, also fsync (everything written so far). Raises OSError.

        Returns the events that could not be encoded, with why: not written, for the
        caller to keep aside (the emitter validates first, so this is a last line only).
        """
        if not events:
            return []
        data, failed = encode_each(events)
        if not data:
            return failed
        with self._lock:
            fd = self._fd if self._fd is not None else self._open()
            write_all(fd, data)
            if sync:
                os.fsync(fd)
                self._dirty = False
            else:
                self._dirty = True
        return failed

    def sync(self) -> None:
        """Make earlier unsynced appends (the caller-side overflow path) durable."""
        with self._lock:
            if self._fd is not None and self._dirty:
                os.fsync(self._fd)
                self._dirty = False

    def rotate(self) -> Path | None:
        """Close the current file so that replay may take it; the next append starts anew."""
        with self._lock:
            return self._close()

    close = rotate

    def after_fork(self) -> None:
        """In a forked child: let go of the parent's file without touching its lock.

        Closing our copy of the descriptor does not release the parent's `flock` (the
        lock stays while any descriptor of that open file remains); unlocking would.
        """
        self._lock = threading.Lock()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._path = None
        self._dirty = False

    def _open(self) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"spool-{os.getpid()}-{_token()}"
        part = self.directory / f".{name}.part"
        final = self.directory / f"{name}.jsonl"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                     0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else knows the name
            os.rename(part, final)
            fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            part.unlink(missing_ok=True)
            raise
        self._fd, self._path = fd, final
        return fd

    def _close(self) -> Path | None:
        fd, path = self._fd, self._path
        self._fd, self._path = None, None
        if fd is not None:
            try:
                if self._dirty:
                    os.fsync(fd)
            finally:
                self._dirty = False
                os.close(fd)  # drops the flock: replay may take the file from now on
        return path


def write_rejected(path: Path, entries: Sequence[dict[str, object]], *,
                   replace: bool) -> None:
    """Keep lines that cannot be delivered, with their errors.

    `replace` writes the whole file by rename (replay of one spool file, which may run
    again after a crash and must then produce the same file); otherwise entries are
    appended (the emitter's own invalid events, which arrive over time).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(entry, sort_keys=True) + "\n" for entry in entries).encode()
    if replace:  # a new file aside (a `.part`, like the spool's own), renamed over
        atomic_write(path, data, mode=0o644, suffix=".part")
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did.

    `replayed` counts events handed to the sink from spool files (the store counts each
    id once, so events it already had are included); `files` the spool files fully
    replayed and removed; `errors` one line per file or batch that failed (those files
    stay for a later replay); `rejected` lines kept aside in `.rejected` files;
    `skipped` files left alone because a live writer or replayer holds them.
    """

    replayed: int
    files: int
    errors: tuple[str, ...] = ()
    rejected: int = 0
    skipped: int = 0


@dataclass(slots=True)
class ReplayProgress:
    """The running totals of a replay in progress; `result()` freezes them."""

    replayed: int = 0
    files: int = 0
    errors: list[str] = field(default_factory=list)
    rejected: int = 0
    skipped: int = 0

    def result(self) -> ReplayResult:
        return ReplayResult(self.replayed, self.files, tuple(self.errors), self.rejected,
                            self.skipped)


def _candidates(directory: Path) -> list[Path]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if SPOOL_NAME.match(name):
            path = directory / name
            try:
                found.append((path.stat().st_mtime, name, path))
            except FileNotFoundError:
                continue
    found.sort()  # oldest first: closest to the order the events happened in
    return [path for _, _, path in found]


# Kept whole (the noqa): exactly-once delivery rests on the order claim (lock, rename),
# chunked writes, then unlink with no yield in between, and on one `finally` releasing the
# lock on every path; helpers would spread that order over several frames.
def iter_replay(  # noqa: C901 (exactly-once: claim, write, unlink read as one)
    sink: EventSink, spool_dir: str | os.PathLike[str], progress: ReplayProgress,
    *, chunk_size: int = DEFAULT_CHUNK,
) -> Generator[None, None, None]:
    """Replay every spool file nobody holds, yielding after each chunk written.

    A generator so that the emitter's background thread can interleave live batches
    with a long replay. Stops at the first sink failure (the store is likely down again:
    the remaining files wait for the next replay); a file-level problem only skips that
    file.
    """
    directory = Path(spool_dir)
    token = _token()
    for path in _candidates(directory):
        fd = _open_spool_file(path, progress)
        if fd is None:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                progress.skipped += 1  # a live writer, or another replayer's claim
                continue
            match = SPOOL_NAME.match(path.name)
            assert match is not None
            stem = match["stem"]
            claim = directory / f"{stem}.jsonl.replaying-{os.getpid()}-{token}"
            try:
                os.rename(path, claim)
            except FileNotFoundError:
                continue  # we locked a file another replayer already took and finished
            # Streamed in chunks, so a spool from a long outage never sits in memory whole.
            source = f"{stem}.jsonl"
            rejected: list[dict[str, object]] = []
            batch: list[_Line] = []
            with open(fd, "rb", closefd=False) as fh:
                for number, (_, raw) in enumerate(bounded_lines(fh), start=1):
                    event = _parse(raw, number, source, rejected)
                    if event is not None and isinstance(raw, bytes):
                        batch.append(_Line(event, number, raw))
                    if len(batch) >= chunk_size:
                        yield  # let live batches go first; then write this chunk
                        if not _write(sink, batch, claim.name, progress, source, rejected):
                            return
                        batch = []
            # No yield between the last write and the unlink below: a replay stopped in
            # that gap would leave a delivered file to be delivered again.
            if batch and not _write(sink, batch, claim.name, progress, source, rejected):
                return
            if rejected:
                write_rejected(directory / f"{stem}.rejected", rejected, replace=True)
                progress.rejected += len(rejected)
                rate_limited(logging.WARNING, "spool-rejected", "ETT spool %s: %d line(s) "
                             "could not be read; kept in %s.rejected", source,
                             len(rejected), stem)
            claim.unlink()
            progress.files += 1
        except OSError as exc:
            progress.errors.append(f"{path.name}: {exc}")
            logger.warning("ETT spool replay: cannot process %s: %s", path.name, exc)
        finally:
            os.close(fd)  # drops the claim's lock


@dataclass(frozen=True, slots=True)
class _Line:
    event: Event
    number: int
    raw: bytes


def _open_spool_file(path: Path, progress: ReplayProgress) -> int | None:
    """A spool file opened for reading, or None: gone since it was listed, or not a
    regular file (a FIFO named like one would block the replay: opened non-blocking, its
    type taken from the descriptor, then left alone and reported)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None  # claimed or finished by someone else since we listed
    except OSError as exc:
        progress.errors.append(f"{path.name}: cannot open: {exc}")
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        progress.errors.append(f"{path.name}: not a regular file, left alone")
        return None
    os.set_blocking(fd, True)
    return fd


def _rejected_line(source: str, number: int, raw: bytes, error: str) -> dict[str, object]:
    return {"source": source, "line": number, "error": error,
            "text": raw.rstrip(b"\n").decode("utf-8", "replace")}


def _parse(raw: bytes | EventError, number: int, source: str,
           rejected: list[dict[str, object]]) -> Event | None:
    if isinstance(raw, EventError):  # a line too long to be an event: not kept whole
        rejected.append(_rejected_line(source, number, b"", str(raw)))
        return None
    if not raw.strip():
        return None
    try:
        return parse_line(raw)
    except EventError as exc:
        rejected.append(_rejected_line(source, number, raw, str(exc)))
        return None


def _is_bad_data(exc: Exception) -> bool:
    """The sink refused what it was given (a value it cannot hold), as opposed to being
    unavailable: waiting will not help, but the rest of the batch can still go in."""
    return isinstance(exc, ValueError | TypeError)


def _write(sink: EventSink, batch: list[_Line], claim: str, progress: ReplayProgress,
           source: str, rejected: list[dict[str, object]]) -> bool:
    """Write a chunk. A sink that refuses it for its data has the chunk split until the
    refused lines stand alone; those are kept aside like unreadable lines, so one bad line
    never holds back its file, nor the files behind it."""
    try:
        sink.write([line.event for line in batch])
    except Exception as exc:
        if _is_bad_data(exc):
            if len(batch) == 1:
                line = batch[0]
                rejected.append(_rejected_line(source, line.number, line.raw,
                                               f"refused by the sink: {exc}"))
                return True
            half = len(batch) // 2
            return (_write(sink, batch[:half], claim, progress, source, rejected)
                    and _write(sink, batch[half:], claim, progress, source, rejected))
        progress.errors.append(f"{claim}: sink failed: {exc!r}")
        rate_limited(logging.WARNING, "replay-sink", "ETT spool replay stopped: the sink "
                     "failed (%r); %s stays for a later replay", exc, claim)
        return False
    progress.replayed += len(batch)
    return True


def replay_spool(sink_or_url: EventSink | str, spool_dir: str | os.PathLike[str], *,
                 chunk_size: int = DEFAULT_CHUNK) -> ReplayResult:
    """Deliver every spooled event that no live process holds, each file exactly once.

    Safe to run while emitters are writing and while other replayers run (see the
    module docstring). A URL builds a `StoreSink`, closed afterwards.
    """
    sink: EventSink = StoreSink(sink_or_url) if isinstance(sink_or_url, str) else sink_or_url
    progress = ReplayProgress()
    try:
        for _ in iter_replay(sink, spool_dir, progress, chunk_size=chunk_size):
            pass
    finally:
        if isinstance(sink_or_url, str):
            try:
                sink.close()  # type: ignore[attr-defined]
            except Exception as exc:
                logger.debug("ETT spool replay: closing the store failed: %r", exc)
    return progress.result()
