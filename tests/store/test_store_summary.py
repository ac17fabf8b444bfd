"""The summary cache: computed once per job version, always fresh while provisional.

The first tests swap in a counting fake for `airflow_ett.ett.attribution`, so they test
the cache alone; the last ones run the real attribution model end to end.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from airflow_ett.ett.events import Event, JobEnded, Progress
from airflow_ett.store import EttStore, JobNotFound
from airflow_ett.store.schema import summaries
from tests.store.ett_store_helpers import job_events


@dataclass
class _FakeResult:
    events: int
    provisional: bool
    now: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"events": self.events, "provisional": self.provisional, "now": self.now,
                "ett_pct": 50.0, "e2e_s": 10.0, "pair": (1, 2)}


class _Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, events: Iterable[Event], now: float | None = None) -> _FakeResult:
        self.calls += 1
        evs = list(events)
        ended = any(isinstance(e, JobEnded) for e in evs)
        return _FakeResult(len(evs), not ended, now)


@pytest.fixture
def fake_attribution(monkeypatch: pytest.MonkeyPatch) -> _Counter:
    counter = _Counter()
    module = types.ModuleType("airflow_ett.ett.attribution")
    module.attribute_job = counter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow_ett.ett.attribution", module)
    return counter


def _cached(store: EttStore, job: str) -> tuple[int, bool] | None:
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(summaries.c.version, summaries.c.provisional)
                           .where(summaries.c.job == job)).first()
    return None if row is None else (row.version, row.provisional)


def test_finished_job_is_computed_once(store: EttStore, fake_attribution: _Counter) -> None:
    evs = job_events("j1")
    store.insert_events(evs)
    first = store.summary("j1")
    assert first["events"] == len(evs) and first["provisional"] is False
    assert first["pair"] == [1, 2]  # JSON shape, the same as a cached read gives
    assert store.summary("j1") == first
    assert store.summary("j1", now=1e12) == first
    assert fake_attribution.calls == 1
    assert _cached(store, "j1") == (len(evs), False)


def test_new_event_invalidates_the_cache(store: EttStore, fake_attribution: _Counter) -> None:
    evs = job_events("j1")
    store.insert_events(evs)
    store.summary("j1")
    store.insert_events(evs)  # a replay changes nothing
    store.summary("j1")
    assert fake_attribution.calls == 1
    late = Progress(id="late", job="j1", ts=1.7e9, attempt="a1", start_ts=1.7e9, step_start=0,
                    step_end=1, cursor_start=0, cursor_end=1)
    store.insert_events([late])
    assert store.summary("j1")["events"] == len(evs) + 1
    assert fake_attribution.calls == 2
    store.summary("j1")
    assert fake_attribution.calls == 2
    assert _cached(store, "j1") == (len(evs) + 1, False)


def test_provisional_job_is_recomputed_every_time(
    store: EttStore, fake_attribution: _Counter
) -> None:
    store.insert_events(job_events("run", ended=False))
    assert store.summary("run", now=100.0)["now"] == 100.0
    assert store.summary("run", now=200.0)["now"] == 200.0
    assert fake_attribution.calls == 2
    assert _cached(store, "run") == (len(job_events("run", ended=False)), True)
    store.insert_events(job_events("run"))  # it ends
    assert store.summary("run")["provisional"] is False
    store.summary("run")
    assert fake_attribution.calls == 3


def test_unknown_job(store: EttStore, fake_attribution: _Counter) -> None:
    with pytest.raises(JobNotFound):
        store.summary("nope")
    assert fake_attribution.calls == 0


def test_an_older_computation_never_replaces_a_newer_one(
    store: EttStore, fake_attribution: _Counter
) -> None:
    evs = job_events("j1")
    store.insert_events(evs)
    store.summary("j1")
    stale = {"job": "j1", "version": 1, "computed_at": 0.0, "provisional": False,
             "payload": "{}"}
    store._write(lambda conn: conn.execute(store._upsert_summary, stale))
    assert _cached(store, "j1") == (len(evs), False)


# -- with the real attribution model (airflow_ett/ett/attribution/) ------------------


def test_real_summary_of_a_finished_job(store: EttStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ett.ett import attribution

    calls: list[int] = []
    real = attribution.attribute_job

    def spy(events: Iterable[Event], now: float | None = None) -> Any:
        calls.append(1)
        return real(events, now=now)

    monkeypatch.setattr(attribution, "attribute_job", spy)
    evs = job_events("real")
    store.insert_events(evs)
    result = store.summary("real")
    assert result["provisional"] is False
    assert result["e2e_s"] == pytest.approx(evs[-1].ts - evs[0].ts)
    assert 0 < result["ett_pct"] <= 100
    assert result == json.loads(json.dumps(real(evs).to_dict()))
    assert store.summary("real") == result
    assert len(calls) == 1


def test_real_summary_of_a_running_job_is_provisional(store: EttStore) -> None:
    evs = job_events("live", ended=False)
    store.insert_events(evs)
    result = store.summary("live", now=evs[-1].ts + 60)
    assert result["provisional"] is True
    later = store.summary("live", now=evs[-1].ts + 120)
    assert later["e2e_s"] == pytest.approx(result["e2e_s"] + 60)


def test_a_summary_cached_before_attempts_had_messages_is_computed_again(
        store: EttStore) -> None:
    """A finished job's summary cached by an older version, whose attempt rows have no
    `message`, is computed again from the events: `runs show` then says what the
    attempts' ends said (a preemption's reason, here a success's note)."""
    from airflow_ett.ett.events import AttemptEnded

    evs = job_events("old")
    end = next(e for e in evs if isinstance(e, AttemptEnded))
    evs[evs.index(end)] = msgspec.structs.replace(end, message="done: 50 steps")
    store.insert_events(evs)
    fresh = store.summary("old")
    assert fresh["attempts"][0]["message"] == "done: 50 steps"
    older = json.loads(json.dumps(fresh))
    for row in older["attempts"]:
        del row["message"]
    with store.engine.begin() as conn:
        conn.execute(sa.update(summaries).where(summaries.c.job == "old")
                     .values(payload=json.dumps(older)))
    assert store.summary("old") == fresh
    with store.engine.connect() as conn:
        cached = json.loads(conn.scalar(sa.select(summaries.c.payload)
                                        .where(summaries.c.job == "old")))
    assert cached == fresh  # and the cache holds the new form again
