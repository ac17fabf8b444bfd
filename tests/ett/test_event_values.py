"""Values the databases cannot hold, or that cannot be real: the rules every path shares.

Strings: identifiers with a NUL or a lone surrogate are rejected (PostgreSQL cannot hold
NUL, SQLite can; nobody can encode a surrogate), free text is escaped. Times lie in
[TS_MIN, TS_MAX). Integers fit 64 bits signed. The rules run on JSON (`parse_line`) and on
Python-built events (`validate_event`, what the emitter uses) alike.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.events import (
    INT64_MAX,
    TS_MAX,
    TS_MIN,
    AttemptEnded,
    EventError,
    JobSubmitted,
    Progress,
    TaskStateChanged,
    check_string,
    escape_text,
    event_to_json,
    parse_line,
    parse_lines,
    validate_event,
)
from tests.factories import MINIMAL, T0, event_dict

IDENTIFIERS = [(t, f) for t, extra in MINIMAL.items()
               for f in ("id", "job", *extra)
               if isinstance(extra.get(f, "x"), str) and f not in ("message", "host")]
BAD = ["x\ud800", "x\udcff", "x\x00", "\x00"]


def parse_obj(o: dict[str, Any]) -> Any:
    return parse_line(json.dumps(o))  # json escapes "\ud800" and "\x00" as \uXXXX


@pytest.mark.parametrize(("etype", "field"), IDENTIFIERS)
@pytest.mark.parametrize("bad", BAD)
def test_an_identifier_that_no_store_can_hold_is_named_in_the_error(
        etype: str, field: str, bad: str) -> None:
    result = parse_lines([json.dumps(event_dict("progress")),
                          json.dumps(event_dict(etype, **{field: bad}))])
    assert len(result.events) == 1 and len(result.errors) == 1  # the good line stays
    error = result.errors[0]
    assert (error.line, error.field, error.value) == (2, field, bad)
    assert ("NUL" if "\x00" in bad else "surrogate") in str(error)
    assert str(error).isascii()  # printable on any terminal: repr escapes both


@pytest.mark.parametrize("etype", ["attempt_ended", "task_state"])
def test_free_text_is_escaped_not_rejected(etype: str) -> None:
    event = parse_obj(event_dict(etype, message="/data/\udcff.bin\x00end"))
    assert event.message == "/data/\\udcff.bin\\x00end"
    assert parse_line(event_to_json(event)) == event  # stable: escaping twice is a no-op


def test_attrs_and_host_are_free_text_everywhere_inside() -> None:
    sub = parse_obj(event_dict("job_submitted", attrs={"k\ud800": ["\x00", {"n": "v\udfff"}, 1]}))
    assert sub.attrs == {"k\\ud800": ["\\x00", {"n": "v\\udfff"}, 1]}
    started = parse_obj(event_dict("attempt_started", host="h\x00"))
    assert started.host == "h\\x00"


def test_the_string_rule_is_one_function() -> None:
    assert check_string("job", "fine-\u00e9\U0001f600") == "fine-\u00e9\U0001f600"
    text = "ok"
    assert escape_text(text) is text
    with pytest.raises(EventError, match="field 'job' = 'a\\\\x00b': contains a NUL"):
        check_string("job", "a\x00b")
    assert check_string("message", "a\x00b", free_text=True) == "a\\x00b"


def test_python_built_events_get_the_same_rules() -> None:
    ended = AttemptEnded(id="a", job="j", ts=T0, attempt="1", status="success",
                         message="/data/\udcff.bin")
    checked = validate_event(ended)
    assert checked.message == "/data/\\udcff.bin"  # type: ignore[union-attr]
    event_to_json(checked)  # encodable now
    with pytest.raises(EventError) as err:
        validate_event(TaskStateChanged(id="a", job="j\x00", ts=T0, dag_id="d", task_id="t",
                                        state="running"))
    assert err.value.field == "job"


@pytest.mark.parametrize(
    ("ts", "hint"),
    [
        (1_795_856_000_000, "looks like milliseconds"),
        (1_795_856_000_000_000, "looks like microseconds"),
        (1e18, "looks like nanoseconds"),
        (1e300, None),
        (10**400, None),
        (-1.0, None),
        (123.5, "relative or monotonic clock"),
        ("2200-01-01T00:00:00Z", None),
        ("1999-12-31T23:59:59Z", None),
        ("0001-01-01T00:00:00+14:00", None),
    ],
)
def test_times_that_cannot_be_real_are_rejected_with_a_hint(ts: Any, hint: str | None) -> None:
    with pytest.raises(EventError) as err:
        parse_obj(event_dict("job_ended", ts=ts))
    text = str(err.value)
    assert err.value.field == "ts" and "time out of range" in text
    assert "946684800" in text and "4102444800" in text
    if hint is not None:
        assert hint in text
    else:
        assert "looks like" not in text
    assert len(text) < 300  # one readable line, even for a 400-digit value


@pytest.mark.parametrize(("etype", "field"), [("progress", "start_ts"),
                                              ("checkpoint_saved", "start_ts"),
                                              ("attempt_ended", "detected_ts")])
def test_every_time_field_has_the_bounds(etype: str, field: str) -> None:
    with pytest.raises(EventError) as err:
        parse_obj(event_dict(etype, **{field: 1_795_856_000_000}))
    assert err.value.field == field and "milliseconds" in str(err.value)


def test_the_bounds_are_inclusive_below_and_exclusive_above() -> None:
    assert parse_obj(event_dict("job_ended", ts=TS_MIN)).ts == TS_MIN
    assert parse_obj(event_dict("job_ended", ts="2000-01-01T00:00:00Z")).ts == TS_MIN
    assert parse_obj(event_dict("job_ended", ts=TS_MAX - 0.5)).ts == TS_MAX - 0.5
    with pytest.raises(EventError):
        parse_obj(event_dict("job_ended", ts=TS_MAX))


@pytest.mark.parametrize(("etype", "field"), [
    ("progress", "step_end"), ("progress", "cursor_end"), ("checkpoint_saved", "step"),
    ("checkpoint_saved", "cursor"), ("checkpoint_saved", "bytes"),
    ("attempt_ended", "exit_code"), ("task_state", "try_number"),
    ("task_state", "map_index"),
])
def test_integers_must_fit_64_bits(etype: str, field: str) -> None:
    assert parse_obj(event_dict(etype, **{field: INT64_MAX})) is not None
    for value in (INT64_MAX + 1, -(2**63) - 1, 10**30):
        with pytest.raises(EventError) as err:
            parse_obj(event_dict(etype, **{field: value}))
        assert err.value.field == field and "64 bits" in str(err.value)


@pytest.mark.parametrize(("etype", "field", "lowest"), [
    ("progress", "step_start", 0), ("progress", "cursor_start", 0),
    ("checkpoint_saved", "step", 0), ("checkpoint_saved", "cursor", 0),
    ("checkpoint_saved", "bytes", 0), ("task_state", "try_number", 0),
    ("task_state", "map_index", -1),
])
def test_counts_and_positions_start_at_their_lowest(etype: str, field: str,
                                                    lowest: int) -> None:
    extra = {"step_end": 10, "cursor_end": 10} if etype == "progress" else {}
    assert parse_obj(event_dict(etype, **extra, **{field: lowest})) is not None
    for value in (lowest - 1, -(2**63)):
        with pytest.raises(EventError) as err:
            parse_obj(event_dict(etype, **extra, **{field: value}))
        assert str(err.value) == f"field '{field}' = {value}: must be >= {lowest}"


@pytest.mark.parametrize("field", ["blocking_s", "total_s"])
def test_durations_cannot_exceed_the_time_window(field: str) -> None:
    with pytest.raises(EventError) as err:
        parse_obj(event_dict("checkpoint_saved", **{field: 1e18}))
    assert err.value.field == field


# Text with everything hypothesis' default alphabet leaves out: surrogates and NUL.
nasty_text = st.text(st.one_of(st.characters(),
                               st.sampled_from(["\x00", "\ud800", "\udbff", "\udcff",
                                                "\udfff"])), max_size=8)
string_fields = st.sampled_from(sorted({f for _, f in IDENTIFIERS} | {"message", "host"}))


@settings(max_examples=150, deadline=None)
@given(etype=st.sampled_from(sorted(MINIMAL)), values=st.dictionaries(string_fields, nasty_text,
                                                                   max_size=4))
def test_arbitrary_text_parses_to_a_storable_event_or_a_named_error(
        etype: str, values: dict[str, str]) -> None:
    line = json.dumps(event_dict(etype, **values))
    try:
        event = parse_line(line)
    except EventError as exc:
        assert exc.field in values or exc.field in ("phase", "status", "component")
        return
    text = event_to_json(event)  # never raises: what parsed can be stored
    assert "\\u0000" not in text and text.encode("utf-8")
    assert parse_line(text) == event


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=80))
def test_arbitrary_bytes_never_raise_anything_but_event_error(raw: bytes) -> None:
    try:
        event = parse_line(raw)
    except EventError:
        return
    event_to_json(event)


def test_deep_nesting_is_an_error_for_its_line() -> None:
    result = parse_lines(["[" * 100_000, json.dumps(event_dict("job_ended"))])
    assert len(result.events) == 1 and result.errors[0].line == 1


def test_python_built_progress_with_huge_values_is_rejected() -> None:
    with pytest.raises(EventError) as err:
        validate_event(Progress(id="p", job="j", ts=T0, attempt="1", start_ts=T0,
                                step_start=0, step_end=2**70, cursor_start=0, cursor_end=1))
    assert err.value.field == "step_end"
    with pytest.raises(EventError):
        validate_event(JobSubmitted(id="s", job="j", ts=T0 * 1000))
