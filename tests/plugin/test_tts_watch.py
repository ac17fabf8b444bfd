"""A job past its tenant's time-to-start bound, flagged while it still waits: the
decision, the deadline's callback on a real store (SQLite) with a real notifier class that
records what it was asked to send, once per job. The deadline itself, as the cluster
policy puts it on a DAG and Airflow serializes it: tests/plugin/test_policy.py."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from airflow_ett.ett.events import AttemptStarted, Event
from airflow_ett.ett.flags import JobFlag, time_to_start_flag
from airflow_ett.plugin.tts_watch import check_time_to_start, time_to_start_passed
from airflow_ett.store import EttStore, upgrade
from tests.operators import recording
from tests.rollup.scenarios import LO, job_a

DAG, RUN = "ads_ctr", "manual__2026-11-28T00:00:00+00:00"
JOB = f"{DAG}__{RUN}"


def test_the_flag_is_raised_only_for_a_job_still_waiting_past_its_bound() -> None:
    assert time_to_start_flag(JOB, started=True, tenant="ads", bound_s=60, queued_at=0,
                              now=500) is None
    assert time_to_start_flag(JOB, started=False, tenant="ads", bound_s=60, queued_at=0,
                              now=59) is None  # a clock that fired early
    flag = time_to_start_flag(JOB, started=False, tenant="ads", bound_s=1800, queued_at=0,
                              now=2100)
    assert flag == JobFlag(job=JOB, kind="time_to_start", at=2100, tenant="ads",
                           bound_s=1800, waited_s=2100, message=(
                               "no effective step 35.0 min after it was queued: past tenant "
                               "ads's time-to-start bound of 30.0 min (max_tts_s)"))
    assert JobFlag.from_json(flag.to_json()) == flag


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    components = tmp_path / "components.toml"
    components.write_text('''
[alerts]
notify = ["all"]
tts_notify = ["oncall"]
[notifiers.all]
class = "tests.operators.recording.RecordingNotifier"
channel = "#all"
[notifiers.oncall]
class = "tests.operators.recording.RecordingNotifier"
channel = "#oncall"
''')
    monkeypatch.setenv("AIRFLOW__ETT__STORE_URL", url)
    monkeypatch.setenv("AIRFLOW__ETT__COMPONENTS_FILE", str(components))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://af.example.com/")
    recording.SENT.clear()
    yield url
    recording.SENT.clear()


def _as_job(events: list[Event]) -> list[Event]:
    return [msgspec.structs.replace(e, job=JOB, id=f"{JOB}-{i}") for i, e in enumerate(events)]


def test_a_job_still_in_startup_is_flagged_and_alerted_once(store_url: str) -> None:
    submitted = job_a()[0]  # queued at LO - 3600
    with EttStore(store_url) as store:
        store.insert_events(_as_job([submitted, AttemptStarted(
            id="x", job="x", ts=submitted.ts + 60, attempt="1")]))
    flag = check_time_to_start(DAG, RUN, tenant="ads", bound_s=1800, queued_at=submitted.ts,
                               now=submitted.ts + 1900)
    assert flag is not None and flag.waited_s == 1900
    with EttStore(store_url) as store:
        assert store.flags.of_job(JOB) == [flag]
    (sent,) = recording.SENT
    assert sent.channel == "#oncall" and sent.alert_key == f"tts/{JOB}"
    assert sent.subject == (f"[ETT] {DAG} run {RUN} (ads) has not started training after "
                            "31.7 min")
    assert "run page: https://af.example.com/ett/runs/ads_ctr/" \
           "manual__2026-11-28T00%3A00%3A00%2B00%3A00" in sent.text
    # Airflow runs a missed deadline's callback once; run twice anyway, nothing doubles
    check_time_to_start(DAG, RUN, tenant="ads", bound_s=1800, queued_at=submitted.ts,
                        now=submitted.ts + 2500)
    with EttStore(store_url) as store:
        assert store.flags.of_job(JOB) == [flag]  # the first time is kept
    assert len(recording.SENT) == 1


def test_a_job_that_started_in_time_is_left_alone(store_url: str) -> None:
    events = job_a()
    with EttStore(store_url) as store:
        store.insert_events(_as_job(events))
    assert check_time_to_start(DAG, RUN, tenant="ads", bound_s=60, queued_at=events[0].ts,
                               now=LO + 4000) is None
    with EttStore(store_url) as store:
        assert store.flags.of_job(JOB) == []
    assert recording.SENT == []


def test_the_deadline_callback_reads_the_run_from_airflows_context(store_url: str) -> None:
    """What the triggerer awaits: no event stored yet (queued, no task ran) is waiting."""
    queued = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=120)
    # the shape Airflow 3.3's scheduler gives (the run's REST form; trimmed)
    context = {"dag_run": {"dag_run_id": RUN, "dag_id": DAG, "state": "running",
                           "queued_at": queued.isoformat().replace("+00:00", "Z")},
               "deadline": {"id": "d", "deadline_time": queued + dt.timedelta(seconds=90)}}
    result = asyncio.run(time_to_start_passed("ads", 90, context=context))
    assert result.startswith("flagged: no effective step 2.0 min after it was queued")
    with EttStore(store_url) as store:
        (flag,) = store.flags.of_job(JOB)
    assert flag.bound_s == 90 and 119 < flag.waited_s < 150
    with pytest.raises(ValueError, match="no dag_id/run_id in the context"):
        asyncio.run(time_to_start_passed("ads", 90, context={"dag_run": {}}))


def test_without_queued_at_the_wait_counts_from_the_deadline_less_the_bound() -> None:
    from airflow_ett.plugin.tts_watch import _queued_at

    deadline = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
    assert _queued_at({"queued_at": "2026-11-28T11:00:00Z"}, {}, 60) == \
        dt.datetime(2026, 11, 28, 11, tzinfo=dt.UTC).timestamp()
    for when in (deadline, deadline.isoformat()):
        assert _queued_at({"queued_at": None}, {"deadline_time": when}, 600) == \
            deadline.timestamp() - 600
    assert _queued_at({"queued_at": "not a time"}, {"deadline_time": deadline}, 60) == \
        deadline.timestamp() - 60
