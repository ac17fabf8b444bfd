"""`decode_stored`: the store's fast read of its own canonical JSON must give exactly what
`parse_line` gives, and send whatever breaks today's rules to `parse_line`'s error."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings

from airflow_ett.ett.events import (
    TS_MAX,
    TS_MIN,
    EventError,
    decode_stored,
    event_to_json,
    parse_line,
)
from airflow_ett.ett.synthetic import simulate
from tests.ett.strategies import soups, specs
from tests.factories import T0, event_dict


@settings(max_examples=50, deadline=None)
@given(spec=specs)
def test_it_reads_what_parse_line_reads(spec: object) -> None:
    for event in simulate(spec):  # type: ignore[arg-type]
        text = event_to_json(event)
        assert decode_stored(text) == parse_line(text) == event
        assert decode_stored(text.encode()) == event


@settings(max_examples=50, deadline=None)
@given(events=soups())
def test_it_reads_every_kind_of_event(events: list[object]) -> None:
    for event in events:  # the soups' times are relative: moved to real Unix seconds
        moved = msgspec.structs.replace(event, **{  # type: ignore[type-var]
            name: getattr(event, name) + T0 for name in event.TIME_FIELDS  # type: ignore[attr-defined]
            if getattr(event, name) is not None})
        text = event_to_json(moved)  # type: ignore[arg-type]
        assert decode_stored(text) == parse_line(text) == moved


@pytest.mark.parametrize(("field", "value"), [
    ("ts", TS_MIN - 1), ("ts", TS_MAX), ("ts", 1_795_856_000_000.0),  # milliseconds
])
def test_a_stored_time_out_of_todays_bounds_is_parse_lines_error(field: str,
                                                                 value: float) -> None:
    text = json.dumps(event_dict("job_ended", **{field: value}))
    with pytest.raises(EventError) as caught:
        decode_stored(text)
    assert caught.value.field == field


@pytest.mark.parametrize("text", [
    '{"type":"job_ended","id":"a","job":"j\\ud800","ts":1795856000,"status":"success"}',
    '{"type":"job_ended","id":"a","job":"j","ts":"2026-11-28T09:00:00Z","status":"success"}',
    '{"type":"nope","id":"a","job":"j","ts":1795856000}',
])
def test_what_does_not_decode_cleanly_goes_through_parse_line(text: str) -> None:
    try:
        expected: object = parse_line(text)
    except EventError as exc:
        with pytest.raises(EventError) as caught:
            decode_stored(text)
        assert str(caught.value) == str(exc)
        return
    assert decode_stored(text) == expected  # an ISO time: parse_line accepts it
