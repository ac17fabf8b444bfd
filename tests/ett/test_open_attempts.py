"""`open_attempts`: the attempts a lost worker leaves without an end."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.ett.events import AttemptEnded, AttemptStarted, Event, JobSubmitted
from airflow_ett.ett.open_attempts import open_attempts


def _started(attempt: str, ts: float) -> AttemptStarted:
    return AttemptStarted(id=f"s-{attempt}-{ts}", job="j", ts=ts, attempt=attempt)


def _ended(attempt: str, ts: float) -> AttemptEnded:
    return AttemptEnded(id=f"e-{attempt}-{ts}", job="j", ts=ts, attempt=attempt,
                        status="failed", cause="application")


def test_started_and_not_ended_in_order_of_start() -> None:
    events: list[Event] = [JobSubmitted(id="s", job="j", ts=0.0), _started("2.1", 30.0),
                           _started("1.1", 10.0), _ended("1.1", 20.0), _started("1.2", 25.0),
                           # the operator and the trainer both report a start
                           _started("2.1", 29.0)]
    assert open_attempts(events) == ["1.2", "2.1"]


def test_an_end_without_a_start_opens_nothing() -> None:
    assert open_attempts([_ended("1.1", 5.0)]) == []


@given(st.lists(st.tuples(st.sampled_from(["1.1", "1.2", "2.1"]), st.booleans(),
                          st.floats(0, 100, allow_nan=False)), max_size=12),
       st.randoms())
def test_the_answer_does_not_depend_on_the_order_events_arrive_in(
        marks: list[tuple[str, bool, float]], rnd: object) -> None:
    events: list[Event] = [(_started if start else _ended)(a, ts) for a, start, ts in marks]
    shuffled = list(events)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    got = open_attempts(shuffled)
    assert got == open_attempts(events)
    ended = {a for a, start, _ in marks if not start}
    assert set(got) == {a for a, start, _ in marks if start} - ended
