"""A running job's live state from its events (airflow_ett/scheduling/live.py): hand-made
streams for each stage and field, then streams as producers write them (the packaged
example job, and a real trainer run, slow) cut at many times and checked against what
the events themselves say, and properties over any prefix of a stream."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import EFFECTIVE_LABEL, attribute_job
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
    read_events,
)
from airflow_ett.ett.timeline import to_s, to_us
from airflow_ett.scheduling.live import (
    LATE_SAVE_S,
    UNREPORTED_COMMIT_S,
    LiveState,
    live_state,
    running_job,
)
from airflow_ett.scheduling.model import Stage
from airflow_ett.scheduling.save_times import SavePrior
from tests.factories import T0

EXAMPLE = Path(str(resources.files("airflow_ett") / "examples" / "demo_job.jsonl"))
DAY = T0 - 3600.0  # a day_start before every hand-made stream


class Maker:
    """Events of one job with ids in creation order; `at` is relative to T0."""

    def __init__(self, job: str = "j") -> None:
        self.job, self.n = job, 0

    def __call__(self, cls: type, at: float, **fields: Any) -> Event:
        self.n += 1
        out: Event = cls(id=f"{self.job}-{self.n}", job=self.job, ts=T0 + at, **fields)
        return out

    def progress(self, attempt: str, start: float, end: float, c0: int, c1: int) -> Event:
        return self(Progress, end, attempt=attempt, start_ts=T0 + start, step_start=c0,
                    step_end=c1, cursor_start=c0, cursor_end=c1)

    def said(self, attempt: str, start: float, end: float, c0: int, c1: int,
             next_save: float) -> Event:
        """A span whose producer says its next save begins at `next_save` (from T0)."""
        return self(Progress, end, attempt=attempt, start_ts=T0 + start, step_start=c0,
                    step_end=c1, cursor_start=c0, cursor_end=c1, next_save_ts=T0 + next_save)

    def checkpoint(self, attempt: str, start: float, *, blocking: float, total: float,
                   cursor: int, at: float | None = None, final: bool = False) -> Event:
        """A save begun at `start`; reported at `at` (default: when all of it is done)."""
        return self(CheckpointSaved, start + total if at is None else at, attempt=attempt,
                    start_ts=T0 + start, step=cursor, cursor=cursor, blocking_s=blocking,
                    total_s=total, final=final)


def state(events: Sequence[Event], at: float, day_start: float = DAY) -> LiveState | None:
    return live_state(events, now=T0 + at, day_start=day_start)


def running(events: Sequence[Event], at: float) -> LiveState:
    got = state(events, at)
    assert got is not None
    return got


def first_attempt(m: Maker) -> list[Event]:
    """Submitted at 0, attempt 1 from 10: compile 10-40, new data 0..200 over 40-60 with a
    checkpoint of cursor 100 begun at 50 (blocking 2 s, 5 s in all)."""
    return [
        m(JobSubmitted, 0, tenant="batch", model="dlrm_small"),
        m(AttemptStarted, 10, attempt="1"),
        m(PhaseStarted, 10, attempt="1", phase="compile"),
        m(PhaseEnded, 40, attempt="1", phase="compile"),
        m.progress("1", 40, 50, 0, 100),
        m.checkpoint("1", 50, blocking=2, total=5, cursor=100),
        m.progress("1", 52, 60, 100, 200),
    ]


def restarted(m: Maker) -> list[Event]:
    """`first_attempt`, which fails (infra) at 70; attempt 2 from 80 restores the cursor-100
    checkpoint (80-90), replays 100..150 over 90-95, then reads 150..250 over 95-105 (past
    the high-water mark 200 from 100 on, by the cursor)."""
    return [
        *first_attempt(m),
        m(AttemptEnded, 70, attempt="1", status="failed", cause="infra"),
        m(AttemptStarted, 80, attempt="2"),
        m(PhaseStarted, 80, attempt="2", phase="checkpoint_restore"),
        m(PhaseEnded, 90, attempt="2", phase="checkpoint_restore"),
        m.progress("2", 90, 95, 100, 150),
        m.progress("2", 95, 105, 150, 250),
    ]


# -- stages ------------------------------------------------------------------------------

def test_startup_until_the_first_progress_on_new_data_has_arrived() -> None:
    m = Maker()
    events = first_attempt(m)[:4]  # compile done at 40, the first span not yet reported
    s = running(events, 45)
    assert (s.job, s.tenant, s.model, s.attempt) == ("j", "batch", "dlrm_small", "1")
    assert s.stage == "startup" and not s.saving
    assert (s.run_s, s.admitted_at, s.last_event_at) == (35, T0 + 10, T0 + 40)
    assert s.since_checkpoint_s is None and s.restart_s is None
    assert running(events[:2], 10.5).stage == "startup"  # just started


def test_training_once_new_data_is_read_and_the_startup_is_the_restart_cost() -> None:
    m = Maker()
    s = running(first_attempt(m)[:5], 51)
    assert s.stage == "training" and not s.saving
    assert s.restart_s == 30  # from its start (10) to its first new data (40)
    assert s.since_checkpoint_s is None  # nothing saved yet: all 41 s are unsaved
    assert running_job(s, priority=1, gpus=8, default_restart_s=99).unsaved_s == 41


def test_restore_and_replay_is_recovery_then_training_past_the_high_water_mark() -> None:
    m = Maker()
    events = restarted(m)
    restoring = running(events[:10], 85)
    assert (restoring.attempt, restoring.stage) == ("2", "startup")  # restore is startup
    assert restoring.restart_s == 30  # not trained yet: the previous attempt's figure
    replaying = running(events[:12], 96)
    assert replaying.stage == "recovery"
    assert replaying.restart_s == 30
    trained = running(events, 106)
    assert trained.stage == "training"
    # the span 150..250 over 95-105 passes the mark 200 halfway: new data from 100 on
    assert trained.restart_s == pytest.approx(20)
    assert (trained.run_s, trained.admitted_at) == (26, T0 + 80)


def test_replay_without_new_data_stays_recovery_whatever_the_time() -> None:
    m = Maker()
    events = [*restarted(m)[:11], m.progress("2", 90, 200, 100, 200)]  # up to the mark only
    assert running(events, 5000).stage == "recovery"


def test_a_reported_blocking_save_phase_is_saving_while_open() -> None:
    m = Maker()
    base = first_attempt(m)[:5]
    events = [*base, m(PhaseStarted, 50, attempt="1", phase="checkpoint_save_blocking",
                       span="s1")]
    s = running(events, 51)
    assert s.stage == "training" and s.saving
    closed = [*events, m(PhaseEnded, 52, attempt="1", phase="checkpoint_save_blocking",
                         span="s1")]
    # closed, its commit not reported: its background part may still be written
    assert running(closed, 52.5).saving
    assert running(closed, 50 + UNREPORTED_COMMIT_S - 0.1).saving
    assert not running(closed, 50 + UNREPORTED_COMMIT_S).saving  # never reported: bounded
    committed = [*closed, m.checkpoint("1", 50.5, blocking=1, total=3, cursor=100, at=53.5)]
    assert not running(committed, 54).saving


def test_a_save_whose_commit_is_not_reported_yet_is_saving_for_the_usual_latency() -> None:
    """The reference trainer opens the phase as a save begins and reports the commit
    when it lands: between the two, the save is in progress; a commit later than any
    seen so far in the attempt is not waited for forever."""
    m = Maker()
    events = [*first_attempt(m)[:5],
              m.checkpoint("1", 40, blocking=1, total=4, cursor=100, at=44),  # 4 s to commit
              m(PhaseStarted, 50, attempt="1", phase="checkpoint_save_blocking", span="s2"),
              m(PhaseEnded, 51, attempt="1", phase="checkpoint_save_blocking", span="s2")]
    assert running(events, 53.9).saving
    assert not running(events, 54.0).saving


def test_an_async_save_is_saving_until_its_background_part_is_done_then_committed() -> None:
    m = Maker()
    # reported when the loop was unblocked (52), though its background part ends at 60
    events = [*first_attempt(m)[:5],
              m.checkpoint("1", 50, blocking=2, total=10, cursor=100, at=52)]
    during = running(events, 55)
    assert during.saving and during.stage == "training"
    assert during.since_checkpoint_s is None  # not committed yet: nothing is saved
    after = running(events, 70)
    assert not after.saving
    # the checkpoint holds the state of when the loop resumed (52): 18 s unsaved at 70
    assert after.since_checkpoint_s == pytest.approx(18)


def test_since_checkpoint_counts_from_the_state_of_the_last_committed_one() -> None:
    m = Maker()
    events = first_attempt(m)  # a save begun at 50, blocking 2 s, committed at 55
    assert running(events[:5], 54).since_checkpoint_s is None
    s = running(events, 80)
    assert not s.saving
    assert s.since_checkpoint_s == pytest.approx(80 - 52)
    later = [*events, m.checkpoint("1", 70, blocking=1, total=3, cursor=200)]
    assert running(later, 80).since_checkpoint_s == pytest.approx(80 - 71)
    # a save still running does not replace the committed one
    inflight = [*events, m.checkpoint("1", 70, blocking=1, total=30, cursor=200, at=71)]
    s = running(inflight, 80)
    assert s.saving and s.since_checkpoint_s == pytest.approx(80 - 52)


def test_a_checkpoint_of_a_previous_attempt_does_not_count() -> None:
    m = Maker()
    s = running(restarted(m), 106)
    assert s.since_checkpoint_s is None  # attempt 1's checkpoint was restored, not made now
    assert running_job(s, priority=1, gpus=2, default_restart_s=0).unsaved_s == s.run_s == 26


def test_the_final_checkpoint_is_shutdown_and_saving() -> None:
    m = Maker()
    events = [*first_attempt(m), m(PhaseStarted, 60, attempt="1", phase="final_checkpoint")]
    s = running(events, 61)
    assert s.stage == "shutdown" and s.saving
    events += [m.checkpoint("1", 60, blocking=3, total=3, cursor=200, final=True),
               m(PhaseEnded, 63, attempt="1", phase="final_checkpoint"),
               m(PhaseStarted, 63, attempt="1", phase="teardown")]
    s = running(events, 64)
    assert s.stage == "shutdown" and not s.saving
    assert s.since_checkpoint_s == pytest.approx(1)
    events.append(m(PhaseEnded, 65, attempt="1", phase="teardown"))
    assert running(events, 65.5).stage == "shutdown"  # until the attempt ends: sticky


def test_a_teardown_over_is_still_shutdown_until_the_attempt_ends() -> None:
    m = Maker()
    events = [*first_attempt(m), m(PhaseStarted, 60, attempt="1", phase="teardown"),
              m(PhaseEnded, 62, attempt="1", phase="teardown")]
    assert running(events, 63).stage == "shutdown"  # no training after a shutdown phase


def test_a_final_checkpoint_reported_without_a_phase_is_shutdown() -> None:
    m = Maker()
    events = [*first_attempt(m), m.checkpoint("1", 60, blocking=3, total=3, cursor=200,
                                              final=True)]
    s = running(events, 64)
    assert s.stage == "shutdown" and not s.saving


def test_publishing_in_the_gpu_task_after_the_last_attempt_is_still_running() -> None:
    m = Maker()
    events = [*first_attempt(m),
              m(AttemptEnded, 65, attempt="1", status="success"),
              m(PhaseStarted, 66, phase="publish_in_gpu", span="p")]  # the operator's
    s = running(events, 70)
    assert (s.stage, s.attempt, s.run_s) == ("publishing", "1", 60)
    published = [*events, m(PhaseEnded, 75, phase="publish_in_gpu", span="p")]
    assert state(published, 76) is None  # attempt ended, nothing holds the GPUs any more
    assert state([*events, m(JobEnded, 75, status="success")], 76) is None


def test_a_publish_phase_of_the_attempt_itself_is_publishing() -> None:
    m = Maker()
    events = [*first_attempt(m), m(PhaseStarted, 60, attempt="1", phase="publish_in_gpu")]
    assert running(events, 61).stage == "publishing"


# -- counts and estimates ----------------------------------------------------------------

def test_preemptions_today_counts_preempted_attempts_ended_since_day_start() -> None:
    m = Maker()
    events = [m(JobSubmitted, 0)]
    causes = ["preemption", "preemption", "infra", "preemption"]
    for i, cause in enumerate(causes):
        attempt = str(i + 1)
        events += [m(AttemptStarted, 100 * i, attempt=attempt),
                   m(AttemptEnded, 100 * i + 50, attempt=attempt, status="failed",
                     cause=cause)]
    events.append(m(AttemptStarted, 400, attempt="5"))
    assert running(events, 401).preemptions_today == 3
    # attempt 1 ended at 50, before the day; attempt 2 exactly at its start counts
    assert state(events, 401, day_start=T0 + 150).preemptions_today == 2  # type: ignore[union-attr]
    assert state(events, 401, day_start=T0 + 351).preemptions_today == 0  # type: ignore[union-attr]


def test_the_latest_end_reported_for_an_attempt_decides_its_cause() -> None:
    m = Maker()
    events = [m(AttemptStarted, 0, attempt="1"),
              m(AttemptEnded, 10, attempt="1", status="failed", cause="unknown"),
              m(AttemptEnded, 12, attempt="1", status="failed", cause="preemption"),
              m(AttemptStarted, 20, attempt="2")]
    assert running(events, 21).preemptions_today == 1


def test_restart_cost_falls_back_to_the_latest_attempt_that_trained_then_the_default() -> None:
    m = Maker()
    events = [*first_attempt(m),
              m(AttemptEnded, 70, attempt="1", status="failed", cause="infra"),
              m(AttemptStarted, 80, attempt="2"),  # dies in its startup
              m(AttemptEnded, 90, attempt="2", status="failed", cause="application"),
              m(AttemptStarted, 100, attempt="3")]
    s = running(events, 101)
    assert (s.attempt, s.restart_s) == ("3", 30)  # attempt 1's, not the untrained 2
    fresh = running(events[:2], 11)
    assert fresh.restart_s is None
    assert running_job(fresh, priority=1, gpus=1, default_restart_s=240).restart_s == 240
    assert running_job(s, priority=1, gpus=1, default_restart_s=240).restart_s == 30


def test_running_job_carries_the_state_and_the_schedulers_figures() -> None:
    m = Maker()
    s = running(first_attempt(m), 80)
    r = running_job(s, priority=3, gpus=4, default_restart_s=100)
    assert (r.job, r.tenant, r.priority, r.gpus, r.stage, r.saving) == (
        "j", "batch", 3, 4, "training", False)
    assert (r.run_s, r.preemptions_today, r.restart_s, r.admitted_at) == (70, 0, 30, T0 + 10)
    assert r.since_checkpoint_s == pytest.approx(28)
    assert r.unsaved_gpu_s == pytest.approx(28 * 4)


# -- the next checkpoint and the exit save ------------------------------------------------

def periodic(m: Maker, attempt: str, starts: Sequence[float], total: float = 5.0,
             blocking: float = 1.0) -> list[Event]:
    """Periodic saves of `attempt` begun at `starts`, cursors 100, 200, ..."""
    return [m.checkpoint(attempt, at, blocking=blocking, total=total, cursor=100 * (i + 1))
            for i, at in enumerate(starts)]


def trained(m: Maker, attempt: str = "1", at: float = 10) -> list[Event]:
    return [m(JobSubmitted, 0, tenant="batch"), m(AttemptStarted, at, attempt=attempt),
            m.progress(attempt, at, at + 5, 0, 10)]


def test_the_next_checkpoint_is_the_last_start_plus_the_gap_and_the_save() -> None:
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100, 130, 160])]
    s = running(events, 170)
    # saves every 30 s taking 5 s: the next begins at 190 and commits at 195
    assert s.next_checkpoint_in_s == pytest.approx(25)
    assert s.exit_save_s == 5
    assert running(events, 194).next_checkpoint_in_s == pytest.approx(1)
    assert running(events, 200).next_checkpoint_in_s == 0  # late, not yet seen: due now
    r = running_job(s, priority=1, gpus=2, default_restart_s=0)
    assert (r.next_checkpoint_in_s, r.exit_save_s) == (s.next_checkpoint_in_s, 5)


def test_one_save_gives_the_exit_save_but_no_cadence() -> None:
    m = Maker()
    s = running([*trained(m), *periodic(m, "1", [100], total=7)], 120)
    assert s.next_checkpoint_in_s is None and s.exit_save_s == 7
    fresh = running(trained(m), 20)
    assert fresh.next_checkpoint_in_s is None and fresh.exit_save_s is None


def test_the_cadence_is_the_median_gap_so_one_odd_save_does_not_move_it() -> None:
    m = Maker()
    # 30-s gaps, and one save 5 s after another (an odd one); totals 2, 2, 2, 2, 20
    events = [*trained(m), *periodic(m, "1", [100, 130, 160, 190], total=2),
              m.checkpoint("1", 195, blocking=1, total=20, cursor=999)]
    s = running(events, 220)
    # gaps 30, 30, 30, 5: median 30; totals' median 2; anchor 195: due at 227
    assert s.next_checkpoint_in_s == pytest.approx(7)
    assert s.exit_save_s == 20  # the longest of the recent saves


def test_an_earlier_attempts_cadence_serves_once_this_attempt_saved() -> None:
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100, 130]),
              m(AttemptEnded, 150, attempt="1", status="failed", cause="infra"),
              m(AttemptStarted, 200, attempt="2"), m.progress("2", 210, 220, 200, 300)]
    assert running(events, 230).next_checkpoint_in_s is None  # no anchor in attempt 2
    events.append(m.checkpoint("2", 240, blocking=1, total=5, cursor=300))
    assert running(events, 250).next_checkpoint_in_s == pytest.approx(240 + 30 + 5 - 250)


def test_a_gap_across_a_restart_is_no_interval() -> None:
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100]),
              m(AttemptEnded, 150, attempt="1", status="failed", cause="infra"),
              m(AttemptStarted, 160, attempt="2"), *periodic(m, "2", [170])]
    assert running(events, 180).next_checkpoint_in_s is None


def test_the_last_save_of_a_preempted_attempt_is_no_interval() -> None:
    m = Maker()
    # attempt 1 saved at 100 and, asked to leave, at 110 (an exit save, 10 s after)
    events = [*trained(m), *periodic(m, "1", [100, 110]),
              m(AttemptEnded, 120, attempt="1", status="failed", cause="preemption"),
              m(AttemptStarted, 200, attempt="2"), *periodic(m, "2", [250])]
    assert running(events, 260).next_checkpoint_in_s is None
    # with a third save, the 100 -> 130 gap stands and the exit save's does not count
    m2 = Maker()
    events = [*trained(m2), *periodic(m2, "1", [100, 130, 135]),
              m2(AttemptEnded, 140, attempt="1", status="failed", cause="preemption"),
              m2(AttemptStarted, 200, attempt="2"), *periodic(m2, "2", [250])]
    assert running(events, 260).next_checkpoint_in_s == pytest.approx(250 + 30 + 5 - 260)


def test_no_next_checkpoint_when_overdue_by_a_gap_saving_or_shutting_down() -> None:
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100, 130, 160])]
    assert running(events, 160 + 30 + 5 + 29).next_checkpoint_in_s == 0
    assert running(events, 160 + 30 + 5 + 31).next_checkpoint_in_s is None
    saving = [*events, m(PhaseStarted, 180, attempt="1", phase="checkpoint_save_blocking")]
    assert running(saving, 181).next_checkpoint_in_s is None
    final = [*events, m(PhaseStarted, 180, attempt="1", phase="final_checkpoint")]
    s = running(final, 181)
    assert s.next_checkpoint_in_s is None and s.exit_save_s == 5


def test_a_final_save_is_neither_cadence_nor_exit_save() -> None:
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100]),
              m.checkpoint("1", 130, blocking=60, total=60, cursor=500, final=True)]
    s = live_state(events, now=T0 + 125, day_start=DAY)  # before the final save began
    assert s is not None and s.exit_save_s == 5 and s.next_checkpoint_in_s is None


# -- the next checkpoint as the trainer reports it (progress.next_save_ts) -----------------

def test_the_trainers_word_gives_the_next_checkpoint_before_this_attempt_saved() -> None:
    m = Maker()
    # attempt 1 saved once (5 s in all) and failed; attempt 2 has not saved yet, but its
    # spans say the next save begins at 400: it commits at 405
    events = [*trained(m), *periodic(m, "1", [100]),
              m(AttemptEnded, 150, attempt="1", status="failed", cause="infra"),
              m(AttemptStarted, 200, attempt="2"), m.said("2", 210, 220, 100, 300, 400)]
    s = running(events, 230)
    assert s.stage == "training" and s.next_checkpoint_in_s == pytest.approx(405 - 230)
    # the cadence alone knows nothing here (one save, none in this attempt)
    plain = [e for e in events if not isinstance(e, Progress)] + [
        m.progress("2", 210, 220, 100, 300)]
    assert running(plain, 230).next_checkpoint_in_s is None
    # the latest word counts: a later span moves the save (an "auto" interval re-chosen)
    events.append(m.said("2", 220, 221, 300, 310, 350))
    assert running(events, 230).next_checkpoint_in_s == pytest.approx(355 - 230)


def test_the_trainers_word_needs_a_save_of_the_job_to_know_how_long_one_takes() -> None:
    m = Maker()
    events = [m(JobSubmitted, 0, tenant="batch"), m(AttemptStarted, 10, attempt="1"),
              m.said("1", 10, 15, 0, 10, 100)]
    assert running(events, 20).next_checkpoint_in_s is None


#: A tenant's recent saves: 40 s to the commit typically, 90 s at the p90, 25 s of it past
#: the loop's blocking part.
PRIOR = SavePrior(typical_s=40.0, exit_s=90.0, commit_wait_s=25.0, saves=12)


def test_before_its_first_save_a_job_takes_its_tenants_saves_for_its_own() -> None:
    m = Maker()
    events = [m(JobSubmitted, 0, tenant="batch"), m(AttemptStarted, 10, attempt="1"),
              m.said("1", 10, 15, 0, 10, 100)]
    s = live_state(events, now=T0 + 20, day_start=DAY, prior=PRIOR)
    assert s is not None
    # the announced start plus the tenant's typical save; its p90 as the exit save
    assert (s.next_checkpoint_in_s, s.exit_save_s, s.commit_wait_s) == (
        pytest.approx(100 + 40 - 20), 90.0, 25.0)
    r = running_job(s, priority=1, gpus=2, default_restart_s=0)
    assert (r.next_checkpoint_in_s, r.exit_save_s, r.commit_wait_s) == (
        s.next_checkpoint_in_s, 90.0, 25.0)
    # its own first save replaces the tenant's: 8 s in all, 2 of them blocking, committed
    # at 108 (its report at 109 is the commit: 9 s after the start, so 7 s past the block).
    # An exit save is priced on the commit's clock too: 9 s, never less than the commit
    # wait it is weighed against (a yield now and one at the checkpoint on one clock)
    events += [m.checkpoint("1", 100, blocking=2, total=8, cursor=20, at=109),
               m.said("1", 102, 110, 20, 30, 200)]
    s = live_state(events, now=T0 + 120, day_start=DAY, prior=PRIOR)
    assert s is not None
    assert (s.next_checkpoint_in_s, s.exit_save_s, s.commit_wait_s) == (
        pytest.approx(200 + 8 - 120), 9.0, 7.0)
    # without the prior, as before: nothing known of its saves
    bare = running(events[:3], 20)
    assert (bare.next_checkpoint_in_s, bare.exit_save_s, bare.commit_wait_s) == (
        None, None, None)


def test_the_commit_wait_is_the_median_of_the_latest_saves_past_their_blocking() -> None:
    m = Maker()
    # blocking 1 s of saves of 5, 5, 9, 5, 5, 5 s (CADENCE_SAMPLE 5: the first left out);
    # one reported 6 s after its background part ended (a commit late to come)
    events = [*trained(m), *periodic(m, "1", [100, 130]),
              m.checkpoint("1", 160, blocking=1, total=9, cursor=300),
              m.checkpoint("1", 190, blocking=1, total=5, cursor=400, at=201),
              *periodic(m, "1", [220, 250])]
    # past the blocking: 4, 8, 10, 4, 4 over the latest five: the median is 4
    assert running(events, 258).commit_wait_s == 4.0
    assert running(events[:-2], 205).commit_wait_s == 6.0  # 4, 4, 8, 10


def test_the_trainers_word_is_spent_by_the_save_it_announced() -> None:
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100], total=5), m.said("1", 110, 111, 10, 20, 160)]
    assert running(events, 120).next_checkpoint_in_s == pytest.approx(165 - 120)
    # the save begins at 160 (its phase), commits at 165: the word is spent until a span
    # after it says when the next one begins; meanwhile the cadence decides (saves 60 s
    # apart, 5 s each: 160 + 60 + 5), not "unknown", which made a controller looking
    # right after a save ask to leave now (CI, a loaded host: the next word lagged)
    begun = [*events, m(PhaseStarted, 160, attempt="1", phase="checkpoint_save_blocking"),
             m(PhaseEnded, 161, attempt="1", phase="checkpoint_save_blocking"),
             m.checkpoint("1", 160, blocking=1, total=5, cursor=30)]
    assert running(begun, 170).next_checkpoint_in_s == pytest.approx(225 - 170)
    begun.append(m.said("1", 166, 170, 30, 40, 220))
    assert running(begun, 170).next_checkpoint_in_s == pytest.approx(225 - 170)


def test_a_late_announced_save_is_due_now_then_doubted() -> None:
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100]), m.said("1", 110, 111, 10, 20, 160)]
    assert running(events, 160 + LATE_SAVE_S).next_checkpoint_in_s == 0
    assert running(events, 160 + LATE_SAVE_S + 1).next_checkpoint_in_s is None


def test_the_trainers_word_of_another_attempt_does_not_count() -> None:
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100]), m.said("1", 110, 111, 10, 20, 500),
              m(AttemptEnded, 150, attempt="1", status="failed", cause="infra"),
              m(AttemptStarted, 200, attempt="2"), m.progress("2", 210, 220, 100, 300)]
    assert running(events, 230).next_checkpoint_in_s is None


@settings(max_examples=200, deadline=None)
@given(due=st.floats(0, 3600), total=st.floats(0, 600), cut=st.floats(0, 1))
def test_the_trainers_word_is_the_commit_it_implies(due: float, total: float,
                                                    cut: float) -> None:
    """Whatever the schedule said and the save took, before the save begins the estimate
    is the announced start plus the job's typical save, from now, never below 0."""
    m = Maker()
    events = [*trained(m), *periodic(m, "1", [100], total=total)]
    said_at = 100 + total + 1
    events.append(m.said("1", said_at - 1, said_at, 10, 20, said_at + due))
    now = said_at + cut * (due + LATE_SAVE_S)
    s = running(events, now)
    assert s.next_checkpoint_in_s == pytest.approx(max(0.0, said_at + due + total - now),
                                                   abs=1e-3)  # Unix seconds' float grain


