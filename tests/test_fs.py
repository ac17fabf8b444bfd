"""`airflow_ett._fs`: the one atomic write (whole or absent, temp file gone either way)
and the one directory fsync, which every writer of the package goes through."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_ett import _fs
from airflow_ett._fs import atomic_file, atomic_write, fsync_dir, fsync_file


def test_atomic_write_replaces_the_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "LATEST"
    target.write_bytes(b"v1\n")
    atomic_write(target, b"v2\n")
    assert target.read_bytes() == b"v2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["LATEST"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="half-way"), atomic_file(target) as out:
        out.file.write(b"new, but not all of it")
        raise RuntimeError("half-way")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_the_temp_file_is_hidden_beside_the_target_with_the_given_suffix(
        tmp_path: Path) -> None:
    # Directories recognise their own leftovers by name: the compile cache removes stale
    # hidden `*.tmp`, the spool ignores `.part` files.
    with atomic_file(tmp_path / "x.rejected", suffix=".part") as out:
        (tmp,) = [p for p in tmp_path.iterdir()]
        assert tmp.name.startswith(".x.rejected.") and tmp.name.endswith(".part")
        out.file.write(b"kept")
    assert (tmp_path / "x.rejected").read_bytes() == b"kept"


def test_a_content_addressed_name_is_chosen_after_writing(tmp_path: Path) -> None:
    with atomic_file(tmp_path / "artifacts") as out:
        out.file.write(b"payload")
        out.path = tmp_path / "artifacts-abc.bin"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts-abc.bin"]


def test_renaming_into_another_directory_is_refused_and_cleaned_up(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="not in"), atomic_file(tmp_path / "a" / "f") as out:
        out.file.write(b"x")
        out.path = tmp_path / "b" / "f"
    assert list((tmp_path / "a").iterdir()) == [] and list((tmp_path / "b").iterdir()) == []


def test_the_directory_is_fsynced_after_the_rename(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the rename itself must survive a power cut: fsync the directory once it is done
    seen: list[tuple[Path, bool]] = []
    monkeypatch.setattr(_fs, "fsync_dir", lambda path, *, best_effort=False: seen.append(
        (Path(path), (tmp_path / "marker").exists())))
    atomic_write(tmp_path / "marker", b"{}")
    assert seen == [(tmp_path, True)]


def test_mode_is_that_of_os_open(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "secret", b"s", mode=0o600)
        atomic_write(tmp_path / "shared", b"s")
    finally:
        os.umask(old)
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "shared").stat().st_mode & 0o777 == 0o644


def test_fsync_dir_raises_unless_best_effort(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        fsync_dir(not_a_dir)
    fsync_dir(not_a_dir, best_effort=True)  # a cache's rename may stay undurable
    fsync_dir(tmp_path)
    fsync_file(not_a_dir)


def test_stdlib_only() -> None:
    # The trainer imports it and must never import Airflow (nor pay for torch here).
    code = ("import sys, airflow_ett._fs; "
            "print(sorted(m for m in ('airflow', 'torch', 'sqlalchemy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
