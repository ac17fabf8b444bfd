"""A checkpoint's files read as untrusted input (issue 22, class 3): a restore that meets a
hostile file falls back to the previous checkpoint, at once, with the reason; it never
hangs, never reads without bound and never builds without bound."""

from __future__ import annotations

import json
import os
import pickle
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_ett.trainer.checkpoint import (
    COMMIT_MARKER,
    CheckpointManager,
    CommitMarker,
    FileRecord,
    RestoreResult,
    read_marker,
    step_dir_name,
)
from airflow_ett.trainer.checkpoint import reader as ckpt_reader
from airflow_ett.trainer.checkpoint.files import pickle_work
from airflow_ett.trainer.checkpoint.marker import write_marker
from tests.hostile import in_thread
from tests.trainer.test_checkpoint import _forge, _two_checkpoints, assert_bitwise

NEWEST = "step-0000000002"


def memo_bomb(levels: int = 100) -> bytes:
    """`t = (t, t)` `levels` times over through pickle's memo, used as a dict key: a
    ~600-byte pickle that builds at once but whose key hashes 2**levels tuples."""
    out = bytearray(b"\x80\x04)\x94")  # PROTO 4, EMPTY_TUPLE, MEMOIZE (memo 0)
    for i in range(levels):
        out += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86\x94"  # BINGET i x2, TUPLE2, MEMOIZE
    out += b"}h" + bytes([levels]) + b"N" + b"s."  # EMPTY_DICT, BINGET top, NONE, SETITEM, STOP
    return bytes(out)


def restore_falls_back(make: Callable[..., CheckpointManager],
                       spoil: Callable[[Path], None]) -> str:
    """Two checkpoints, the newest spoiled by `spoil`: the restore (in a thread that must
    return) gives the older one; the reason the newest was skipped."""
    manager, job, older = _two_checkpoints(make)
    newest = manager.directory / NEWEST
    spoil(newest)
    restored: RestoreResult | None = in_thread(lambda: manager.restore(job.state()))
    assert restored is not None and restored.step == 1
    assert restored.skipped[0][0] == newest
    assert_bitwise(job.snapshot(), older)
    return restored.skipped[0][1]


def test_the_memo_bomb_is_what_it_says() -> None:
    data = memo_bomb(20)  # 2**20 objects by reference: still quick to hash for the check
    assert len(data) < 200 and pickle_work(data) is not None
    assert len(memo_bomb()) < 700


@pytest.mark.timeout(120)
def test_a_metadata_memo_bomb_is_refused_before_it_is_built(
        manager_factory: Callable[..., CheckpointManager]) -> None:
    """A 600-byte `.metadata` whose unpickling hashes 2**100 tuples (restore hashed
    forever) is refused by the opcode walk, and restore falls back."""
    reason = restore_falls_back(manager_factory,
                                lambda newest: _forge(newest, ".metadata", memo_bomb()))
    assert reason.startswith(".metadata refused: the pickle builds more than"), reason


def test_real_metadata_is_far_below_the_work_bound(
        manager_factory: Callable[..., CheckpointManager]) -> None:
    """What a real DCP `.metadata` builds: under one object per byte (the bound allows
    `MAX_OBJECTS_PER_BYTE`), so the bound never refuses a real checkpoint."""
    manager, _, _ = _two_checkpoints(manager_factory)
    data = (manager.directory / NEWEST / ".metadata").read_bytes()
    assert pickle_work(data, per_byte=1) is None
    assert pickle_work(data, per_byte=0) is None or len(data) > 10_000


@pytest.mark.parametrize("listed", ["/dev/zero", "../step-0000000001/.metadata", "a/b", ".."])
def test_a_marker_listing_a_file_outside_the_directory_is_refused(
        manager_factory: Callable[..., CheckpointManager], listed: str) -> None:
    """A marker that lists `/dev/zero` (size 0, as stat says) made the checksum read
    forever; any name that is not a plain file name in the directory is refused."""
    def spoil(newest: Path) -> None:
        marker = json.loads((newest / COMMIT_MARKER).read_text())
        marker["files"][listed] = {"size": 0, "crc32": "00000000"}
        (newest / COMMIT_MARKER).write_text(json.dumps(marker))

    reason = restore_falls_back(lambda: manager_factory(verify="checksum"), spoil)
    assert "not a file name in the directory" in reason, reason


@pytest.mark.parametrize("kind", ["dev_zero", "fifo"])
def test_a_listed_file_that_is_a_device_or_fifo_is_refused(
        manager_factory: Callable[..., CheckpointManager], kind: str) -> None:
    """A data file or `.metadata` replaced by a symlink to /dev/zero or a FIFO (the
    checksum or DCP's open hung on it)."""
    def spoil(newest: Path) -> None:
        for name in (".metadata", *(p.name for p in newest.glob("*.distcp"))):
            (newest / name).unlink()
            if kind == "fifo":
                os.mkfifo(newest / name)
            else:
                (newest / name).symlink_to("/dev/zero")

    reason = restore_falls_back(lambda: manager_factory(verify="checksum"), spoil)
    assert reason.endswith("is not a regular file"), reason


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "deep"])
def test_a_hostile_commit_marker_is_refused(
        manager_factory: Callable[..., CheckpointManager], kind: str) -> None:
    def spoil(newest: Path) -> None:
        marker = newest / COMMIT_MARKER
        marker.unlink()
        if kind == "fifo":
            os.mkfifo(marker)
        elif kind == "dev_zero":
            marker.symlink_to("/dev/zero")
        else:
            marker.write_text("[" * 5000 + "]" * 5000)

    reason = restore_falls_back(manager_factory, spoil)
    assert reason.startswith("unreadable commit marker: commit marker"), reason


