"""CheckpointManager: exact round trips, atomic commit, fallback past broken checkpoints,
retention, one save in flight, and (slow) two ranks saving while they keep training.

Single-process tests use a tiny module and run in well under a second each; the write is
held back (an Event in front of `dcp.save`) where a test needs the save to be in flight.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

import airflow_ett.trainer.checkpoint as ckpt
import airflow_ett.trainer.checkpoint.commit as ckpt_commit
import airflow_ett.trainer.checkpoint.manager as ckpt_manager
import airflow_ett.trainer.checkpoint.reader as ckpt_reader
from airflow_ett.trainer.checkpoint import (
    COMMIT_MARKER,
    CheckpointError,
    CheckpointManager,
    SaveResult,
)

ROOT = Path(__file__).resolve().parents[2]


# -- helpers -----------------------------------------------------------------------------


class Job:
    """A tiny model with Adam, trained on data derived from the step (deterministic)."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.optim = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.step = 0

    def train(self, steps: int = 1) -> None:
        for _ in range(steps):
            g = torch.Generator().manual_seed(self.step)
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
            nn.functional.mse_loss(self.model(x), y).backward()
            self.optim.step()
            self.optim.zero_grad()
            self.step += 1

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optim": self.optim}

    def snapshot(self) -> dict[str, torch.Tensor]:
        out = {f"model.{k}": v.detach().clone() for k, v in self.model.state_dict().items()}
        for pid, st in self.optim.state_dict()["state"].items():
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    out[f"optim.{pid}.{k}"] = v.detach().clone()
        return out


def rng_extra(step: int) -> dict[str, Any]:
    raw = torch.get_rng_state().numpy().tobytes()
    return {"step": step, "cursor": step * 4, "rng": base64.b64encode(raw).decode("ascii")}


