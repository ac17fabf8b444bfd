"""The cluster policies and the priority strategy (`airflow_ett.plugin.policy`,
`plugin.priority`) on real lifecycle DAGs, in-process and through Airflow's own DagBag
(which loads the policies from the `airflow.policy` entry point)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_ett.operators import training_job
from airflow_ett.plugin import policy
from airflow_ett.plugin.priority import EttTenantPriority
from airflow_ett.plugin.tts_watch import CALLBACK, DEADLINE_NAME
from airflow_ett.scheduling import tenants
from airflow_ett.scheduling.rules import SCALE, aged_weight, arrival_of_run

TENANTS = """
[scheduling]
aging_per_hour = 2.0

[tenants.ads]
priority = 10
quota_gpus = 4
borrow_limit_gpus = 2
max_tts_s = 1800

[tenants.batch]
priority = 1
quota_gpus = 1
"""


@pytest.fixture
def tenants_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS, encoding="utf-8")
    monkeypatch.setenv("AIRFLOW__ETT__TENANTS_FILE", str(path))
    tenants._CACHE.clear()
    return path


def job(**changes: object) -> object:
    kwargs: dict[str, object] = {"model": "dlrm_tiny", "steps": 5, "tenant": "ads",
                                 "nproc": 2}
    kwargs.update(changes)
    return training_job("ads_ctr", **kwargs)  # type: ignore[arg-type]


def apply(dag: object) -> None:
    policy.dag_policy(dag)
    for task in dag.tasks:  # type: ignore[attr-defined]
        policy.task_policy(task)


def test_lifecycle_tasks_get_their_tenants_settings(tenants_file: Path) -> None:
    dag = job()
    apply(dag)
    train, prewarm, publish = (dag.get_task(t) for t in  # type: ignore[attr-defined]
                               ("train", "prewarm_compile_cache", "publish_model"))
    assert (train.pool, train.pool_slots, train.queue, train.priority_weight) == (
        "ett_tenant_ads", 2, "gpu", 10)
    assert isinstance(train.weight_rule, EttTenantPriority)
    for task in (prewarm, publish):
        assert (task.queue, task.priority_weight) == ("cpu", 10)
        assert task.pool == "default_pool" and isinstance(task.weight_rule, EttTenantPriority)


def test_a_command_jobs_train_task_follows_its_tenant_too(tenants_file: Path) -> None:
    """Bring-your-own-trainer jobs are training jobs: pool, queue, priority, deadline."""
    dag = training_job("ads_own", command=["python", "train.py"], model="own", tenant="ads",
                       nproc=2)
    apply(dag)
    train = dag.get_task("train")  # type: ignore[attr-defined]
    assert (train.pool, train.pool_slots, train.queue, train.priority_weight) == (
        "ett_tenant_ads", 2, "gpu", 10)
    assert [d.name for d in dag.deadline] == [DEADLINE_NAME]  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="task 'train' trains without retries"):
        policy.dag_policy(training_job("ads_own", command=["x"], model="own", tenant="ads",
                                       retries=0))


@pytest.mark.parametrize(("changes", "message"), [
    ({"tenant": "adz"}, "tenant 'adz' is not in the tenants file (known: ads, batch)"),
    ({"tenant": "default"}, "(training_job() says 'default' when no tenant=... is given)"),
    ({"retries": 0}, "task 'train' trains without retries"),
    ({"queues": {"publish": "gpu"}}, "task 'publish_model' (publish) runs on the GPU queue"),
])
def test_a_dag_breaking_a_rule_is_rejected_for_its_owner(
        tenants_file: Path, changes: dict[str, object], message: str) -> None:
    from airflow.exceptions import AirflowClusterPolicyViolation

    with pytest.raises(AirflowClusterPolicyViolation) as exc:
        policy.dag_policy(job(**changes))
    assert "DAG 'ads_ctr' breaks the training fleet's rules: (1) " in str(exc.value)
    assert message in str(exc.value)


def test_a_tenants_time_to_start_bound_is_a_deadline_on_its_dags(tenants_file: Path) -> None:
    from airflow.sdk.definitions.callback import AsyncCallback
    from airflow.sdk.definitions.deadline import DagRunQueuedAtDeadline, DeadlineAlert

    async def own_callback(context: object = None) -> None:
        return None

    own = DeadlineAlert(reference=DagRunQueuedAtDeadline(), interval=dt.timedelta(hours=9),
                        callback=AsyncCallback(own_callback), name="owner's own")
    dag = job()
    dag.deadline = [own]  # type: ignore[attr-defined]
    apply(dag)
    apply(dag)  # parsed again: still one of ours
    mine = [d for d in dag.deadline if d.name == DEADLINE_NAME]  # type: ignore[attr-defined]
    assert [d.name for d in dag.deadline] == ["owner's own", DEADLINE_NAME]  # type: ignore[attr-defined]
    (alert,) = mine
    assert isinstance(alert.reference, DagRunQueuedAtDeadline)  # from queued: TTS's start
    assert alert.interval == dt.timedelta(seconds=1800)
    assert (alert.callback.path, alert.callback.kwargs) == (
        CALLBACK, {"tenant": "ads", "bound_s": 1800.0})
    batch = job(tenant="batch")
    apply(batch)
    assert not batch.deadline  # type: ignore[attr-defined]


def test_no_tenants_file_leaves_dags_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__ETT__TENANTS_FILE", raising=False)
    dag = job(tenant="nobody", retries=0, queues={"train": "a100"})
    apply(dag)
    assert dag.get_task("train").queue == "a100"  # type: ignore[attr-defined]


def test_a_broken_file_keeps_the_last_good_version(tenants_file: Path) -> None:
    apply(job())  # the good version is loaded
    tenants_file.write_text("[tenants.ads]\npriority = 'high'\n", encoding="utf-8")
    os.utime(tenants_file, (1, 1))  # a new signature, old enough to be trusted
    dag = job()
    apply(dag)  # no exception: the good version stays in force
    assert dag.get_task("train").pool == "ett_tenant_ads"  # type: ignore[attr-defined]
    state = tenants.current(tenants_file)
    assert state.stale and "tenant 'ads'" in (state.error or "")


def test_a_file_never_valid_turns_the_policies_off(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("not toml [", encoding="utf-8")
    monkeypatch.setenv("AIRFLOW__ETT__TENANTS_FILE", str(bad))
    tenants._CACHE.clear()
    dag = job(tenant="nobody")
    apply(dag)  # nothing rejected, nothing changed
    assert dag.get_task("train").queue == "gpu"  # type: ignore[attr-defined]


def test_other_dags_and_tasks_are_left_alone(tenants_file: Path) -> None:
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    with DAG("plain", schedule=None, tags=["ett:tenant=nobody"]) as dag:
        EmptyOperator(task_id="noop", queue="whatever")
    apply(dag)
    assert dag.get_task("noop").queue == "whatever"


class _Ti:
    def __init__(self, task: object, run_id: str) -> None:
        self.task, self.run_id = task, run_id


def test_the_strategy_ages_the_tenants_priority_by_the_runs_arrival(tenants_file: Path) -> None:
    dag = job()
    apply(dag)
    train = dag.get_task("train")  # type: ignore[attr-defined]
    run_id = "manual__2026-12-01T10:00:00+00:00"
    weight = EttTenantPriority().get_weight(_Ti(train, run_id))  # type: ignore[arg-type]
    assert weight == aged_weight(10, arrival_of_run(run_id, 0.0), 2.0)
    # five hours older at 2 points/hour: 10 points more, as much as priority 20
    older = EttTenantPriority().get_weight(
        _Ti(train, "manual__2026-12-01T05:00:00+00:00"))  # type: ignore[arg-type]
    assert older - weight == 10 * SCALE


@pytest.mark.integration
def test_airflow_loads_the_policies_from_the_entry_point(tmp_path: Path) -> None:
    """A real DagBag in a fresh interpreter: the bad DAG is an import error with the
    owner's message, the good one's train task is in its tenant's pool, and the DAG
    serializes and reads back with the strategy (the plugin registers it)."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (tmp_path / "tenants.toml").write_text(TENANTS, encoding="utf-8")
    for name, tenant in (("good", "ads"), ("bad", "nobody")):
        (dags / f"{name}.py").write_text(textwrap.dedent(f'''
            from airflow_ett.operators import training_job
            dag = training_job("{name}", model="dlrm_tiny", steps=5, tenant="{tenant}", nproc=2)
            '''), encoding="utf-8")
    code = textwrap.dedent(f'''
        import json
        from airflow.dag_processing.dagbag import DagBag
        from airflow.serialization.serialized_objects import DagSerialization
        bag = DagBag(dag_folder={str(dags)!r})
        train = bag.dags["good"].get_task("train")
        back = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["good"]))
        print(json.dumps({{
            "dags": sorted(bag.dags),
            "errors": {{k.rsplit("/", 1)[-1]: v for k, v in bag.import_errors.items()}},
            "train": [train.pool, train.pool_slots, train.queue, train.priority_weight],
            "rule": type(back.get_task("train").weight_rule).__name__,
            "deadline": back.deadline,
        }}))
        ''')
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "home"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__ETT__TENANTS_FILE": str(tmp_path / "tenants.toml")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["dags"] == ["good"]
    assert "tenant 'nobody' is not in the tenants file (known: ads, batch)" in got["errors"][
        "bad.py"]
    assert got["train"] == ["ett_tenant_ads", 2, "gpu", 10]
    assert got["rule"] == "EttTenantPriority"
    (deadline,) = got["deadline"]  # as the scheduler reads it from the serialized DAG
    assert deadline["name"] == "ett_time_to_start"
    assert deadline["reference"] == {"reference_type": "DagRunQueuedAtDeadline"}
    assert deadline["interval"]["__data__"] == 1800.0
    assert deadline["callback"]["__data__"] == {"path": CALLBACK, "kwargs": {
        "tenant": "ads", "bound_s": 1800.0}}


def test_the_policies_open_no_database_session(tenants_file: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """In `task_instance_mutation_hook` and the DAG processor they would run inside
    Airflow's own transaction: any session they opened is a bug. Every way to one raises
    here; the policies still apply, and the strategy still weighs."""
    import airflow.settings
    import airflow.utils.session

    class SessionOpened(BaseException):  # not an Exception: the policies' guards let it out
        pass

    def no_session(*args: object, **kwargs: object) -> object:
        raise SessionOpened("a cluster policy opened a database session")

    monkeypatch.setattr(airflow.settings, "Session", no_session)
    monkeypatch.setattr(airflow.utils.session, "create_session", no_session)
    dag = job()
    apply(dag)
    train = dag.get_task("train")  # type: ignore[attr-defined]
    assert train.pool == "ett_tenant_ads"
    assert EttTenantPriority().get_weight(
        _Ti(train, "manual__2026-12-01T10:00:00+00:00")) != 0  # type: ignore[arg-type]
