"""What an attempt's end said (a preemption's reason, a failure's message), from an events
file through the store to every place a person reads a run: `runs show` (text and
`--json`), the run page and its JSON. The messages hold markup: the page shows it as text."""

from __future__ import annotations

import html
import json
from pathlib import Path

import msgspec
import pytest
from fastapi.testclient import TestClient

from airflow_ett.cli import main
from airflow_ett.ett.events import AttemptEnded, Event, event_to_json
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.jobs import job_id_for

DAG, RUN = "ranking_ctr_v7", "manual__2026-12-01T06:00:00+00:00"
JOB = job_id_for(DAG, RUN)
#: The victim's message as the trainer writes it (trainer/leaving.py `Leaving.message`
#: around the controller's reason, README's example), and a crash's.
REASON = ("left at its checkpoint on request: preempted " + JOB + ": tenant batch over its "
          "guarantee by 2 GPUs, checkpointed 40 s ago, unsaved work 40 s x 8 GPUs, for "
          "ads_ranker__manual__1 (priority 100 over 10); yields at its next checkpoint")
CRASH = "RuntimeError: bad batch <b>id</b> & <script>alert(1)</script>"


def _events() -> list[Event]:
    spec = JobSpec(job=JOB, dag_id=DAG, run_id=RUN, steps=100, world_size=8,
                   failures=(InjectedFailure(at_step=30, cause="preemption"),
                             InjectedFailure(at_step=60, cause="application")))
    messages = {"preemption": REASON, "application": CRASH}
    return [msgspec.structs.replace(e, message=messages[e.cause])
            if isinstance(e, AttemptEnded) and e.cause in messages else e
            for e in simulate(spec)]


@pytest.fixture
def store_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    log = tmp_path / "events.jsonl"
    log.write_text("".join(event_to_json(e) + "\n" for e in _events()), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    assert main(["db", "upgrade", "--store-url", url]) == 0
    assert main(["ingest", str(log), "--store-url", url]) == 0
    capsys.readouterr()
    return url


def _attempts() -> list[tuple[str, str | None]]:
    """(attempt id, message) of each attempt, in order, from the events."""
    return [(e.attempt, e.message) for e in _events() if isinstance(e, AttemptEnded)]


def test_runs_show_says_each_attempts_message(store_url: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (first, _), (second, _), (third, _) = _attempts()
    assert main(["runs", "show", JOB, "--store-url", store_url]) == 0
    out = capsys.readouterr().out
    assert f"  attempt {first} failed (preemption, exit -9): {REASON}" in out.splitlines()
    assert f"  attempt {second} failed (application, exit 1): {CRASH}" in out.splitlines()
    assert f"attempt {third} success" not in out  # it said nothing
    assert main(["runs", "show", JOB, "--store-url", store_url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(a["attempt"], a["message"]) for a in shown["attempts"]] == _attempts()


def test_the_run_page_and_its_json_say_each_attempts_message(store_url: str) -> None:
    from airflow_ett.plugin.web.app import create_app
    from airflow_ett.store import EttStore
    from tests.plugin.web.conftest import overridden

    (first, _), (second, _), (third, _) = _attempts()
    with EttStore(store_url) as store:
        client = TestClient(overridden(create_app(), store, now=2e9))
        page = client.get(f"/runs/{DAG}/{RUN}", headers={"accept": "text/html"}).text
        body = client.get(f"/api/v1/runs/{DAG}/{RUN}").json()
    for attempt, message in ((first, REASON), (second, CRASH)):
        assert (f'<tr class="message" data-attempt-message="{attempt}"><td></td>'
                f'<td colspan="7">{html.escape(message)}</td></tr>') in page
    assert f'data-attempt-message="{third}"' not in page
    assert "<b>id</b>" not in page and "<script>alert" not in page
    assert [(a["attempt"], a["message"]) for a in body["attempts"]] == _attempts()
