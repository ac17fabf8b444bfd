"""Where the CLI's tables, styled lines and progress meet rich: the one place that decides
between terminal output and plain text.

On a terminal (rich's own test: `isatty`, or `FORCE_COLOR` / `TTY_COMPATIBLE`; `NO_COLOR`
drops the colour and keeps the rest) output is rich's: boxed tables, bold headings,
colours, a live progress bar. Anywhere else (a pipe, a file, a test's capture, the demo
reading `runs show` from a child process) it is plain text that a script can grep and a
README can quote: no escape sequences, no borders, nothing wrapped at a width (a stored
raw time like 1795856400000000.0 or a 60-character job id stays whole on its line), no
trailing blanks, and a progress bar becomes a line now and then. Every cell and line is a
`Text`, never markup, so a value holding brackets (`[provisional: ...]`, a job id) prints
as it is.

`airflow-ett --help` must stay light: the command modules import this one inside the
commands that print through it.
"""

from __future__ import annotations

import dataclasses
import io
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TextIO

from rich import box
from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.table import Column, Table
from rich.text import Text

__all__ = ["Advance", "Column", "Text", "emit", "indent", "is_terminal", "line", "progress",
           "render_to_text", "table"]

# Plain output is as wide as its longest value: rich needs a width, this one is never met.
_PLAIN_WIDTH = 1 << 20
Cell = str | Text


class Advance(Protocol):
    """What `progress` yields: `advance()` after each step, `advance(n)` after n."""

    def __call__(self, n: int = 1) -> None: ...


def is_terminal(file: TextIO | None = None) -> bool:
    """Whether `file` (default: stdout) gets rich's terminal output, by rich's own rules."""
    return Console(file=file or sys.stdout).is_terminal


def _console(file: TextIO, *, terminal: bool, width: int | None = None) -> Console:
    # markup/highlight/emoji off: what is printed is data, styled only where the code says.
    if terminal:
        return Console(file=file, force_terminal=True, width=width, markup=False,
                       highlight=False, emoji=False)
    return Console(file=file, force_terminal=False, color_system=None, no_color=True,
                   width=_PLAIN_WIDTH, markup=False, highlight=False,
                   emoji=False, legacy_windows=False)


def render_to_text(renderable: RenderableType, *, terminal: bool,
                   width: int | None = None) -> str:
    """The renderable as a string, without a final newline: with escapes and boxes when
    `terminal` (at `width`, default rich's: $COLUMNS or 80), plain otherwise (never
    wrapped, whatever `width` says, and each line without trailing blanks)."""
    buffer = io.StringIO()
    _console(buffer, terminal=terminal, width=width).print(renderable)
    text = buffer.getvalue()
    if terminal:
        return text.removesuffix("\n")
    return "\n".join(row.rstrip() for row in text.splitlines())


def emit(*renderables: RenderableType, file: TextIO | None = None) -> None:
    """Print each renderable on its own lines to `file` (default: stdout, looked up at the
    call so that redirections and test captures are honoured)."""
    out = file or sys.stdout
    if is_terminal(out):
        console = _console(out, terminal=True)
        for renderable in renderables:
            console.print(renderable)
        return
    for renderable in renderables:
        out.write(render_to_text(renderable, terminal=False) + "\n")


def line(text: Cell, *, file: TextIO | None = None, flush: bool = False) -> None:
    """One line, styled on a terminal and written exactly as its plain text otherwise
    (progress messages to stderr, say, read the same in a log as before rich)."""
    out = file or sys.stdout
    if is_terminal(out):
        _console(out, terminal=True).print(text, soft_wrap=True)
    else:
        out.write((text.plain if isinstance(text, Text) else text) + "\n")
    if flush:
        out.flush()


def _cell(value: Cell) -> Text:
    return value if isinstance(value, Text) else Text(value)


def table(columns: Sequence[str | Column], rows: Iterable[Sequence[Cell]], *,
          terminal: bool, totals: Iterable[Sequence[Cell]] = (),
          title: str | None = None) -> Table:
    """A table of the given rows, then `totals` after a rule (bold on a terminal).

    Built for where it will be shown (`terminal`, from `is_terminal()` or the caller's
    choice): a rounded box and a bold header on a terminal; plain, no box and no edge
    padding, two blanks between columns and no cell ever wrapped, anywhere else.
    """
    specs = [c if isinstance(c, Column) else Column(c) for c in columns]
    if terminal:
        grid = Table(*specs, box=box.ROUNDED, header_style="bold", title=title)
    else:
        # No wrapping, and the console is wider than any value: a cell is never cut.
        # (Not overflow="ignore": rich then drops a column's right justification.)
        specs = [dataclasses.replace(c, no_wrap=True) for c in specs]
        grid = Table(*specs, box=None, pad_edge=False, header_style="", title=title,
                     title_style="")
    for row in rows:
        grid.add_row(*(_cell(v) for v in row))
    for i, row in enumerate(totals):
        if i == 0:
            grid.add_section()
        grid.add_row(*(_cell(v) for v in row), style="bold" if terminal else None)
    return grid


def indent(renderable: RenderableType, spaces: int = 2) -> Padding:
    """The renderable shifted right, no wider than itself (no padding out to the width)."""
    return Padding(renderable, (0, 0, 0, spaces), expand=False)


@contextmanager
def progress(total: int, description: str, *,
             file: TextIO | None = None) -> Iterator[Advance]:
    """A progress meter over `total` steps; yields `advance(n)`.

    On a terminal, a rich progress bar (with count, elapsed and remaining time); otherwise
    a plain line `description: done/total` each tenth of the way and at the end, so a log
    shows that a long backfill moves without filling up. Default stream: stderr, so that
    what a command prints on stdout stays only its result.
    """
    out = file or sys.stderr
    if is_terminal(out):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(),
                      console=_console(out, terminal=True)) as bar:
            task = bar.add_task(description, total=total)

            def advance_bar(n: int = 1) -> None:
                bar.advance(task, n)

            yield advance_bar
        return

    step = max(1, -(-total // 10))  # ceil(total / 10)
    done = 0

    def advance(n: int = 1) -> None:
        nonlocal done
        before, done = done, done + n
        if done // step > before // step or (done >= total > before):
            out.write(f"{description}: {min(done, total)}/{total}\n")
            out.flush()

    yield advance
