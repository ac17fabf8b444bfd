"""The one reader of untrusted files: regular files only, bounded size, UTF-8, depth."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett._untrusted import (
    UntrustedFileError,
    load_json,
    load_toml,
    nesting_depth,
    parse_json,
    parse_toml,
    read_bytes,
    read_text,
)


def _error(call, *args, **kwargs) -> str:
    with pytest.raises(UntrustedFileError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_reads_a_regular_file_whole(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_bytes(b"\xef\xbb\xbfa = 1\n")
    assert read_bytes(f, what="tenants file", max_bytes=100) == b"\xef\xbb\xbfa = 1\n"
    assert read_text(f, what="tenants file", max_bytes=100) == "a = 1\n"
    assert load_toml(f, what="tenants file", max_bytes=100) == {"a": 1}


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done: list[str] = []

    def read() -> None:
        done.append(_error(read_bytes, fifo, what="tenants file", max_bytes=100))

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(timeout=30)  # a blocking open would never return: the thread stays alive
    assert not worker.is_alive(), "reading a FIFO blocked"
    assert done == [f"tenants file {fifo}: not a regular file (a FIFO)"]


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/null"])
def test_a_symlink_to_a_device_is_refused(tmp_path: Path, target: str) -> None:
    link = tmp_path / "request.json"
    link.symlink_to(target)
    message = _error(read_bytes, link, what="preemption request", max_bytes=10)
    assert message.endswith("not a regular file (a character device)")


def test_directories_sockets_and_missing_files(tmp_path: Path) -> None:
    assert _error(read_bytes, tmp_path, what="x", max_bytes=1).endswith(
        "not a regular file (a directory)")
    assert _error(read_bytes, tmp_path / "nope", what="x", max_bytes=1).endswith("not found")
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert _error(read_bytes, path, what="x", max_bytes=1).endswith(
            "not a regular file (a socket)")


def test_size_is_bounded_and_reads_one_byte_more(tmp_path: Path) -> None:
    f = tmp_path / "big"
    f.write_bytes(b"x" * 101)
    assert _error(read_bytes, f, what="trainer config", max_bytes=100).endswith(
        "larger than its limit of 100 bytes")
    assert read_bytes(f, what="trainer config", max_bytes=101) == b"x" * 101


def test_a_sparse_huge_file_costs_only_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "sparse"
    with f.open("wb") as fh:
        fh.truncate(1 << 40)  # 1 TiB of holes: reading it whole would never end
    started = time.monotonic()
    _error(read_bytes, f, what="x", max_bytes=1 << 16)
    assert time.monotonic() - started < 30


def test_not_utf8_names_the_byte(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_bytes(b'{"a": "\xff"}')
    assert _error(read_text, f, what="trainer config", max_bytes=100) == (
        f"trainer config {f}: not UTF-8 text (byte 7: b'\\xff')")


@pytest.mark.parametrize("depth", [33, 5000, 100_000])
def test_deep_json_is_one_error_not_a_recursion_error(depth: int) -> None:
    text = "[" * depth + "]" * depth
    assert _error(parse_json, text, what="request", path="r.json").endswith(
        "nested deeper than 32 levels")


@pytest.mark.parametrize("depth", [33, 5000])
def test_deep_toml_is_one_error_not_a_recursion_error(depth: int) -> None:
    arrays = "a = " + "[" * depth + "]" * depth
    tables = "a = " + "{b = " * depth + "1" + "}" * depth
    for text in (arrays, tables):
        assert _error(parse_toml, text, what="tenants file", path="t.toml").endswith(
            "nested deeper than 32 levels")


def test_depth_at_the_limit_is_read() -> None:
    assert nesting_depth(parse_json("[" * 32 + "]" * 32, what="x", path="p"),
                         stop_after=40) == 32
    assert parse_json('{"a": {"b": [1]}}', what="x", path="p", max_depth=3) == {
        "a": {"b": [1]}}


def test_invalid_syntax_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_text("{nope")
    assert "not valid JSON" in _error(load_json, f, what="trainer config", max_bytes=100)
    assert "not valid TOML" in _error(parse_toml, "a = = 1", what="t", path="p")


@given(st.binary(max_size=200))
def test_any_bytes_give_a_value_or_the_one_error(data: bytes) -> None:
    for parse in (parse_json, parse_toml):
        try:
            text = data.decode("utf-8")
            parse(text, what="x", path="p")
        except (UnicodeDecodeError, UntrustedFileError):
            pass


@given(st.recursive(st.integers(), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=2), inner, max_size=3), max_leaves=20))
def test_nesting_depth_matches_a_recursive_count(value: object) -> None:
    def depth(v: object) -> int:
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        return 0

    assert nesting_depth(value, stop_after=100) == depth(value)
