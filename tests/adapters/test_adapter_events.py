"""What the adapters report, against what it means: per-step reports coalesced into
progress spans attribute exactly as a hand-written stream of one event per step; the
job's exit paths give the protocol's exit codes and exit record."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.adapters.job import EttJob
from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    Event,
    JobEnded,
    JobSubmitted,
    Progress,
)
from airflow_ett.protocol.env import TrainerEnv

T0 = 1_800_000_000.0
JOB, ATTEMPT = "d/r", "1.1"


class Recorder:
    """Stands in for the emitter: keeps the progress spans it is handed."""

    def __init__(self) -> None:
        self.spans: list[tuple[Any, ...]] = []

    def progress(self, *args: Any) -> None:
        self.spans.append(args)

    def flush(self, timeout: float | None = None) -> bool:
        return True


def _frame(progress: list[Progress], end: float) -> list[Event]:
    return [JobSubmitted(id="s", job=JOB, ts=T0 - 10),
            AttemptStarted(id="a", job=JOB, ts=T0 - 5, attempt=ATTEMPT),
            *progress,
            AttemptEnded(id="e", job=JOB, ts=end + 0.5, attempt=ATTEMPT, status="success"),
            JobEnded(id="j", job=JOB, ts=end + 1.0, status="success")]


def _progress(i: int, s0: int, s1: int, c0: int, c1: int, t0: float, t1: float) -> Progress:
    return Progress(id=f"p{i}", job=JOB, ts=t1, attempt=ATTEMPT, start_ts=t0, step_start=s0,
                    step_end=s1, cursor_start=c0, cursor_end=c1)


@settings(max_examples=80, deadline=None)
@given(resume=st.integers(0, 30), per_step=st.integers(1, 8), marked=st.booleans(),
       steps=st.lists(st.tuples(st.floats(0.0, 2.0), st.floats(0.001, 1.5)), min_size=1,
                      max_size=40))
def test_coalesced_spans_attribute_as_one_event_per_step(
        resume: int, per_step: int, marked: bool, steps: list[tuple[float, float]]) -> None:
    recorder = Recorder()
    job = EttJob(TrainerEnv(JOB, ATTEMPT), emitter=recorder)  # type: ignore[arg-type]
    job.resumed(resume, resume * per_step)
    hand: list[Progress] = []
    t, last_end = T0, None
    for i, (gap, duration) in enumerate(steps):
        t += gap
        begin = t if marked else last_end  # unmarked: a step starts where the last ended
        if marked:
            job.begin_step(t)
        t += duration
        step = resume + i + 1
        job.step(step, step * per_step, ts=t)
        if begin is not None:  # the first unmarked step has no known start: start-up
            hand.append(_progress(i, step - 1, step, (step - 1) * per_step, step * per_step,
                                  begin, t))
        last_end = t
    job.flush()
    spans = [_progress(100 + i, s0, s1, c0, c1, a, b)
             for i, (s0, s1, c0, c1, a, b, _loss) in enumerate(recorder.spans)]
    assert len(spans) <= len(hand)  # coalesced
    ours = attribute_job(_frame(spans, t)).summary()
    theirs = attribute_job(_frame(hand, t)).summary()
    assert ours.effective_s == pytest.approx(theirs.effective_s, abs=1e-5)
    for name, seconds in theirs.components.items():
        assert ours.components[name] == pytest.approx(seconds, abs=1e-5), name
    assert ours.tts_s == pytest.approx(theirs.tts_s, abs=1e-5)


def _run(tmp_path: Path, body: str
         ) -> tuple[int, str, dict[str, Any], list[dict[str, Any]]]:
    """A script using `job()` in a child, as the task runs it; its exit code, exit record
    and events."""
    script = tmp_path / "train.py"
    script.write_text("from airflow_ett.adapters import job, Refused\n"
                      + textwrap.dedent(body))
    exits, events = tmp_path / "exits", tmp_path / "events.jsonl"
    exits.mkdir()
    env = {"ETT_JOB_ID": JOB, "ETT_ATTEMPT_ID": ATTEMPT, "ETT_EXIT_DIR": str(exits),
           "ETT_EVENTS_FILE": str(events), "ETT_JOB_DIR": str(tmp_path)}
    import os

    done = subprocess.run([sys.executable, str(script)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120, check=False)
    record = json.loads((exits / "rank0.json").read_text())
    lines = [json.loads(line) for line in events.read_text().splitlines()] \
        if events.exists() else []
    return done.returncode, done.stderr, record, lines


@pytest.mark.parametrize(("body", "code", "cause", "said"), [
    ("with job() as ett:\n    ett.step(1)\n", 0, None, ""),
    ("with job() as ett:\n    raise RuntimeError('boom')\n", 1, "application",
     "RuntimeError: boom"),
    ("with job() as ett:\n    raise Refused('data: no such file x.tsv')\n", 78,
     "application", "airflow-ett: refused: data: no such file x.tsv"),
    ("import os, signal\nwith job() as ett:\n    os.kill(os.getpid(), signal.SIGTERM)\n"
     "    assert ett.should_leave and ett.should_save\n", 75, "preemption",
     "leaving preempted (exit 75): SIGTERM: checkpointed and left"),
])
def test_the_block_exits_as_the_protocol_says(tmp_path: Path, body: str, code: int,
                                              cause: str | None, said: str) -> None:
    got, stderr, record, events = _run(tmp_path, body)
    assert got == code and said in stderr, stderr
    assert record["state"] == "exited" and record["exit_code"] == code
    assert record["reported_cause"] == cause  # it reported its own end
    (ended,) = [e for e in events if e["type"] == "attempt_ended"]
    assert ended.get("cause") == cause and ended["exit_code"] == code
    assert [e["phase"] for e in events if e["type"] == "phase_started"] == ["trainer_init"]


def test_an_exit_of_its_own_is_on_record_and_left_to_the_task(tmp_path: Path) -> None:
    """`sys.exit(3)` in the block: not reported by the trainer (the task reports it from
    the exit code), but the exit record says it exited, so it is no silent death."""
    got, _, record, events = _run(tmp_path, "import sys\nwith job():\n    sys.exit(3)\n")
    assert got == 3 and record["state"] == "exited" and record["exit_code"] == 3
    assert "reported_cause" not in record
    assert not [e for e in events if e["type"] == "attempt_ended"]


def test_outside_a_train_task_the_block_records_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("from airflow_ett.adapters import job\n"
                      "with job() as ett:\n    ett.step(1)\n    print(ett.checkpoint_dir)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, check=False, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr


def test_a_malformed_protocol_variable_is_one_line_and_exit_78(tmp_path: Path) -> None:
    import os

    done = subprocess.run([sys.executable, "-c", "from airflow_ett.adapters import job\n"
                           "with job():\n    pass\n"], capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "ETT_GRACE_S": "soon"})
    assert done.returncode == 78
    assert done.stderr.strip() == ("airflow-ett: ETT_GRACE_S = 'soon': not a number of "
                                   "seconds in [0, 86400]")
