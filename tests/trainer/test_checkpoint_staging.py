"""Overlapped staging (`overlap_staging`): the copy leaves the caller's thread, the
barrier proves the snapshot, and the blocking breakdown. Real DCP saves into real files,
bitwise comparisons; the staging copy is held back (an Event in front of `_Stager.copy`)
where a test needs it still running.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

import airflow_ett.trainer.checkpoint as ckpt
import airflow_ett.trainer.checkpoint.staging as ckpt_staging
from airflow_ett.trainer.checkpoint import COMMIT_MARKER, CheckpointError, CheckpointManager
from tests.trainer.test_checkpoint import Job, assert_bitwise

ROOT = Path(__file__).resolve().parents[2]




@pytest.fixture
def held_copy(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[str]]]:
    """Holds every staging copy until the Event is set; lists the threads that copied."""
    release = threading.Event()
    threads: list[str] = []
    real = ckpt_staging._Stager.copy

    def held(copies: list[Any], breakdown: ckpt.StagingBreakdown) -> None:
        threads.append(threading.current_thread().name)
        assert release.wait(10), "test never released the copy"
        real(copies, breakdown)

    monkeypatch.setattr(ckpt_staging._Stager, "copy", staticmethod(held))
    yield release, threads
    release.set()


def restored_snapshot(manager: CheckpointManager, step: int) -> dict[str, torch.Tensor]:
    probe = Job(seed=7)
    probe.train(1)
    state = probe.state()
    dcp_load(state, checkpoint_id=manager.directory / ckpt.step_dir_name(step),
             no_dist=True)
    return probe.snapshot()


def test_overlapped_save_returns_before_the_copy_and_holds_the_state_at_save(
    manager_factory: Callable[..., CheckpointManager],
    held_copy: tuple[threading.Event, list[str]],
) -> None:
    release, threads = held_copy
    job = Job()
    job.train(3)
    want = job.snapshot()
    manager = manager_factory(overlap_staging=True)
    result = manager.save(3, job.state(), {"step": 3})
    assert threads == ["ett-staging_0"]  # the copy runs off the caller's thread...
    assert manager.staging_pending
    assert not release.is_set()  # ...and save() returned while it was still held
    assert result.total_s is None
    threading.Timer(0.2, release.set).start()
    waited = manager.wait_staged()
    assert waited >= 0.15  # the barrier waited for the held copy
    assert manager.wait_staged() == 0.0  # passed: nothing pending any more
    assert not manager.staging_pending
    job.train(5)  # modifying the state after the barrier is allowed
    done = manager.wait(timeout=10)
    assert done is not None and done.step == 3
    assert done.blocking_s == pytest.approx(result.blocking_s + waited)
    marker = ckpt.read_marker(done.path)
    assert marker.blocking_s == pytest.approx(done.blocking_s)
    assert_bitwise(restored_snapshot(manager, 3), want)
    assert manager.last_staging.barrier_s == waited
    assert not manager.last_staging.copy_on_caller


def test_overlapped_saves_in_a_training_loop_restore_bitwise(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    """The loop shape the barrier is for: save, then the barrier before the next step."""
    job = Job()
    manager = manager_factory(overlap_staging=True, keep_last=0)
    wanted: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(1, 6):
        job.train(1)
        wanted[step] = job.snapshot()
        manager.save(step, job.state(), {"step": step})
        manager.wait_staged()
    manager.wait()
    for step, want in wanted.items():
        assert_bitwise(restored_snapshot(manager, step), want)


def test_a_state_modified_before_the_barrier_fails_the_save(
    manager_factory: Callable[..., CheckpointManager],
    held_copy: tuple[threading.Event, list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    release, _ = held_copy
    job = Job()
    job.train(2)
    manager = manager_factory(overlap_staging=True)
    manager.save(2, job.state(), {})
    job.train(1)  # the optimizer steps while the copy has not been made: torn snapshot
    release.set()
    with caplog.at_level(logging.ERROR, logger=ckpt.__name__):
        manager.wait_staged()
    assert "modified while being staged" in caplog.text
    with pytest.raises(CheckpointError, match=r"model/0\.weight.*modified while being staged"):
        manager.wait(timeout=10)
    assert manager.latest() is None
    assert [p.name for p in manager.directory.iterdir()] == []  # the temp dir is gone


def test_every_collecting_call_passes_the_barrier_first(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    """Without an explicit wait_staged(), the next save (and close) check and commit."""
    job = Job()
    job.train(1)
    first = job.snapshot()
    manager = manager_factory(overlap_staging=True, keep_last=0)
    manager.save(1, job.state(), {})
    second_result = manager.save(1 + 1, job.state(), {})  # unchanged state: commits both
    assert second_result.step == 2
    manager.close()
    assert [p.name for p in sorted(manager.directory.iterdir())] == [
        "step-0000000001", "step-0000000002"]
    assert_bitwise(restored_snapshot(manager, 1), first)


def test_a_program_that_ends_before_the_barrier_commits_nothing(tmp_path: Path) -> None:
    """Nobody vouched for the copy: the write may finish, the commit must not happen, and
    the process must still exit (the background thread gives up once main has ended)."""
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        from airflow_ett.trainer.checkpoint import CheckpointManager
        m = CheckpointManager({str(tmp_path / "ckpt")!r}, overlap_staging=True)
        m.save(1, {{"w": torch.arange(1000.0)}}, {{}})
        print("saved", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "saved" in proc.stdout
    assert not list((tmp_path / "ckpt").glob(f"*/{COMMIT_MARKER}"))
    assert "ended before the staging barrier" in proc.stderr


def test_breakdown_counts_buffers_tensors_and_bytes(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    job = Job()
    job.train(1)
    manager = manager_factory()
    result = manager.save(1, job.state(), {})
    first = manager.last_staging
    # 4 parameters, and Adam's exp_avg, exp_avg_sq and step for each
    assert first.tensors == 4 * 4 and first.new_buffers == first.tensors
    # (the snapshot holds the parameters and Adam's state, step counters included)
    want_bytes = sum(t.numel() * t.element_size() for t in job.snapshot().values())
    assert first.bytes == want_bytes
    assert first.copy_on_caller and first.copy_s > 0 and first.barrier_s == 0.0
    named = (first.wait_previous_s + first.state_dict_s + first.alloc_s + first.leaves_s
             + first.copy_s)
    assert named <= result.blocking_s
    manager.save(2, job.state(), {})
    second = manager.last_staging
    assert second.new_buffers == 0 and second.alloc_s == 0.0  # reused
    assert second.wait_previous_s > 0  # it collected the first save


def test_overlap_needs_async(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overlap_staging=True needs async_save=True"):
        CheckpointManager(tmp_path, async_save=False, overlap_staging=True)
