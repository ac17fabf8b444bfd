"""The cluster policies' decisions (`airflow_ett.scheduling.rules`), without Airflow."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.scheduling.model import TenantPolicy
from airflow_ett.scheduling.rules import (
    EPOCH,
    INT32_MAX,
    SCALE,
    LifecycleTask,
    PolicyViolation,
    aged_weight,
    arrival_of_run,
    check_dag,
    task_settings,
)

ADS = TenantPolicy(name="ads", priority=10, quota_gpus=8, borrow_limit_gpus=4)
BATCH = TenantPolicy(name="batch", priority=1, quota_gpus=2)
TENANTS = {"ads": ADS, "batch": BATCH}
GOOD = [LifecycleTask("prewarm_compile_cache", "prewarm", "cpu", 0),
        LifecycleTask("train", "train", "gpu", 2),
        LifecycleTask("publish_model", "publish", "cpu", 1)]


def test_a_good_dag_passes() -> None:
    check_dag("ads_ctr", "ads", GOOD, TENANTS, gpu_queue="gpu")


@pytest.mark.parametrize(("tenant", "tasks", "message"), [
    (None, GOOD, "it names no tenant: pass tenant=... to training_job() (one of ads, batch)"),
    ("", GOOD, "it names no tenant"),
    ("adz", GOOD, "tenant 'adz' is not in the tenants file (known: ads, batch)"),
    ("ads", [LifecycleTask("train", "train", "gpu", 0)],
     "task 'train' trains without retries: a preemption or an infrastructure failure would "
     "end the job; set retries >= 1"),
    ("ads", [LifecycleTask("publish_model", "publish", "gpu", 0)],
     "task 'publish_model' (publish) runs on the GPU queue 'gpu': it needs no GPU"),
    ("ads", [LifecycleTask("prewarm_compile_cache", "prewarm", "gpu", 0)],
     "task 'prewarm_compile_cache' (prewarm) runs on the GPU queue"),
])
def test_each_rule_is_named_to_the_model_owner(tenant: str | None, tasks: list[LifecycleTask],
                                               message: str) -> None:
    with pytest.raises(PolicyViolation, match="DAG 'ads_ctr' breaks the training fleet's "
                                              "rules: ") as exc:
        check_dag("ads_ctr", tenant, tasks, TENANTS, gpu_queue="gpu")
    assert message in str(exc.value)


def test_every_broken_rule_is_named_at_once() -> None:
    tasks = [LifecycleTask("train", "train", "gpu", 0),
             LifecycleTask("publish_model", "publish", "gpu", 0)]
    with pytest.raises(PolicyViolation) as exc:
        check_dag("d", "nobody", tasks, TENANTS, gpu_queue="gpu")
    assert "(1) tenant 'nobody'" in str(exc.value) and "(3) task 'publish_model'" in str(
        exc.value) and "(4)" not in str(exc.value)
    with pytest.raises(PolicyViolation, match=r"known: \(none\)"):
        check_dag("d", "x", GOOD, {}, gpu_queue="gpu")


def test_task_settings_follow_the_tenant() -> None:
    train = task_settings("train", ADS, gpus=4, gpu_queue="gpu", cpu_queue="cpu")
    assert (train.queue, train.pool, train.pool_slots, train.priority_weight) == (
        "gpu", "ett_tenant_ads", 4, 10)
    publish = task_settings("publish", BATCH, gpus=4, gpu_queue="gpu", cpu_queue="cpu")
    assert (publish.queue, publish.pool, publish.pool_slots, publish.priority_weight) == (
        "cpu", None, None, 1)
    with pytest.raises(ValueError, match="role: 'evaluate' is not one of"):
        task_settings("evaluate", ADS, gpus=1, gpu_queue="gpu", cpu_queue="cpu")
    with pytest.raises(ValueError, match="gpus: 0 is not a positive GPU count"):
        task_settings("train", ADS, gpus=0, gpu_queue="gpu", cpu_queue="cpu")


def test_aging_by_hand() -> None:
    assert aged_weight(10, EPOCH, 1.0) == 10 * SCALE
    assert aged_weight(10, EPOCH + 3600, 1.0) == 10 * SCALE - SCALE  # an hour later: -1
    # priority 10 arriving 5 h after priority 5 ties with it: 5 points at 1 point/hour
    assert aged_weight(10, EPOCH + 5 * 3600, 1.0) == aged_weight(5, EPOCH, 1.0)
    assert aged_weight(3, EPOCH + 10**9, 0.0) == 3 * SCALE  # no aging: the priority alone
    assert aged_weight(1, EPOCH - 10**15, 1.0) == INT32_MAX  # clamped to Airflow's int32


@given(p_old=st.integers(0, 1000), p_new=st.integers(0, 1000),
       t_old=st.floats(EPOCH, EPOCH + 10 * 365 * 86400), gap_h=st.floats(0, 2000),
       aging=st.floats(0.01, 10), at_h=st.floats(0, 5000))
def test_the_static_weight_orders_like_aging_at_every_moment(
        p_old: int, p_new: int, t_old: float, gap_h: float, aging: float, at_h: float) -> None:
    """Comparing the static weights gives the order of `priority + aging x hours waited`
    at any later moment (ties aside, at the weights' rounding)."""
    t_new = t_old + gap_h * 3600
    now = t_new + at_h * 3600
    aged_old = p_old + aging * (now - t_old) / 3600
    aged_new = p_new + aging * (now - t_new) / 3600
    w_old, w_new = aged_weight(p_old, t_old, aging), aged_weight(p_new, t_new, aging)
    if abs(aged_old - aged_new) * SCALE > 1:
        assert (w_old > w_new) == (aged_old > aged_new)


@pytest.mark.parametrize(("run_id", "expected"), [
    ("manual__2026-12-01T10:00:00+00:00", dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)),
    ("scheduled__2026-11-30T00:00:00+00:00", dt.datetime(2026, 11, 30, tzinfo=dt.UTC)),
    ("backfill__2026-11-02T00:00:00.123000+00:00",
     dt.datetime(2026, 11, 2, 0, 0, 0, 123000, tzinfo=dt.UTC)),
    ("asset_triggered__2026-12-01T09:30:00+01:00",
     dt.datetime(2026, 12, 1, 8, 30, tzinfo=dt.UTC)),
    ("manual__2026-12-01T10:00:00Z", dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)),
    ("manual__2026-12-01T10:00:00", dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)),
])
def test_a_runs_arrival_comes_from_its_id(run_id: str, expected: dt.datetime) -> None:
    assert arrival_of_run(run_id, fallback=0.0) == expected.timestamp()


@pytest.mark.parametrize("run_id", ["my-own-run", "", None, "manual__2026-13-45T99:00:00",
                                    "manual__yesterday"])
def test_a_run_id_without_a_time_arrives_now(run_id: str | None) -> None:
    assert arrival_of_run(run_id, fallback=123.0) == 123.0