@settings(max_examples=200, deadline=None)
@given(gap=st.floats(5, 600), total=st.floats(0.1, 60), saves=st.integers(2, 8),
       jitter=st.floats(0, 1), cut=st.floats(0, 1))
def test_a_regular_cadence_is_foreseen_to_within_its_jitter(
        gap: float, total: float, saves: int, jitter: float, cut: float) -> None:
    """Saves every `gap` (+- `jitter`) taking `total` (+- `jitter`): cut anywhere before
    the next commit, the estimate is that commit to within the jitter, and never < 0."""
    total = min(total, gap / 2)
    rng = random.Random(f"{gap}-{total}-{saves}")
    m = Maker()
    events = trained(m, at=0)
    start = 50.0
    for i in range(saves):
        events.append(m.checkpoint("1", start, blocking=min(1.0, total),
                                   total=total + rng.uniform(-jitter, jitter) / 10,
                                   cursor=100 * (i + 1)))
        start += gap + rng.uniform(-jitter, jitter)
    last = max(max(e.ts, e.start_ts + e.total_s) for e in events
               if isinstance(e, CheckpointSaved)) + 1e-3  # all of them committed
    last_start = max(e.start_ts for e in events if isinstance(e, CheckpointSaved))
    next_commit = last_start + gap + total
    now = last + cut * (next_commit - last) - T0
    s = running(events, now)
    assert s.next_checkpoint_in_s is not None and s.next_checkpoint_in_s >= 0
    assert s.next_checkpoint_in_s == pytest.approx(max(0.0, next_commit - T0 - now),
                                                   abs=3 * jitter + 1e-6)


