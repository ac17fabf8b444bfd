"""One rule of the attribution stages per test: hand-computed event streams (times relative
to t=0, worked out on paper), each pinning a rule the module docstrings of
airflow_ett/ett/attribution/ promise, at its boundary where it has one."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import msgspec
import pytest

from airflow_ett.ett.attribution import (
    AttributionError,
    attribute,
    attribute_job,
    attribute_window,
    clip_to_window,
    dedupe,
)
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobEnded,
    JobSubmitted,
    ModelPublished,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from airflow_ett.ett.timeline import US_PER_S
from tests.ett.test_attribution import Maker


def steps(m: Maker, attempt: str, start: float, end: float, c0: int, c1: int) -> Event:
    """One progress report: `attempt` stepped from `start` to `end` over cursor [c0, c1)."""
    return m(Progress, ts=end, start_ts=start, attempt=attempt, step_start=c0, step_end=c1,
             cursor_start=c0, cursor_end=c1)


def secs(us: dict[str, int]) -> dict[str, float]:
    return {k: v / US_PER_S for k, v in us.items()}


# -- stage 1-3: collect, window, close attempts ------------------------------------------


def test_attempt_rows_carry_what_each_attempt_reported() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=1.0, attempt="1"),
        m(AttemptEnded, ts=4.0, attempt="1", status="failed", cause="infra", exit_code=137),
        m(AttemptStarted, ts=6.0, attempt="2"),
        steps(m, "2", 6.0, 10.0, 0, 40),
        m(AttemptEnded, ts=10.0, attempt="2", status="success", exit_code=0),
        m(JobEnded, ts=10.0, status="success"),
    ]
    rows = [(a.attempt, a.start, a.end, a.status, a.cause, a.exit_code, a.inferred,
             a.effective_s) for a in attribute_job(events).attempts]
    # Both ends were reported: nothing inferred; an attempt without a step made 0 s.
    assert rows == [("1", 1.0, 4.0, "failed", "infra", 137, False, 0.0),
                    ("2", 6.0, 10.0, "success", None, 0, False, 4.0)]


def test_only_a_guessed_end_is_inferred() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        steps(m, "1", 0.0, 5.0, 0, 5),
        # attempt 1 never reports its end; attempt 2 is still starting when we look (t=20)
        m(AttemptStarted, ts=8.0, attempt="2"),
    ]
    r = attribute_job(events, now=20.0)
    assert [(a.attempt, a.status, a.cause, a.inferred, a.end) for a in r.attempts] == [
        ("1", "failed", "unknown", True, 8.0),  # ended when the next one started
        ("2", "running", None, False, 20.0),  # still running: nothing was guessed
    ]
    assert r.warnings == ("attempt '1' never reported its end: failed (unknown) when the "
                          "next attempt started",)
    # attempt 2 made no step yet: its 12 s are startup, not a gap in a loop
    assert secs(r.phases_us) == {"effective_steps": 5.0, "detection": 3.0,
                                 "startup_other": 12.0}


OVERLAP = "attempt '1' overlaps the next one: cut at its start"


@pytest.mark.parametrize(("end_1", "start_2", "job_end", "ends", "warned"), [
    (12.0, 10.0, 20.0, [10.0, 20.0], True),  # ran on after the next one started
    (10.0, 10.0, 20.0, [10.0, 20.0], False),  # handed over at the very moment
    # both past the job's end: cut by the window, and no overlap between them
    (12.0, 12.0, 8.0, [8.0, 8.0], False),
])
def test_an_attempt_is_cut_at_the_next_start_and_warned_only_if_it_overlaps(
        end_1: float, start_2: float, job_end: float, ends: list[float], warned: bool) -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(AttemptEnded, ts=end_1, attempt="1", status="failed", cause="infra"),
        m(AttemptStarted, ts=start_2, attempt="2"),
        m(AttemptEnded, ts=20.0, attempt="2", status="success"),
        m(JobEnded, ts=job_end, status="success"),
    ]
    r = attribute_job(events)
    assert [a.end for a in r.attempts] == ends
    assert (OVERLAP in r.warnings) is warned


@pytest.mark.parametrize("end_1", [9.0, 10.0, 11.0])
def test_an_overlap_is_warned_even_where_the_submission_clips_both_attempts(
        end_1: float) -> None:
    """Attempt 1 (from 0) runs past attempt 2's start (5) in each case; the job was
    submitted at 10, so clipping to the window hides the overlap, but it happened."""
    m = Maker()
    events = [
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(AttemptStarted, ts=5.0, attempt="2"),
        m(AttemptEnded, ts=end_1, attempt="1", status="failed", cause="infra"),
        m(JobSubmitted, ts=10.0),
        m(AttemptEnded, ts=20.0, attempt="2", status="success"),
        m(JobEnded, ts=20.0, status="success"),
    ]
    assert OVERLAP in attribute_job(events).warnings


def test_an_attempt_without_attempt_started_starts_at_its_first_step() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        steps(m, "a", 2.0, 6.0, 0, 4),  # reported at +6, for steps from +2
        m(AttemptEnded, ts=7.0, attempt="a", status="success"),
        m(JobEnded, ts=7.0, status="success"),
    ]
    r = attribute_job(events)
    assert r.attempts[0].start == 2.0
    assert secs(r.phases_us) == {"queued": 2.0, "effective_steps": 4.0, "shutdown_other": 1.0}
    assert r.warnings == ("attempt 'a' has no attempt_started: starts at its first event",)


def test_the_earliest_submission_opens_the_window_ties_by_id() -> None:
    def submitted(ident: str, ts: float, tenant: str) -> Event:
        return JobSubmitted(id=ident, job="j", ts=ts, tenant=tenant)

    end = JobEnded(id="z-end", job="j", ts=10.0, status="success")
    for events, tenant in (
        ([submitted("s-1", 5.0, "late"), submitted("s-2", 3.0, "early"), end], "early"),
        ([submitted("s-b", 3.0, "b"), submitted("s-a", 3.0, "a"), end], "a"),
    ):
        r = attribute_job(events)
        assert (r.submitted_at, r.tenant, r.e2e_us) == (3.0, tenant, 7 * US_PER_S)


@pytest.mark.parametrize(("ended", "warnings"), [
    (5.0, ()),  # an instant job: E2E 0, nothing odd about it
    (3.0, ("the job ends before it was submitted: E2E is 0",)),
])
def test_a_job_never_ends_before_its_submission(ended: float,
                                                warnings: tuple[str, ...]) -> None:
    m = Maker()
    r = attribute_job([m(JobSubmitted, ts=5.0), m(JobEnded, ts=ended, status="success")])
    assert (r.submitted_at, r.ended_at, r.e2e_us) == (5.0, 5.0, 0)
    assert r.warnings == warnings


def test_a_running_job_without_now_runs_until_the_clock() -> None:
    m = Maker()
    submitted = time.time() - 30.0
    r = attribute_job([m(JobSubmitted, ts=submitted)])
    assert r.provisional
    assert 30.0 <= r.e2e_us / US_PER_S < 30.0 + 60.0


# -- stage 4: the implied timeline --------------------------------------------------------


def _implied_scenarios() -> list[tuple[str, list[Event], float | None, dict[str, float]]]:
    m = Maker()
    out: list[tuple[str, list[Event], float | None, dict[str, float]]] = []
    out.append(("after a finished attempt's last step: shutdown_other, then gpu_release", [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        steps(m, "a", 0.0, 5.0, 0, 5),
        m(AttemptEnded, ts=7.0, attempt="a", status="success"),
        m(JobEnded, ts=8.0, status="success"),
    ], None, {"effective_steps": 5.0, "shutdown_other": 2.0, "gpu_release": 1.0}))
    out.append(("a finished attempt that never stepped was all startup", [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=1.0, attempt="a"),
        m(AttemptEnded, ts=3.0, attempt="a", status="success"),
        m(JobEnded, ts=4.0, status="success"),
    ], None, {"queued": 1.0, "startup_other": 2.0, "gpu_release": 1.0}))
    out.append(("a failed attempt that never stepped: startup until detected, no detection", [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        m(AttemptEnded, ts=4.0, attempt="a", status="failed", cause="infra", detected_ts=3.0),
        # the job is over: after its last (failed) attempt it releases its GPUs
        m(JobEnded, ts=6.0, status="failed"),
    ], None, {"startup_other": 3.0, "failed_attempt_shutdown": 1.0, "gpu_release": 2.0}))
    out.append(("queued before the first attempt, rescheduling between attempts", [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=2.0, attempt="1"),
        steps(m, "1", 2.0, 4.0, 0, 4),
        m(AttemptEnded, ts=5.0, attempt="1", status="failed", cause="infra", detected_ts=4.5),
        m(AttemptStarted, ts=7.0, attempt="2"),
        steps(m, "2", 7.0, 9.0, 4, 8),
        m(AttemptEnded, ts=9.0, attempt="2", status="success"),
        m(JobEnded, ts=9.0, status="success"),
    ], None, {"queued": 2.0, "effective_steps": 4.0, "detection": 0.5,
              "failed_attempt_shutdown": 0.5, "rescheduling": 2.0}))
    out.append(("a running attempt that has not stepped yet is in startup", [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=1.0, attempt="a"),
    ], 5.0, {"queued": 1.0, "startup_other": 4.0}))
    return out


@pytest.mark.parametrize(("events", "now", "phases"),
                         [s[1:] for s in _implied_scenarios()],
                         ids=[s[0] for s in _implied_scenarios()])
def test_implied_labels_where_nobody_reported_a_phase(
        events: list[Event], now: float | None, phases: dict[str, float]) -> None:
    r = attribute_job(events, now=now)
    assert secs(r.phases_us) == phases


def test_a_straddling_span_is_cut_on_a_whole_microsecond_replay_rounded_down() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        steps(m, "1", 0.0, 1.0, 0, 1),
        m(AttemptEnded, ts=1.0, attempt="1", status="failed", cause="infra"),
        m(AttemptStarted, ts=1.0, attempt="2"),
        # 10 s over cursor 0..3 with the mark at 1: the first third (3.333333.. s) is replay
        steps(m, "2", 1.0, 11.0, 0, 3),
        m(AttemptEnded, ts=11.0, attempt="2", status="success"),
    ]
    r = attribute_job(events)
    assert r.phases_us == {"effective_steps": 7_666_667, "replay": 3_333_333}
    assert r.ttr_us == [3_333_333]


# -- stage 5: explicit phases -------------------------------------------------------------


def test_phases_and_saves_are_clipped_to_their_attempt() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        steps(m, "a", 0.0, 10.0, 0, 100),
        # both reported as lasting past the attempt's end at +10 (the job ends at +14)
        m(PhaseStarted, ts=9.0, attempt="a", phase="teardown"),
        m(PhaseEnded, ts=12.0, attempt="a", phase="teardown"),
        m(CheckpointSaved, ts=13.0, start_ts=9.0, attempt="a", step=90, cursor=90,
          blocking_s=3.0, total_s=4.0),
        m(AttemptEnded, ts=10.0, attempt="a", status="success"),
        m(JobEnded, ts=14.0, status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["phases_raw"] == {"teardown": 1.0, "checkpoint_save_blocking": 1.0}
    assert d["phases"] == {"effective_steps": 9.0, "checkpoint_save_blocking": 1.0,
                           "gpu_release": 4.0}
    assert d["csbt_s"] == 3.0  # CSBT is what the trainer reported, not the clipped part


@pytest.mark.parametrize(("phase_span", "raw"), [
    ((2.0, 2.5), 0.5 + 0.5),  # the phase holds the first save: counted once
    ((2.0, 2.4), 0.4 + 0.5 + 0.5),  # ends before the save's blocking does: both count
    ((2.1, 3.0), 0.9 + 0.5 + 0.5),  # starts after the save began: both count
])
def test_a_save_reported_both_ways_counts_once(phase_span: tuple[float, float],
                                               raw: float) -> None:
    """A producer may report `checkpoint_save_blocking` around a save (the reference
    trainer does, so that a save in progress can be seen) besides its checkpoint_saved;
    the save's blocking time then counts once, in the raw phases too. The second save
    (at +6, unreported) counts by its checkpoint_saved alone."""
    m = Maker()
    lo, hi = phase_span
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        steps(m, "a", 0.0, 2.0, 0, 20),
        m(PhaseStarted, ts=lo, attempt="a", phase="checkpoint_save_blocking"),
        m(PhaseEnded, ts=hi, attempt="a", phase="checkpoint_save_blocking"),
        m(CheckpointSaved, ts=4.0, start_ts=2.0, attempt="a", step=20, cursor=20,
          blocking_s=0.5, total_s=2.0),
        steps(m, "a", 3.0, 6.0, 20, 50),
        m(CheckpointSaved, ts=7.0, start_ts=6.0, attempt="a", step=50, cursor=50,
          blocking_s=0.5, total_s=1.0),
        steps(m, "a", 6.5, 10.0, 50, 90),
        m(AttemptEnded, ts=10.0, attempt="a", status="success"),
        m(JobEnded, ts=10.0, status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["phases_raw"]["checkpoint_save_blocking"] == pytest.approx(raw)
    assert d["csbt_s"] == 1.0  # CSBT is the checkpoint_saved's either way


def test_a_final_save_inside_the_final_checkpoint_phase_counts_once() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        steps(m, "a", 0.0, 8.0, 0, 80),
        m(PhaseStarted, ts=8.0, attempt="a", phase="final_checkpoint"),
        m(CheckpointSaved, ts=9.5, start_ts=8.0, attempt="a", step=80, cursor=80,
          blocking_s=1.0, total_s=1.5, final=True),
        m(PhaseEnded, ts=9.5, attempt="a", phase="final_checkpoint"),
        m(AttemptEnded, ts=10.0, attempt="a", status="success"),
        m(JobEnded, ts=10.0, status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["phases_raw"]["final_checkpoint"] == 1.5  # not 1.5 + 1.0


@pytest.mark.parametrize(("start_id", "end_id"), [("p-a", "p-b"), ("p-b", "p-a")])
def test_a_phase_that_starts_and_ends_at_one_moment_is_empty(start_id: str,
                                                             end_id: str) -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        steps(m, "a", 0.0, 10.0, 0, 100),
        PhaseStarted(id=start_id, job="j", ts=3.0, attempt="a", phase="stall"),
        PhaseEnded(id=end_id, job="j", ts=3.0, attempt="a", phase="stall"),
        m(AttemptEnded, ts=10.0, attempt="a", status="success"),
    ]
    r = attribute_job(events)
    assert secs(r.phases_us) == {"effective_steps": 10.0}
    assert r.phases_raw_us == {"stall": 0}
    assert r.warnings == ()


def test_ends_without_a_start_are_counted_and_the_rest_still_pairs() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        steps(m, "a", 0.0, 10.0, 0, 100),
        m(PhaseEnded, ts=1.0, attempt="a", phase="data_wait"),
        m(PhaseEnded, ts=2.0, attempt="a", phase="stall"),
        m(PhaseStarted, ts=4.0, attempt="a", phase="data_wait"),
        m(PhaseEnded, ts=5.0, attempt="a", phase="data_wait"),
        m(AttemptEnded, ts=10.0, attempt="a", status="success"),
    ]
    r = attribute_job(events)
    assert secs(r.phases_us) == {"effective_steps": 9.0, "data_wait": 1.0}
    assert r.warnings == ("2 phase_ended event(s) without a start were ignored",)


def test_a_foreign_phase_declared_once_keeps_its_name() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(PhaseStarted, ts=0.0, attempt="1", phase="warmup", component="initialization"),
        m(PhaseEnded, ts=3.0, attempt="1", phase="warmup"),  # the end need not repeat it
        m(AttemptEnded, ts=3.0, attempt="1", status="success"),
    ]
    r = attribute_job(events)
    assert secs(r.phases_us) == {"warmup": 3.0}
    assert r.phase_components["warmup"] == "initialization"
    assert r.warnings == ()


def test_a_foreign_phase_under_two_components_left_open_keeps_its_component() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(PhaseStarted, ts=0.0, attempt="1", phase="warmup", component="initialization"),
        m(PhaseEnded, ts=2.0, attempt="1", phase="warmup"),
        m(PhaseStarted, ts=2.0, attempt="1", phase="warmup", span="b",
          component="compilation"),  # never ended: it runs to its attempt's end
        m(AttemptEnded, ts=5.0, attempt="1", status="success"),
    ]
    r = attribute_job(events)
    assert secs(r.phases_us) == {"warmup@initialization": 2.0, "warmup@compilation": 3.0}
    assert r.warnings == ("phase(s) ['warmup'] declared under several components: kept "
                          "apart as name@component",)


# -- stage 6: precedence among phases of one component ------------------------------------


@pytest.mark.parametrize(("first", "second", "component", "phases"), [
    # registry order, not the alphabet: trainer_init is listed before data_pipeline_init
    ("trainer_init", "data_pipeline_init", None,
     {"trainer_init": 2.0, "data_pipeline_init": 2.0}),
    # a registered phase before a foreign one of its component
    ("trainer_init", "warmup", "initialization", {"trainer_init": 2.0, "warmup": 2.0}),
    ("publish_in_gpu", "upload", "shutdown", {"publish_in_gpu": 2.0, "upload": 2.0}),
])
def test_phases_starting_together_go_by_the_registry_then_foreign(
        first: str, second: str, component: str | None, phases: dict[str, float]) -> None:
    # `first` 2-4 and `second` 2-6 start together, after the steps of 0-2; the attempt ends
    # at 6. Where both run, the tie-break decides; afterwards `second` has the time alone.
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        steps(m, "a", 0.0, 2.0, 0, 20),
        m(PhaseStarted, ts=2.0, attempt="a", phase=first),
        m(PhaseStarted, ts=2.0, attempt="a", phase=second, component=component),
        m(PhaseEnded, ts=4.0, attempt="a", phase=first),
        m(PhaseEnded, ts=6.0, attempt="a", phase=second),
        m(AttemptEnded, ts=6.0, attempt="a", status="success"),
    ]
    r = attribute_job(events)
    assert secs(r.phases_us) == {"effective_steps": 2.0, **phases}


# -- stage 8: Level 1 ---------------------------------------------------------------------


def test_every_failure_before_the_first_step_is_in_tts_without_detection() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="1"),
        m(AttemptEnded, ts=2.0, attempt="1", status="failed", cause="application",
          detected_ts=1.0),
        m(AttemptStarted, ts=3.0, attempt="2"),
        m(AttemptEnded, ts=5.0, attempt="2", status="failed", cause="infra", detected_ts=4.0),
        m(AttemptStarted, ts=6.0, attempt="3"),
        steps(m, "3", 6.0, 10.0, 0, 40),
        m(AttemptEnded, ts=10.0, attempt="3", status="success"),
        m(JobEnded, ts=10.0, status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["tts_s"] == 6.0 and d["ttr_s"] == []
    assert [(f["attempt"], f["cause"], f["at"], f["during_tts"], f["ttr_s"], f["detection_s"])
            for f in d["failures"]] == [("1", "application", 0.0, True, None, 0.0),
                                        ("2", "infra", 3.0, True, None, 0.0)]
    assert d["nof"]["total"] == 2


def test_a_failure_after_the_first_step_is_a_recovery() -> None:
    events = _implied_scenarios()[3][1]  # fails at +5 after steps 2-4; new data again at +7
    (f,) = attribute_job(events).to_dict()["failures"]
    assert (f["at"], f["during_tts"], f["ttr_s"], f["detection_s"]) == (4.0, False, 3.0, 0.5)


def test_a_failure_at_the_first_step_is_a_recovery_of_zero() -> None:
    # Attempt 1 dies the moment it starts (+1), and attempt 2 steps from that moment: the
    # failure is not before the first effective step, so it is no part of TTS.
    m = Maker()
    events = [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=1.0, attempt="1"),
        m(AttemptEnded, ts=1.0, attempt="1", status="failed", cause="infra"),
        m(AttemptStarted, ts=1.0, attempt="2"),
        steps(m, "2", 1.0, 5.0, 0, 40),
        m(AttemptEnded, ts=5.0, attempt="2", status="success"),
    ]
    d = attribute_job(events).to_dict()
    assert d["tts_s"] == 1.0
    (f,) = d["failures"]
    assert (f["during_tts"], f["ttr_s"]) == (False, 0.0)


# -- stage 9 and the result ---------------------------------------------------------------


def test_the_submission_names_the_job() -> None:
    m = Maker()
    events = [m(JobSubmitted, ts=0.0, tenant="ads", model="dlrm", dag_id="ctr_v7",
                run_id="manual__1"), m(JobEnded, ts=1.0, status="success")]
    r = attribute_job(events)
    assert (r.tenant, r.model, r.dag_id, r.run_id) == ("ads", "dlrm", "ctr_v7", "manual__1")
    d = r.to_dict()
    assert (d["tenant"], d["model"], d["dag_id"], d["run_id"]) == (
        "ads", "dlrm", "ctr_v7", "manual__1")


@pytest.mark.parametrize(("published", "ended", "after"), [
    (8.0, True, 3.0),
    (5.0, True, 0.0),  # published as the GPUs were released
    (3.0, True, 0.0),  # published inside the GPU task: never negative
    (8.0, False, None),  # the job still runs: nothing to report yet
])
def test_publishing_after_release_is_reported_once_the_job_is_over(
        published: float, ended: bool, after: float | None) -> None:
    m = Maker()
    events = [m(JobSubmitted, ts=0.0), m(ModelPublished, ts=published, uri="file:///m")]
    if ended:
        events.append(m(JobEnded, ts=5.0, status="success"))
    d = attribute_job(events, now=9.0).to_dict()
    assert d["model_available_after_release_s"] == after


@pytest.mark.parametrize(("attempts", "rates"), [
    ([], {"attempts": 0.0, "attempts_without_preemption": 0.0,
          "failures_per_attempt": 0.0, "failures_per_attempt_without_preemption": 0.0}),
    (["preemption"], {"attempts": 1.0, "attempts_without_preemption": 0.0,
                      "failures_per_attempt": 1.0,
                      "failures_per_attempt_without_preemption": 0.0}),
])
def test_failure_rates_without_attempts_to_divide_by_are_zero(
        attempts: list[str], rates: dict[str, float]) -> None:
    m = Maker()
    events: list[Event] = [m(JobSubmitted, ts=0.0)]
    for i, cause in enumerate(attempts):
        events += [m(AttemptStarted, ts=float(i), attempt=str(i)),
                   m(AttemptEnded, ts=i + 0.5, attempt=str(i), status="failed", cause=cause)]
    events.append(m(JobEnded, ts=5.0, status="failed"))
    assert attribute_job(events).failure_rates() == rates


def test_the_timeline_is_in_the_dict_only_when_asked_relative_to_submission() -> None:
    m = Maker()
    events = [
        m(JobSubmitted, ts=100.0),
        m(AttemptStarted, ts=101.0, attempt="a"),
        steps(m, "a", 101.0, 104.0, 0, 30),
        m(AttemptEnded, ts=104.0, attempt="a", status="success"),
        m(JobEnded, ts=105.0, status="success"),
    ]
    r = attribute_job(events)
    assert "timeline" not in r.to_dict()
    assert r.to_dict(include_timeline=True)["timeline"] == [
        [0.0, 1.0, "scheduling", "queued"],
        [1.0, 4.0, "effective_training", "effective_steps"],
        [4.0, 5.0, "shutdown", "gpu_release"],
    ]


# -- entry points -------------------------------------------------------------------------


def _short_job() -> list[Event]:
    m = Maker()
    return [
        m(JobSubmitted, ts=0.0),
        m(AttemptStarted, ts=0.0, attempt="a"),
        steps(m, "a", 0.0, 4.0, 0, 4),  # still running: E2E runs to `now`
    ]


def test_dedupe_keeps_one_event_per_id_and_counts_conflicts() -> None:
    events = _short_job()
    assert dedupe(events + events) == (events, 0)
    other = msgspec.structs.replace(events[2], cursor_end=3)  # same id; its JSON sorts first
    for ordering in ([*events, other], [other, *events]):
        unique, conflicts = dedupe(ordering)
        assert conflicts == 1
        assert sorted(unique, key=lambda e: e.id) == [*events[:2], other]


def test_any_iterable_of_events_is_accepted() -> None:
    events = _short_job()

    def gen() -> Iterator[Event]:
        yield from events

    expected = attribute_job(events, now=10.0).to_dict(include_timeline=True)
    assert attribute_job(gen(), now=10.0).to_dict(include_timeline=True) == expected
    assert attribute_job(tuple(events), now=10.0).to_dict(include_timeline=True) == expected
    assert attribute(gen(), now=10.0)["j"].to_dict(include_timeline=True) == expected
    assert dedupe(gen()) == (events, 0)


def test_attribute_measures_running_jobs_up_to_now() -> None:
    r = attribute(_short_job(), now=10.0)["j"]
    assert r.provisional and r.e2e_us == 10 * US_PER_S
    assert secs(r.phases_us) == {"effective_steps": 4.0, "loop_gap": 6.0}


@pytest.mark.parametrize(("jobs", "message"), [
    ("", "no events: nothing to attribute"),
    ("abcdef", "events of 6 jobs given, expected one: ['a', 'b', 'c', 'd', 'e']"),
])
def test_attribute_job_refuses_anything_but_one_job(jobs: str, message: str) -> None:
    events = [JobSubmitted(id=f"s-{job}", job=job, ts=0.0) for job in reversed(jobs)]
    with pytest.raises(AttributionError, match=f"^{re.escape(message)}$"):
        attribute_job(events)


def test_window_attribution_keeps_its_bounds_and_now() -> None:
    events = _short_job()
    w = attribute_window(events, -5.0, 100.0, now=10.0)
    assert (w.lo, w.hi, w.provisional) == (-5.0, 100.0, True)
    assert w.e2e_in_window_us == 10 * US_PER_S  # up to `now`, not to the clock
    c = clip_to_window(attribute_job(events, now=10.0), 2.0, 3.5)
    assert (c.lo, c.hi, c.e2e_in_window_us) == (2.0, 3.5, 1_500_000)
