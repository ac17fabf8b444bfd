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

The manifest is a `Manifest` (each part's record a `PayloadFile`: `ArtifactsPart`,
`ArchivePart`, `PrecompiledPart`), written by `write_manifest` alone and read by
`read_manifest` alone. Every file is read as untrusted (`airflow_ett._untrusted`: regular
files only, bounded sizes); a bad manifest or payload raises `EntryError` with a one-line
reason naming the field and its value, and the caller ignores that entry or part. A
malformed part's record is read as a `BadPart`, so that part alone is dropped. Checksums
catch damage, not tampering (docs/security.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final, TypeGuard, TypeVar

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
from airflow_ett.trainer.compile_cache.inductor import VecIsaRecord
from airflow_ett.trainer.compile_cache.key import CACHE_FORMAT

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

MANIFEST_NAME = "manifest.json"
ARTIFACTS_PREFIX = "artifacts-"
ARCHIVE_PREFIX = "inductor-"
PRECOMPILED_PREFIX = "precompiled-"
#: Payloads no manifest names are deleted by a later save only once this old.
_ORPHAN_GRACE_S = 600.0
_CHUNK = 1 << 20
#: A manifest names a few payloads and each precompiled forward's span: a few KB.
MAX_MANIFEST_BYTES = 16 << 20
_SHA256: Final = re.compile(r"[0-9a-f]{64}")


class EntryError(Exception):
    """An entry (or one part of it) that must be ignored; the message is the reason."""


class NoEntry(EntryError):
    """No entry at all: a plain miss, not worth a warning."""


class PayloadGone(EntryError):
    """A payload the manifest names is missing (a concurrent save may have replaced it)."""


# -- the manifest ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PayloadFile:
    """A payload file as the manifest names it: in the entry dir, with size and SHA-256."""

    file: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ArtifactsPart(PayloadFile):
    """torch's portable artifacts, and how many of each kind they hold."""

    counts: dict[str, int]


@dataclass(frozen=True, slots=True)
class ArchivePart(PayloadFile):
    """The archive of the inductor dir: its member count and unpacked bytes."""

    files: int
    unpacked_bytes: int


@dataclass(frozen=True, slots=True)
class Span:
    """Where one precompiled forward lies in the precompiled payload."""

    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class PrecompiledPart(PayloadFile):
    """The precompiled forwards back to back, indexed by name."""

    forwards: dict[str, Span]


@dataclass(frozen=True, slots=True)
class BadPart:
    """A part whose manifest record is malformed (read only): that part alone is dropped,
    with `reason`."""

    reason: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """An entry's `manifest.json` (module docstring). A part is None when the entry has
    none (no artifacts recorded, no forward precompiled)."""

    key: str
    torch: str
    python: str
    settings: dict[str, bool]
    created: float
    host: str
    artifacts: ArtifactsPart | BadPart | None
    inductor_dir: ArchivePart | BadPart | None
    precompiled: PrecompiledPart | BadPart | None
    jit_forwards: tuple[str, ...]
    vec_isa: VecIsaRecord | None
    format: int = CACHE_FORMAT


P = TypeVar("P", bound=PayloadFile)


class _HashingWriter(io.RawIOBase):
    """A write-only file wrapper that counts and hashes what passes through it."""

    def __init__(self, target: IO[bytes]) -> None:
        self._target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        self._target.write(view)
        self.sha256.update(view)
        self.size += len(view)
        return len(view)


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


def read_manifest(entry: Path, key: str,
                  settings_problem: Callable[[dict[str, bool]], str | None]) -> Manifest:
    """The manifest of the entry dir `entry` for `key`, checked against this process (cache
    format, key, torch version, and the inductor settings the saver recorded, which
    `settings_problem` says why this process cannot use, or None); `NoEntry` when there is
    none, `EntryError` (one line naming the field and its value) when it is not one to
    use. A malformed part's record is read as a `BadPart`: the other parts stay usable."""
    import torch

    path = entry / MANIFEST_NAME
    try:
        raw = read_text(path, what="manifest", max_bytes=MAX_MANIFEST_BYTES)
        loaded = parse_json(raw, what="manifest", path=path)
    except MissingFileError:
        raise NoEntry(f"no entry for key {key} under {entry.parent}") from None
    except UntrustedFileError as exc:  # not a regular file, too large, not JSON, deep
        raise EntryError(f"manifest unreadable: {exc.reason}") from None
    if not isinstance(loaded, dict):
        raise EntryError("manifest is not a JSON object")
    doc: dict[str, object] = loaded
    if doc.get("format") != CACHE_FORMAT:  # first: another format may have other fields
        raise EntryError(
            f"stale entry: cache format {_show(doc.get('format'))}, expected {CACHE_FORMAT}"
        )
    if doc.get("key") != key:
        raise EntryError(f"manifest names key {_show(doc.get('key'))}, not {key!r}")
    if doc.get("torch") != torch.__version__:
        raise EntryError(
            f"version mismatch: entry written by torch {str(doc.get('torch'))[:80]}, "
            f"this is {torch.__version__}"
        )
    settings = _settings(doc.get("settings"))
    problem = settings_problem(settings)
    if problem is not None:
        raise EntryError(problem)
    return Manifest(
        key=key,
        torch=torch.__version__,
        python=_text(doc, "python"),
        settings=settings,
        created=_seconds(doc, "created"),
        host=_text(doc, "host"),
        artifacts=_part(doc.get("artifacts"), "artifacts", _artifacts),
        inductor_dir=_part(doc.get("inductor_dir"), "inductor dir archive", _archive),
        precompiled=_part(doc.get("precompiled"), "precompiled forwards", _precompiled),
        jit_forwards=_names(doc.get("jit_forwards")),
        vec_isa=_vec_isa(doc.get("vec_isa")),
    )


def _show(value: object) -> str:
    """A value for a reason: its repr, cut to one short line."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: object) -> TypeGuard[int]:
    """An integer, not a bool (JSON's `true` is no size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _text(doc: Mapping[str, object], name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str):
        raise EntryError(f"manifest: {name} is {_show(value)}, not a string")
    return value


def _seconds(doc: Mapping[str, object], name: str) -> float:
    value = doc.get(name)
    if _is_int(value) or (isinstance(value, float) and math.isfinite(value)):
        return float(value)
    raise EntryError(f"manifest: {name} is {_show(value)}, not a time")


def _settings(value: object) -> dict[str, bool]:
    if isinstance(value, dict) and all(isinstance(v, bool) for v in value.values()):
        return value
    raise EntryError(f"manifest: settings is {_show(value)}, not inductor settings")


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise EntryError(f"manifest: jit_forwards is {_show(value)}, not a list of names")
    return tuple(value)


def _vec_isa(value: object) -> VecIsaRecord | None:
    if value is None:
        return None
    if isinstance(value, dict):
        ok, isas, compiler = value.get("ok"), value.get("isas"), value.get("compiler")
        if (isinstance(ok, bool) and isinstance(isas, list)
                and all(isinstance(i, str) for i in isas) and isinstance(compiler, str)):
            return VecIsaRecord(ok=ok, isas=tuple(isas), compiler=compiler)
    raise EntryError(f"manifest: vec_isa is {_show(value)}, not a vector-ISA record")


class _Bad(Exception):
    """A part's record is malformed; the message is the reason."""


def _part(value: object, what: str,
          build: Callable[[PayloadFile, dict[str, object], str], P]) -> P | BadPart | None:
    """A part's record: None when the entry has none, a `BadPart` when it is malformed."""
    if value is None:
        return None
    try:
        if not isinstance(value, dict) or not {"file", "size", "sha256"} <= value.keys():
            raise _Bad(f"manifest has no valid {what} record")
        name, size, digest = value["file"], value["size"], value["sha256"]
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise _Bad(f"manifest names a bad {what} file {_show(name)}")
        if not _is_int(size) or size < 0:
            raise _Bad(f"manifest: the {what} record's size is {_show(size)}, not a size")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise _Bad(f"manifest: the {what} record's sha256 is {_show(digest)}, not a "
                       "SHA-256")
        return build(PayloadFile(file=name, size=size, sha256=digest), value, what)
    except _Bad as bad:
        return BadPart(str(bad))


def _count(record: Mapping[str, object], name: str, what: str) -> int:
    value = record.get(name)
    if not _is_int(value) or value < 0:
        raise _Bad(f"manifest: the {what} record's {name} is {_show(value)}, not a count")
    return value


def _artifacts(file: PayloadFile, record: dict[str, object], what: str) -> ArtifactsPart:
    counts = record.get("counts")
    if not isinstance(counts, dict) or not all(_is_int(n) for n in counts.values()):
        raise _Bad(f"manifest: the {what} record's counts are {_show(counts)}, not counts "
                   "by kind")
    return ArtifactsPart(file.file, file.size, file.sha256, counts=counts)


def _archive(file: PayloadFile, record: dict[str, object], what: str) -> ArchivePart:
    return ArchivePart(file.file, file.size, file.sha256, files=_count(record, "files", what),
                       unpacked_bytes=_count(record, "unpacked_bytes", what))


def _precompiled(file: PayloadFile, record: dict[str, object], what: str) -> PrecompiledPart:
    """The forwards' index; each span is checked against the payload once it is read
    (`read_precompiled`)."""
    index = record.get("forwards")
    if not isinstance(index, dict) or not index:
        raise _Bad(f"{what} index is not a non-empty object: {_show(index)}")
    forwards: dict[str, Span] = {}
    for name, span in index.items():
        offset, size = (span.get("offset"), span.get("size")) if isinstance(span, dict) \
            else (None, None)
        if not (isinstance(name, str) and name and _is_int(offset) and _is_int(size)
                and offset >= 0 and size > 0):
            raise _Bad(f"{what} index: bad span {_show(name)}: {_show(span)}")
        forwards[name] = Span(offset=offset, size=size)
    return PrecompiledPart(file.file, file.size, file.sha256, forwards=forwards)


def _valid(meta: P | BadPart | None, what: str) -> P:
    """The part's record, or the `EntryError` that drops that part."""
    if meta is None:
        raise EntryError(f"manifest has no valid {what} record")
    if isinstance(meta, BadPart):
        raise EntryError(meta.reason)
    return meta


# -- payloads ----------------------------------------------------------------------------


def payload(entry: Path, meta: PayloadFile | BadPart | None, what: str) -> Path:
    """The verified path of a payload named in a manifest (size and SHA-256 checked)."""
    return _verified(entry, _valid(meta, what), what)


def _verified(entry: Path, meta: PayloadFile, what: str) -> Path:
    path = entry / meta.file
    try:
        size, digest = _file_digest(path, limit=min(meta.size, MAX_ARCHIVE_BYTES))
    except MissingFileError:
        raise PayloadGone(f"{what} file {meta.file} is missing") from None
    except UntrustedFileError as exc:
        raise EntryError(f"{what} file {meta.file}: {exc.reason}") from None
    if size != meta.size:
        raise EntryError(
            f"{what} file {meta.file} has {size} bytes, manifest says {meta.size} (truncated?)"
        )
    if digest != meta.sha256:
        raise EntryError(f"{what} file {meta.file} fails its checksum (corrupt)")
    return path


def payload_bytes(entry: Path, meta: PayloadFile | BadPart | None, what: str) -> bytes:
    """A verified payload's bytes, read again bounded by its verified size (a file
    swapped since is refused, not read without bound)."""
    return _verified_bytes(entry, _valid(meta, what), what)


def _verified_bytes(entry: Path, meta: PayloadFile, what: str) -> bytes:
    path = _verified(entry, meta, what)
    try:
        return read_bytes(path, what=f"{what} file", max_bytes=meta.size)
    except UntrustedFileError as exc:
        raise EntryError(str(exc)) from None


def read_precompiled(entry: Path, manifest: Manifest) -> dict[str, bytes]:
    """Read and checksum the precompiled forwards' payload; split it by the manifest's
    index (name -> offset, size). Nothing is unpickled here: `precompile` does that for
    the forwards the run installs."""
    what = "precompiled forwards"
    meta = _valid(manifest.precompiled, what)
    blob = _verified_bytes(entry, meta, what)
    parts: dict[str, bytes] = {}
    for name, span in meta.forwards.items():
        if span.offset + span.size > len(blob):
            raise EntryError(f"{what} index: bad span {name!r}: {span} (payload has "
                             f"{len(blob)} bytes)")
        parts[name] = blob[span.offset:span.offset + span.size]
    return parts


def write_payload(
    entry: Path, prefix: str, suffix: str, write: Callable[[IO[bytes]], object]
) -> PayloadFile:
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
    return PayloadFile(file=name, size=hashing.size, sha256=digest)


def write_precompiled(entry: Path, blobs: Mapping[str, bytes]) -> PrecompiledPart | None:
    """One payload with every precompiled forward in `blobs`, back to back; the manifest
    record indexes them by name. None when there is none."""
    if not blobs:
        return None
    index: dict[str, Span] = {}
    offset = 0
    for name, blob in blobs.items():
        index[name] = Span(offset=offset, size=len(blob))
        offset += len(blob)

    def write(fh: IO[bytes]) -> None:
        for blob in blobs.values():
            fh.write(blob)

    meta = write_payload(entry, PRECOMPILED_PREFIX, ".bin", write)
    return PrecompiledPart(meta.file, meta.size, meta.sha256, forwards=index)


def write_manifest(entry: Path, manifest: Manifest) -> None:
    """Write the manifest, last and atomically, then remove the payloads it orphaned."""
    bad = [p for p in (manifest.artifacts, manifest.inductor_dir, manifest.precompiled)
           if isinstance(p, BadPart)]
    if bad:
        raise ValueError(f"a manifest with a bad part is not written: {bad[0].reason}")
    # a cache may be lost, never lie: the directory fsync is best effort
    atomic_write(entry / MANIFEST_NAME,
                 json.dumps(asdict(manifest), indent=2, sort_keys=True).encode(),
                 best_effort_dir_sync=True)
    remove_orphans(entry, manifest)


def remove_orphans(entry: Path, manifest: Manifest) -> None:
    """Delete payloads no manifest names, once older than the grace period (a reader
    may still hold the manifest that named them)."""
    keep = {
        part.file
        for part in (manifest.artifacts, manifest.inductor_dir, manifest.precompiled)
        if isinstance(part, PayloadFile)
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