# -- not running -------------------------------------------------------------------------

def test_not_running_without_a_current_attempt() -> None:
    m = Maker()
    assert live_state([], now=T0, day_start=DAY) is None
    assert state([m(JobSubmitted, 0)], 100) is None  # queued, never started
    ended = [*first_attempt(m), m(AttemptEnded, 70, attempt="1", status="failed",
                                  cause="preemption")]
    assert state(ended, 71) is None  # between attempts: waiting to be placed again
    job_ended = [*first_attempt(m), m(JobEnded, 70, status="cancelled")]
    assert state(job_ended, 71) is None  # the job released its GPUs (no attempt end came)


def test_an_attempt_after_the_job_ended_runs_again() -> None:
    m = Maker()
    events = [*first_attempt(m), m(AttemptEnded, 70, attempt="1", status="failed",
                                   cause="application"),
              m(JobEnded, 70, status="failed"),
              m(AttemptStarted, 500, attempt="2")]  # the DAG run was cleared and re-run
    s = running(events, 510)
    assert (s.attempt, s.stage, s.run_s) == ("2", "startup", 10)


def test_an_attempt_without_attempt_started_starts_at_its_first_event() -> None:
    m = Maker()
    events = [m(JobSubmitted, 0), m.progress("1", 20, 30, 0, 10)]
    s = running(events, 40)
    assert (s.attempt, s.admitted_at, s.stage, s.restart_s) == ("1", T0 + 20, "training", 0)


