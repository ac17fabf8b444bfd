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

What is printed is made safe for a terminal here, and only here: every string that
becomes a cell, a line or a `Text` (this module's `Text`, the only one the CLI and the
reports may use: rich's own is banned elsewhere by ruff) has each character Python's
`repr` would escape shown as that escape (`terminal_text`): C0/C1 controls with ESC and
newlines, Unicode bidi and other format characters (U+202E, U+2066, U+200E, U+061C, U+FEFF),
line/paragraph separators, lone surrogates. A DAG id, run id, tenant, owner or path then
cannot move the cursor, recolour, retitle or clear the terminal, reorder what follows, or
start a forged line of a report, on a terminal or in `report.txt`; it prints as
`evil\x1b[2J`. Backslashes are left as they are (a path or name keeps its look).

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
from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.style import Style
from rich.table import Column, Table
from rich.text import Span
from rich.text import Text as RichText

__all__ = ["Advance", "Column", "Text", "emit", "indent", "is_terminal", "line", "progress",
           "render_to_text", "table", "terminal_text"]


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def terminal_text(text: str) -> str:
    """`text` with every character that is not printable (Python's `str.isprintable`: the
    categories Cc, Cf, Cs, Co, Cn, Zl, Zp and every space but ' ') shown as its escape, as
    `repr` shows it (`\\x1b`, `\\u202e`, `\\n`): what a terminal would obey instead of
    show. Text with none comes back as it is (the same object)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


class Text(RichText):
    """rich's `Text`, whose strings are always `terminal_text`: made, appended or
    assembled, a name in it prints as what it is. (rich itself only drops five control
    characters and keeps ESC.) The one `Text` the CLI and the reports use."""

    __slots__ = ()

    def __init__(self, text: str = "", style: str | Style = "", **kwargs: object) -> None:
        super().__init__(terminal_text(text), style, **kwargs)  # type: ignore[arg-type]

    def append(self, text: str | RichText, style: str | Style | None = None) -> Text:
        if isinstance(text, str):
            text = terminal_text(text)
        elif not isinstance(text, Text):
            text = _safe_text(text)
        super().append(text, style)
        return self

    def append_text(self, text: RichText) -> Text:
        super().append_text(text if isinstance(text, Text) else _safe_text(text))
        return self

    def append_tokens(self, tokens: Iterable[tuple[str, str | Style | None]]) -> Text:
        super().append_tokens((terminal_text(content), style) for content, style in tokens)
        return self

    @RichText.plain.setter  # type: ignore[attr-defined, untyped-decorator]
    def plain(self, new_text: str) -> None:
        RichText.plain.fset(self, terminal_text(new_text))  # type: ignore[attr-defined]


def _safe_text(text: RichText) -> Text:
    """Another `rich.text.Text` made one of ours, its styles kept: cut at every span's
    ends, so that each piece is escaped whole and keeps the spans that cover it."""
    if isinstance(text, Text):
        return text
    plain = text.plain
    safe = Text(style=text.style, justify=text.justify, overflow=text.overflow,
                no_wrap=text.no_wrap, end=text.end, tab_size=text.tab_size)
    if plain.isprintable():
        safe.append(plain)
        safe.spans = list(text.spans)
        return safe
    cuts = sorted({edge for span in text.spans for edge in (span.start, span.end)
                   if 0 < edge < len(plain)})
    for start, end in zip([0, *cuts], [*cuts, len(plain)], strict=True):
        offset = len(safe)
        safe.append(plain[start:end])
        safe.spans.extend(Span(offset, len(safe), span.style) for span in text.spans
                          if span.start <= start and end <= span.end)
    return safe


def _safe(renderable: RenderableType) -> RenderableType:
    """What `emit` and `render_to_text` print, with every string and `Text` in it (through
    groups and padding) made ours; tables are safe as `table` builds them."""
    if isinstance(renderable, str):
        return Text(renderable)
    if isinstance(renderable, RichText):
        return _safe_text(renderable)
    if isinstance(renderable, Group):
        return Group(*(_safe(r) for r in renderable.renderables), fit=renderable.fit)
    if isinstance(renderable, Padding):
        return Padding(_safe(renderable.renderable),
                       (renderable.top, renderable.right, renderable.bottom, renderable.left),
                       style=renderable.style, expand=renderable.expand)
    return renderable


# Plain output is as wide as its longest value: rich needs a width, this one is never met.
_PLAIN_WIDTH = 1 << 20
Cell = str | RichText


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
    _console(buffer, terminal=terminal, width=width).print(_safe(renderable))
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
            console.print(_safe(renderable))
        return
    for renderable in renderables:
        out.write(render_to_text(renderable, terminal=False) + "\n")


def line(text: Cell, *, file: TextIO | None = None, flush: bool = False) -> None:
    """One line, styled on a terminal and written exactly as its plain text otherwise
    (progress messages to stderr, say, read the same in a log as before rich). A newline
    inside it is shown as `\\n`, like every other control character: one call, one line."""
    out = file or sys.stdout
    safe = _cell(text)
    if is_terminal(out):
        _console(out, terminal=True).print(safe, soft_wrap=True)
    else:
        out.write(safe.plain + "\n")
    if flush:
        out.flush()


def _cell(value: Cell) -> Text:
    return Text(value) if isinstance(value, str) else _safe_text(value)


def _header(column: Column) -> Column:
    header = column.header
    return dataclasses.replace(column, header=terminal_text(header) if isinstance(header, str)
                               else _safe(header))


def table(columns: Sequence[str | Column], rows: Iterable[Sequence[Cell]], *,
          terminal: bool, totals: Iterable[Sequence[Cell]] = (),
          title: str | None = None) -> Table:
    """A table of the given rows, then `totals` after a rule (bold on a terminal).

    Built for where it will be shown (`terminal`, from `is_terminal()` or the caller's
    choice): a rounded box and a bold header on a terminal; plain, no box and no edge
    padding, two blanks between columns and no cell ever wrapped, anywhere else.
    """
    specs = [_header(c) if isinstance(c, Column) else Column(terminal_text(c)) for c in columns]
    title = None if title is None else terminal_text(title)
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
    description = terminal_text(description)
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
