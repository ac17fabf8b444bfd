"""Values the databases cannot hold: both backends refuse the same ones, the same way.

PostgreSQL cannot hold a NUL in text and SQLite can; nobody can encode a lone surrogate.
Through the parser (what `ingest` uses) and through `insert_events` directly, a bad event
is named and nothing of it is stored, on both backends, and good events are stored once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.cli import main
from airflow_ett.ett.events import (
    AttemptEnded,
    EventError,
    JobEnded,
    JobSubmitted,
    event_to_json,
    parse_lines,
)
from airflow_ett.store import EttStore
from airflow_ett.store.schema import events as events_table
from tests.factories import T0
from tests.store.ett_store_helpers import job_events

BAD_IDS = ["x\ud800", "x\x00"]


def line(etype: str = "job_ended", **fields: Any) -> str:
    base: dict[str, Any] = {"type": etype, "id": "e", "job": "j", "ts": T0}
    if etype == "job_ended":
        base["status"] = "success"
    return json.dumps({**base, **fields})


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("field", ["id", "job"])
def test_ingest_stores_the_good_lines_and_names_the_bad_one(
        store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str,
        field: str) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join([line(id="good-1"), line(**{"id": "bad", field: bad}),
                               line(id="good-2", ts=1_795_856_000_000),
                               line(id="good-3")]) + "\n")
    assert main(["ingest", str(path), "--store-url", store_url]) == 0
    captured = capsys.readouterr()
    assert "stored 2 new event(s) of 2 read" in captured.out
    assert f"line 2: field '{field}' = {bad!r}" in captured.err
    assert "line 3: field 'ts' = 1795856000000: time out of range" in captured.err
    assert "milliseconds" in captured.err
    with EttStore(store_url) as store:
        assert sorted(e.id for e in store.job_events("j")) == ["good-1", "good-3"]
        assert store.count_events() == 2


def test_ingest_says_when_an_id_comes_back_with_different_content(
        store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join([line(id="a"), line(id="b")]) + "\n")
    assert main(["ingest", str(first), "--store-url", store_url]) == 0
    capsys.readouterr()
    again = tmp_path / "again.jsonl"
    again.write_text("\n".join([line(id="a"), line(id="b", status="failed"), line(id="c"),
                                line(id="c", status="cancelled")]) + "\n")
    assert main(["ingest", str(again), "--store-url", store_url]) == 0
    captured = capsys.readouterr()
    assert "stored 1 new event(s) of 4 read (3 already there)" in captured.out
    assert "2 event id(s) reused with different content" in captured.err
    assert main(["ingest", str(first), "--store-url", store_url]) == 0
    assert "reused" not in capsys.readouterr().err  # a plain replay is not a conflict


def test_ingest_result_counts_new_duplicates_and_conflicts(store: EttStore) -> None:
    evs = job_events("j1", t0=T0)
    assert store.ingest(evs).new == len(evs)
    changed = JobEnded(id=evs[-1].id, job="j1", ts=evs[-1].ts, status="failed")
    result = store.ingest([*evs[:3], changed])
    assert (result.new, result.duplicates, result.conflicts) == (0, 4, 1)
    assert store.job_events("j1")[-1] == evs[-1]  # the first stored version stands


@pytest.mark.parametrize("bad", [{"job": "j\x00"}, {"id": "i\ud800"}, {"attempt": "a\x00"},
                                 {"message": "m\udcff"}, {"ts": 5.0},
                                 {"detected_ts": 1e300}])
def test_a_python_built_event_the_store_cannot_hold_is_refused_alike(
        store: EttStore, bad: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"id": "x", "job": "j", "ts": T0, "attempt": "a",
                              "status": "failed", "cause": "infra", **bad}
    good = JobSubmitted(id="ok", job="j", ts=T0)
    with pytest.raises(EventError) as err:
        store.insert_events([good, AttemptEnded(**fields)])
    assert "cannot be stored" in str(err.value)
    field = next(iter(bad))
    if field != "message":  # the payload's encoder names no field
        assert f"field '{field}'" in str(err.value)
    assert store.count_events() == 0  # nothing of the batch was written


def test_a_stored_event_that_breaks_todays_rules_does_not_break_its_job(
        store: EttStore, caplog: pytest.LogCaptureFixture) -> None:
    evs = job_events("old", t0=T0)
    store.insert_events(evs)
    odd = {"type": "job_ended", "v": 1, "id": "odd", "job": "old", "ts": 1e300,
           "status": "success"}
    with store.engine.begin() as conn:  # as an earlier version let it in
        seq = conn.scalar(sa.select(sa.func.max(events_table.c.seq))) or 0
        conn.execute(events_table.insert().values(
            id="odd", seq=seq + 1, job="old", type="job_ended", ts=1e300, attempt=None,
            payload=json.dumps(odd), ingested_at=T0))
    assert store.job_events("old") == sorted(evs, key=lambda e: e.ts)
    assert "left out" in caplog.text and "'odd'" in caplog.text
    assert store.summary("old")["job"] == "old"


# Text with what hypothesis' default alphabet leaves out: lone surrogates and NUL.
nasty = st.text(st.one_of(st.characters(), st.sampled_from(["\x00", "\ud800", "\udfff"])),
                min_size=1, max_size=6)


@pytest.mark.integration
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.tuples(st.sampled_from(["id", "job", "message", "tenant", "raw"]),
                                nasty), min_size=1, max_size=8))
def test_arbitrary_text_parse_to_store_each_good_event_once_each_bad_reported(
        store: EttStore, unique_job: Callable[[str], str],
        items: list[tuple[str, str]]) -> None:
    job = unique_job("prop")
    lines: list[str | bytes] = []
    for n, (field, text) in enumerate(items):
        if field == "raw":  # arbitrary bytes, as a torn or foreign line
            lines.append(text.encode("utf-8", "surrogatepass"))
            continue
        etype = "job_submitted" if field == "tenant" else "attempt_ended"
        fields: dict[str, Any] = {"type": etype, "id": f"{job}-{n}", "job": job, "ts": T0}
        if etype == "attempt_ended":
            fields.update(attempt="1", status="success")
        fields[field] = text if field != "id" else f"{job}-{n}-{text}"
        if field == "job":
            fields["job"] = job + text
        lines.append(json.dumps(fields))
    parsed = parse_lines(lines)
    assert len(parsed.events) + len(parsed.errors) == sum(1 for x in lines if x.strip())
    new = store.insert_events(parsed.events)
    assert new == len({e.id for e in parsed.events})
    assert store.insert_events(parsed.events) == 0  # once, however often
    stored = {e.id: e for j in {e.job for e in parsed.events} for e in store.job_events(j)}
    assert {e.id for e in parsed.events} <= set(stored)
    for event in parsed.events:
        assert event_to_json(stored[event.id]) == event_to_json(event)
