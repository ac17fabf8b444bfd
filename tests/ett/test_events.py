"""The event contract: round trips, and errors that name the line, field and value."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.events import (
    EVENT_TYPES,
    EventError,
    event_from_dict,
    event_to_dict,
    event_to_json,
    parse_line,
    parse_lines,
)
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from tests.factories import T0

GOOD = {"type": "progress", "id": "p1", "job": "j", "ts": T0 + 2, "attempt": "1",
        "start_ts": T0 + 1, "step_start": 0, "step_end": 10, "cursor_start": 0, "cursor_end": 64}


def line(**changes: object) -> str:
    obj = {**GOOD, **changes}
    return json.dumps({k: v for k, v in obj.items() if v is not ...})


def test_every_simulated_event_round_trips_through_json() -> None:
    events = simulate(JobSpec(failures=(InjectedFailure(at_step=30, cause="infra"),)))
    assert {type(e).__struct_config__.tag for e in events} >= set(EVENT_TYPES) - {  # type: ignore[attr-defined]
        "model_published", "task_state", "rank_steps"}  # the last: tests/ett/test_stragglers.py
    for event in events:
        text = event_to_json(event)
        assert parse_line(text) == event
        assert json.loads(text)["v"] == 1


def test_task_state_round_trips_and_names_a_bad_source() -> None:
    text = json.dumps({"type": "task_state", "id": "t1", "job": "d__r", "ts": 1795856005.0,
                       "dag_id": "d", "task_id": "train", "state": "up_for_retry",
                       "try_number": 2, "source": "scheduler", "message": "killed"})
    event = parse_line(text)
    assert parse_line(event_to_json(event)) == event
    with pytest.raises(EventError) as err:
        parse_line(text.replace('"scheduler"', '"cron"'))
    assert err.value.field == "source" and err.value.value == "cron"


def test_iso_times_with_zone_are_accepted() -> None:
    e = parse_line(line(ts="2026-11-28T10:00:02+00:00", start_ts="2026-11-28T10:00:01Z"))
    assert e.ts - e.start_ts == 1.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (line(cursor_end="x"), "line 1: field 'cursor_end' = 'x': Expected `int`, got `str`"),
        (line(cursor_end=...), "line 1: field 'cursor_end': required field is missing"),
        (line(cursor_end=-5), "field 'cursor_end' = -5: must be >= cursor_start (0)"),
        (line(ts=T0 + 0.5), "field 'ts' = 1795856000.5: span ends before it starts"),
        (line(ts="2026-11-28 10:00"), "field 'ts' = '2026-11-28 10:00': ISO-8601 time needs"),
        (line(ts="yesterday"), "field 'ts' = 'yesterday': not an ISO-8601 time"),
        (line(type="progess"), "field 'type' = 'progess': unknown event type"),
        (line(v=3), "field 'v' = 3: unsupported format version"),
        (line(v=True), "field 'v' = True: unsupported format version"),
        (line(rank=1), "field 'v' = 1: an event of rank > 0 needs format version 2"),
        (line(v=2, rank=-1), "field 'rank' = -1: must be a rank in [0, 1048576)"),
        (line(v=2, rank=1 << 20), "field 'rank' = 1048576: must be a rank in"),
        (line(v=2, rank="1"), "field 'rank' = '1': Expected `int`, got `str`"),
        (line(id=""), "field 'id' = '': must not be empty"),
        ('{"type": "attempt_ended", "id": "a", "job": "j", "ts": 1795856001, "attempt": "1", '
         '"status": "failed"}', "field 'cause': a failed attempt needs a cause"),
        ('{"type": "attempt_ended", "id": "a", "job": "j", "ts": 1795856001, "attempt": "1", '
         '"status": "failed", "cause": "gremlins"}', "field 'cause' = 'gremlins'"),
        ('{"type": "phase_started", "id": "a", "job": "j", "ts": 1795856001, "phase": "my_phase"}',
         "field 'phase' = 'my_phase': unknown phase; name a registered phase or declare"),
        ('{"type": "phase_started", "id": "a", "job": "j", "ts": 1795856001, "phase": "replay"}',
         "field 'phase' = 'replay': this phase is derived"),
        ('{"type": "phase_started", "id": "a", "job": "j", "ts": 1795856001, "phase": "compile", '
         '"component": "shutdown"}', "phase 'compile' belongs to 'compilation'"),
        ('{"type": "phase_started", "id": "a", "job": "j", "ts": 1795856001, "phase": "mine", '
         '"component": "effective_training"}', "effective time comes only from progress"),
        ('{"type": "checkpoint_saved", "id": "c", "job": "j", "ts": 1795856003, "attempt": "1", '
         '"start_ts": 1795856001, "step": 1, "cursor": 1, "blocking_s": -1, "total_s": 2}',
         "field 'blocking_s' = -1.0: must be a number of seconds in [0, "),
        ("{not json", "line 1: not valid JSON"),
        ("[1, 2]", "an event must be a JSON object, got list"),
    ],
)
def test_bad_events_name_line_field_and_value(text: str, expected: str) -> None:
    result = parse_lines([text])
    assert result.events == []
    assert len(result.errors) == 1
    assert expected in str(result.errors[0])


def test_bad_lines_do_not_discard_good_ones() -> None:
    lines = [line(id="a"), line(id="b", cursor_end="x"), "", line(id="c"), "garbage"]
    result = parse_lines(lines)
    assert [e.id for e in result.events] == ["a", "c"]
    assert [err.line for err in result.errors] == [2, 5]


def test_custom_phase_with_declared_component_and_unknown_fields() -> None:
    e = parse_line('{"type": "phase_started", "id": "a", "job": "j", "ts": 1795856001, '
                   '"phase": "feature_store_warmup", "component": "initialization", '
                   '"my_extra": {"x": 1}}')
    assert e.component == "initialization"  # type: ignore[union-attr]
    assert "my_extra" not in event_to_dict(e)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"ts": 1795856001, "status": "failed", "job": "j", "id": "e", "type": "job_ended"}',
         {"type": "job_ended", "v": 1, "id": "e", "job": "j", "ts": 1795856001.0,
          "status": "failed"}),
        ('{"attempt": "1", "id": "a", "type": "attempt_started", "v": 1, "job": "j", '
         '"ts": 1795856001.5, "host": null}',
         {"type": "attempt_started", "v": 1, "id": "a", "job": "j", "ts": 1795856001.5,
          "attempt": "1"}),
    ],
)
def test_the_json_form_leads_with_the_common_fields_once(
        text: str, expected: dict[str, object]) -> None:
    """`type, v, id, job, ts` first in every line written (so a reader or a human sees what
    an event is at a glance), each once, then the type's own fields, nulls left out."""
    written = event_to_dict(parse_line(text))
    assert list(written.items()) == list(expected.items())


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([*list(GOOD), "extra"]),
                       st.one_of(st.none(), st.integers(), st.text(max_size=5),
                                 st.floats(allow_nan=True))))
def test_arbitrary_objects_either_parse_or_raise_event_error(obj: dict[str, object]) -> None:
    try:
        event_from_dict({**GOOD, **obj})
    except EventError as exc:
        assert str(exc)
