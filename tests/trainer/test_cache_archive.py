"""A compile-cache archive's headers are bounded before tarfile expands them (issue 22,
class 3): a 509 KB gzip whose tar holds a 512 MB long-name header cost 4.5 GB before the
member checks ran; now it is refused at its header, in a few MB."""

from __future__ import annotations

import functools
import gzip
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from airflow_ett.trainer.cache_archive import MAX_HEADER_BYTES, UnsafeArchiveError, open_archive

BOMB_BYTES = 512 << 20


@functools.cache
def header_bomb(kind: bytes = tarfile.GNUTYPE_LONGNAME, size: int = BOMB_BYTES) -> bytes:
    """A gzip'd tar whose first member is a `kind` header of `size` zero bytes: about
    500 KB compressed (zeros compress ~1000x)."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = kind, size
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(info.tobuf(tarfile.USTAR_FORMAT))
        zeros = bytes(1 << 20)
        for _ in range(size // len(zeros)):
            gz.write(zeros)
        gz.write(bytes(size % len(zeros) + 1024))
    return buf.getvalue()


def sparse_member() -> bytes:
    info = tarfile.TarInfo("a.so")
    info.type, info.size = tarfile.GNUTYPE_SPARSE, 0
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(bytes(block) + bytes(1024))
    return buf.getvalue()


def test_the_bomb_is_small() -> None:
    assert len(header_bomb()) < 600_000


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK,
                                  tarfile.XHDTYPE, tarfile.XGLTYPE])
def test_an_oversize_extended_header_is_refused_before_it_is_read(
        tmp_path: Path, kind: bytes) -> None:
    archive = tmp_path / "inductor.tar.gz"
    archive.write_bytes(header_bomb(kind, MAX_HEADER_BYTES + 1))
    with pytest.raises(UnsafeArchiveError, match=f"a '{kind.decode()}' header of 65,537 bytes"):
        open_archive(archive)


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "inductor.tar.gz"
    archive.write_bytes(sparse_member())
    with pytest.raises(UnsafeArchiveError, match=r"'a\.so': a sparse file"):
        open_archive(archive)


def test_long_names_within_the_bound_still_read(tmp_path: Path) -> None:
    """Inductor's names are short, but a GNU long name or a pax header of a few hundred
    bytes is an ordinary archive."""
    names = ["d/" + "n" * 300, "p/" + "é" * 200]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        archive = tmp_path / f"{fmt}.tar.gz"
        with tarfile.open(archive, mode="w:gz", format=fmt) as tar:
            for name in names:
                info = tarfile.TarInfo(name)
                info.size = 2
                tar.addfile(info, io.BytesIO(b"ok"))
        with open_archive(archive) as tar:
            assert tar.getnames() == names


def test_the_512_mb_header_costs_a_few_mb(tmp_path: Path) -> None:
    """Measured in a fresh process (peak RSS): refused at the header, never read."""
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(header_bomb())
    code = (
        "import json, resource, sys\n"
        "from pathlib import Path\n"
        "from airflow_ett.trainer.cache_archive import UnsafeArchiveError, open_archive\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    open_archive(Path(sys.argv[1]))\n"
        "    said = 'opened'\n"
        "except UnsafeArchiveError as exc:\n"
        "    said = str(exc)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'said': said, 'grew_kb': after - before}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(archive)], capture_output=True,
                          text=True, timeout=120, check=True)
    result = json.loads(done.stdout)
    assert result["said"].startswith("a 'L' header of 536,870,912 bytes"), result
    assert result["grew_kb"] < 32 << 10, result  # under 32 MB (the header is 512 MB)
