"""`CompileCachePrewarmOperator.execute`: a miss compiles and saves, a hit only checks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_ett.ett.events import PhaseEnded, PhaseStarted
from airflow_ett.operators import CompileCachePrewarmOperator, JobConfigError
from tests.operators.conftest import TINY, context, execute_in_thread, started_trainer, store_events
from tests.proc_tree import TreeRecorder, still_running

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_a_miss_compiles_and_saves_then_a_hit_only_checks(
        ett_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # A host with no compile output of earlier processes: warmth can only come from the
    # cache under test.
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "tmp").mkdir()
    op = CompileCachePrewarmOperator(task_id="prewarm",
                                     trainer_config={**TINY, "compile": True})
    first = op.execute(context("warm"))
    assert (first["hit"], first["saved"], first["exit_code"]) == (False, True, 0)
    cache_dir = ett_home / "ett_work" / "compile_cache"
    assert any(cache_dir.iterdir())

    capsys.readouterr()
    second = op.execute(context("warm2"))
    assert second == {"hit": True, "key": first["key"]}
    said = capsys.readouterr().out  # the task log (structlog to stdout outside a runner)
    assert "compile cache hit" in said and "nothing to compile" in said

    # Each run is one job-level cache_prewarm phase (no trainer attempt is recorded).
    for job in ("ett_test__warm", "ett_test__warm2"):
        events = store_events(job)
        assert [(type(e), e.phase, e.attempt) for e in events] == [
            (PhaseStarted, "cache_prewarm", None), (PhaseEnded, "cache_prewarm", None)]


def test_nothing_to_prewarm_when_compile_is_off(ett_home: Path) -> None:
    op = CompileCachePrewarmOperator(task_id="prewarm", trainer_config=TINY)
    assert op.execute(context("off")) == {"hit": None, "key": None}


def test_a_bad_timeout_is_refused_at_parse_time() -> None:
    with pytest.raises(JobConfigError, match="timeout_s = 0"):
        CompileCachePrewarmOperator(task_id="p", trainer_config=TINY, timeout_s=0)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"timeout_s": float("inf")}, "timeout_s = inf: must be a finite number > 0"),
    ({"timeout_s": float("nan")}, "timeout_s = nan"),
    ({"timeout_s": "600"}, "timeout_s = '600': must be a number"),
    ({"timeout_s": 1e308}, "timeout_s = 1e\\+308: must be > 0 and <= 86400.0"),
    ({"nproc": 100_000}, "nproc = 100000: must be >= 1 and <= 1024"),
    ({"record": "no"}, "record = 'no': must be true or false"),
    ({"nproc": 2.0}, "nproc = 2.0: must be an integer"),
    ({"queue": ["cpu"]}, "queue = \\['cpu'\\]: must be a string"),
    ({"trainer_config": {**TINY, "compile": "no"}}, "compile = 'no'"),
])
def test_constructor_arguments_are_read_typed(kwargs: dict[str, object], named: str) -> None:
    args: dict[str, object] = {"task_id": "p", "trainer_config": TINY, **kwargs}
    with pytest.raises(JobConfigError, match=named):
        CompileCachePrewarmOperator(**args)  # type: ignore[arg-type]


def test_on_kill_ends_the_prewarm_compile_and_everything_under_it(
        ett_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed prewarm task used to leave its compile running (no on_kill): on a fleet
    that is a process holding a GPU that Airflow believes free."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "tmp").mkdir()
    op = CompileCachePrewarmOperator(task_id="prewarm",
                                     trainer_config={**TINY, "compile": True})
    thread, outcome = execute_in_thread(op, "killed_prewarm")
    with TreeRecorder() as recorder:
        thread.start()
        try:
            deadline = time.monotonic() + 120
            recorder.watch(started_trainer(op, thread, outcome, deadline))
            time.sleep(3.0)  # inside the trainer's start or its compile
            op.on_kill()
            left = still_running(recorder.starts)
        finally:
            thread.join(60)
    assert not thread.is_alive()
    assert recorder.starts, "the prewarm trainer was never seen"
    assert left == {}, left
    assert outcome["result"]["saved"] is False, outcome
    assert outcome["result"]["exit_code"] != 0, outcome
