"""safe_extract: the compile cache's archive restore checks every member itself, the same on
every Python 3.11.x (tarfile's extraction filters arrived in 3.11.4; Debian 12 has 3.11.2).

Every test runs twice: with the filter this Python may have, and with the 3.11.2 path
forced (`_HAS_DATA_FILTER` off and `extractall` refusing a `filter` keyword, as 3.11.2's
does). Crafted archives are written with tarfile itself; each bad one must be refused with
a reason naming the member, and nothing may be written, inside the destination or out.
"""

from __future__ import annotations

import io
import stat
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import airflow_ett.trainer.cache_archive as cc
from airflow_ett.trainer.cache_archive import UnsafeArchiveError, safe_extract

PATHS = ["filter"] if cc._HAS_DATA_FILTER else []
PATHS.append("3.11.2 fallback")


@pytest.fixture(params=PATHS)
def extraction_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on this Python's tarfile, and again as on 3.11.2 (no filters)."""
    if request.param == "3.11.2 fallback":
        monkeypatch.setattr(cc, "_HAS_DATA_FILTER", False)
        real = tarfile.TarFile.extractall

        def extractall_3112(self: tarfile.TarFile, path: Any = ".", members: Any = None,
                            *, numeric_owner: bool = False, **kwargs: Any) -> None:
            if kwargs:  # 3.11.2's signature has no `filter`
                raise TypeError(f"extractall() got an unexpected keyword argument {kwargs}")
            real(self, path, members, numeric_owner=numeric_owner)

        monkeypatch.setattr(tarfile.TarFile, "extractall", extractall_3112)
    return str(request.param)


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def _entry(name: str, kind: bytes, linkname: str = "", mode: int = 0o644,
           ) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info, None