# -- robustness --------------------------------------------------------------------------

def test_order_and_repeats_do_not_matter() -> None:
    m = Maker()
    events = [*restarted(m), m.checkpoint("2", 105, blocking=1, total=4, cursor=250)]
    want = running(events, 112)
    shuffled = list(events) * 2
    random.Random(7).shuffle(shuffled)
    assert running(shuffled, 112) == want


def test_a_phase_start_sent_twice_is_closed_by_its_one_end() -> None:
    """A re-sent event (spool replay, a retry after a timeout) counts once."""
    m = Maker()
    start = m(PhaseStarted, 50, attempt="1", phase="checkpoint_save_blocking")
    events = [*first_attempt(m)[:5], start, start,
              m(PhaseEnded, 52, attempt="1", phase="checkpoint_save_blocking"),
              m.checkpoint("1", 50.5, blocking=1, total=2, cursor=100, at=52.5)]
    assert not running(events, 53).saving


def test_an_event_stamped_after_now_counts() -> None:
    """A trainer whose clock runs ahead: its save has begun, whatever our clock says."""
    m = Maker()
    events = [*first_attempt(m)[:5],
              m(PhaseStarted, 53, attempt="1", phase="checkpoint_save_blocking")]
    s = running(events, 52)
    assert s.saving
    early = running(events, 5)  # now before the attempt's start: durations stay >= 0
    assert early.run_s == 0


