"""The exact error each bad event gets: what a producer reads to fix its line.

docs/events.md promises an error that names the field and the offending value, so the
whole text is the contract here, and so are `EventError.field/value/line`. Beside each
rule sits the boundary it lets through, since an off-by-one there drops good events.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.ett.events import (
    EVENT_TYPES,
    MAX_DURATION_S,
    TS_MAX,
    TS_MIN,
    EventError,
    JobSubmitted,
    check_string,
    parse_line,
    parse_lines,
    read_events,
    validate_event,
)
from airflow_ett.ett.phases import COMPONENTS
from tests.factories import T0, event_dict

RANGE = ("time out of range: Unix seconds must be in [946684800, 4102444800) "
         "(2000-01-01 to 2100-01-01 UTC)")


def parse_error(etype: str, **changes: Any) -> EventError:
    with pytest.raises(EventError) as err:
        parse_line(json.dumps(event_dict(etype, **changes)))
    return err.value


@pytest.mark.parametrize(
    ("etype", "changes", "field", "value", "message"),
    [
        ("job_ended", {"job": ""}, "job", "", "must not be empty"),
        ("job_ended", {"job": "x\ud800"}, "job", "x\ud800",
         "contains a lone surrogate (not valid Unicode text)"),
        ("progress", {"step_start": 10, "step_end": 5}, "step_end", 5,
         "must be >= step_start (10)"),
        ("progress", {"cursor_start": 10, "cursor_end": 5}, "cursor_end", 5,
         "must be >= cursor_start (10)"),
        ("progress", {"cursor_start": -3, "cursor_end": 0}, "cursor_start", -3,
         "must be >= 0"),
        ("progress", {"ts": T0, "start_ts": T0 + 1}, "ts", T0,
         "span ends before it starts (start_ts=1795856001.0)"),
        ("checkpoint_saved", {"blocking_s": -0.5}, "blocking_s", -0.5,
         "must be a number of seconds in [0, 3155760000]"),
        ("checkpoint_saved", {"total_s": MAX_DURATION_S + 1}, "total_s", MAX_DURATION_S + 1,
         "must be a number of seconds in [0, 3155760000]"),
        ("checkpoint_saved", {"bytes": -1}, "bytes", -1, "must be >= 0"),
        ("attempt_ended", {"status": "success", "cause": "infra", "detected_ts": ...},
         "cause", "infra", "only a failed attempt has a cause"),
        ("attempt_ended", {"detected_ts": T0 + 1}, "detected_ts", T0 + 1,
         "must not be after the attempt ended (ts=1795856000.0)"),
        ("phase_started", {"phase": "mine", "component": "effective_training"}, "component",
         "effective_training", "effective time comes only from progress events, not phases"),
        # phase_ended has phase_started's fields (no MINIMAL entry of its own).
        ("phase_started", {"type": "phase_ended", "phase": "replay"}, "phase", "replay",
         "this phase is derived by the ETT model and cannot be reported"),
        ("phase_started", {"type": "phase_ended", "phase": "compile", "component": "shutdown"},
         "component", "shutdown", "phase 'compile' belongs to 'compilation'"),
        ("phase_started", {"phase": "my_phase"}, "phase", "my_phase",
         "unknown phase; name a registered phase or declare its 'component' "
         f"(one of {list(COMPONENTS)})"),
        ("job_ended", {"type": []}, "type", [],
         f"unknown event type; expected one of {sorted(EVENT_TYPES)}"),
    ],
)
def test_each_rule_names_its_field_and_value(etype: str, changes: dict[str, Any], field: str,
                                             value: Any, message: str) -> None:
    error = parse_error(etype, **changes)
    assert (error.field, error.value, error.message, error.line) == (field, value, message, None)
    assert str(error) == f"field '{field}' = {value!r}: {message}"  # no "line" outside a file


@pytest.mark.parametrize(
    ("etype", "changes"),
    [
        ("progress", {"step_start": 7, "step_end": 7}),  # a report of no steps
        ("progress", {"cursor_start": 5, "cursor_end": 5}),  # no data read
        ("progress", {"cursor_start": 0, "cursor_end": 0}),
        ("progress", {"ts": T0, "start_ts": T0}),  # a span of no time
        ("checkpoint_saved", {"blocking_s": 0.0, "total_s": 0.0, "bytes": 0}),
        ("checkpoint_saved", {"blocking_s": 0.5, "total_s": MAX_DURATION_S}),
        ("attempt_ended", {"detected_ts": T0}),  # detected at the very end
        ("attempt_ended", {"status": "success", "cause": ..., "detected_ts": ...}),
    ],
)
def test_the_edge_of_each_rule_is_accepted(etype: str, changes: dict[str, Any]) -> None:
    event = parse_line(json.dumps(event_dict(etype, **changes)))
    for name, value in changes.items():
        assert getattr(event, name) == (None if value is ... else value)


@pytest.mark.parametrize(
    ("ts", "hint"),
    [
        (TS_MIN * 1000, "; it looks like milliseconds (divide by 1000): Unix seconds are expected"),
        (TS_MAX * 1000, ""),  # the first millisecond value past the window
        (1_795_856_000_000_000, "; it looks like microseconds (divide by 1000000): Unix seconds "
                                "are expected"),
        (1.795856e18, "; it looks like nanoseconds (divide by 1000000000): Unix seconds are "
                      "expected"),
        (0, "; it looks like a relative or monotonic clock: Unix seconds (time.time()) are "
            "expected"),
        (99_999_999.5, "; it looks like a relative or monotonic clock: Unix seconds "
                       "(time.time()) are expected"),
        (1e8, ""),  # over three years: not a clock since boot any more
        (-0.5, ""),
        (TS_MIN - 0.5, ""),
    ],
)
def test_a_time_out_of_range_says_what_it_looks_like(ts: float, hint: str) -> None:
    error = parse_error("job_ended", ts=ts)
    assert (error.field, error.value) == ("ts", ts)
    assert str(error) == f"field 'ts' = {ts!r}: {RANGE}{hint}"


@pytest.mark.parametrize(("etype", "field"), [("job_ended", "ts"), ("progress", "start_ts"),
                                              ("attempt_ended", "detected_ts")])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_time_that_is_not_finite_is_named(etype: str, field: str, value: float) -> None:
    error = parse_error(etype, **{field: value})  # json writes NaN, Infinity, -Infinity
    assert error.field == field and str(error.value) == str(value)
    assert str(error) == f"field '{field}' = {value!r}: time must be finite"


@pytest.mark.parametrize(
    ("etype", "field", "value", "message"),
    [
        # Strict typing: a number in a string or a whole float is not an integer.
        ("progress", "step_end", "10", "Expected `int`, got `str`"),
        ("progress", "step_end", 10.0, "Expected `int`, got `float`"),
        ("progress", "cursor_end", True, "Expected `int`, got `bool`"),
        ("job_ended", "ts", True, "Expected `float`, got `bool`"),
        ("job_ended", "ts", [T0], "Expected `float`, got `array`"),
        ("attempt_ended", "detected_ts", {"at": T0}, "Expected `float | null`, got `object`"),
        # A deeply nested value (json reads it) in a typed field is just a wrong type.
        ("job_ended", "status", [[[[[[[[]]]]]]]], "Expected `str`, got `array`"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_with_msgspec_words(
        etype: str, field: str, value: Any, message: str) -> None:
    error = parse_error(etype, **{field: value})
    assert (error.field, error.value) == (field, value)
    assert str(error) == f"field '{field}' = {value!r}: {message}"


def test_deep_nesting_in_a_typed_field_is_an_error_for_its_line() -> None:
    deep = "[" * 600 + "]" * 600  # within what json reads, deeper than escaping could recurse
    text = json.dumps(event_dict("job_ended", status=...))[:-1] + f', "status": {deep}}}'
    result = parse_lines([text, json.dumps(event_dict("job_ended"))])
    assert len(result.events) == 1
    assert (result.errors[0].line, result.errors[0].field) == (1, "status")
    # a wrong type, in msgspec's words: the free-text nesting bound is not applied here
    assert "Expected `str`, got `array`" in str(result.errors[0])


@pytest.mark.parametrize("length", [118, 119, 200])
def test_a_long_value_is_cut_to_one_short_line_but_kept_whole(length: int) -> None:
    value = "x" * length  # repr adds two quotes: 120 is the longest shown whole
    error = parse_error("progress", step_end=value)
    shown = repr(value) if length <= 118 else f"'{'x' * 114}...x'"
    assert len(shown) <= 120
    assert str(error) == f"field 'step_end' = {shown}: Expected `int`, got `str`"
    assert error.value == value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "not valid JSON: Expecting property name enclosed in double quotes"),
        ('{"type": "job_ended",', "not valid JSON: Expecting property name enclosed in double "
                                 "quotes"),
        (b"\xff{}", "not valid JSON: 'utf-8' codec can't decode byte 0xff in position 0: "
                    "invalid start byte"),
        ("[" * 100_000, "not valid JSON: nested too deeply"),
        ("[1, 2]", "an event must be a JSON object, got list"),
    ],
)
def test_a_line_that_is_no_event_object_says_why(raw: str | bytes, message: str) -> None:
    with pytest.raises(EventError) as err:
        parse_line(raw)
    assert str(err.value) == message
    (error,) = parse_lines(["", raw]).errors
    assert str(error) == f"line 2: {message}" and error.line == 2


def test_check_string_names_a_lone_surrogate() -> None:
    with pytest.raises(EventError) as err:
        check_string("job", "a\udcff")
    assert str(err.value) == ("field 'job' = 'a\\udcff': contains a lone surrogate "
                              "(not valid Unicode text)")


def test_python_built_events_that_json_cannot_hold_are_event_errors() -> None:
    with pytest.raises(EventError) as err:
        validate_event(JobSubmitted(id="s", job="j", ts=T0, attrs={"k": object()}))
    assert str(err.value) == ("a value cannot be written as JSON: Encoding objects of type "
                              "object is unsupported")
    # A key JSON cannot have (not a string) is refused, not crashed on.
    with pytest.raises(EventError, match="Expected `str`, got `int`"):
        validate_event(JobSubmitted(id="s", job="j", ts=T0, attrs={1: "x"}))  # type: ignore[dict-item]


def test_read_events_reads_bytes_so_one_bad_line_stays_that_lines_error(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    good = json.dumps(event_dict("job_ended")).encode()
    path.write_bytes(good + b"\n" + b'{"job": "\xff"}\n' + b"\n" + good.replace(b"e1", b"e2"))
    result = read_events(str(path))
    assert [e.id for e in result.events] == ["e1", "e2"]
    assert [(e.line, "utf-8" in str(e)) for e in result.errors] == [(2, True)]


def test_a_value_nested_too_deep_is_refused_and_the_good_lines_are_kept() -> None:
    """500 levels once raised RecursionError out of the parser, losing the whole file."""
    from airflow_ett.ett.events import MAX_NESTING, parse_lines

    def submitted(event_id: str, depth: int) -> str:
        nested = "[" * depth + "]" * depth
        return json.dumps({"type": "job_submitted", "id": event_id, "job": "j",
                           "ts": 1795856000, "attrs": {"k": 0}}).replace("0}", nested + "}")

    good = submitted("ok", MAX_NESTING - 1)
    with pytest.raises(EventError) as caught:
        parse_line(submitted("deep", 500))
    assert caught.value.field == "attrs" and "nested deeper than 64 levels" in str(caught.value)
    result = parse_lines([good, submitted("deep", 500), good.replace('"ok"', '"ok2"')])
    assert [e.id for e in result.events] == ["ok", "ok2"]
    assert len(result.errors) == 1 and result.errors[0].line == 2
