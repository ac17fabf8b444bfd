"""An entry on disk: its manifest, its payload files, and the rules that keep them whole.

`<root>/<key>/manifest.json` names immutable payload files in the same directory,
`artifacts-<sha>.bin`, `inductor-<sha>.tar.gz` and `precompiled-<sha>.bin` (the forwards
back to back, indexed by name in the manifest), each with size and SHA-256. The manifest
also lists `jit_forwards`, the forwards the saver could not compile ahead of time, so that
a loader compiles them just in time without trying again.

A saver writes each payload atomically (`airflow_ett._fs.atomic_file`: hidden temp file,
fsync, rename into place) and the manifest the same way, last. A reader that sees a
manifest therefore sees complete payloads; two concurrent savers each write their own
payload files and the last manifest wins. Payloads no manifest names are removed by later
saves once older than `_ORPHAN_GRACE_S`, so a reader holding an older manifest has time
to finish; a reader that finds a payload gone (`PayloadGone`) re-reads the manifest once.
Directory fsyncs are best effort: a lost entry costs a compile, never a wrong result.

Every file is read as untrusted (`airflow_ett._untrusted`: regular files only, bounded
sizes); a bad manifest or payload raises `EntryError` with the reason, and the caller
ignores that entry or part. Checksums catch damage, not tampering (docs/security.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from airflow_ett._fs import atomic_file, atomic_write
from airflow_ett._untrusted import (
    MissingFileError,
    UntrustedFileError,
    open_regular,
    parse_json,
    read_bytes,
    read_text,
)
from airflow_ett.trainer.cache_archive import MAX_ARCHIVE_BYTES
from airflow_ett.trainer.compile_cache.key import CACHE_FORMAT

MANIFEST_NAME = "manifest.json"
ARTIFACTS_PREFIX = "artifacts-"
ARCHIVE_PREFIX = "inductor-"
PRECOMPILED_PREFIX = "precompiled-"
#: Payloads no manifest names are deleted by a later save only once this old.
_ORPHAN_GRACE_S = 600.0
_CHUNK = 1 << 20
#: A manifest names a few payloads and each precompiled forward's span: a few KB.
MAX_MANIFEST_BYTES = 16 << 20


class EntryError(Exception):
    """An entry (or one part of it) that must be ignored; the message is the reason."""


class NoEntry(EntryError):
    """No entry at all: a plain miss, not worth a warning."""


class PayloadGone(EntryError):
    """A payload the manifest names is missing (a concurrent save may have replaced it)."""


class _HashingWriter(io.RawIOBase):
    """A write-only file wrapper that counts and hashes what passes through it."""

    def __init__(self, target: IO[bytes]) -> None:
        self._target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._target.write(view)
        self.sha256.update(view)
        self.size += len(view)
        return len(view)


def _declared_size(value: Any) -> int:
    """A manifest's size for a payload, as a bound for reading it (0 when it is no size:
    the digest then reads one byte and the size check fails)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return min(value, MAX_ARCHIVE_BYTES)


def _file_digest(path: Path, *, limit: int) -> tuple[int, str]:
    """Size and SHA-256 of the regular file at `path`, read to at most `limit` + 1 bytes
    (a longer file is told by its size without being read to its end, and a FIFO or a
    device is refused: `UntrustedFileError`)."""
    digest = hashlib.sha256()
    size = 0
    with open_regular(path, what="compile cache file") as fh:
        while size <= limit and (chunk := fh.read(min(_CHUNK, limit + 1 - size))):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def check_key(key: str) -> None:
    if not key or not all(c.isalnum() or c in "-_." for c in key) or key.startswith("."):
        raise ValueError(f"bad compile cache key {key!r}: use cache_key()")