def test_odd_checkpoint_times_keep_the_unsaved_time_within_the_run() -> None:
    m = Maker()
    # begun before the attempt's reported start (another host's clock): at most run_s
    early = [m(AttemptStarted, 10, attempt="1"), m.progress("1", 10, 20, 0, 10),
             m.checkpoint("1", 5, blocking=1, total=2, cursor=10)]
    s = running(early, 30)
    assert s.since_checkpoint_s == s.run_s == 20
    # blocking longer than the whole save (nothing in the format forbids it): at least 0
    odd = [m(AttemptStarted, 10, attempt="1"), m.progress("1", 10, 20, 0, 10),
           m.checkpoint("1", 20, blocking=9, total=1, cursor=10)]
    assert running(odd, 22).since_checkpoint_s == 0


def test_bad_input_is_refused_naming_the_field() -> None:
    m = Maker()
    mixed = [*first_attempt(m), *first_attempt(Maker("other"))]
    with pytest.raises(ValueError, match=r"2 jobs given.*'j', 'other'"):
        state(mixed, 80)
    with pytest.raises(ValueError, match="now = nan"):
        live_state(first_attempt(m), now=float("nan"), day_start=DAY)
    with pytest.raises(ValueError, match="day_start = inf"):
        live_state(first_attempt(m), now=T0, day_start=float("inf"))
    s = running(first_attempt(m), 80)
    with pytest.raises(ValueError, match="gpus = 0"):
        running_job(s, priority=1, gpus=0, default_restart_s=1)
    with pytest.raises(ValueError, match="default_restart_s = -1"):
        running_job(s, priority=1, gpus=1, default_restart_s=-1)


