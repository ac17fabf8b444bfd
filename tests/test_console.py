"""`airflow_ett/console.py`, the one place output meets rich, makes every string safe
for a terminal: control, bidi and other format characters shown as escapes, markup never
read. The commands that print through it are tested in tests/cli/test_hostile_names.py."""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Group  # rich's Text is banned in airflow_ett/ only
from rich.text import Text as RichText

from airflow_ett import console
from airflow_ett.console import Text, terminal_text

# What a hostile name carries: a clear-screen and colour escape, an OSC title change ended
# by BEL, a carriage return that would overwrite the line, the bidi override that
# reorders what follows, isolates and marks, a line separator, NUL, DEL, a C1 CSI.
HOSTILE = ["\x1b[2J", "\x1b]0;owned\x07", "\r", "\u202e", "\u2066", "\u2069", "\u200e",
           "\u200f", "\u061c", "\u2028", "\u2029", "\x00", "\x7f", "\x9b31m", "\ufeff",
           "\n", "\t", "\udcff"]
# rich's own styling, the only escapes a terminal line may hold.
SGR = re.compile(r"\x1b\[[0-9;]*m")


def shown(text: str) -> str:
    """The text with rich's styling removed: what must hold no control character."""
    return SGR.sub("", text)


def safe(text: str) -> bool:
    return all(line.isprintable() for line in shown(text).split("\n"))


@pytest.mark.parametrize(("raw", "escaped"), [
    ("evil\x1b[2Jname", "evil\\x1b[2Jname"),
    ("a\u202eb", "a\\u202eb"),
    ("a\nb\rc\td", "a\\nb\\rc\\td"),
    ("nul\x00", "nul\\x00"),
    ("c1\x9b", "c1\\x9b"),
    ("tag\U000e0041", "tag\\U000e0041"),
    ("lone\udcff", "lone\\udcff"),
    ("plain ünïcødé 中文 [red]x \\x1b", "plain ünïcødé 中文 [red]x \\x1b"),
])
def test_terminal_text_shows_what_a_terminal_would_obey(raw: str, escaped: str) -> None:
    assert terminal_text(raw) == escaped


@given(st.text())
def test_terminal_text_is_printable_idempotent_and_keeps_printable_text(text: str) -> None:
    out = terminal_text(text)
    assert out.isprintable()
    assert terminal_text(out) == out
    if text.isprintable():
        assert out is text


def test_text_made_appended_assembled_or_set_is_escaped() -> None:
    made = Text("a\x1b[31m")
    made.append("b\u202e", style="bold")
    made.append(RichText("c\x1bd", style="red"))
    made.append_text(RichText("e\u2066"))
    made.append_tokens([("f\r", None)])
    assert made.plain == "a\\x1b[31mb\\u202ec\\x1bde\\u2066f\\r"
    assembled = Text.assemble(("job \x1b[2J", "bold"), " ", "\u202eX")
    assert assembled.plain == "job \\x1b[2J \\u202eX"
    assert assembled.spans[0].end == len("job \\x1b[2J")  # styles cover the escaped text
    made.plain = "new\x07"
    assert made.plain == "new\\x07"


def test_another_rich_text_keeps_its_styles_over_the_escaped_pieces() -> None:
    text = RichText("ab\x1bcd\u202ee")
    text.stylize("bold", 1, 4)  # "b\x1bc"
    text.stylize("red", 4, 6)  # "d\u202e"
    safe_text = console._safe_text(text)
    assert safe_text.plain == "ab\\x1bcd\\u202ee"
    styled = {str(span.style): safe_text.plain[span.start:span.end] for span in safe_text.spans}
    assert styled == {"bold": "b\\x1bc", "red": "d\\u202e"}


@pytest.mark.parametrize("terminal", [False, True])
def test_tables_lines_and_groups_print_every_name_escaped(terminal: bool) -> None:
    names = [f"n{i}{h}x" for i, h in enumerate(HOSTILE)]
    grid = console.table([f"head{HOSTILE[0]}", console.Column(f"c{HOSTILE[4]}")],
                         [(n, RichText(n)) for n in names], terminal=terminal,
                         title=f"title{HOSTILE[1]}")
    out = console.render_to_text(Group(RichText(f"group {HOSTILE[3]}"), grid, "str\x1b[2J",
                                       console.indent(RichText(f"pad{HOSTILE[5]}"))),
                                 terminal=terminal)
    assert safe(out), ascii(out)
    for n in names:
        assert terminal_text(n) in out
    buffer = io.StringIO()
    console.line(f"line {''.join(HOSTILE)}", file=buffer)
    assert buffer.getvalue().count("\n") == 1 and safe(buffer.getvalue())


@pytest.mark.parametrize("terminal", [False, True])
def test_markup_in_a_name_prints_as_it_is(terminal: bool) -> None:
    name = "[red]x[/red] [bold link=https://evil.example]y :smile:"
    out = console.render_to_text(console.table(["n"], [(name,)], terminal=terminal),
                                 terminal=terminal)
    assert name in shown(out)
    buffer = io.StringIO()
    console.emit(name, file=buffer)
    assert name in shown(buffer.getvalue())