def _open(data: bytes) -> tarfile.TarFile:
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(destination, the directory around it): the latter must hold nothing else after."""
    outer = tmp_path / "outer"
    dest = outer / "a" / "b" / "dest"
    dest.mkdir(parents=True)
    yield dest, outer


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


BAD: dict[str, tuple[Callable[[], bytes], str]] = {
    # name: (the archive, what the reason says)
    "absolute path": (lambda: _tar(_file("/tmp/ett-abs-escape")), "absolute path"),
    "dot-dot": (lambda: _tar(_file("ok/../../../escape")), "'..' component"),
    "dot-dot at the start": (lambda: _tar(_file("../escape")), "'..' component"),
    "symlink to an absolute path": (
        lambda: _tar(_entry("link", tarfile.SYMTYPE, "/etc")), "absolute"
    ),
    "symlink escaping with ..": (
        lambda: _tar(_entry("x/link", tarfile.SYMTYPE, "../../../../escape")),
        "outside the destination",
    ),
    "file written through a symlinked dir": (
        lambda: _tar(_entry("sub", tarfile.SYMTYPE, "/tmp"), _file("sub/escape")),
        "absolute",
    ),
    "symlink chain escaping": (
        lambda: _tar(
            _entry("d/up", tarfile.SYMTYPE, ".."),  # d/up -> . (inside, alone)
            _entry("d/up2", tarfile.SYMTYPE, "up/../.."),  # -> outside
        ),
        "outside the destination",
    ),
    "symlink loop": (
        lambda: _tar(_entry("a", tarfile.SYMTYPE, "b"), _entry("b", tarfile.SYMTYPE, "a")),
        "symlink loop",
    ),
    "hardlink to an absolute path": (
        lambda: _tar(_entry("h", tarfile.LNKTYPE, "/etc/passwd")), "absolute path"
    ),
    "hardlink escaping with ..": (
        lambda: _tar(_entry("h", tarfile.LNKTYPE, "../../outside")), "'..' component"
    ),
    "hardlink to no member": (
        lambda: _tar(_entry("h", tarfile.LNKTYPE, "etc/passwd")), "not a regular file"
    ),
    "character device": (lambda: _tar(_entry("dev", tarfile.CHRTYPE)), "special file"),
    "block device": (lambda: _tar(_entry("blk", tarfile.BLKTYPE)), "special file"),
    "fifo": (lambda: _tar(_entry("fifo", tarfile.FIFOTYPE)), "special file"),
    "setuid file": (lambda: _tar(_file("suid", mode=0o4755)), "setuid"),
    "setgid dir": (lambda: _tar(_entry("sgid", tarfile.DIRTYPE, mode=0o2755)), "setuid"),
    "oversize member": (lambda: _tar(_file("big", b"y" * 2048)), "over 1024"),
    "too many bytes in all": (
        lambda: _tar(*[_file(f"f{i}", b"z" * 1000) for i in range(5)]), "in all"
    ),
    "too many members": (lambda: _tar(*[_file(f"n{i}") for i in range(11)]), "more than 10"),
    "duplicate name": (lambda: _tar(_file("a", b"1"), _file("./a", b"2")), "appears twice"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_archive_is_refused_and_writes_nothing(
    name: str, extraction_path: str, box: tuple[Path, Path]
) -> None:
    dest, outer = box
    make, reason = BAD[name]
    with _open(make()) as tar, pytest.raises(UnsafeArchiveError) as refused:
        safe_extract(tar, dest, max_members=10, max_member_bytes=1024, max_total_bytes=4096)
    assert reason in str(refused.value)
    assert "member" in str(refused.value) or "more than" in str(refused.value)
    assert _tree(outer) == {"a", "a/b", "a/b/dest"}  # nothing written, in dest or out
    assert not Path("/tmp/ett-abs-escape").exists()


def _good() -> bytes:
    return _tar(
        _entry("d", tarfile.DIRTYPE, mode=0o777),
        _file("d/kernel.so", b"\x7fELF", mode=0o775),
        _file("d/source.cpp", b"int x;", mode=0o666),
        _file("d/nested/deep/entry", b"fx" * 100, mode=0o400),
        _entry("d/same.cpp", tarfile.LNKTYPE, "d/source.cpp"),
        _entry("d/alias", tarfile.SYMTYPE, "nested/deep"),
        _entry("top", tarfile.SYMTYPE, "d/nested/../kernel.so"),
        _file("through/link/ok", b"ok"),  # parents made implicitly
    )


def _snapshot(root: Path) -> dict[str, tuple[str, int | None, bytes | str | None]]:
    out: dict[str, tuple[str, int | None, bytes | str | None]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", None, str(path.readlink()))
        elif path.is_dir():
            out[rel] = ("dir", None, None)
        else:
            out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return out


def test_a_good_archive_extracts_the_same_on_both_paths(
    extraction_path: str, box: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest, outer = box
    with _open(_good()) as tar:
        assert safe_extract(tar, dest) == 8
    got = _snapshot(dest)
    assert got["d/kernel.so"] == ("file", 0o755, b"\x7fELF")
    assert got["d/source.cpp"] == ("file", 0o644, b"int x;")  # group/other write dropped
    assert got["d/nested/deep/entry"] == ("file", 0o600, b"fx" * 100)  # owner rw added
    assert got["d/same.cpp"] == ("file", 0o644, b"int x;")
    assert got["d/alias"] == ("link", None, "nested/deep")
    assert got["top"] == ("link", None, "d/nested/../kernel.so")
    assert (dest / "top").read_bytes() == b"\x7fELF"
    assert got["through/link/ok"] == ("file", 0o644, b"ok")
    assert _tree(outer) == {"a", "a/b", "a/b/dest", *(f"a/b/dest/{p}" for p in got)}

    # The same archive through the 3.11.2 path gives the same tree (modes included).
    if extraction_path == "3.11.2 fallback":
        return  # compared from the "filter" run (absent on a 3.11.2 interpreter)
    monkeypatch.setattr(cc, "_HAS_DATA_FILTER", False)
    other = tmp_path / "other"
    other.mkdir()
    with _open(_good()) as tar:
        safe_extract(tar, other)
    assert _snapshot(other) == got