# -- streams as producers write them -----------------------------------------------------

STAGE_RANK: dict[Stage, int] = {"startup": 0, "recovery": 1, "training": 2, "shutdown": 3,
                                "publishing": 3}


def save_windows(events: Sequence[Event]) -> list[tuple[str | None, float, float]]:
    """When a save really ran: each checkpoint from its start to all of it done, each
    save phase from its start to its end."""
    out: list[tuple[str | None, float, float]] = [
        (e.attempt, e.start_ts, max(e.ts, e.start_ts + e.total_s))
        for e in events if isinstance(e, CheckpointSaved)]
    starts = {(e.attempt, e.phase, e.span): e.ts for e in events
              if isinstance(e, PhaseStarted)
              and e.phase in ("final_checkpoint", "checkpoint_save_blocking")}
    out += [(e.attempt, starts[(e.attempt, e.phase, e.span)], e.ts) for e in events
            if isinstance(e, PhaseEnded) and (e.attempt, e.phase, e.span) in starts]
    return out


def check_cuts(events: Sequence[Event], day_start: float) -> dict[str, list[Stage]]:
    """The stream cut at every event time (and just before it): at each cut `t`, the
    events with `ts <= t` at `now = t`. Checks what the events say on their own, and
    returns the stages each attempt went through, in order, repeats dropped."""
    cuts = sorted({t for e in events for t in (e.ts, e.ts - 1e-3)})
    windows = save_windows(events)
    attribution = attribute_job(events)
    seen: dict[str, list[Stage]] = {}
    for t in cuts:
        prefix = [e for e in events if e.ts <= t]
        s = live_state(prefix, now=t, day_start=day_start)
        starts = {e.attempt: e.ts for e in prefix if isinstance(e, AttemptStarted)}
        if not starts:
            assert s is None
            continue
        current = max(starts, key=lambda a: (starts[a], a))
        over = any(isinstance(e, AttemptEnded) and e.attempt == current for e in prefix) \
            or any(isinstance(e, JobEnded) for e in prefix)
        assert (s is None) == over, (t, s)
        if s is None:
            continue
        assert s.attempt == current and s.admitted_at == starts[current]
        assert 0 <= s.run_s == pytest.approx(t - starts[current])
        assert s.since_checkpoint_s is None or 0 <= s.since_checkpoint_s <= s.run_s
        # training exactly when a span of this attempt read past every earlier cursor
        mark, new_data = -1, False
        for e in sorted((e for e in prefix if isinstance(e, Progress)), key=lambda e: e.ts):
            if e.attempt == current and e.cursor_end > max(mark, e.cursor_start):
                new_data = True
            mark = max(mark, e.cursor_end)
        if s.stage in ("startup", "recovery"):
            assert not new_data, (t, s)
        if s.stage == "training":
            assert new_data, (t, s)
            first = attribution.timeline.first_start(EFFECTIVE_LABEL, to_us(starts[current]))
            assert first is not None
            assert s.restart_s == pytest.approx(to_s(first) - starts[current], abs=1e-3)
        if s.saving:  # only inside a save that was really running then
            assert any(a == current and lo <= t < hi for a, lo, hi in windows), (t, s)
        stages = seen.setdefault(current, [])
        if not stages or stages[-1] != s.stage:
            assert not stages or STAGE_RANK[stages[-1]] < STAGE_RANK[s.stage], (t, stages, s)
            stages.append(s.stage)
    return seen


