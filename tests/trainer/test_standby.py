"""The warm standby (trainer/standby.py): the go message, the clipping of a spare's
warm-up phases, and the spare as a real process under the real launcher: told to go
(early or late), not needed, or gone before it was needed; the job's final weights are
those of a run without failures either way."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import AttemptStarted, PhaseEnded, PhaseStarted, read_events
from airflow_ett.protocol.exits import EXIT_APPLICATION, EXIT_OK
from airflow_ett.trainer.config import load_config
from airflow_ett.trainer.final_state import load_final_state
from airflow_ett.trainer.launcher import AttemptOutcome, run_attempts
from airflow_ett.trainer.standby import (
    Go,
    GoListener,
    GoMessageError,
    Recorded,
    clip_to,
    parse_go,
)
from tests.trainer.test_trainer_e2e import TIMEOUT, operator_says, run_attempt, write_config

# -- the go message and the clipping (pure) -------------------------------------------


def test_a_go_line_round_trips() -> None:
    go = Go(1796184852.615, {"ETT_FIRST_STEP_FILE": "/tmp/x y/first-step"})
    assert parse_go(go.line()) == go
    assert parse_go("go 12.5\n") == Go(12.5, {})
    assert parse_go("") is None  # end of file: the launcher let the spare go


@pytest.mark.parametrize(("line", "names"), [
    ("stop 12\n", "'stop 12'"),
    ("go soon\n", "go time = 'soon'"),
    ("go -3\n", "go time = '-3'"),
    ("go nan\n", "go time = 'nan'"),
    ("go 12 {oops\n", "go env = '{oops'"),
    ('go 12 ["A"]\n', "must be an object of strings"),
    ('go 12 {"A": 1}\n', "must be an object of strings"),
])
def test_a_bad_go_line_names_what_is_wrong(line: str, names: str) -> None:
    with pytest.raises(GoMessageError, match=names.replace("[", r"\[").replace("{", r"\{")):
        parse_go(line)


intervals = st.lists(
    st.tuples(st.floats(0, 100), st.floats(0, 50)).map(lambda p: (p[0], p[0] + p[1])),
    max_size=8)


@given(intervals, st.floats(0, 160))
def test_clipping_keeps_exactly_the_time_after_go(spans: list[tuple[float, float]],
                                                  go: float) -> None:
    recorded = [Recorded(f"p{i}", s, e) for i, (s, e) in enumerate(spans)]
    clipped = clip_to(recorded, go)
    assert all(r.start >= go and r.end > r.start - 1e-9 for r in clipped)
    # what is kept of each phase is its part after go, no more, no less
    kept = {r.name: r.end - r.start for r in clipped}
    for r in recorded:
        assert kept.get(r.name, 0.0) == pytest.approx(max(0.0, r.end - max(r.start, go)))
    assert [r.name for r in clipped] == [r.name for r in recorded if r.end > go]


# -- the spare as a process ---------------------------------------------------------

def _spare(config: Path, number: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_ett.trainer", "--config", str(config), "--job-id",
         "j", "--attempt-number", str(number), "--standby"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=config.parent)


def _events(config: Path) -> list[Any]:
    path = config.parent / "events.jsonl"
    return read_events(str(path)).events if path.exists() else []


@pytest.mark.integration
@pytest.mark.slow
def test_a_spare_not_needed_exits_at_end_of_file_and_says_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.json")
    proc = _spare(config, 2)
    out, _ = proc.communicate("", timeout=TIMEOUT)  # closes its standard input
    assert proc.returncode == EXIT_OK, out
    assert "warm standby not needed" in out
    assert _events(config) == []


@pytest.mark.integration
@pytest.mark.slow
def test_a_spare_told_to_go_at_once_starts_then_and_reports_only_what_came_after(
        tmp_path: Path) -> None:
    """Go before its warm-up ended: the attempt starts at the go time, its warm-up
    phases count from then on (the job waited for them), and with no checkpoint yet it
    trains from scratch to the weights of a plain process."""
    config = write_config(tmp_path / "spare" / "job.json", steps=20)
    proc = _spare(config, 1)
    go_ts = time.time()
    out, _ = proc.communicate(Go(go_ts, {}).line(), timeout=TIMEOUT)
    assert proc.returncode == EXIT_OK, out
    events = _events(config)
    (started,) = [e for e in events if isinstance(e, AttemptStarted)]
    assert started.ts == pytest.approx(go_ts, abs=1e-6)
    phases = [e for e in events if isinstance(e, PhaseStarted | PhaseEnded)]
    assert phases and min(e.ts for e in phases) >= go_ts - 1e-6
    assert {"trainer_init", "model_creation"} & {e.phase for e in phases}

    plain = write_config(tmp_path / "plain" / "job.json", steps=20)
    assert run_attempt(plain, "j", 1).returncode == EXIT_OK
    _same_weights(plain, config)


def _same_weights(want_config: Path, got_config: Path) -> None:
    want = load_final_state(load_config(want_config))
    got = load_final_state(load_config(got_config))
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), f"{name} differs"


def _run(config: Path, job: str, *, attempts: int, lines: list[str] | None = None,
         on_line: Any = None) -> list[AttemptOutcome]:
    operator_says(config, job, what="job_submitted", tenant="t", model="dlrm_tiny")

    def report(outcome: AttemptOutcome) -> None:  # a SIGKILLed attempt said nothing
        operator_says(config, job, what="attempt_ended", attempt=outcome.attempt_id,
                      status=outcome.exit_class.status, cause=outcome.exit_class.cause,
                      exit_code=outcome.exit_code, ts=outcome.ended)

    seen = lines if lines is not None else []

    def output(line: str) -> None:
        seen.append(line)
        if on_line is not None:
            on_line(line)

    result = run_attempts(config, job, max_attempts=attempts, cwd=config.parent,
                          report_unreported=report, timeout=TIMEOUT, on_output=output,
                          warm_standby=True)
    operator_says(config, job, what="job_ended", status="success")
    return result.attempts


@pytest.mark.integration
@pytest.mark.slow
def test_restarts_on_warm_spares_end_bitwise_equal_to_a_clean_run(tmp_path: Path) -> None:
    """Two failures, each attempt after them a spare that restores the newest checkpoint:
    an exception after two checkpoints, a SIGKILL after four. Each spare starts once the
    running attempt has stepped (the launcher looks once a second: the faults come
    seconds after the first step). A spare with no checkpoint to restore: the go-at-once
    test above."""
    clean = write_config(tmp_path / "clean" / "job.json", steps=60)
    assert run_attempt(clean, "clean", 1).returncode == EXIT_OK
    faulty = write_config(tmp_path / "faulty" / "job.json", steps=60, step_sleep_s=0.1,
                          faults=[{"kind": "raise", "at_step": 25, "attempt": 1},
                                  {"kind": "kill", "at_step": 45, "attempt": 2}])
    lines: list[str] = []
    attempts = _run(faulty, "faulty", attempts=3, lines=lines)
    assert [a.exit_code for a in attempts] == [EXIT_APPLICATION, -9, EXIT_OK], lines[-40:]
    assert sum("warm standby ready" in line for line in lines) == 2
    _same_weights(clean, faulty)

    events = _events(faulty)
    starts = {e.attempt: e.ts for e in events if isinstance(e, AttemptStarted)}
    assert sorted(starts) == ["1", "2", "3"]
    for attempt in ("2", "3"):  # nothing of a spare's reported before it was the attempt
        own = [e for e in events if isinstance(e, PhaseStarted | PhaseEnded)
               and e.attempt == attempt]
        assert own and min(e.ts for e in own) >= starts[attempt] - 1e-6, attempt
    d = attribute_job(events).to_dict()
    assert d["nof"]["total"] == 2 and len(d["ttr_s"]) == 2
    assert sum(d["components"].values()) == pytest.approx(d["e2e_s"], abs=1e-5)


@pytest.mark.integration
@pytest.mark.slow
def test_a_spare_gone_before_it_is_needed_means_a_cold_restart(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.json", steps=200, step_sleep_s=0.05,
                          faults=[{"kind": "raise", "at_step": 150, "attempt": 1}])
    messages: list[str] = []

    def kill_the_spare(message: str) -> None:
        messages.append(message)
        if "warm standby for attempt 2 started" in message:
            for child in psutil.Process().children(recursive=True):
                if "--standby" in child.cmdline():
                    child.kill()

    handler = _OnMessage(kill_the_spare)
    launcher_log = logging.getLogger("airflow_ett.trainer")
    launcher_log.addHandler(handler)
    launcher_log.setLevel(logging.INFO)
    try:
        attempts = _run(config, "gone", attempts=2)
    finally:
        launcher_log.removeHandler(handler)
    assert [a.exit_code for a in attempts] == [EXIT_APPLICATION, EXIT_OK], messages
    assert any("ended before it was needed" in m for m in messages), messages
    assert not any("taken over by its warm standby" in m for m in messages)
    assert len([e for e in _events(config) if isinstance(e, AttemptStarted)]) == 2


class _OnMessage(logging.Handler):
    """Hands each of the launcher's messages (logged in this process) to `act`."""

    def __init__(self, act: Any) -> None:
        super().__init__()
        self.act = act

    def emit(self, record: logging.LogRecord) -> None:
        self.act(record.getMessage())