def assert_bitwise(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert torch.equal(got[key], want[key]), key


def data_file(step_dir: Path) -> Path:
    return next(p for p in sorted(step_dir.iterdir()) if p.suffix == ".distcp")


@pytest.fixture
def held_write(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Holds every DCP write until the returned Event is set (the save stays in flight)."""
    release = threading.Event()
    real = ckpt_commit.dcp_save

    def held(*args: Any, **kwargs: Any) -> Any:
        assert release.wait(10), "test never released the write"
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt_commit, "dcp_save", held)
    yield release
    release.set()




# -- exactness ---------------------------------------------------------------------------


def test_async_round_trip_is_bitwise_and_staged(
    manager_factory: Callable[..., CheckpointManager], held_write: threading.Event
) -> None:
    """Training mutates the state right after save() returns, before the write even
    starts: the checkpoint still holds the values at save time (that is the staging)."""
    job = Job()
    job.train(3)
    want, extra = job.snapshot(), rng_extra(3)
    rng_at_save = torch.get_rng_state().clone()
    manager = manager_factory()
    result = manager.save(3, job.state(), extra)
    assert result.total_s is None and result.bytes is None
    job.train(5)  # the write is held: it cannot have started
    with torch.no_grad():
        for p in job.model.parameters():
            p.add_(1.0)
    held_write.set()
    done = manager.wait(timeout=10)
    assert done is not None and done.step == 3 and done.total_s is not None
    assert done.bytes and done.total_s >= done.blocking_s == result.blocking_s
    assert manager.wait() is None  # nothing in flight any more

    torch.manual_seed(1234)  # move the RNG on too
    restored = manager.restore(job.state())
    assert restored is not None
    assert restored.step == 3 and restored.skipped == []
    assert restored.extra == extra
    assert_bitwise(job.snapshot(), want)
    rng = torch.frombuffer(bytearray(base64.b64decode(restored.extra["rng"])), dtype=torch.uint8)
    assert torch.equal(rng, rng_at_save)


def test_restored_run_continues_exactly(manager_factory: Callable[..., CheckpointManager]) -> None:
    straight = Job()
    straight.train(8)

    first = Job()
    first.train(4)
    manager = manager_factory()
    manager.save(4, first.state(), {"step": 4})
    manager.wait()
    second = Job(seed=99)  # a fresh process: other initial weights, no optimizer state
    second.train(1)  # Adam's state exists, so DCP can load into it in place
    restored = manager.restore(second.state())
    assert restored is not None and restored.step == 4
    second.step = 4
    second.train(4)
    assert_bitwise(second.snapshot(), straight.snapshot())


def test_sync_save_is_durable_and_commits_before_returning(
    manager_factory: Callable[..., CheckpointManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    fsynced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    commits: list[tuple[SaveResult, str]] = []
    manager = manager_factory(
        async_save=False,
        on_commit=lambda r: commits.append((r, threading.current_thread().name)))
    job = Job()
    job.train(2)
    result = manager.save(2, job.state(), {"step": 2})
    assert result.total_s is not None and result.blocking_s == result.total_s
    assert result.bytes == sum(p.stat().st_size for p in result.path.iterdir()
                               if p.name != COMMIT_MARKER)
    assert commits == [(result, threading.current_thread().name)]
    assert manager.latest() == result.path
    marker = json.loads((result.path / COMMIT_MARKER).read_text())
    # data file + .metadata + tmp dir + parent dir + marker + step dir, at least
    assert len(fsynced) >= len(marker["files"]) + 4
    assert manager.wait() is None


def test_on_commit_from_the_background_with_final_figures(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    seen: list[tuple[SaveResult, str]] = []
    manager = manager_factory(
        on_commit=lambda r: seen.append((r, threading.current_thread().name)))
    job = Job()
    manager.save(1, job.state(), {})
    final = manager.wait(timeout=10)
    assert final is not None
    assert seen == [(final, seen[0][1])] and seen[0][1].startswith("ett-checkpoint")
    assert final.total_s is not None and final.bytes is not None and final.bytes > 0


def test_on_commit_failure_does_not_fail_the_save(
    manager_factory: Callable[..., CheckpointManager], caplog: pytest.LogCaptureFixture
) -> None:
    def boom(_: SaveResult) -> None:
        raise RuntimeError("emitter down")

    manager = manager_factory(on_commit=boom)
    manager.save(1, Job().state(), {})
    assert manager.wait(timeout=10) is not None
    assert manager.latest() is not None
    assert "on_commit callback failed" in caplog.text


def test_staging_buffers_are_reused_without_leaking_into_the_previous_save(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    """The second staging overwrites the first one's buffers only after its write."""
    job = Job()
    manager = manager_factory(keep_last=0)
    job.train(1)
    first = job.snapshot()
    manager.save(1, job.state(), {})
    buffers = dict(manager._stager._buffers)
    job.train(1)
    second = job.snapshot()
    manager.save(2, job.state(), {})
    manager.wait()
    reused = manager._stager._buffers
    assert buffers and all(reused[k] is v for k, v in buffers.items() if k in reused)
    for step, want in ((1, first), (2, second)):
        probe = Job(seed=7)
        probe.train(1)
        state = probe.state()
        dcp_load(state, checkpoint_id=manager.directory / ckpt.step_dir_name(step),
                 no_dist=True)
        assert_bitwise(probe.snapshot(), want)


def test_plain_tensors_nested_values_and_non_tensor_leaves(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    t = torch.arange(10, dtype=torch.float64)
    view = torch.arange(100, dtype=torch.int32)[10:20]  # a view of a bigger storage
    state: dict[str, Any] = {"a": {"t": t, "view": view, "meta": {"lr": 0.5, "tag": "x"}},
                             "lst": [torch.ones(3), torch.zeros(2, dtype=torch.bfloat16)]}
    manager = manager_factory()
    manager.save(0, state, {})
    t.add_(100)
    view.add_(100)
    state["lst"][0].add_(5)
    manager.wait()
    target: dict[str, Any] = {"a": {"t": torch.empty(10, dtype=torch.float64),
                                    "view": torch.empty(10, dtype=torch.int32),
                                    "meta": {"lr": 0.0, "tag": ""}},
                              "lst": [torch.empty(3), torch.empty(2, dtype=torch.bfloat16)]}
    restored = manager.restore(target)
    assert restored is not None and restored.step == 0
    assert torch.equal(target["a"]["t"], torch.arange(10, dtype=torch.float64))
    assert torch.equal(target["a"]["view"], torch.arange(10, 20, dtype=torch.int32))
    assert target["a"]["meta"] == {"lr": 0.5, "tag": "x"}
    assert torch.equal(target["lst"][0], torch.ones(3))
    assert torch.equal(target["lst"][1], torch.zeros(2, dtype=torch.bfloat16))


# -- layout, commit, fallback -------------------------------------------------------------


def test_layout_and_marker(manager_factory: Callable[..., CheckpointManager]) -> None:
    manager = manager_factory()
    result = manager.save(42, Job().state(), {"cursor": 7})
    manager.wait()
    path = manager.directory / "step-0000000042"
    assert result.path == path and manager.latest() == path
    assert sorted(p.name for p in manager.directory.iterdir()) == [path.name]
    marker = json.loads((path / COMMIT_MARKER).read_text())
    assert marker["step"] == 42 and marker["extra"] == {"cursor": 7}
    assert ".metadata" in marker["files"]
    for name, info in marker["files"].items():
        assert (path / name).stat().st_size == info["size"]
        assert len(info["crc32"]) == 8
    assert marker["bytes"] == sum(f["size"] for f in marker["files"].values())
    assert "rank_extras" not in marker


def _two_checkpoints(make: Callable[..., CheckpointManager]) -> tuple[
        CheckpointManager, Job, dict[str, torch.Tensor]]:
    job = Job()
    manager = make()
    job.train(1)
    older = job.snapshot()
    manager.save(1, job.state(), {"step": 1})
    job.train(1)
    manager.save(2, job.state(), {"step": 2})
    manager.wait()
    job.train(3)
    return manager, job, older


def test_truncated_newest_falls_back_to_the_previous(
    manager_factory: Callable[..., CheckpointManager], caplog: pytest.LogCaptureFixture
) -> None:
    manager, job, older = _two_checkpoints(manager_factory)
    newest = manager.directory / "step-0000000002"
    victim = data_file(newest)
    with open(victim, "r+b") as fh:
        fh.truncate(victim.stat().st_size // 2)
    with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
        restored = manager.restore(job.state())
    assert restored is not None and restored.step == 1
    assert restored.extra == {"step": 1}
    assert len(restored.skipped) == 1
    path, reason = restored.skipped[0]
    assert path == newest and victim.name in reason and "bytes" in reason
    assert str(newest) in caplog.text and victim.name in caplog.text
    assert_bitwise(job.snapshot(), older)


def test_missing_marker_falls_back_to_the_previous(
    manager_factory: Callable[..., CheckpointManager], caplog: pytest.LogCaptureFixture
) -> None:
    manager, job, older = _two_checkpoints(manager_factory)
    newest = manager.directory / "step-0000000002"
    (newest / COMMIT_MARKER).unlink()
    assert manager.latest() == manager.directory / "step-0000000001"
    with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
        restored = manager.restore(job.state())
    assert restored is not None and restored.step == 1
    assert restored.skipped == [(newest, "no commit marker (the save never committed)")]
    assert str(newest) in caplog.text
    assert_bitwise(job.snapshot(), older)


def test_flipped_byte_is_caught_by_the_checksum(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    manager, job, older = _two_checkpoints(manager_factory)
    victim = data_file(manager.directory / "step-0000000002")
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    restored = manager.restore(job.state())
    assert restored is not None and restored.step == 1
    assert "checksum" in restored.skipped[0][1]
    assert_bitwise(job.snapshot(), older)


def _forge(path: Path, name: str, data: bytes) -> None:
    """Replace a checkpoint file and rewrite the commit marker to vouch for it (what anyone
    who can write the directory can do: a CRC is not authentication)."""
    (path / name).write_bytes(data)
    marker = json.loads((path / COMMIT_MARKER).read_text())
    marker["files"][name] = {"size": len(data), "crc32": ckpt_commit._crc32(path / name)[1]}
    (path / COMMIT_MARKER).write_text(json.dumps(marker))


def test_a_failing_dcp_load_falls_back(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    """Files that match their marker but that DCP cannot load (here: a damaged data file
    with a marker rewritten to match) are skipped after the load raises."""
    manager, job, older = _two_checkpoints(manager_factory)
    newest = manager.directory / "step-0000000002"
    data = sorted(newest.glob("*.distcp"))[0]
    _forge(newest, data.name, b"\0" * data.stat().st_size)
    restored = manager.restore(job.state())
    assert restored is not None and restored.step == 1
    assert restored.skipped[0][0] == newest
    assert restored.skipped[0][1].startswith("DCP load failed")
    assert_bitwise(job.snapshot(), older)


def test_unreadable_metadata_is_invalid_before_any_tensor_is_loaded(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    manager, job, older = _two_checkpoints(manager_factory)
    newest = manager.directory / "step-0000000002"
    _forge(newest, ".metadata", b"not a pickle")
    restored = manager.restore(job.state())
    assert restored is not None and restored.step == 1
    assert restored.skipped[0] == (newest, restored.skipped[0][1])
    assert restored.skipped[0][1].startswith(".metadata refused: not a readable pickle")
    assert_bitwise(job.snapshot(), older)


class _Boom:
    """Pickles as a call to os.system creating `marker`: what a crafted checkpoint runs
    when its metadata is read with a plain pickle.load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def crafted_metadata(marker: Path) -> bytes:
    """A .metadata pickle that runs `touch marker` when unpickled without restriction."""
    import pickle

    return pickle.dumps(_Boom(marker))


def crafted_bytes_item(marker: Path) -> bytes:
    """A torch.save'd non-tensor leaf that runs `touch marker` when loaded with
    weights_only=False (DCP's own planner does)."""
    buf = io.BytesIO()
    torch.save(_Boom(marker), buf)
    return buf.getvalue()


def _pickle_enums_like_python_3112(obj: Any) -> bytes:
    """`obj` pickled as Python 3.11.0-3.11.3 do: enum members as getattr(cls, name)."""
    import enum
    import pickle

    class Pickler(pickle.Pickler):
        def reducer_override(self, o: Any) -> Any:
            if isinstance(o, enum.Enum):
                return getattr, (type(o), o.name)
            return NotImplemented

    buf = io.BytesIO()
    Pickler(buf, protocol=4).dump(obj)
    return buf.getvalue()


def test_metadata_written_by_python_3112_is_read(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    """Debian 12's Python 3.11.2 pickles DCP's `_MEM_FORMAT_ENCODING` members with
    `builtins.getattr`: such checkpoints restore, and getattr reaches nothing else."""
    import pickletools

    manager, job, _ = _two_checkpoints(manager_factory)
    newest = manager.directory / "step-0000000002"
    assert manager.restore(job.state()) is not None
    want = job.snapshot()  # step 2, restored from the metadata as this Python wrote it
    with open(newest / ".metadata", "rb") as fh:
        metadata = ckpt_reader.read_checkpoint_metadata(fh)
    as_3112 = _pickle_enums_like_python_3112(metadata)
    assert "getattr" in {str(arg) for _, arg, _ in pickletools.genops(as_3112)}
    _forge(newest, ".metadata", as_3112)
    job.train(3)  # move away from the checkpoint, so the restore must bring it back
    restored = manager.restore(job.state())
    assert restored is not None and restored.step == 2 and restored.skipped == []
    assert_bitwise(job.snapshot(), want)

    for target, name in ((Metadata, "__init__"), (object, "__subclasses__")):
        with pytest.raises(ckpt_reader.UnsafeCheckpointError, match="only members of DCP"):
            ckpt_reader._enum_member(target, name)
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    with pytest.raises(ckpt_reader.UnsafeCheckpointError):
        ckpt_reader._enum_member(_MEM_FORMAT_ENCODING, "__class__")


def test_a_crafted_metadata_pickle_runs_no_code_and_falls_back(
    manager_factory: Callable[..., CheckpointManager], tmp_path: Path
) -> None:
    manager, job, older = _two_checkpoints(manager_factory)
    newest = manager.directory / "step-0000000002"
    ran = tmp_path / "the-attacker-code-ran"
    _forge(newest, ".metadata", crafted_metadata(ran))
    restored = manager.restore(job.state())
    assert not ran.exists()
    assert restored is not None and restored.step == 1
    assert restored.skipped[0][0] == newest
    assert restored.skipped[0][1] == (
        ".metadata refused: checkpoint metadata names the forbidden global posix.system "
        "(only DCP metadata classes and plain builtins are allowed)"
    )
    assert_bitwise(job.snapshot(), older)


def test_the_load_itself_reads_metadata_through_the_restricted_unpickler(
    manager_factory: Callable[..., CheckpointManager], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defence in depth: ranks other than the coordinator (and a file swapped after the
    coordinator validated it) read .metadata inside DCP's load, not in `_check`."""
    manager, job, older = _two_checkpoints(manager_factory)
    newest = manager.directory / "step-0000000002"
    ran = tmp_path / "the-attacker-code-ran"
    _forge(newest, ".metadata", crafted_metadata(ran))
    real_check = CheckpointManager._check
    monkeypatch.setattr(  # validation passes as if the file were swapped right after it
        CheckpointManager, "_check",
        lambda self, path: (None, ckpt.read_marker(path)) if path == newest
        else real_check(self, path),
    )
    restored = manager.restore(job.state())
    assert not ran.exists()
    assert restored is not None and restored.step == 1
    assert "forbidden global posix.system" in restored.skipped[0][1]
    assert_bitwise(job.snapshot(), older)


def test_a_crafted_non_tensor_leaf_runs_no_code(
    manager_factory: Callable[..., CheckpointManager], tmp_path: Path
) -> None:
    """DCP stores non-tensor leaves (Adam's lr, betas...) as torch.save'd "bytes" items and
    its planner loads them with weights_only=False; ours must not."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    manager, job, older = _two_checkpoints(manager_factory)
    newest = manager.directory / "step-0000000002"
    with open(newest / ".metadata", "rb") as fh:
        metadata = ckpt_reader.read_checkpoint_metadata(fh)
    fqn = next(k for k, v in metadata.state_dict_metadata.items()
               if isinstance(v, BytesStorageMetadata) and k.endswith(".lr"))
    info = next(v for k, v in metadata.storage_data.items() if k.fqn == fqn)
    ran = tmp_path / "the-attacker-code-ran"
    payload = crafted_bytes_item(ran)
    blob = (newest / info.relative_path).read_bytes()
    info.offset, info.length = len(blob), len(payload)  # the leaf now reads the payload
    blob += payload
    import pickle

    _forge(newest, ".metadata", pickle.dumps(metadata))
    _forge(newest, info.relative_path, blob)
    restored = manager.restore(job.state())
    assert not ran.exists()
    assert restored is not None and restored.step == 1
    assert restored.skipped[0][1].startswith("DCP load failed")
    assert "weights_only" in restored.skipped[0][1] or "Unpickl" in restored.skipped[0][1]
    assert_bitwise(job.snapshot(), older)


def test_a_load_failure_with_nothing_to_fall_back_to_raises(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    job = Job()
    manager = manager_factory()
    manager.save(1, job.state(), {})
    manager.wait()
    other = {"model": nn.Linear(3, 3)}  # keys the checkpoint does not have
    with pytest.raises(CheckpointError, match="failed load"):
        manager.restore(other)


@pytest.mark.parametrize("damage", ["garbage", "wrong step", "bad file entry", "no metadata"])
def test_a_damaged_marker_falls_back(
    manager_factory: Callable[..., CheckpointManager], damage: str
) -> None:
    manager, job, older = _two_checkpoints(manager_factory)
    marker_path = manager.directory / "step-0000000002" / COMMIT_MARKER
    marker = json.loads(marker_path.read_text())
    if damage == "garbage":
        marker_path.write_text('{"step": 2, "extra"')
    else:
        if damage == "wrong step":
            marker["step"] = 3
        elif damage == "bad file entry":
            marker["files"][".metadata"] = 12
        else:
            del marker["files"][".metadata"]
        marker_path.write_text(json.dumps(marker))
    restored = manager.restore(job.state())
    assert restored is not None and restored.step == 1, restored
    assert len(restored.skipped) == 1
    assert_bitwise(job.snapshot(), older)


def test_verify_size_still_catches_truncation(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    manager, job, older = _two_checkpoints(lambda: manager_factory(verify="size"))
    victim = data_file(manager.directory / "step-0000000002")
    with open(victim, "r+b") as fh:
        fh.truncate(10)
    restored = manager.restore(job.state())
    assert restored is not None and restored.step == 1
    assert_bitwise(job.snapshot(), older)


def test_restore_without_checkpoints(manager_factory: Callable[..., CheckpointManager]) -> None:
    manager = manager_factory()
    assert manager.latest() is None
    assert manager.restore(Job().state()) is None


def test_only_broken_checkpoints_restore_none(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    manager = manager_factory()
    manager.save(1, Job().state(), {})
    manager.wait()
    (manager.directory / "step-0000000001" / COMMIT_MARKER).unlink()
    assert manager.restore(Job().state()) is None


def test_saving_a_step_again_replaces_it(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    job = Job()
    manager = manager_factory()
    manager.save(5, job.state(), {"v": 1})
    job.train(2)
    want = job.snapshot()
    manager.save(5, job.state(), {"v": 2})
    manager.wait()
    assert [p.name for p in manager.directory.iterdir()] == ["step-0000000005"]
    probe = Job(seed=3)
    probe.train(1)
    restored = manager.restore(probe.state())
    assert restored is not None and restored.extra == {"v": 2}
    assert_bitwise(probe.snapshot(), want)


# -- retention and stale temp directories --------------------------------------------------


def test_keep_last(manager_factory: Callable[..., CheckpointManager]) -> None:
    manager = manager_factory(keep_last=2)
    job = Job()
    for step in range(1, 6):
        job.train(1)
        manager.save(step, job.state(), {})
    manager.wait()
    assert sorted(p.name for p in manager.directory.iterdir()) == [
        "step-0000000004", "step-0000000005"]


def test_keep_last_zero_keeps_all(manager_factory: Callable[..., CheckpointManager]) -> None:
    manager = manager_factory(keep_last=0, async_save=False)
    for step in range(4):
        manager.save(step, Job().state(), {})
    assert len(list(manager.directory.iterdir())) == 4


def test_a_failed_save_deletes_nothing_and_is_reported(
    manager_factory: Callable[..., CheckpointManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = manager_factory(keep_last=1)
    job = Job()
    manager.save(1, job.state(), {})
    manager.wait()

    def disk_full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt_commit, "dcp_save", disk_full)
    manager.save(2, job.state(), {})
    with pytest.raises(CheckpointError, match="No space left"):
        manager.wait(timeout=10)
    assert manager.wait() is None  # reported once
    assert sorted(p.name for p in manager.directory.iterdir()) == ["step-0000000001"]
    monkeypatch.undo()
    manager.save(3, job.state(), {})
    manager.wait()
    assert sorted(p.name for p in manager.directory.iterdir()) == ["step-0000000003"]


def test_a_failed_save_is_raised_by_the_next_save(
    manager_factory: Callable[..., CheckpointManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = manager_factory()
    monkeypatch.setattr(ckpt_commit, "dcp_save", lambda *a, **k: 1 / 0)
    manager.save(1, Job().state(), {})
    with pytest.raises(CheckpointError, match="division by zero"):
        manager.save(2, Job().state(), {})


def test_uncommitted_step_dirs_older_than_a_commit_are_removed(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    manager = manager_factory(keep_last=5, async_save=False)
    manager.save(1, Job().state(), {})
    (manager.directory / "step-0000000001" / COMMIT_MARKER).unlink()
    manager.save(2, Job().state(), {})
    assert sorted(p.name for p in manager.directory.iterdir()) == ["step-0000000002"]


def test_stale_temp_dirs_are_removed_at_startup(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    with CheckpointManager(directory, async_save=False) as first:
        first.save(10, Job().state(), {})
    committed_at = (directory / "step-0000000010" / COMMIT_MARKER).stat().st_mtime
    crashed = directory / ".tmp-step-0000000009-dead-1"  # before the commit: stale
    same_step = directory / ".tmp-step-0000000010-dead-2"  # a crashed duplicate: stale
    newer = directory / ".tmp-step-0000000011-live-1"  # may be a live save elsewhere
    recent = directory / ".tmp-step-0000000008-live-2"  # written after the commit
    for d in (crashed, same_step, newer, recent):
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
    for d in (crashed, same_step, newer):
        os.utime(d, (committed_at - 60, committed_at - 60))
    os.utime(recent, (committed_at + 60, committed_at + 60))
    CheckpointManager(directory).close()
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [newer.name, recent.name, "step-0000000010"])


def test_a_live_save_of_this_process_is_never_removed(
    manager_factory: Callable[..., CheckpointManager], held_write: threading.Event
) -> None:
    manager = manager_factory()
    manager.save(1, Job().state(), {})
    held_write.set()
    manager.wait()
    held_write.clear()
    manager.save(1, Job().state(), {})  # in flight, same step as the newest commit
    (live,) = manager._live_tmp  # the write is held, so DCP has not created it yet
    live.mkdir()
    os.utime(live, (0, 0))  # looks old
    manager._remove_stale()
    assert live.exists()
    held_write.set()
    assert manager.wait(timeout=10) is not None


# -- one save in flight, wait, close --------------------------------------------------------


def test_one_save_in_flight(
    manager_factory: Callable[..., CheckpointManager], held_write: threading.Event
) -> None:
    manager = manager_factory()
    job = Job()
    manager.save(1, job.state(), {})
    timer = threading.Timer(0.3, held_write.set)
    timer.start()
    second = manager.save(2, job.state(), {})  # waits for the first
    assert second.blocking_s >= 0.25
    assert manager.latest() == manager.directory / "step-0000000001"
    assert manager.wait(timeout=10) is not None
    assert manager.latest() == manager.directory / "step-0000000002"


def test_wait_times_out_and_the_save_stays_in_flight(
    manager_factory: Callable[..., CheckpointManager], held_write: threading.Event
) -> None:
    manager = manager_factory()
    manager.save(1, Job().state(), {})
    with pytest.raises(TimeoutError):
        manager.wait(timeout=0.05)
    held_write.set()
    result = manager.wait(timeout=10)
    assert result is not None and result.step == 1


def test_close_waits_and_is_idempotent(
    manager_factory: Callable[..., CheckpointManager], held_write: threading.Event
) -> None:
    manager = manager_factory()
    manager.save(1, Job().state(), {})
    threading.Timer(0.1, held_write.set).start()
    manager.close()
    assert manager.latest() is not None
    manager.close()
    with pytest.raises(CheckpointError, match="closed"):
        manager.save(2, Job().state(), {})


def test_bad_arguments(manager_factory: Callable[..., CheckpointManager], tmp_path: Path) -> None:
    manager = manager_factory()
    with pytest.raises(ValueError, match="JSON"):
        manager.save(1, Job().state(), {"x": object()})
    with pytest.raises(ValueError, match="step"):
        manager.save(-1, Job().state(), {})
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path / "x", keep_last=-1)
    assert manager.wait() is None


def test_extra_is_frozen_at_save_time(
    manager_factory: Callable[..., CheckpointManager], held_write: threading.Event
) -> None:
    manager = manager_factory()
    extra: dict[str, Any] = {"cursor": 1, "nested": [1]}
    manager.save(1, Job().state(), extra)
    extra["cursor"] = 2
    extra["nested"].append(2)
    held_write.set()
    manager.wait()
    restored = manager.restore(Job().state())
    assert restored is not None and restored.extra == {"cursor": 1, "nested": [1]}


def test_no_dist_warning_is_silenced(
    manager_factory: Callable[..., CheckpointManager],
) -> None:
    import warnings

    manager = manager_factory(async_save=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        ckpt_manager._quiet_no_dist_warning()
        manager.save(1, Job().state(), {})
        manager.restore(Job().state())
    assert not [w for w in caught if "uninitialized" in str(w.message)]


# -- two processes --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.integration
@pytest.mark.slow
def test_two_ranks_sharded_async_save_while_training(tmp_path: Path) -> None:
    """torchrun, 2 ranks, gloo: TorchRec DMP tables sharded table-wise with a fused
    RowWiseAdagrad (ShardedTensors), a DTensor and per-rank tensors; async save while both
    ranks keep training and all-reducing; restore equals the state at save time. A
    deadlock fails on the timeout instead of hanging."""
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           str(ROOT / "tests" / "trainer" / "_checkpoint_dist_child.py"), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        output, _ = proc.communicate()
        pytest.fail(f"two-rank checkpoint test hung (deadlock?):\n{output[-6000:]}")
    assert proc.returncode == 0, output[-6000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, report in enumerate(reports):
        assert report["ok"] and report["rank"] == rank
        # each rank owns one table and its optimizer state, as ShardedTensors
        assert report["sharded_keys"] == [f"/model/embedding_bags.t{rank}.weight",
                                          f"/optim/state/embedding_bags.t{rank}.weight/"
                                          f"t{rank}.momentum1"]
        assert report["compared"] == 4
        # The save was still in flight after the first collective of the loop; the write
        # is held 0.3 s and the loop runs >= 1.8 s, so DCP's collectives overlapped it.
        assert report["inflight_at_first_collective"], report
        assert report["loop_s"] >= 1.8, report
    shutil.rmtree(out / "ckpt", ignore_errors=True)


def test_latest_step_is_the_newest_committed_one(
        manager_factory: Callable[..., CheckpointManager]) -> None:
    # what `Trainer.finish` asks to avoid saving the last step twice
    manager = manager_factory(async_save=False, keep_last=0)
    assert manager.latest_step() is None
    manager.save(41, Job().state(), {})
    manager.save(42, Job().state(), {})
    assert manager.latest_step() == 42
    (manager.directory / "step-0000000042" / COMMIT_MARKER).unlink()  # never committed
    assert manager.latest_step() == 41
