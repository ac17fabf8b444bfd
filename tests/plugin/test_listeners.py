"""The listener's hooks called directly, as Airflow's listener managers call them.

Hand-built objects carry the attributes Airflow 3.3 passes (a DAG run in the scheduler, a
`RuntimeTaskInstance` on the worker, an ORM task instance in the API server); events go
to a real SQLite store through a real emitter. The last tests make the store unreachable
and a hook body raise: nothing reaches Airflow and nothing recorded is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_ett.emit import Emitter, replay_spool
from airflow_ett.ett.events import JobEnded, JobSubmitted, PhaseEnded, TaskStateChanged
from airflow_ett.plugin.listeners import EttListener
from airflow_ett.settings import EttSettings
from airflow_ett.store import EttStore, upgrade

QUEUED = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
TAGS = ["ett", "ett:tenant=ads", "ett:model=dlrm_small"]


class RuntimeTaskInstance(SimpleNamespace):
    """Named like the Task SDK's class: that is how the listener knows it is on a worker."""


def dag_run(tags: list[str] | None = TAGS, **changes: Any) -> SimpleNamespace:
    fields: dict[str, Any] = dict(
        dag_id="ranking", run_id="manual__1", queued_at=QUEUED, start_date=QUEUED,
        end_date=QUEUED + timedelta(minutes=5), conf={"steps": 10}, run_type="manual",
        dag=SimpleNamespace(tags=set(tags)) if tags is not None else None)
    fields.update(changes)
    return SimpleNamespace(**fields)


def worker_ti(state: str = "running", tags: list[str] = TAGS, **changes: Any
              ) -> RuntimeTaskInstance:
    task = SimpleNamespace(dag=SimpleNamespace(tags=set(tags)), retry_delay=timedelta(seconds=30),
                           retry_exponential_backoff=False)
    fields: dict[str, Any] = dict(dag_id="ranking", run_id="manual__1", task_id="train",
                                  try_number=1, map_index=-1, state=state, task=task,
                                  start_date=QUEUED + timedelta(seconds=10))
    fields.update(changes)
    return RuntimeTaskInstance(**fields)


def api_ti(state: str) -> SimpleNamespace:
    """An ORM task instance in the API server: no task, so no tags to see."""
    return SimpleNamespace(dag_id="ranking", run_id="manual__1", task_id="train",
                           try_number=2, map_index=-1, state=state)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ett.db"
    upgrade(url)
    return url


@pytest.fixture
def listener(url: str, tmp_path: Path) -> Iterator[EttListener]:
    emitter = Emitter(sink=url, spool_dir=tmp_path / "spool", emit_timeout=5.0, linger=0.01)
    settings = EttSettings(store_url=url, disabled=False, spool_dir=tmp_path / "spool",
                           emit_timeout=5.0, work_dir=tmp_path / "work")
    yield EttListener(emitter=lambda: emitter, settings=lambda: settings)
    emitter.close()


def events(listener: EttListener, url: str, job: str = "ranking__manual__1") -> list[Any]:
    assert listener.flush(10.0)
    with EttStore(url) as store:
        return store.job_events(job)


def test_dag_run_running_submits_the_job_at_queued_at(listener: EttListener, url: str) -> None:
    listener.on_dag_run_running(dag_run(), "running")
    (submitted,) = events(listener, url)
    assert isinstance(submitted, JobSubmitted)
    assert submitted.ts == QUEUED.timestamp()
    assert (submitted.tenant, submitted.model) == ("ads", "dlrm_small")
    assert (submitted.dag_id, submitted.run_id) == ("ranking", "manual__1")
    assert submitted.attrs == {"run_type": "manual", "conf": {"steps": 10}}


def test_dags_without_the_ett_tag_are_not_recorded(listener: EttListener, url: str) -> None:
    listener.on_dag_run_running(dag_run(tags=["etl"]), "running")
    listener.on_task_instance_running(None, worker_ti(tags=["etl"]))
    listener.on_dag_run_failed(dag_run(tags=["etl"]), "failed")
    assert events(listener, url) == []


