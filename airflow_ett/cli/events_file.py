"""Reading an events file (JSON Lines, or stdin) for `compute` and `ingest`, streamed.

Bad lines are the one exception to "bad input is exit 1": each is reported on stderr and
skipped, the good ones are used and the exit is 0, with a count of what was skipped;
`--strict` turns any bad line into exit 1 (and `ingest` then stores nothing).

Memory does not grow with the file: events go by one at a time (`iter_events`), `ingest`
stores them in batches and `compute` keeps only each event's byte offset, by job, then
reads one job's lines back at a time. So the source must be seekable: a path is opened as
untrusted input (a regular file only: a FIFO or `/dev/zero` is refused before a byte is
read), and standard input is first copied to a temporary file.
"""

from __future__ import annotations

import codecs
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, Final

from airflow_ett.cli.common import fail

if TYPE_CHECKING:
    from airflow_ett.ett.events import Event, EventError

MAX_REPORTED_ERRORS: Final = 20

_NOT_UTF8: Final = {codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16",
                    codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32",
                    b"\x1f\x8b": "gzip-compressed"}


@contextlib.contextmanager
def events_source(source: str) -> Iterator[BinaryIO]:
    """The events file (or stdin, copied to a temporary file) open for binary reading,
    positioned after a UTF-8 byte-order mark; one line saying why when it cannot be.

    UTF-16/32 and gzip are told at once, since every line of them would be bad."""
    with contextlib.ExitStack() as stack:
        if source == "-":
            fh: BinaryIO = stack.enter_context(tempfile.TemporaryFile(prefix="ett-events-"))
            _copy_stdin(fh)
            shown = "on standard input"
        else:
            from airflow_ett._untrusted import UntrustedFileError, open_regular

            try:
                fh = stack.enter_context(open_regular(source, what="events file"))
            except UntrustedFileError as exc:
                fail(str(exc))
            shown = source
        head = fh.read(4)
        for magic, kind in _NOT_UTF8.items():
            # UTF-32-LE's BOM starts with UTF-16-LE's: the dict lists UTF-16 first, and
            # both answers say the same thing ("not UTF-8").
            if head.startswith(magic):
                fail(f"events file {shown} is {kind}, not UTF-8 JSON Lines text")
        fh.seek(len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0)
        yield fh


def _copy_stdin(out: BinaryIO) -> None:
    stdin = getattr(sys.stdin, "buffer", None)
    if stdin is not None:
        shutil.copyfileobj(stdin, out)
    else:  # a text stream without bytes underneath (tests, embedding)
        for text in sys.stdin:
            out.write(text.encode("utf-8", "surrogateescape"))
    out.seek(0)


@dataclass
class BadLines:
    """The bad lines met while reading `source`: counted, the first few kept to show."""

    source: str
    count: int = 0
    good: int = 0
    shown: list[EventError] = field(default_factory=list)

    def add(self, error: EventError) -> None:
        self.count += 1
        if len(self.shown) < MAX_REPORTED_ERRORS:
            self.shown.append(error)

    def report(self, *, strict: bool) -> None:
        """Say on stderr what was skipped; exit 1 (`fail`) under `strict` when any line
        was bad, and whenever no line was good."""
        from airflow_ett.console import line

        for error in self.shown:  # escaped: they quote the file
            line(f"airflow-ett: skipped {self.source}: {error}", file=sys.stderr)
        if self.count > len(self.shown):
            print(f"airflow-ett: ... and {self.count - len(self.shown)} more bad lines",
                  file=sys.stderr)
        if strict and self.count:
            fail(f"{self.count} bad line(s) in {self.source} (--strict)")
        if not self.good:
            fail(f"no valid events in {self.source}")
        if self.count:
            line(f"airflow-ett: warning: skipped {self.count} bad line(s) of "
                 f"{self.count + self.good} in {self.source}; used the {self.good} good "
                 "one(s) (--strict fails instead)", file=sys.stderr)


def iter_events(fh: BinaryIO, bad: BadLines) -> Iterator[tuple[int, Event]]:
    """(byte offset, event) for each good line from where `fh` stands; each bad line goes
    to `bad`, numbered. Offsets are from that start position."""
    from airflow_ett.ett.events import EventError, bounded_lines, parse_line

    start = fh.tell()
    try:
        for number, (offset, raw) in enumerate(bounded_lines(fh), start=1):
            if isinstance(raw, EventError):
                bad.add(raw.at_line(number))
                continue
            if not raw.strip():
                continue
            try:
                event = parse_line(raw)
            except EventError as exc:
                bad.add(exc.at_line(number))
                continue
            bad.good += 1
            yield start + offset, event
    except OSError as exc:  # a read error mid-file (EIO, a vanished network mount)
        fail(f"cannot read events file {bad.source}: {exc.strerror or exc}")


def event_at(fh: BinaryIO, offset: int) -> Event:
    """The event on the line at `offset` (one `iter_events` gave), parsed again by the
    same rules (not the store's faster typed decoder: a first read escapes free text,
    which that decoder, meant for canonical stored JSON, does not)."""
    from airflow_ett.ett.events import MAX_LINE_BYTES, parse_line

    fh.seek(offset)
    return parse_line(fh.readline(MAX_LINE_BYTES + 1))


def check_strict(fh: BinaryIO, source: str) -> None:
    """Under `--strict`: read the whole source once, failing on any bad line before
    anything is used; then back to where it stood."""
    start = fh.tell()
    bad = BadLines(source)
    for _ in iter_events(fh, bad):
        pass
    if bad.count:
        bad.report(strict=True)
    fh.seek(start)
