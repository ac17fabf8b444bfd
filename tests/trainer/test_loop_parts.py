"""The parts `Trainer._loop` delegates to, each on its own: the checkpoint-interval policy,
the step logger, the fault injector's flush before a fault, and the exit codes' module
(cheap enough for `python -m airflow_ett.trainer` to import before anything else)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.checkpoint_math import daly_interval, interval_floor
from airflow_ett.trainer.checkpoint_interval import IntervalPolicy
from airflow_ett.trainer.config import FaultSpec, config_from_mapping
from airflow_ett.trainer.faults import FAULT_KINDS, FaultInjector, FaultKind, InjectedFault
from airflow_ett.trainer.save_cost import MeasuredSave

# -- the interval policy -----------------------------------------------------------------


def test_every_n_steps_counts_from_the_last_save() -> None:
    policy = IntervalPolicy(steps=3)
    policy.start(10, now=0.0)
    assert [policy.due(s, 1e9) for s in (11, 12, 13)] == [False, False, True]
    policy.saved(13, now=5.0)
    assert not policy.due(15, 1e9) and policy.due(16, 0.0)


def test_every_n_seconds_counts_from_the_last_save() -> None:
    policy = IntervalPolicy(seconds=30.0)
    policy.start(0, now=100.0)
    assert not policy.due(999, 129.9) and policy.due(1, 130.0)
    policy.saved(1, now=131.0)
    assert not policy.due(2, 160.0) and policy.due(2, 161.0)


def test_the_next_save_is_announced_by_time_or_by_steps_at_the_step_rate() -> None:
    by_time = IntervalPolicy(seconds=30.0)
    by_time.start(0, now=100.0)
    assert by_time.next_save_ts(5, 110.0, 0.5, last_step=1000) == 130.0
    assert by_time.next_save_ts(5, 140.0, 0.5, last_step=1000) == 140.0  # overdue: now
    by_time.saved(60, now=131.0)
    assert by_time.next_save_ts(61, 132.0, None, last_step=1000) == 161.0  # no rate needed
    by_steps = IntervalPolicy(steps=100)
    by_steps.start(0, now=0.0)
    assert by_steps.next_save_ts(40, 50.0, 0.5, last_step=1000) == 50.0 + 60 * 0.5
    assert by_steps.next_save_ts(40, 50.0, None, last_step=1000) is None  # no rate yet


def test_the_final_save_is_announced_when_it_comes_before_the_periodic_one() -> None:
    by_time = IntervalPolicy(seconds=3600.0)
    by_time.start(0, now=0.0)
    assert by_time.next_save_ts(90, 100.0, 2.0, last_step=100) == 100.0 + 10 * 2.0
    by_steps = IntervalPolicy(steps=50)
    by_steps.start(60, now=0.0)  # next periodic at 110, past the last step
    assert by_steps.next_save_ts(70, 10.0, 1.0, last_step=100) == 10.0 + 30
    assert by_steps.next_save_ts(100, 10.0, 1.0, last_step=100) == 10.0  # the end: now
    assert IntervalPolicy().next_save_ts(0, 5.0, 1.0, last_step=3) == 8.0
    assert IntervalPolicy().next_save_ts(0, 5.0, None, last_step=3) is None


@settings(max_examples=200, deadline=None)
@given(every=st.integers(1, 50), start=st.integers(0, 100), done=st.integers(0, 200),
       step_s=st.floats(0.01, 10.0))
def test_a_step_interval_announces_the_time_its_due_step_is_reached(
        every: int, start: int, done: int, step_s: float) -> None:
    """At a steady rate, the announced time is when `due` first says yes (or the end)."""
    last = start + 150
    policy = IntervalPolicy(steps=every)
    policy.start(start, now=0.0)
    step = min(start + done % every, last)
    said = policy.next_save_ts(step, 1000.0, step_s, last_step=last)
    due_step = next((s for s in range(step, last) if policy.due(s, 0.0)), last)
    assert said == pytest.approx(1000.0 + (due_step - step) * step_s)


def test_no_interval_is_never_due() -> None:
    policy = IntervalPolicy()
    policy.start(0, now=0.0)
    assert not policy.due(10**9, 1e12)


def test_auto_chooses_at_start_and_again_after_each_save_that_blocked(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def history() -> tuple[float, int, float | None]:
        calls.append(1)
        return 36_000.0, 10, 2.0  # MTBF 3600 s, CSBT 2 s from earlier attempts

    policy = IntervalPolicy(history=history)
    caplog.set_level(logging.INFO, logger="airflow_ett.trainer")
    policy.start(0, now=0.0)
    first = policy.seconds
    assert first is not None and 30.0 < first < 3600.0 and len(calls) == 1
    assert "checkpoint interval auto:" in caplog.text and "CSBT 2.000s" in caplog.text
    policy.saved(5, now=10.0)
    policy.measured(MeasuredSave(5, 0.0, None, 0, 0.1))  # nothing measured: keep the choice
    assert policy.seconds == first and len(calls) == 1
    policy.saved(6, now=20.0)  # a cheaper save (blocking + slowdown): a shorter interval
    policy.measured(MeasuredSave(6, 0.2, 0.3, 4, 1.0))
    # the history is read once an attempt (the choice after a save runs on the loop)
    assert policy.seconds is not None and policy.seconds < first and len(calls) == 1
    assert "cost 0.500s = blocking 0.200s + slowdown 0.300s" in caplog.text
    # (20 + s) - 20 can round below s: the due time is checked a microsecond after it
    assert not policy.due(7, 20.0 + policy.seconds - 0.01)
    assert policy.due(7, 20.0 + policy.seconds + 1e-6)


def test_auto_is_bounded_below_by_what_a_save_costs_not_by_30_seconds() -> None:
    # nothing trained yet, no CSBT on record: an unmeasured save is taken at 1 s
    fresh = IntervalPolicy(history=lambda: (0.0, 0, None))
    fresh.start(0, now=0.0)
    assert fresh.seconds == interval_floor(1.0)
    # 60 failure-free seconds so far (the MTBF estimate, read at start)
    policy = IntervalPolicy(history=lambda: (60.0, 0, None))
    policy.start(0, now=0.0)
    cheap = MeasuredSave(step=40, blocking_s=0.004, slowdown_s=0.3, steps=6, duration_s=0.8)
    policy.measured(cheap)
    assert policy.seconds == pytest.approx(daly_interval(cheap.cost_s, 60.0), rel=1e-3)
    assert interval_floor(cheap.cost_s, 0.8) <= policy.seconds < 30.0
    # one dear save moves the typical cost by half (the median of two) ...
    dear = MeasuredSave(step=80, blocking_s=2.0, slowdown_s=4.0, steps=30, duration_s=9.0)
    policy.measured(dear)
    assert cheap.cost_s < policy.measures[-1].cost_s
    assert len(policy.measures) == 2
    # ... saves that stay dear set it: the floor, a tenth of the time between saves
    for _ in range(3):
        policy.measured(dear)
    assert policy.seconds == interval_floor(6.0, 9.0) == pytest.approx(60.0)


def test_from_config_reads_each_form_of_checkpoint_interval() -> None:
    def history() -> tuple[float, int, float | None]:
        return 0.0, 0, None

    def policy(value: object) -> IntervalPolicy:
        cfg = config_from_mapping({"model": "dlrm_tiny", "steps": 10, "checkpoint_dir": "c",
                                   "checkpoint_interval": value})
        return IntervalPolicy.from_config(cfg, history)

    assert (policy(7).steps, policy(7).seconds, policy(7).history) == (7, None, None)
    assert (policy("2.5s").steps, policy("2.5s").seconds) == (None, 2.5)
    auto = policy("auto")
    assert auto.history is history and auto.steps is None
    auto.start(0, now=0.0)
    assert auto.seconds == interval_floor(1.0)  # nothing trained yet: an unmeasured save's floor


# -- the step logger ---------------------------------------------------------------------


def test_step_logger_logs_every_interval_and_the_last_step(
        caplog: pytest.LogCaptureFixture) -> None:
    from airflow_ett.trainer.progress import StepLogger

    steps = StepLogger(total_steps=10, samples_per_step=64, every_s=5.0, since=0.0)
    with caplog.at_level(logging.INFO, logger="airflow_ett.trainer"):
        for step, now in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (5, 6.0), (10, 7.0)]:
            steps.step_done(step, 0.5, now)
    lines = [r.getMessage() for r in caplog.records]
    # 4 steps in 5 s: 51 samples/s, 6 steps left at 1.25 s each; then 2 steps in 2 s
    assert lines == ["step 4/10  loss 0.5000  51 samples/s  ETA 8s",
                     "step 10/10  loss 0.5000  64 samples/s  ETA 0s"]


# -- the fault injector ------------------------------------------------------------------


def test_progress_is_flushed_just_before_a_fault_of_this_attempt_only() -> None:
    flushed: list[float] = []
    faults = (FaultSpec("raise", 3, attempt=1), FaultSpec("raise", 2, attempt=2))
    injector = FaultInjector(faults, 1, before_fault=flushed.append)
    injector.after_step(2, 20.0)  # attempt 2's fault: nothing happens here
    assert flushed == []
    with pytest.raises(InjectedFault, match="after step 3 \\(attempt 1\\)"):
        injector.after_step(3, 30.0)
    assert flushed == [30.0]


def test_fault_kinds_are_the_literal_type() -> None:
    assert FAULT_KINDS == get_args(FaultKind) == ("raise", "kill", "hang", "sigterm",
                                                   "slow_save", "slow_steps")


def test_the_exit_codes_module_imports_the_stdlib_alone() -> None:
    # __main__ imports it before parsing arguments: it must not start torch (whose import
    # is part of trainer_init, measured from the process start) nor the trainer's config.
    code = ("import sys, airflow_ett.protocol.exits as f; "
            "print(f.EXIT_BAD_CONFIG, sorted(m for m in ('torch', 'airflow', "
            "'airflow_ett.trainer.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "78 []"


def test_a_slow_save_fault_delays_only_its_save_and_fails_nothing() -> None:
    from airflow_ett.trainer.config import FaultSpec
    from airflow_ett.trainer.faults import FaultInjector

    injector = FaultInjector((FaultSpec("slow_save", 4, 1, 2.5), FaultSpec("slow_save", 6, 2)),
                             attempt_number=1)
    assert [injector.save_delay_s(step) for step in (3, 4, 5, 6)] == [0.0, 2.5, 0.0, 0.0]
    injector.after_step(4, 0.0)  # nothing happens after the step: it acted in the save


def test_a_slow_steps_fault_slows_every_step_after_its_step_on_its_rank_only() -> None:
    spec = FaultSpec("slow_steps", at_step=3, seconds=0.05, rank=1)
    slowed = FaultInjector((spec,), 1, rank=1)
    assert [slowed.step_delay_s(s) for s in range(1, 7)] == [0, 0, 0, 0.05, 0.05, 0.05]
    assert FaultInjector((spec,), 1, rank=0).step_delay_s(5) == 0
    slowed.after_step(3, 0.0)  # acts in the step, never after it
    assert config_from_mapping({"model": "dlrm_tiny", "steps": 10, "checkpoint_dir": "c",
                                "faults": [{"kind": "slow_steps", "at_step": 3,
                                            "seconds": 0.05}]}).faults == (
        FaultSpec("slow_steps", 3, None, 0.05, None),)


def test_the_rank_clock_reports_each_step_once_its_own_time_and_its_wait(
        tmp_path: Path) -> None:
    from airflow_ett.emit import Emitter
    from airflow_ett.emit.sinks import JsonlSink
    from airflow_ett.ett.events import RankSteps, read_events
    from airflow_ett.trainer.rank_steps import RankClock, probe_group

    assert probe_group() is None  # one process: no other rank to wait for
    em = Emitter("j", "1", sink=JsonlSink(tmp_path / "e.jsonl"), replay_on_start=False)
    clock = RankClock(em, span_s=1.0)
    t = 1_780_000_000.0
    for step in range(1, 8):  # 0.4 s steps, 0.1 s of each waiting: a report per 3 steps
        clock.add(step, t, t + 0.4, 0.1)
        t += 0.4
    clock.add(8, t, t + 0.4, 5.0)  # a wait longer than the step is the step
    clock.flush(t + 0.4)
    clock.flush()  # nothing left: no empty report
    assert em.close()
    got = [e for e in read_events(str(tmp_path / "e.jsonl")).events if isinstance(e, RankSteps)]
    assert [(e.step_start, e.step_end) for e in got] == [(0, 3), (3, 6), (6, 8)]
    assert [round(e.busy_s, 6) for e in got] == [0.9, 0.9, 0.3]
    assert [round(e.wait_s, 6) for e in got] == [0.3, 0.3, 0.5]
    assert got[0].start_ts == 1_780_000_000.0 and got[-1].ts == pytest.approx(t + 0.4)