def test_worker_task_tries_are_recorded_with_a_retry_delay(
        listener: EttListener, url: str) -> None:
    listener.on_task_instance_running(None, worker_ti("running"))
    listener.on_task_instance_failed("running", worker_ti("up_for_retry"), RuntimeError("boom"))
    listener.on_task_instance_running(None, worker_ti("running", try_number=2))
    listener.on_task_instance_success("running", worker_ti("success", try_number=2))
    got = events(listener, url)
    states = [(e.try_number, e.state, e.source) for e in got if isinstance(e, TaskStateChanged)]
    assert sorted(states) == [(1, "running", "worker"), (1, "up_for_retry", "worker"),
                              (2, "running", "worker"), (2, "success", "worker")]
    retry = next(e for e in got if isinstance(e, TaskStateChanged) and e.state == "up_for_retry")
    assert retry.message == "boom"
    (delay_end,) = [e for e in got if isinstance(e, PhaseEnded)]
    assert delay_end.phase == "retry_delay" and delay_end.ts == pytest.approx(retry.ts + 30.0)


def test_a_task_killed_from_outside_is_recorded_from_the_scheduler(
        listener: EttListener, url: str) -> None:
    # The scheduler's `handle_failure` passes an ORM task instance with its task attached.
    ti = SimpleNamespace(**{**vars(worker_ti("up_for_retry")), "try_number": 3})
    listener.on_task_instance_failed("running", ti, "Executor reported the task as failed")
    got = events(listener, url)
    (state,) = [e for e in got if isinstance(e, TaskStateChanged)]
    assert (state.source, state.state, state.try_number) == ("scheduler", "up_for_retry", 3)
    assert [e.phase for e in got if isinstance(e, PhaseEnded)] == ["retry_delay"]


def test_api_state_changes_are_recorded_for_known_jobs_only(
        listener: EttListener, url: str) -> None:
    listener.on_task_instance_failed(None, api_ti("failed"), "set by hand")
    assert events(listener, url) == []  # the store knows no such job yet
    listener.on_dag_run_running(dag_run(), "running")
    listener.flush(10.0)
    listener.on_task_instance_failed(None, api_ti("failed"), "set by hand")
    (state,) = [e for e in events(listener, url) if isinstance(e, TaskStateChanged)]
    assert (state.source, state.state, state.try_number) == ("api", "failed", 2)


def test_dag_run_end_is_a_fallback_for_jobs_the_train_task_did_not_end(
        listener: EttListener, url: str, tmp_path: Path) -> None:
    listener.on_dag_run_running(dag_run(), "running")
    listener.flush(10.0)
    listener.on_dag_run_failed(dag_run(), "failed")
    ended = [e for e in events(listener, url) if isinstance(e, JobEnded)]
    assert [(e.status, e.ts) for e in ended] == [
        ("failed", (QUEUED + timedelta(minutes=5)).timestamp())]

    # A job whose train task already ended keeps that end (the GPUs were released then).
    run2 = dag_run(run_id="manual__2")
    listener.on_dag_run_running(run2, "running")
    with Emitter("ranking__manual__2", sink=url, spool_dir=tmp_path / "s2") as train_task:
        train_task.job_ended("success", ts=QUEUED.timestamp() + 60)
    listener.on_dag_run_success(run2, "success")
    ended = [e for e in events(listener, url, "ranking__manual__2") if isinstance(e, JobEnded)]
    assert [e.ts for e in ended] == [QUEUED.timestamp() + 60]