def example_events() -> list[Event]:
    result = read_events(str(EXAMPLE))
    assert not result.errors and result.events
    return result.events


def test_the_example_job_goes_through_the_stages_a_restarted_job_should() -> None:
    events = example_events()
    submitted = min(e.ts for e in events)
    stages = check_cuts(events, day_start=submitted)
    assert stages == {"1": ["startup", "training"],
                      "2": ["startup", "recovery", "training"],
                      "3": ["startup", "recovery", "training", "shutdown"]}
    # attempt 2 ended preempted: attempt 3 counts it today, not once the day has moved on
    in_third = max(e.ts for e in events if isinstance(e, Progress) and e.attempt == "3")
    so_far = [e for e in events if e.ts <= in_third]
    s = live_state(so_far, now=in_third, day_start=submitted)
    assert s is not None and (s.attempt, s.stage, s.preemptions_today) == ("3", "training", 1)
    assert s.since_checkpoint_s is not None  # attempt 3 committed a save before it
    s = live_state(so_far, now=in_third, day_start=in_third - 1)
    assert s is not None and s.preemptions_today == 0


EXAMPLE_EVENTS = example_events()


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_prefix_of_a_real_stream_gives_a_sane_state(data: st.DataObject) -> None:
    events = EXAMPLE_EVENTS
    prefix = events[:data.draw(st.integers(0, len(events)), label="events")]
    last = max((e.ts for e in prefix), default=T0)
    now = last + data.draw(st.floats(-120, 3600), label="now after the last event")
    day_start = last + data.draw(st.floats(-4000, 100), label="day_start")
    s = live_state(prefix, now=now, day_start=day_start)
    if s is None:
        return
    assert s.run_s >= 0
    assert s.since_checkpoint_s is None or 0 <= s.since_checkpoint_s <= s.run_s
    assert s.restart_s is None or s.restart_s >= 0
    assert s.admitted_at <= s.last_event_at
    assert s.exit_save_s is None or s.exit_save_s >= 0
    assert s.next_checkpoint_in_s is None or s.next_checkpoint_in_s >= 0
    periodic_saves = [e for e in prefix if isinstance(e, CheckpointSaved) and not e.final]
    if len(periodic_saves) < 2:  # a cadence needs two saves of one attempt
        assert s.next_checkpoint_in_s is None
    if not periodic_saves:
        assert s.exit_save_s is None
    shuffled = data.draw(st.permutations(prefix), label="the same events, shuffled")
    assert live_state([*shuffled, *prefix[:3]], now=now, day_start=day_start) == s


