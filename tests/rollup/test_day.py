"""The day rollup on hand-computed jobs (tests/rollup/scenarios.py): every expected
number was worked out on paper."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.rollup import day_window, job_day, load_components, rollup_day
from airflow_ett.rollup.figures import aggregate
from tests.rollup.scenarios import LO, PREVIOUS, WINDOW, D, job_a, job_b


def days_of_d():
    a, b = attribute_job(job_a()), attribute_job(job_b())
    return [job_day(a, WINDOW, gpus=a.world_size), job_day(b, WINDOW, gpus=b.world_size)]


def test_a_job_across_midnight_is_split_by_time() -> None:
    a = attribute_job(job_a())
    before, during = job_day(a, PREVIOUS, gpus=2), job_day(a, WINDOW, gpus=2)
    assert before is not None and during is not None
    assert before.e2e_us == 3600 * 10**6 and during.e2e_us == 3000 * 10**6
    assert before.components_us["scheduling"] == 600 * 10**6
    assert before.effective_us == 3000 * 10**6 and during.effective_us == 3000 * 10**6
    # TTS (the first effective step began before midnight) and the attempt: the day before
    assert before.tts_us == 600 * 10**6 and during.tts_us is None
    assert (before.attempts, during.attempts) == (1, 0)
    assert job_day(a, day_window(D + dt.timedelta(days=1), "UTC"), gpus=2) is None


def test_the_day_figures_by_hand() -> None:
    fleet = aggregate(d for d in days_of_d() if d is not None)
    assert fleet.jobs == 2 and fleet.provisional_jobs == 0
    assert fleet.e2e_s == 5500.0 and fleet.effective_s == 4500.0
    # by GPU time: A's 3000 s on 2 GPUs and B's 2500 s on 1; effective 2 x 3000 + 1500
    # (seconds over seconds would say 100 x 4500 / 5500 = 81.8: A's second GPU unseen)
    assert fleet.ett_pct == pytest.approx(100 * 7500 / 8500)
    assert fleet.components_s == {"scheduling": 200.0, "initialization": 0.0,
                                  "compilation": 200.0, "effective_training": 4500.0,
                                  "wasted_training": 600.0, "shutdown": 0.0}
    assert fleet.shares_pct["wasted_training"] == pytest.approx(100 * 600 / 8500)
    assert fleet.shares_pct["effective_training"] == fleet.ett_pct
    assert fleet.gpu_hours == pytest.approx((3000 * 2 + 2500) / 3600)
    assert fleet.gpu_hours_lost == pytest.approx(1000 / 3600)
    assert fleet.gpu_hours_lost_by_component["compilation"] == pytest.approx(200 / 3600)
    assert fleet.nof == {"preemption": 0, "infra": 1, "application": 0, "unknown": 0,
                         "total": 1}
    assert fleet.tts_p50_s == 300.0 and fleet.tts_p90_s == 300.0  # B only: A's was before D
    assert fleet.ttr_p50_s == 700.0  # last progress 8500 -> next effective step 9200
    assert fleet.attempts == 2 and fleet.attempts_per_job == 2.0
    assert fleet.failures_per_attempt == 0.5
    assert fleet.failures_per_attempt_without_preemption == 0.5


def test_the_rollup_groups_slos_what_if_and_worst_runs() -> None:
    rollup = rollup_day(WINDOW, [d for d in days_of_d() if d is not None], load_components(),
                        computed_at=LO + 86400 + 60, cut_pct=50, start_s=60)
    assert rollup.day == "2026-11-28" and rollup.tz == "UTC"
    assert set(rollup.tenants) == {"t1", "t2"} and set(rollup.models) == {"m1"}
    assert rollup.tenants["t1"].ett_pct == 100.0
    assert rollup.tenants["t2"].ett_pct == pytest.approx(100 * 1500 / 2500)
    slo = {row.component: row for row in rollup.slo}
    # bundled SLOs, shares of the 8500 GPU-s: wasted < 3% (7.1%: breach), scheduling < 3%
    # (2.4%: ok; 3.6% of the seconds was a false breach), compilation < 1.5% (2.4%:
    # breach), initialization < 1% (0%: ok), ETT >= 90% (88.2%: breach)
    assert slo["wasted_training"].status == "breach"
    assert slo["scheduling"].status == "ok"
    assert slo["scheduling"].share_pct == pytest.approx(100 * 200 / 8500)
    assert slo["compilation"].status == "breach"
    assert slo["initialization"].status == "ok" and slo["initialization"].target == "<1%"
    assert slo["effective_training"].status == "breach"
    assert slo["shutdown"].status == "ok"
    teams = {t.team: t for t in rollup.teams}
    assert teams["checkpoint-team"].gpu_hours_lost == pytest.approx(600 / 3600)
    assert teams["checkpoint-team"].breaches == ["wasted_training"]
    assert rollup.teams[0].team == "checkpoint-team"  # the most GPU-hours lost comes first
    gains = {(w.kind, w.component): w for w in rollup.what_if}
    # half of B's 600 s of waste on 1 GPU: 300 GPU-s of the 8500
    assert gains["cut", "wasted_training"].ett_pct_after == pytest.approx(100 * 7500 / 8200)
    # B starts twice: 2 x 60 s of its 200 s of compilation
    assert gains["faster_start", "compilation"].e2e_s_saved == 120.0
    assert gains["faster_start", "compilation"].ett_pct_after == pytest.approx(
        100 * 7500 / 8380)
    assert gains["cut", "initialization"].gain_pts == 0.0
    assert [w.gain_pts for w in rollup.what_if] == sorted(
        (w.gain_pts for w in rollup.what_if), reverse=True)
    assert [r.job for r in rollup.top_runs] == ["b"]  # A lost nothing in D
    assert rollup.top_runs[0].worst_component == "wasted_training"
    assert rollup.top_runs[0].gpu_hours_lost == pytest.approx(1000 / 3600)


def test_a_running_job_is_provisional_up_to_now() -> None:
    running = job_b()[:5]  # still in its first attempt's steps
    attribution = attribute_job(running, now=LO + 8000)
    day = job_day(attribution, WINDOW)
    assert day is not None and day.provisional
    assert day.e2e_us == 800 * 10**6
    rollup = rollup_day(WINDOW, [day], load_components(), computed_at=LO + 8000)
    assert rollup.provisional and rollup.fleet.provisional_jobs == 1


def test_an_empty_day_has_no_ett_and_no_slo_verdicts() -> None:
    rollup = rollup_day(WINDOW, [], load_components(), computed_at=LO)
    assert rollup.fleet.jobs == 0 and rollup.fleet.ett_pct is None  # none, never 0.0
    assert set(rollup.fleet.shares_pct.values()) == {None}
    assert rollup.fleet.tts_p50_s is None and rollup.fleet.failures_per_attempt == 0.0
    assert {row.status for row in rollup.slo} == {"none"}  # never a breach
    assert {row.share_pct for row in rollup.slo} == {None}
    assert {t.share_pct for t in rollup.teams} == {None} and rollup.what_if == []
    assert rollup.top_runs == [] and rollup.tenants == {}


def test_a_gpu_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="gpus: 0"):
        job_day(attribute_job(job_b()), WINDOW, gpus=0)