def test_disabled_records_nothing_and_registers_no_listener(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = EttSettings(store_url=url, disabled=True, spool_dir=tmp_path / "spool",
                           emit_timeout=1.0, work_dir=tmp_path)
    emitter = Emitter(sink=url, spool_dir=tmp_path / "spool")
    off = EttListener(emitter=lambda: emitter, settings=lambda: settings)
    off.on_dag_run_running(dag_run(), "running")
    off.on_task_instance_running(None, worker_ti())
    assert events(off, url) == []
    emitter.close()

    import airflow_ett.plugin as plugin

    monkeypatch.setenv("AIRFLOW__ETT__DISABLED", "True")
    assert plugin._listeners() == []
    monkeypatch.setenv("AIRFLOW__ETT__DISABLED", "False")
    assert [type(x).__name__ for x in plugin._listeners()] == ["EttListener"]


def test_hooks_are_registered_under_airflows_hook_names(listener: EttListener, url: str) -> None:
    from airflow.listeners.listener import ListenerManager
    from airflow.listeners.spec import dagrun
    from airflow.sdk._shared.listeners.spec import lifecycle, taskinstance

    manager = ListenerManager()
    for spec in (lifecycle, dagrun, taskinstance):
        manager.add_hookspecs(spec)
    manager.add_listener(listener)
    manager.hook.on_dag_run_running(dag_run=dag_run(), msg="running")
    manager.hook.on_task_instance_running(previous_state=None, task_instance=worker_ti())
    manager.hook.before_stopping(component=None)
    assert {type(e).__name__ for e in events(listener, url)} == {"JobSubmitted",
                                                                  "TaskStateChanged"}


def test_a_raising_hook_and_an_unreachable_store_never_reach_airflow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import airflow_ett.plugin.listeners as listeners

    dead = f"sqlite:///{tmp_path}/missing-dir/ett.db"  # a directory that does not exist
    spool = tmp_path / "spool"
    emitter = Emitter(sink=dead, spool_dir=spool, emit_timeout=1.0, linger=0.01)
    settings = EttSettings(store_url=dead, disabled=False, spool_dir=spool, emit_timeout=1.0,
                           work_dir=tmp_path)
    hooks = EttListener(emitter=lambda: emitter, settings=lambda: settings)

    hooks.on_dag_run_running(dag_run(), "running")
    hooks.on_task_instance_running(None, worker_ti())
    hooks.on_dag_run_success(dag_run(), "success")  # its store check fails in the background

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in a hook")

    monkeypatch.setattr(listeners, "_task_try", broken)
    with caplog.at_level(logging.WARNING, logger="airflow_ett.listeners"):
        hooks.on_task_instance_success("running", worker_ti("success"))  # must not raise
    assert "a bug in a hook" in caplog.text
    hooks.before_stopping(component=None)
    emitter.close()

    # What was recorded waits in the spool and reaches the store once it is back.
    good = f"sqlite:///{tmp_path}/ett.db"
    upgrade(good)
    result = replay_spool(good, spool)
    assert result.replayed == 2 and not result.errors
    with EttStore(good) as store:
        got = store.job_events("ranking__manual__1")
    assert sorted(type(e).__name__ for e in got) == ["JobSubmitted", "TaskStateChanged"]


def test_a_forked_child_makes_its_own_store_connection_and_thread(
        listener: EttListener, url: str) -> None:
    # The LocalExecutor forks its workers from the scheduler, listener and all.
    import os

    listener.on_dag_run_running(dag_run(), "running")
    listener.flush(10.0)
    listener.on_task_instance_failed(None, api_ti("failed"), "set by hand")  # reads the store
    listener.flush(10.0)
    assert listener._store is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        fresh = listener._store is None and listener._background._thread is None
        os.write(write, b"1" if fresh else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"


# --- secrets (issue 8, point 4) -------------------------------------------------------------


def _register(secret: str, *, sdk: bool, core: bool) -> None:
    """As Airflow does: the Task SDK's masker in a task process, core's in the scheduler
    and the API server (connections, variables, `mask_secret`)."""
    if sdk:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
    if core:
        from airflow._shared.secrets_masker import mask_secret as core_mask_secret

        core_mask_secret(secret)


def test_conf_and_errors_pass_airflows_secrets_masker(listener: EttListener, url: str) -> None:
    worker_secret, core_secret = "w0rker-Secret-42", "c0re-Secret-43"
    _register(worker_secret, sdk=True, core=False)
    _register(core_secret, sdk=False, core=True)
    conf = {"steps": 10, "db": f"postgresql://u:{core_secret}@h/db", "password": "plainpw1",
            "nested": {"api_token": "tok-value-1", "note": f"uses {worker_secret}"}}
    listener.on_dag_run_running(dag_run(conf=conf), "running")  # scheduler
    listener.on_task_instance_failed(  # worker
        "running", worker_ti("up_for_retry"), RuntimeError(f"login as {worker_secret} failed"))
    ti = SimpleNamespace(**{**vars(worker_ti("failed")), "try_number": 2})  # scheduler
    listener.on_task_instance_failed("running", ti, f"killed; conn had {core_secret}")
    listener.flush(10.0)
    listener.on_task_instance_failed(None, api_ti("failed"), f"set by hand {core_secret}")  # API
    got = events(listener, url)
    (submitted,) = [e for e in got if isinstance(e, JobSubmitted)]
    assert submitted.attrs["conf"] == {
        "steps": 10, "db": "postgresql://u:***@h/db", "password": "***",
        "nested": {"api_token": "***", "note": "uses ***"}}
    messages = sorted(e.message for e in got if isinstance(e, TaskStateChanged))
    assert messages == ["killed; conn had ***", "login as *** failed", "set by hand ***"]
    recorded = repr(got)
    for secret in (worker_secret, core_secret, "plainpw1", "tok-value-1"):
        assert secret not in recorded


def test_a_long_message_is_redacted_before_it_is_cut(listener: EttListener, url: str) -> None:
    secret = "cut-Secret-4711"
    _register(secret, sdk=True, core=True)
    text = "x" * 495 + secret  # the secret straddles the 500-character cut
    listener.on_task_instance_failed("running", worker_ti("failed"), text)
    (state,) = [e for e in events(listener, url) if isinstance(e, TaskStateChanged)]
    assert state.message == "x" * 495 + "***"


def test_redaction_that_fails_records_nothing_of_the_value(
        listener: EttListener, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow_ett.plugin.listeners as listeners

    def broken(value: Any) -> Any:
        raise RuntimeError("masker broke")

    monkeypatch.setattr(listeners, "_redactors", [broken])
    listener.on_dag_run_running(dag_run(conf={"k": "v"}), "running")
    listener.on_task_instance_failed("running", worker_ti("failed"), "has a secret")
    got = events(listener, url)
    (submitted,) = [e for e in got if isinstance(e, JobSubmitted)]
    assert submitted.attrs["conf"] == "<redaction-failed>"
    assert [e.message for e in got if isinstance(e, TaskStateChanged)] == ["<redaction-failed>"]


def _attempt_events(url: str, *attempts: str) -> None:
    """A trainer's attempts as it reports them: each started; all but the last ended."""
    from airflow_ett.ett.events import AttemptEnded, AttemptStarted

    with EttStore(url) as store:
        base = QUEUED.timestamp()
        batch: list[Any] = [JobSubmitted(id="s", job="ranking__manual__1", ts=base)]
        for i, attempt in enumerate(attempts):
            batch.append(AttemptStarted(id=f"a{i}", job="ranking__manual__1", ts=base + 10 + i,
                                        attempt=attempt))
            if i + 1 < len(attempts):
                batch.append(AttemptEnded(id=f"e{i}", job="ranking__manual__1",
                                          ts=base + 11 + i, attempt=attempt, status="failed",
                                          cause="application"))
        store.insert_events(batch)


@pytest.mark.parametrize("task", [worker_ti("up_for_retry"), api_ti("up_for_retry")],
                         ids=["task-attached", "no-task"])
def test_a_try_the_scheduler_fails_closes_the_attempt_its_lost_worker_ran_as_infra(
        listener: EttListener, url: str, task: Any) -> None:
    """A worker's process tree SIGKILLed: nobody is left to end the trainer's attempt; the
    scheduler's heartbeat check fails the try from outside (with the task attached, or,
    on the heartbeat path, without it): the open attempt ends there, cause infra."""
    from airflow_ett.ett.events import AttemptEnded

    _attempt_events(url, "1.1", "1.2")
    ti = SimpleNamespace(**{**vars(task), "try_number": 1})
    listener.on_task_instance_failed("running", ti, "Task did not emit heartbeat")
    got = [e for e in events(listener, url) if isinstance(e, AttemptEnded)]
    assert [(e.attempt, e.cause) for e in got] == [("1.1", "application"), ("1.2", "infra")]
    lost = got[1]
    assert lost.status == "failed" and lost.detected_ts == lost.ts
    assert "failed by the scheduler" in str(lost.message)
    assert "Task did not emit heartbeat" in str(lost.message)


def test_a_worker_side_failure_or_an_ended_attempt_is_not_closed_again(
        listener: EttListener, url: str) -> None:
    from airflow_ett.ett.events import AttemptEnded

    _attempt_events(url, "1.1", "1.2")
    # on the worker: the operator reports its own attempts' ends; nothing is inferred
    listener.on_task_instance_failed("running", worker_ti("up_for_retry"), "boom")
    assert [e.attempt for e in events(listener, url) if isinstance(e, AttemptEnded)] == ["1.1"]
    # the scheduler, for a job whose attempts all ended: nothing to close
    _attempt_events(url, "1.1", "1.2", "1.3")  # 1.2 ends now; 1.3 is open
    with EttStore(url) as store:
        store.insert_events([AttemptEnded(id="e-last", job="ranking__manual__1",
                                          ts=QUEUED.timestamp() + 20, attempt="1.3",
                                          status="success")])
    ti = SimpleNamespace(**{**vars(worker_ti("failed")), "try_number": 2})
    listener.on_task_instance_failed("running", ti, "Executor reported the task as failed")
    ends = [e for e in events(listener, url) if isinstance(e, AttemptEnded)]
    assert sorted((e.attempt, e.cause) for e in ends) == [
        ("1.1", "application"), ("1.2", "application"), ("1.3", None)]