def test_the_standby_flag_is_refused_with_prewarm_or_under_torchrun(tmp_path: Path) -> None:
    config = write_config(tmp_path / "job.json")
    done = run_attempt(config, "j", 1, "--standby", "--prewarm")
    assert done.returncode == 78 and "--standby" in done.stderr
    done = run_attempt(config, "j", 1, "--standby", env={"WORLD_SIZE": "2"})
    assert done.returncode == 78 and "not under torchrun" in done.stderr
    json.loads(config.read_text())  # the config is untouched


def test_a_go_heard_during_the_warm_up_gives_the_priority_back_at_once() -> None:
    """In a process of its own (nice is the process's to keep): the spare lowered its
    priority; the listener thread hears go while the main thread still works, and every
    thread is back at the old niceness before the warm-up ends."""
    code = textwrap.dedent('''
        import io, os, threading, time
        from airflow_ett.trainer import standby
        before = os.getpriority(os.PRIO_PROCESS, 0)
        standby.lower_priority()
        assert os.getpriority(os.PRIO_PROCESS, 0) == before + standby.STANDBY_NICE
        read_fd, write_fd = os.pipe()
        listener = standby.GoListener(os.fdopen(read_fd))
        os.write(write_fd, standby.Go(time.time(), {"A": "1"}).line().encode())
        deadline = time.monotonic() + 10
        while os.getpriority(os.PRIO_PROCESS, 0) != before:  # the main thread's own
            assert time.monotonic() < deadline, "priority not restored"
            time.sleep(0.01)
        go = listener.wait()
        assert go is not None and go.env == {"A": "1"}
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        assert all(os.getpriority(os.PRIO_PROCESS, t) == before for t in tids)
        print("ok")
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_listener_says_not_needed_at_end_of_file_and_names_a_bad_line() -> None:
    assert GoListener(io.StringIO("")).wait() is None
    with pytest.raises(GoMessageError, match="'later'"):
        GoListener(io.StringIO("go later\n")).wait()