def test_metadata_pointing_dcp_outside_the_listed_files_is_refused(
        manager_factory: Callable[..., CheckpointManager]) -> None:
    """The metadata says where DCP reads each tensor: a location naming /dev/zero or a
    range beyond the file is refused before DCP opens anything."""
    def spoil_with(relative_path: str | None, length: int | None) -> Callable[[Path], None]:
        def spoil(newest: Path) -> None:
            with open(newest / ".metadata", "rb") as fh:
                metadata = ckpt_reader.read_checkpoint_metadata(fh)
            index, info = next(iter(metadata.storage_data.items()))
            if relative_path is not None:
                info.relative_path = relative_path
            if length is not None:
                info.length = length
            metadata.storage_data[index] = info
            _forge(newest, ".metadata", pickle.dumps(metadata))
        return spoil

    reason = restore_falls_back(manager_factory, spoil_with("/dev/zero", None))
    assert "not a listed file" in reason, reason
    reason = restore_falls_back(manager_factory, spoil_with(None, 1 << 40))
    assert "beyond its" in reason, reason


def test_latest_passes_over_a_marker_that_would_hang(
        manager_factory: Callable[..., CheckpointManager]) -> None:
    manager, _, _ = _two_checkpoints(manager_factory)
    marker = manager.directory / NEWEST / COMMIT_MARKER
    marker.unlink()
    os.mkfifo(marker)
    latest = in_thread(manager.latest)
    assert latest is not None and latest.name == "step-0000000001"


def test_the_walk_refuses_what_is_not_a_pickle() -> None:
    assert pickle_work(b"not a pickle") is not None
    assert pickle_work(b"\x80\x04h\x05.") is not None  # a memo index never set
    assert pickle_work(struct.pack("<B", 0x80)) is not None  # truncated


# -- the commit marker: one writer, one reader ----------------------------------------------


_MARKER = CommitMarker(
    step=7, extra={"cursor": 3, "rng": {"cpu": "AA=="}},
    files={".metadata": FileRecord(size=120, crc32="0badcafe"),
           "__0_0.distcp": FileRecord(size=4096, crc32="12345678")},
    bytes=4216, blocking_s=0.25, total_s=1.5, time=1_795_856_001.5, world_size=2,
    torch="2.13.0", rank_extras=({"rank": 0}, {"rank": 1}))


@pytest.mark.parametrize("rank_extras", [None, ({"rank": 0}, {"rank": 1})])
def test_the_marker_reads_back_what_its_writer_wrote(
        tmp_path: Path, rank_extras: tuple[dict[str, object], ...] | None) -> None:
    step_dir = tmp_path / step_dir_name(7)
    step_dir.mkdir()
    marker = replace(_MARKER, rank_extras=rank_extras)
    write_marker(step_dir, marker)
    assert read_marker(step_dir) == marker
    doc = json.loads((step_dir / COMMIT_MARKER).read_text())  # the layout it always had
    assert doc["format"] == 1 and doc["files"][".metadata"] == {"size": 120, "crc32": "0badcafe"}
    assert ("rank_extras" in doc) == (rank_extras is not None)


@pytest.mark.parametrize(("change", "message"), [
    ({"step": 8}, "commit marker says step 8, directory 7"),
    ({"step": True}, "commit marker says step True, directory 7"),
    ({"format": 2}, "commit marker: format is 2, this trainer reads 1"),
    ({"extra": [1]}, "commit marker lacks its file list or extra"),
    ({"files": {".metadata": 12}},
     "commit marker: files['.metadata'] is 12, not an object with size and crc32"),
    ({"files": {".metadata": {"size": -1, "crc32": "0badcafe"}}},
     "commit marker: files['.metadata'].size is -1, not a size in bytes"),
    ({"files": {".metadata": {"size": 1, "crc32": "zz"}}},
     "commit marker: files['.metadata'].crc32 is 'zz', not 8 hex digits"),
    ({"bytes": "4216"}, "commit marker: bytes is '4216', not a count >= 0"),
    ({"world_size": 0}, "commit marker: world_size is 0, not >= 1"),
    ({"total_s": None}, "commit marker: total_s is None, not a number of seconds"),
    ({"torch": 2}, "commit marker: torch is 2, not a string"),
    ({"rank_extras": [{}, 3]}, "commit marker: rank_extras is [{}, 3], not a list of JSON"),
])
def test_a_malformed_marker_is_one_line_naming_field_and_value(
        tmp_path: Path, change: dict[str, object], message: str) -> None:
    step_dir = tmp_path / step_dir_name(7)
    step_dir.mkdir()
    write_marker(step_dir, _MARKER)
    doc = json.loads((step_dir / COMMIT_MARKER).read_text())
    (step_dir / COMMIT_MARKER).write_text(json.dumps({**doc, **change}))
    with pytest.raises(ValueError) as caught:
        read_marker(step_dir)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