def read_manifest(entry: Path, key: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest of the entry dir `entry` for `key`, checked against this process (cache
    format, key, torch version, inductor `settings`); `NoEntry` when there is none."""
    import torch

    path = entry / MANIFEST_NAME
    try:
        raw = read_text(path, what="manifest", max_bytes=MAX_MANIFEST_BYTES)
        manifest = parse_json(raw, what="manifest", path=path)
    except MissingFileError:
        raise NoEntry(f"no entry for key {key} under {entry.parent}") from None
    except UntrustedFileError as exc:  # not a regular file, too large, not JSON, deep
        raise EntryError(f"manifest unreadable: {exc.reason}") from None
    if not isinstance(manifest, dict):
        raise EntryError("manifest is not a JSON object")
    if manifest.get("format") != CACHE_FORMAT:
        raise EntryError(
            f"stale entry: cache format {manifest.get('format')!r}, expected {CACHE_FORMAT}"
        )
    if manifest.get("key") != key:
        raise EntryError(f"manifest names key {manifest.get('key')!r}, not {key!r}")
    if manifest.get("torch") != torch.__version__:
        raise EntryError(
            f"version mismatch: entry written by torch {manifest.get('torch')}, "
            f"this is {torch.__version__}"
        )
    if manifest.get("settings") != settings:
        raise EntryError(
            f"inductor settings differ: entry {manifest.get('settings')}, "
            f"this process {settings}"
        )
    return manifest


def payload(entry: Path, meta: Any, what: str) -> Path:
    """The verified path of a payload named in a manifest (size and SHA-256 checked)."""
    if not isinstance(meta, dict) or not {"file", "size", "sha256"} <= meta.keys():
        raise EntryError(f"manifest has no valid {what} record")
    name = meta["file"]
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        raise EntryError(f"manifest names a bad {what} file {name!r}")
    path = entry / name
    try:
        size, digest = _file_digest(path, limit=_declared_size(meta["size"]))
    except MissingFileError:
        raise PayloadGone(f"{what} file {name} is missing") from None
    except UntrustedFileError as exc:
        raise EntryError(f"{what} file {name}: {exc.reason}") from None
    if size != meta["size"]:
        raise EntryError(
            f"{what} file {name} has {size} bytes, manifest says {meta['size']} (truncated?)"
        )
    if digest != meta["sha256"]:
        raise EntryError(f"{what} file {name} fails its checksum (corrupt)")
    return path


def payload_bytes(entry: Path, meta: Any, what: str) -> bytes:
    """A verified payload's bytes, read again bounded by its verified size (a file
    swapped since is refused, not read without bound)."""
    path = payload(entry, meta, what)
    try:
        return read_bytes(path, what=f"{what} file", max_bytes=int(meta["size"]))
    except UntrustedFileError as exc:
        raise EntryError(str(exc)) from None


def read_precompiled(entry: Path, manifest: dict[str, Any]) -> dict[str, bytes]:
    """Read and checksum the precompiled forwards' payload; split it by the manifest's
    index (name -> offset, size). Nothing is unpickled here: `precompile` does that for
    the forwards the run installs."""
    meta = manifest["precompiled"]
    blob = payload_bytes(entry, meta, "precompiled forwards")
    index = meta.get("forwards")
    if not isinstance(index, dict) or not index:
        raise EntryError(f"precompiled forwards index is not a non-empty object: {index!r}")
    parts: dict[str, bytes] = {}
    for name, span in index.items():
        offset, size = (span.get("offset"), span.get("size")) if isinstance(span, dict) \
            else (None, None)
        if not (isinstance(name, str) and name and isinstance(offset, int)
                and isinstance(size, int) and offset >= 0 and size > 0
                and offset + size <= len(blob)):
            raise EntryError(f"precompiled forwards index: bad span {name!r}: {span!r} "
                             f"(payload has {len(blob)} bytes)")
        parts[name] = blob[offset:offset + size]
    return parts


def write_payload(
    entry: Path, prefix: str, suffix: str, write: Callable[[IO[bytes]], object]
) -> dict[str, Any]:
    """Write a payload through `write(fh)`, hashed on the way, and rename it to its
    content-addressed name. Returns its manifest record."""
    with atomic_file(entry / prefix.rstrip("-"), best_effort_dir_sync=True) as out:
        hashing = _HashingWriter(out.file)
        buffered = io.BufferedWriter(hashing, buffer_size=_CHUNK)
        write(buffered)
        buffered.flush()
        digest = hashing.sha256.hexdigest()
        name = f"{prefix}{digest[:32]}{suffix}"
        out.path = entry / name  # content-addressed: named once all is written
    return {"file": name, "size": hashing.size, "sha256": digest}


def write_precompiled(entry: Path, blobs: Mapping[str, bytes]) -> dict[str, Any] | None:
    """One payload with every precompiled forward in `blobs`, back to back; the manifest
    record indexes them by name. None when there is none."""
    if not blobs:
        return None
    index: dict[str, dict[str, int]] = {}
    offset = 0
    for name, blob in blobs.items():
        index[name] = {"offset": offset, "size": len(blob)}
        offset += len(blob)

    def write(fh: IO[bytes]) -> None:
        for blob in blobs.values():
            fh.write(blob)

    meta = write_payload(entry, PRECOMPILED_PREFIX, ".bin", write)
    meta["forwards"] = index
    return meta


def write_manifest(entry: Path, manifest: Mapping[str, Any]) -> None:
    """Write the manifest, last and atomically, then remove the payloads it orphaned."""
    # a cache may be lost, never lie: the directory fsync is best effort
    atomic_write(entry / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True).encode(),
                 best_effort_dir_sync=True)
    remove_orphans(entry, manifest)


def remove_orphans(entry: Path, manifest: Mapping[str, Any]) -> None:
    """Delete payloads no manifest names, once older than the grace period (a reader
    may still hold the manifest that named them)."""
    keep = {
        meta["file"]
        for meta in (manifest.get("artifacts"), manifest.get("inductor_dir"),
                     manifest.get("precompiled"))
        if isinstance(meta, dict)
    }
    now = time.time()
    for path in entry.iterdir():
        name = path.name
        is_payload = name.startswith((ARTIFACTS_PREFIX, ARCHIVE_PREFIX, PRECOMPILED_PREFIX))
        is_stale_tmp = name.startswith(".") and name.endswith(".tmp")
        if name in keep or not (is_payload or is_stale_tmp):
            continue
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > _ORPHAN_GRACE_S:
                path.unlink()
