"""Hand-computed timelines: every expected number below was worked out on paper from the
scenario, not read back from the code."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from airflow_ett.ett.attribution import AttributionError, attribute, attribute_job
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobEnded,
    JobSubmitted,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.ett.timeline import US_PER_S

S = 1_780_000_000.0  # the simulator's default submission time
BASE = JobSpec()  # queue 10 s; startup 2+4+3+8 s; 100 steps x 0.5 s; ckpt every 25 (1 s)


def seconds(result_dict: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in result_dict.items()}


def components(spec: JobSpec, now: float | None = None) -> dict[str, float]:
    return seconds(attribute_job(simulate(spec), now=now).to_dict()["components"])


class Maker:
    """Builds events for hand-written timelines with times relative to t=0."""

    def __init__(self, job: str = "j") -> None:
        self.job = job
        self.n = 0

    def __call__(self, cls: type, **fields: object) -> Event:
        self.n += 1
        return cls(id=f"{self.job}-{self.n}", job=self.job, **fields)  # type: ignore[no-any-return]


def test_clean_run() -> None:
    r = attribute_job(simulate(BASE))
    d = r.to_dict()
    assert d["e2e_s"] == 83.0  # 10 queue + 17 startup + 50 steps + 3 ckpt + 2 final + 1 down
    assert seconds(d["components"]) == {
        "scheduling": 10.0,
        "initialization": 9.0,
        "compilation": 8.0,
        "effective_training": 50.0,
        "wasted_training": 3.0,
        "shutdown": 3.0,
    }
    assert d["ett_pct"] == pytest.approx(100 * 50 / 83)
    assert d["tts_s"] == 27.0
    assert d["ttr_s"] == []
    assert d["nof"]["total"] == 0
    assert d["in_loop_waste_s"] == 3.0
    assert d["shutdown_s"] == 3.0
    assert d["csbt_s"] == 3.0
    assert d["checkpoints"]["saves"] == 3 and d["checkpoints"]["final_saves"] == 1
    assert not d["provisional"]
    assert d["warnings"] == []


def test_one_failure_with_replay() -> None:
    # Fails after step 40; last checkpoint at 25 -> steps 25..40 (7.5 s) are replayed.
    spec = replace(BASE, failures=(InjectedFailure(at_step=40),))
    d = attribute_job(simulate(spec)).to_dict()
    assert d["e2e_s"] == 116.5
    assert seconds(d["components"]) == {
        "scheduling": 15.0,  # queue 10 + rescheduling 5
        "initialization": 20.0,  # 9 per startup, twice, + restore 2
        "compilation": 16.0,
        "effective_training": 50.0,
        "wasted_training": 11.5,  # ckpt blocking 3 + detection 1 + replay 7.5
        "shutdown": 4.0,  # failed-attempt shutdown 1 + final ckpt 2 + teardown 1
    }
    assert d["phases"]["replay"] == 7.5
    assert d["tts_s"] == 27.0
    assert d["ttr_s"] == [33.5]  # last progress at +48 -> next new data at +81.5
    assert d["ttr_from_detection_s"] == [32.5]
    (failure,) = d["failures"]
    assert seconds(failure["stages"]) == {
        "detection": 1.0,
        "shutdown": 1.0,
        "rescheduling": 5.0,
        "startup": 17.0,
        "restore": 2.0,
        "replay": 7.5,
    }
    assert d["nof"] == {"preemption": 0, "infra": 0, "application": 1, "unknown": 0,
                        "total": 1}
    assert d["in_loop_waste_s"] == 3.0
    assert d["shutdown_s"] == 3.0
    # Level 1 and Level 2 describe the same 116.5 s.
    assert d["tts_s"] + sum(d["ttr_s"]) + d["effective_s"] + d["in_loop_waste_s"] \
        + d["shutdown_s"] == pytest.approx(d["e2e_s"], abs=1e-9)
    assert [a["status"] for a in d["attempts"]] == ["failed", "success"]
    assert [a["effective_s"] for a in d["attempts"]] == [20.0, 30.0]


def test_preemption_counts_apart() -> None:
    spec = replace(BASE, failures=(InjectedFailure(at_step=40, cause="preemption"),))
    r = attribute_job(simulate(spec))
    assert r.nof["preemption"] == 1 and r.nof["total"] == 1
    rates = r.failure_rates()
    assert rates["attempts"] == 2
    assert rates["failures_per_attempt"] == 0.5
    assert rates["attempts_without_preemption"] == 1
    assert rates["failures_per_attempt_without_preemption"] == 0.0


def test_parallel_init_counts_wall_time_once() -> None:
    # Startup phases all start together: the 8 s compile covers the 2/4/3 s ones, and
    # compilation outranks initialization where they overlap.
    spec = replace(BASE, parallel_init=True)
    d = attribute_job(simulate(spec)).to_dict()
    assert d["e2e_s"] == 74.0  # 83 - 17 + 8
    assert d["components"]["compilation"] == 8.0
    assert d["components"]["initialization"] == 0.0
    assert d["tts_s"] == 18.0
    assert seconds(d["phases_raw"]) == {
        "checkpoint_save_blocking": 3.0,
        "compile": 8.0,
        "data_pipeline_init": 4.0,
        "final_checkpoint": 2.0,
        "model_creation": 3.0,
        "teardown": 1.0,
        "trainer_init": 2.0,
    }


def test_overlap_longer_than_compile_keeps_the_rest_in_initialization() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        m(PhaseStarted, ts=0.0, attempt="a", phase="data_pipeline_init"),
        m(PhaseStarted, ts=0.0, attempt="a", phase="compile"),
        m(PhaseStarted, ts=2.0, attempt="a", phase="model_creation"),
        m(PhaseEnded, ts=5.0, attempt="a", phase="model_creation"),
        m(PhaseEnded, ts=6.0, attempt="a", phase="compile"),
        m(PhaseEnded, ts=10.0, attempt="a", phase="data_pipeline_init"),
        m(Progress, ts=20.0, start_ts=10.0, attempt="a", step_start=0, step_end=5,
          cursor_start=0, cursor_end=50),
        m(AttemptEnded, ts=20.0, attempt="a", status="success"),
        m(JobEnded, ts=20.0, status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["phases"] == {"compile": 6.0, "data_pipeline_init": 4.0, "effective_steps": 10.0}
    assert d["phases_raw"]["model_creation"] == 3.0
    assert d["tts_s"] == 10.0
    assert d["ett_pct"] == 50.0


def test_hang_before_detection_is_wasted_and_excluded_from_ttr_after_detection() -> None:
    hang = InjectedFailure(at_step=40, cause="infra", detection_s=120.0)
    d = attribute_job(simulate(replace(BASE, failures=(hang,)))).to_dict()
    assert d["phases"]["detection"] == 120.0
    assert d["ttr_s"] == [33.5 + 119.0]
    assert d["ttr_from_detection_s"] == [32.5]
    assert d["components"]["wasted_training"] == 11.5 + 119.0
    assert d["failures"][0]["detection_s"] == 120.0


def test_job_still_running_is_provisional_up_to_now() -> None:
    spec = replace(BASE, running_until_step=60)
    # Progress to step 60 ends at +59 (27 startup + 30 steps + 2 ckpt); now is +70.
    r = attribute_job(simulate(spec), now=S + 70)
    d = r.to_dict()
    assert d["provisional"] is True
    assert d["e2e_s"] == 70.0
    assert seconds(d["components"]) == {
        "scheduling": 10.0,
        "initialization": 9.0,
        "compilation": 8.0,
        "effective_training": 30.0,
        "wasted_training": 13.0,  # 2 ckpt + 11 since the last report, still in the loop
        "shutdown": 0.0,
    }
    assert d["shutdown_s"] == 0.0
    assert d["in_loop_waste_s"] == 13.0
    assert d["attempts"][0]["status"] == "running"
    later = attribute_job(simulate(spec), now=S + 80).to_dict()
    assert later["e2e_s"] == 80.0


def test_running_job_waiting_for_its_retry_is_in_recovery() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(Progress, ts=10.0, start_ts=0.0, attempt="1", step_start=0, step_end=1,
          cursor_start=0, cursor_end=10),
        m(AttemptEnded, ts=12.0, attempt="1", status="failed", cause="infra"),
    ]
    d = attribute_job(events, now=30.0).to_dict()
    assert d["provisional"]
    assert d["ttr_s"] == [20.0]
    assert d["phases"] == {"effective_steps": 10.0, "detection": 2.0, "rescheduling": 18.0}


def test_failure_before_first_effective_step_lengthens_tts() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=1.0, attempt="1"),
        m(PhaseStarted, ts=1.0, attempt="1", phase="model_creation"),
        m(AttemptEnded, ts=4.0, attempt="1", status="failed", cause="application",
          detected_ts=3.0),
        m(AttemptStarted, ts=6.0, attempt="2"),
        m(Progress, ts=16.0, start_ts=8.0, attempt="2", step_start=0, step_end=8,
          cursor_start=0, cursor_end=80),
        m(AttemptEnded, ts=17.0, attempt="2", status="success"),
        m(JobEnded, ts=17.0, status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["tts_s"] == 8.0
    assert d["ttr_s"] == []
    assert d["nof"]["total"] == 1
    assert d["failures"][0]["during_tts"] is True
    assert d["failures"][0]["ttr_s"] is None
    # The open model_creation phase runs to its attempt's end and outranks the implied
    # failed-attempt shutdown.
    assert d["phases"]["model_creation"] == 3.0
    assert d["phases"]["startup_other"] == 2.0
    assert d["shutdown_s"] == 1.0


def test_missing_attempt_end_is_inferred_from_the_next_attempt() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(Progress, ts=5.0, start_ts=0.0, attempt="1", step_start=0, step_end=5,
          cursor_start=0, cursor_end=5),
        # attempt 1 was SIGKILLed: nobody reported its end
        m(AttemptStarted, ts=9.0, attempt="2"),
        m(Progress, ts=14.0, start_ts=9.0, attempt="2", step_start=5, step_end=10,
          cursor_start=5, cursor_end=10),
        m(JobEnded, ts=14.0, status="success"),
    ]
    r = attribute_job(events)
    assert r.nof == {"preemption": 0, "infra": 0, "application": 0, "unknown": 1, "total": 1}
    assert r.attempts[0].inferred and r.attempts[0].end == 9.0
    assert r.attempts[1].status == "success"
    assert r.phases_us["detection"] == 4 * US_PER_S
    assert any("never reported its end" in w for w in r.warnings)


def test_straddling_span_is_split_at_the_high_water_mark() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(Progress, ts=10.0, start_ts=0.0, attempt="1", step_start=0, step_end=10,
          cursor_start=0, cursor_end=100),
        m(AttemptEnded, ts=10.0, attempt="1", status="failed", cause="infra"),
        m(AttemptStarted, ts=10.0, attempt="2"),
        # resumed from cursor 60: 40 of these 100 cursor units are replay
        m(Progress, ts=20.0, start_ts=10.0, attempt="2", step_start=6, step_end=16,
          cursor_start=60, cursor_end=160),
        m(AttemptEnded, ts=20.0, attempt="2", status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["phases"] == {"effective_steps": 16.0, "replay": 4.0}
    assert d["ttr_s"] == [4.0]
    assert d["provisional"] is False  # the last attempt succeeded: the job is over


def test_several_jobs_and_errors() -> None:
    a = simulate(replace(BASE, job="a"))
    b = simulate(replace(BASE, job="b", failures=(InjectedFailure(at_step=10),)))
    results = attribute(a + b)
    assert list(results) == ["a", "b"]
    assert results["b"].nof["total"] == 1
    with pytest.raises(AttributionError, match="2 jobs"):
        attribute_job(a + b)
    with pytest.raises(AttributionError, match="no events"):
        attribute_job([])


def test_publish_after_release_is_reported_apart() -> None:
    from airflow_ett.ett.events import ModelPublished

    events = simulate(BASE)
    published = ModelPublished(id="pub", job=BASE.job, ts=S + 83 + 12.5, uri="file:///m")
    d = attribute_job([*events, published]).to_dict()
    assert d["e2e_s"] == 83.0
    assert d["model_available_after_release_s"] == 12.5


def test_foreign_phase_declared_under_two_components_is_kept_apart() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(PhaseStarted, ts=0.0, attempt="1", phase="warmup", component="initialization"),
        m(PhaseEnded, ts=4.0, attempt="1", phase="warmup", component="initialization"),
        m(PhaseStarted, ts=4.0, attempt="1", phase="warmup", span="b",
          component="compilation"),
        m(PhaseEnded, ts=6.0, attempt="1", phase="warmup", span="b"),
        m(AttemptEnded, ts=6.0, attempt="1", status="success"),
    ]
    for ordering in (events, list(reversed(events))):
        d = attribute_job(ordering).to_dict()
        assert d["phases"] == {"warmup@initialization": 4.0, "warmup@compilation": 2.0}
        assert d["components"]["initialization"] == 4.0
        assert d["components"]["compilation"] == 2.0
        assert any("several components" in w for w in d["warnings"])


# -- pins for the refactor of the attribution into stages (issue 9) ---------------------
# Each test below kills a hand-made mutation that the tests above let live, or gives a
# second, independent check of a rule only one property test held.


def test_wasted_training_outranks_compilation_both_ways() -> None:
    # One 60 s step span (cursor 0 -> 600) with three overlaps inside it:
    #   compile 10-20 with a data_wait 12-14 nested inside (the inner wait wins: waste ranks
    #   above compilation whatever is innermost);
    #   stall 30-40 with a compile 32-34 nested inside (the stall keeps all ten seconds);
    #   a blocking checkpoint save 50-54 overlapped by a compile 52-56 (the save keeps 50-54).
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        m(Progress, ts=60.0, start_ts=0.0, attempt="a", step_start=0, step_end=60,
          cursor_start=0, cursor_end=600),
        m(PhaseStarted, ts=10.0, attempt="a", phase="compile"),
        m(PhaseStarted, ts=12.0, attempt="a", phase="data_wait"),
        m(PhaseEnded, ts=14.0, attempt="a", phase="data_wait"),
        m(PhaseEnded, ts=20.0, attempt="a", phase="compile"),
        m(PhaseStarted, ts=30.0, attempt="a", phase="stall"),
        m(PhaseStarted, ts=32.0, attempt="a", phase="compile", span="b"),
        m(PhaseEnded, ts=34.0, attempt="a", phase="compile", span="b"),
        m(PhaseEnded, ts=40.0, attempt="a", phase="stall"),
        m(CheckpointSaved, ts=55.0, start_ts=50.0, attempt="a", step=50, cursor=500,
          blocking_s=4.0, total_s=5.0),
        m(PhaseStarted, ts=52.0, attempt="a", phase="compile", span="c"),
        m(PhaseEnded, ts=56.0, attempt="a", phase="compile", span="c"),
        m(AttemptEnded, ts=60.0, attempt="a", status="success"),
        m(JobEnded, ts=60.0, status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert seconds(d["phases"]) == {
        "effective_steps": 34.0,  # 60 - 10 - 10 - 6
        "compile": 10.0,  # 10-12, 14-20, 54-56
        "data_wait": 2.0,
        "stall": 10.0,
        "checkpoint_save_blocking": 4.0,
    }
    assert d["components"]["compilation"] == 10.0
    assert d["components"]["wasted_training"] == 16.0
    assert seconds(d["phases_raw"]) == {
        "compile": 16.0, "data_wait": 2.0, "stall": 10.0, "checkpoint_save_blocking": 4.0,
    }
    assert d["in_loop_waste_s"] == 26.0  # everything after the first step that is not new data
    assert d["csbt_s"] == 4.0


def _four_causes() -> list[Event]:
    """Five attempts: preempted, infra, application, killed unseen (unknown), success."""
    m = Maker()
    events: list[Event] = [m(JobSubmitted, ts=0.0)]
    causes = ["preemption", "infra", "application"]
    for i in range(5):
        t = 10.0 * i
        events += [
            m(AttemptStarted, ts=t, attempt=str(i)),
            m(Progress, ts=t + 5, start_ts=t, attempt=str(i), step_start=i, step_end=i + 1,
              cursor_start=i, cursor_end=i + 1),
        ]
        if i < len(causes):
            events.append(m(AttemptEnded, ts=t + 6, attempt=str(i), status="failed",
                            cause=causes[i]))
        elif i == 4:
            events.append(m(AttemptEnded, ts=t + 6, attempt=str(i), status="success"))
        # attempt 3 never reports its end: failed (unknown) when attempt 4 starts
    events.append(m(JobEnded, ts=46.0, status="success"))
    return events


def test_rates_without_preemption_subtract_only_preemptions() -> None:
    r = attribute_job(_four_causes())
    assert r.nof == {"preemption": 1, "infra": 1, "application": 1, "unknown": 1, "total": 4}
    assert r.failure_rates() == {
        "attempts": 5.0,
        "attempts_without_preemption": 4.0,
        "failures_per_attempt": 4 / 5,
        "failures_per_attempt_without_preemption": 3 / 4,
    }
    assert r.to_dict()["rates"] == r.failure_rates()


def test_rates_with_an_infra_failure_alone_are_unchanged_without_preemption() -> None:
    r = attribute_job(simulate(replace(BASE, failures=(InjectedFailure(at_step=40,
                                                                       cause="infra"),))))
    assert r.nof["infra"] == 1 and r.nof["preemption"] == 0
    assert r.failure_rates() == {
        "attempts": 2.0,
        "attempts_without_preemption": 2.0,
        "failures_per_attempt": 0.5,
        "failures_per_attempt_without_preemption": 0.5,
    }


def _one_checkpoint_job(*, final: bool, blocking_s: float = 3.0) -> list[Event]:
    # 10 s of steps, a save from +8 (3 s blocking, 5 s in all, 1000 bytes), teardown
    # 11-12, the attempt ends at 12, the job at 13.
    m = Maker()
    return [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        m(Progress, ts=10.0, start_ts=0.0, attempt="a", step_start=0, step_end=10,
          cursor_start=0, cursor_end=100),
        m(CheckpointSaved, ts=13.0, start_ts=8.0, attempt="a", step=10, cursor=100,
          blocking_s=blocking_s, total_s=5.0, bytes=1000, final=final),
        m(PhaseStarted, ts=11.0, attempt="a", phase="teardown"),
        m(PhaseEnded, ts=12.0, attempt="a", phase="teardown"),
        m(AttemptEnded, ts=12.0, attempt="a", status="success"),
        m(JobEnded, ts=13.0, status="success"),
    ]


def test_a_final_checkpoint_is_shutdown_and_never_erases_a_step() -> None:
    d = attribute_job(_one_checkpoint_job(final=True)).to_dict()
    # final_checkpoint is a shutdown phase: below progress, so 8-10 stays effective.
    assert seconds(d["phases"]) == {
        "effective_steps": 10.0, "final_checkpoint": 1.0, "teardown": 1.0, "gpu_release": 1.0,
    }
    assert d["phases_raw"]["final_checkpoint"] == 3.0
    assert d["components"]["shutdown"] == 3.0 and d["components"]["wasted_training"] == 0.0
    assert d["shutdown_s"] == 3.0 and d["in_loop_waste_s"] == 0.0
    assert d["csbt_s"] == 0.0  # CSBT counts the regular saves only
    assert d["checkpoints"] == {"saves": 0, "final_saves": 1, "blocking_s": 0.0,
                                "total_s": 5.0, "bytes": 1000}


def test_a_regular_checkpoint_is_waste_and_outranks_a_step() -> None:
    d = attribute_job(_one_checkpoint_job(final=False)).to_dict()
    assert seconds(d["phases"]) == {
        "effective_steps": 8.0, "checkpoint_save_blocking": 3.0, "teardown": 1.0,
        "gpu_release": 1.0,
    }
    assert d["components"]["wasted_training"] == 3.0 and d["components"]["shutdown"] == 2.0
    assert d["shutdown_s"] == 5.0  # the last effective step ends at +8
    assert d["csbt_s"] == 3.0
    assert d["checkpoints"] == {"saves": 1, "final_saves": 0, "blocking_s": 3.0,
                                "total_s": 5.0, "bytes": 1000}


def test_regular_and_final_checkpoints_are_counted_apart() -> None:
    final = _one_checkpoint_job(final=True)
    regular = msgspec.structs.replace(final[3], id="j-regular", start_ts=2.0, ts=4.0,
                                      blocking_s=1.0, total_s=2.0, bytes=10, final=False)
    d = attribute_job([*final, regular]).to_dict()
    assert d["checkpoints"] == {"saves": 1, "final_saves": 1, "blocking_s": 1.0,
                                "total_s": 7.0, "bytes": 1010}
    assert d["csbt_s"] == 1.0
    assert d["phases"]["checkpoint_save_blocking"] == 1.0
    assert d["phases"]["final_checkpoint"] == 1.0


def test_an_event_sent_twice_counts_once() -> None:
    events = _one_checkpoint_job(final=False)
    once = attribute_job(events).to_dict(include_timeline=True)
    twice = attribute_job(events + events).to_dict(include_timeline=True)
    assert twice == once
    copies = [msgspec.json.decode(msgspec.json.encode(e), type=type(e)) for e in events]
    assert copies == events and all(c is not e for c, e in zip(copies, events, strict=True))
    assert attribute_job(events + copies).to_dict(include_timeline=True) == once
    assert twice["checkpoints"]["saves"] == 1 and twice["csbt_s"] == 3.0
    assert twice["warnings"] == []
    assert attribute(events + events)["j"].to_dict() == attribute_job(events).to_dict()


def test_one_id_with_two_contents_keeps_the_smaller_json_in_any_order() -> None:
    events = _one_checkpoint_job(final=False, blocking_s=2.0)
    # The same id again, blocking 1 s: its JSON ("blocking_s":1.0) sorts before 2.0's.
    other = msgspec.structs.replace(events[3], blocking_s=1.0)
    for ordering in ([*events, other], [other, *events]):
        for r in (attribute_job(ordering), attribute(ordering)["j"]):
            assert r.csbt_us == 1 * US_PER_S
            assert r.checkpoint_saves == 1
            assert r.warnings == ("1 event id(s) reused with different content",)


def test_a_reused_id_warns_its_own_job_once_however_often_it_comes() -> None:
    a = _one_checkpoint_job(final=False, blocking_s=2.0)
    b = [msgspec.structs.replace(e, job="k", id=f"k-{i}") for i, e in enumerate(a)]
    other = msgspec.structs.replace(a[3], blocking_s=1.0)
    for ordering in ([*a, other, other, *b], [other, *b, *a, other]):
        results = attribute(ordering)
        assert results["j"].warnings == ("1 event id(s) reused with different content",)
        assert results["k"].warnings == ()


def test_an_id_reused_across_jobs_warns_both() -> None:
    j = _one_checkpoint_job(final=False)
    k = [msgspec.structs.replace(e, job="k", id=f"k-{i}") for i, e in enumerate(j)]
    k[3] = msgspec.structs.replace(k[3], id=j[3].id)  # job k's checkpoint reuses j's id
    for ordering in ([*j, *k], [*k, *j]):
        results = attribute(ordering)
        # `"job":"j"` sorts first: j keeps its checkpoint, k loses the one it sent.
        assert results["j"].checkpoint_saves == 1 and results["k"].checkpoint_saves == 0
        for job in "jk":
            assert results[job].warnings == ("1 event id(s) reused with different content",)


def test_time_between_steps_nobody_claims_is_a_loop_gap() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        m(Progress, ts=5.0, start_ts=0.0, attempt="a", step_start=0, step_end=5,
          cursor_start=0, cursor_end=5),
        m(Progress, ts=10.0, start_ts=8.0, attempt="a", step_start=5, step_end=7,
          cursor_start=5, cursor_end=7),
        m(AttemptEnded, ts=10.0, attempt="a", status="success"),
        m(JobEnded, ts=10.0, status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["phases"] == {"effective_steps": 7.0, "loop_gap": 3.0}
    assert d["components"]["wasted_training"] == 3.0
    assert d["in_loop_waste_s"] == 3.0 and d["tts_s"] == 0.0 and d["shutdown_s"] == 0.0


def test_without_a_submission_the_job_starts_at_its_earliest_event() -> None:
    m = Maker()
    events = [
        m(AttemptStarted, ts=2.0, attempt="a"),
        m(Progress, ts=7.0, start_ts=3.0, attempt="a", step_start=0, step_end=4,
          cursor_start=0, cursor_end=4),
        m(AttemptEnded, ts=7.0, attempt="a", status="success"),
    ]
    r = attribute_job(list(reversed(events)))
    assert r.submitted_at == 2.0 and r.e2e_us == 5 * US_PER_S
    assert r.phases_us == {"startup_other": US_PER_S, "effective_steps": 4 * US_PER_S}
    assert r.tenant == "default" and r.model == "" and r.run_id is None
    assert r.warnings == ("no job_submitted event: E2E starts at the earliest event",)


@pytest.mark.parametrize(("job_status", "status", "cause"),
                         [("success", "success", None), ("failed", "failed", "unknown")])
def test_a_last_attempt_without_an_end_ends_with_the_job(
        job_status: str, status: str, cause: str | None) -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=1.0, attempt="a"),
        m(Progress, ts=5.0, start_ts=1.0, attempt="a", step_start=0, step_end=4,
          cursor_start=0, cursor_end=4),
        m(JobEnded, ts=6.0, status=job_status),
    ]
    r = attribute_job(events)
    (a,) = r.attempts
    assert (a.status, a.cause, a.inferred, a.end) == (status, cause, True, 6.0)
    assert r.nof["total"] == (status == "failed")
    assert not r.provisional and r.e2e_us == 6 * US_PER_S


def test_a_component_declared_on_an_end_also_makes_a_name_ambiguous() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(PhaseStarted, ts=0.0, attempt="1", phase="warmup", component="initialization"),
        m(PhaseEnded, ts=4.0, attempt="1", phase="warmup", component="compilation"),
        m(AttemptEnded, ts=4.0, attempt="1", status="success"),
    ]
    d = attribute_job(events).to_dict()
    # The pair takes its start's declaration; the end's other one keeps the name apart.
    assert d["phases"] == {"warmup@initialization": 4.0}
    assert any("several components" in w for w in d["warnings"])