TRAINER_CONFIG = {
    "model": "dlrm_tiny", "steps": 100, "batch_size": 64, "checkpoint_dir": "ckpt",
    "checkpoint_interval": 30, "num_workers": 0, "compile": False,
    "events_file": "events.jsonl", "log_every_s": 1.0, "seed": 11,
    # slow steps, so that the replay after the restore fills a whole progress span
    "step_sleep_s": 0.04,
    "faults": [{"kind": "raise", "at_step": 59, "attempt": 1}],
}


@pytest.mark.integration
@pytest.mark.slow
def test_a_real_trainer_run_cut_at_every_event(tmp_path: Path) -> None:
    """The reference trainer, two attempts: the first fails after step 59, the second
    restores step 30, replays to 59 and finishes with its final checkpoint."""
    (tmp_path / "job.json").write_text(json.dumps(TRAINER_CONFIG))
    for number, code in ((1, 1), (2, 0)):
        done = subprocess.run(
            [sys.executable, "-m", "airflow_ett.trainer", "--config", "job.json", "--job-id",
             "real", "--attempt-number", str(number)],
            capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path)
        assert done.returncode == code, done.stderr[-3000:]
    result = read_events(str(tmp_path / "events.jsonl"))
    assert not result.errors
    events = result.events
    stages = check_cuts(events, day_start=min(e.ts for e in events))
    assert stages == {"1": ["startup", "training"],
                      "2": ["startup", "recovery", "training", "shutdown"]}
    final = next(e for e in events if isinstance(e, PhaseStarted)
                 and e.phase == "final_checkpoint")
    s = live_state([e for e in events if e.ts <= final.ts], now=final.ts,
                   day_start=final.ts)
    assert s is not None and s.saving and s.stage == "shutdown"
    assert s.restart_s is not None and s.restart_s > 0
    assert s.since_checkpoint_s is not None  # step 60 and 90 were committed in attempt 2
    # each periodic save is seen from its start: the trainer opens the phase before it
    for begun in (e for e in events if isinstance(e, PhaseStarted)
                  and e.phase == "checkpoint_save_blocking"):
        cut = live_state([e for e in events if e.ts <= begun.ts], now=begun.ts,
                         day_start=begun.ts)
        assert cut is not None and cut.saving, begun
    check_the_trainers_word(events)


def check_the_trainers_word(events: Sequence[Event]) -> None:
    """The trainer says on every span when its next save begins; the span just before a
    periodic save announced no later than it began; and once the job has saved, the
    restored attempt's next checkpoint is known before that attempt saved (the cadence
    of its saves alone would need a save of its own)."""
    spans = sorted((e for e in events if isinstance(e, Progress)), key=lambda e: e.ts)
    assert spans and all(p.next_save_ts is not None for p in spans)
    saves = [e for e in events if isinstance(e, CheckpointSaved) and not e.final]
    for save in saves:
        before = [p for p in spans if p.attempt == save.attempt and p.ts <= save.start_ts]
        assert before and before[-1].next_save_ts is not None
        assert before[-1].next_save_ts <= save.start_ts + 1e-6, save
    first_own = min(e.start_ts for e in saves if e.attempt == "2")
    restored = [p for p in spans if p.attempt == "2" and p.ts < first_own]
    totals = sorted(e.total_s for e in saves if e.ts < restored[-1].ts)
    assert len(totals) == 1  # attempt 1's step-30 save, the job's only one so far
    for p in restored:
        cut = live_state([e for e in events if e.ts <= p.ts], now=p.ts, day_start=p.ts)
        assert cut is not None and p.next_save_ts is not None
        assert cut.next_checkpoint_in_s == pytest.approx(
            max(0.0, p.next_save_ts + totals[0] - p.ts), abs=1e-3), p


@pytest.mark.parametrize("reported_after_s", [0.1, 0.4, 3.0])
def test_an_exit_save_never_costs_less_than_the_commit_wait_it_is_weighed_against(
        reported_after_s: float) -> None:
    """A small model's save: 0.1 s in all, 0.05 s blocking; its commit stamped 0.1 to 3 s
    after its start (a loaded host stamps late). Priced on one clock, leaving now (an exit
    save) never looks cheaper than leaving at a checkpoint due within the grace (its commit
    wait): CI once saw 0.1 s against 0.35 s and chose to leave now."""
    m = Maker()
    events = [m(JobSubmitted, 0, tenant="batch"), m(AttemptStarted, 10, attempt="1"),
              m.checkpoint("1", 100, blocking=0.05, total=0.1, cursor=20,
                           at=100 + reported_after_s)]
    s = live_state(events, now=T0 + 120, day_start=DAY)
    assert s is not None and s.exit_save_s is not None and s.commit_wait_s is not None
    assert s.exit_save_s >= s.commit_wait_s
    assert s.exit_save_s == pytest.approx(reported_after_s)
