"""Reading an events file (JSON Lines, or stdin) for `compute` and `ingest`.

Bad lines are the one exception to "bad input is exit 1": each is reported on stderr and
skipped, the good ones are used and the exit is 0, with a count of what was skipped;
`--strict` turns any bad line into exit 1 (and `ingest` then stores nothing).
"""

from __future__ import annotations

import codecs
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO, Final

from airflow_ett.cli.common import fail

if TYPE_CHECKING:
    from airflow_ett.ett.events import Event

MAX_REPORTED_ERRORS: Final = 20

_NOT_UTF8: Final = {codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16",
                    codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32",
                    b"\x1f\x8b": "gzip-compressed"}


def _event_lines(fh: BinaryIO, source: str) -> Iterator[bytes]:
    """The lines of a binary stream, a UTF-8 BOM removed from the first.

    Bytes, not text: a line that is not UTF-8 is then one bad line (named by number)
    rather than a decode error that ends the whole read. A BOM (Windows editors write
    one) would otherwise make line 1 invalid JSON. UTF-16/32 and gzip are told at once,
    since every line of them would be bad.
    """
    first = True
    for line in fh:
        if first:
            first = False
            for magic, kind in _NOT_UTF8.items():
                # UTF-32-LE's BOM starts with UTF-16-LE's: the dict lists UTF-16 first,
                # and both answers say the same thing ("not UTF-8").
                if line.startswith(magic):
                    fail(f"events file {source} is {kind}, not UTF-8 JSON Lines text")
            if line.startswith(codecs.BOM_UTF8):
                line = line[len(codecs.BOM_UTF8):]
        yield line


def _open_events(source: str) -> BinaryIO:
    """The events file opened for reading, or one line saying why it cannot be."""
    try:
        return open(source, "rb")
    except FileNotFoundError:
        fail(f"events file not found: {source}")
    except IsADirectoryError:
        fail(f"events file {source} is a directory, not a file")
    except PermissionError:
        fail(f"cannot read events file {source}: permission denied")
    except OSError as exc:
        fail(f"cannot read events file {source}: {exc.strerror or exc}")


def read_events(source: str, *, strict: bool) -> list[Event]:
    """Parse an events file (or stdin), report bad lines on stderr, keep the good ones."""
    from airflow_ett.ett.events import parse_lines

    try:
        if source == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            if stdin is not None:
                parsed = parse_lines(_event_lines(stdin, "on standard input"))
            else:  # a text stream without bytes underneath (tests, embedding)
                parsed = parse_lines(line.removeprefix("\ufeff") if n == 0 else line
                                     for n, line in enumerate(sys.stdin))
        else:
            with _open_events(source) as fh:
                parsed = parse_lines(_event_lines(fh, source))
    except OSError as exc:  # a read error mid-file (EIO, a vanished network mount)
        fail(f"cannot read events file {source}: {exc.strerror or exc}")
    from airflow_ett.cli.console import line

    for error in parsed.errors[:MAX_REPORTED_ERRORS]:  # escaped: they quote the file
        line(f"airflow-ett: skipped {source}: {error}", file=sys.stderr)
    if len(parsed.errors) > MAX_REPORTED_ERRORS:
        print(f"airflow-ett: ... and {len(parsed.errors) - MAX_REPORTED_ERRORS} more bad "
              "lines", file=sys.stderr)
    if strict and parsed.errors:
        fail(f"{len(parsed.errors)} bad line(s) in {source} (--strict)")
    if not parsed.events:
        fail(f"no valid events in {source}")
    if parsed.errors:
        line(f"airflow-ett: warning: skipped {len(parsed.errors)} bad line(s) of "
             f"{len(parsed.errors) + len(parsed.events)} in {source}; used the "
             f"{len(parsed.events)} good one(s) (--strict fails instead)", file=sys.stderr)
    return list(parsed.events)
