"""Checkpoints that cost the training loop as little as possible and never lie about being done.

A `CheckpointManager` saves and restores DCP (`torch.distributed.checkpoint`) state dicts
in the spirit of torchtitan's CheckpointManager, with three promises:

1. **A checkpoint counts only when complete.** DCP writes into
   `<dir>/.tmp-step-<step>-<token>/` with `sync_files=True` (every data file and
   `.metadata` fsynced). Then the coordinator (rank 0 of the checkpoint group) fsyncs that
   directory, renames it to `<dir>/step-<step:010d>/` (atomic on one filesystem), fsyncs
   `<dir>`, and writes the commit marker `COMMITTED.json` LAST (`airflow_ett._fs.
   atomic_write`: temp file, fsync, rename, fsync). The marker holds step, `extra` (the
   caller's small JSON metadata: data cursor, RNG states...), bytes, times and the size
   and CRC32 of every DCP file. A crash at any
   point leaves either an unrenamed temp directory or a step directory without a marker,
   and neither is ever restored.
2. **Restore takes the newest checkpoint that is really valid.** Newest first; a step
   directory without a (readable, matching) marker, whose files differ from the marker's
   sizes or checksums (a truncated or damaged file), or whose DCP load raises is skipped
   with a warning naming it and why, and the previous one is tried. Validation happens
   before any tensor is touched; if a DCP load fails half-way and no older checkpoint
   loads either, restore raises instead of letting training start "from scratch" on
   half-loaded weights.
3. **Saving blocks the caller only for a memory copy** (`async_save=True`), and at most
   one save is in flight: a save while one is in flight first waits for it, and that wait
   counts in its `blocking_s`. With `overlap_staging` even the copy leaves the caller's
   thread: `save()` returns once the copies are started, and the caller passes a barrier
   (`wait_staged()`) before training next modifies the state; the blocking time is then
   `save()` plus that wait. The barrier compares every source tensor's version counter
   with its value at `save()`, so a state modified too early fails the save rather than
   commits a torn snapshot.

Why staging is ours and not `dcp.async_save`'s default stager: the default stager fails
on the ShardedTensors TorchRec uses for sharded tables (`data_ptr ... not supported`, torch
2.13, torchrec 1.8). So `save()` stages by itself: it calls `state_dict()` on every
top-level `Stateful`, then copies every tensor into CPU memory that training never
touches -- plain tensors, each local shard of a ShardedTensor (rebuilt with the same
global metadata, placement moved to CPU) and the local tensor of a DTensor -- and
deep-copies the small non-tensor leaves. With CUDA the buffers are pinned and the copies
non-blocking, synchronised once at the end. The buffers are kept and reused from one save
to the next (`reuse_staging_buffers`, as torchtitan does with pinned memory): the previous
save has always finished before the next staging starts, so reuse is safe, and it removes
the allocation and page-fault cost that dominates a fresh copy on CPU, which is what takes
the blocking part of a save below a plain `clone()` of the state (figures: bench/RESULTS.md,
"Checkpoint blocking"). The staged copy is then written by a plain `dcp.save` on one
background thread, followed by the commit, which is what `dcp.async_save` with a blocking
stager would do, but with the commit ordered after the write on the same thread and its
errors reported through one future.

Why a dedicated process group: `dcp.async_save` on the default group deadlocked while
training went on (observed in issue 3). DCP coordinates a save with collectives (gather
plans, scatter the global plan, gather write results) issued from the background thread,
while training issues its own collectives from the main thread; on one process group the
ranks may then interleave the two streams in different orders and wait on each other
forever. When torch.distributed is initialized, every checkpoint collective goes through a
gloo group of its own (`dist.new_group(backend="gloo")`, created once per default group
and shared by managers), or the group passed in. Only the background thread uses it while
a save is in flight; restore and start-up use it from the caller's thread when none is.

Without torch.distributed (one process), DCP runs with `no_dist=True` and every
coordination step below is local.

`extra` is per rank: the marker's `extra` is rank 0's (what discovery reads: cursor,
step), and when ranks saved different ones (their own RNG states, say) the marker also
lists them all and `restore` gives each rank its own, as long as the world size is the
same.

The directory must be one filesystem shared by all ranks (DCP's `FileSystemWriter`
assumes it too: the coordinator renames the directory all ranks wrote into). Each rank
checksums its own data files (DCP names them `__<rank>_<n>.distcp`) and the coordinator
gathers the lists into the marker, so that work is spread like the write; at restore the
coordinator alone verifies (`verify="size"` skips the re-read for huge checkpoints).

Checkpoints are read as untrusted input
---------------------------------------
A commit marker's CRCs catch damage, not tampering: anyone who can write the checkpoint
directory can also rewrite the marker. DCP itself reads `.metadata` with a plain
`pickle.load` and non-tensor leaves (optimizer hyperparameters, say) with
`torch.load(weights_only=False)`, so a crafted checkpoint ran code in the restoring process
(train and publish hosts). Every read here therefore goes through `SafeFileSystemReader`,
whose unpickler admits only DCP's metadata classes, torch sizes, dtypes, layouts and
memory formats, `pathlib` paths and plain builtins (`METADATA_GLOBALS`), and
`SafeLoadPlanner`, which loads those leaves with `torch.load(weights_only=True)`. The
coordinator also reads the metadata that way while validating, so a checkpoint whose
metadata names anything else is invalid (with the forbidden name as the reason) and
restore falls back before any tensor is touched. See docs/security.md for what remains a
trust boundary.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import io
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.stateful import Stateful

from airflow_ett._fs import atomic_write, fsync_dir
from airflow_ett.trainer.checkpoint_files import (
    UntrustedFileError,
    crc32_of,
    listed_file_problem,
    load_marker,
    pickle_work,
    read_metadata_bytes,
    storage_problem,
)
from airflow_ett.trainer.checkpoint_interval import IntervalPolicy

log = logging.getLogger(__name__)

COMMIT_MARKER = "COMMITTED.json"
MARKER_FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{10})$")
_TMP_DIR = re.compile(r"^\.tmp-step-(\d+)-[A-Za-z0-9_.-]+$")
_DCP_METADATA = ".metadata"
_NO_DIST_WARNING = r"torch\.distributed is (disabled, )?unavailable or uninitialized"
_CHUNK = 8 * 1024 * 1024

T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A save did not commit, or a restore could not leave the state consistent."""


# -- reading checkpoints as untrusted input ---------------------------------------------

#: The only globals a checkpoint's `.metadata` pickle may name: what DCP (torch 2.13)
#: writes for plain, ShardedTensor and DTensor state (found by listing the globals of
#: real checkpoints' metadata with pickletools), and builtins that build plain data.
METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [
        *(
            ("torch.distributed.checkpoint.metadata", name)
            for name in (
                "Metadata", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
                "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # looks a torch.layout up by its name
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
        # Not bytes, bytearray or range: called with a huge int they allocate (or let
        # list() allocate) without bound; pickle has opcodes for real bytes values.
        *(
            ("builtins", name)
            for name in (
                "dict", "list", "tuple", "set", "frozenset", "str", "int", "float",
                "complex", "bool", "slice",
            )
        ),
    ]
)


class UnsafeCheckpointError(pickle.UnpicklingError):
    """Checkpoint metadata that names a global outside `METADATA_GLOBALS`."""


class _MetadataUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only `METADATA_GLOBALS` (and torch's dtypes and
    memory formats, which pickle as `torch.<name>`): nothing else can be called or built,
    so a crafted pickle fails here instead of running."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and isinstance(
            getattr(torch, name, None), torch.dtype | torch.memory_format | torch.layout
        ):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"checkpoint metadata names the forbidden global {module}.{name} (only DCP "
            "metadata classes and plain builtins are allowed)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError("checkpoint metadata uses persistent ids")


def _enum_member(cls: Any, name: Any) -> Any:
    """The one `getattr` a metadata pickle may call: an enum member of an allowed enum.

    Python 3.11.0-3.11.3 pickle enum members as `getattr(EnumClass, "NAME")` (3.11.4+ as
    `EnumClass(value)`), so checkpoints written on Debian 12's 3.11.2 name
    `builtins.getattr` for DCP's `_MEM_FORMAT_ENCODING`. A real `getattr` would reach any
    attribute (`__init__.__globals__`, modules, `os.system`): only members pass."""
    allowed = (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and (cls.__module__, cls.__qualname__) in METADATA_GLOBALS
        and isinstance(name, str)
        and name in cls.__members__
    )
    if not allowed:
        raise UnsafeCheckpointError(
            f"checkpoint metadata calls getattr({getattr(cls, '__qualname__', cls)!r}, "
            f"{name!r}): only members of DCP's metadata enums are allowed"
        )
    return cls[name]


def read_checkpoint_metadata(stream: Any) -> Metadata:
    """A DCP `.metadata` pickle read through the restricted unpickler; raises
    `UnsafeCheckpointError` for anything but DCP metadata."""
    metadata = _MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(
            f"checkpoint metadata is a {type(metadata).__name__}, not DCP Metadata"
        )
    return metadata


def load_checkpoint_metadata(path: Path) -> Metadata:
    """The `.metadata` file at `path`, read bounded (`checkpoint_files`: a regular file of
    bounded size whose pickle makes bounded work), then by the restricted unpickler;
    `UnsafeCheckpointError` for anything else."""
    try:
        data = read_metadata_bytes(path)
    except UntrustedFileError as exc:
        raise UnsafeCheckpointError(exc.reason) from None
    problem = pickle_work(data)
    if problem is not None:
        raise UnsafeCheckpointError(problem)
    return read_checkpoint_metadata(io.BytesIO(data))


class SafeFileSystemReader(FileSystemReader):
    """DCP's `FileSystemReader` with `.metadata` read by `load_checkpoint_metadata`
    instead of a plain `pickle.load` (torch 2.13's `read_metadata`, otherwise the same)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = load_checkpoint_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor leaves (DCP's "bytes" items: optimizer
    hyperparameters, small Python values) are loaded with `torch.load(weights_only=True)`
    rather than DCP's `weights_only=False`, another pickle path into the process."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


@dataclass(frozen=True)
class SaveResult:
    """What one save cost and where it went.

    `blocking_s` is how long `save()` held up its caller: the wait for the previous save,
    if one was in flight, plus the staging copy (async), or the whole durable write and
    commit (synchronous). With `overlap_staging`, the result `save()` returns counts its
    own time only; the final one (`wait()`, `on_commit`, the marker) adds the caller's
    wait at the staging barrier. `total_s` runs from the `save()` call to the commit (the marker
    written and fsynced), so it always includes `blocking_s`; it and `bytes` (all ranks'
    DCP files) are None while the save is in flight.
    """

    step: int
    path: Path
    blocking_s: float
    total_s: float | None
    bytes: int | None


@dataclass(frozen=True)
class RestoreResult:
    """The checkpoint a restore loaded, the `extra` saved with it, and what it skipped."""

    step: int
    path: Path
    extra: dict[str, Any]
    skipped: list[tuple[Path, str]]


# -- coordination ------------------------------------------------------------------------

_GROUP_LOCK = threading.Lock()
_GROUP_CACHE: list[tuple[Any, dist.ProcessGroup]] = []  # (default group, checkpoint group)


def checkpoint_process_group(timeout: timedelta | None = None) -> dist.ProcessGroup:
    """The dedicated gloo group for checkpoint collectives, created once per default group.

    Collective: every rank must call it (a `CheckpointManager` does, in its constructor).
    A new default group (after `destroy_process_group` and a new `init_process_group`)
    gets a new checkpoint group.
    """
    world = dist.group.WORLD
    with _GROUP_LOCK:
        if _GROUP_CACHE and _GROUP_CACHE[0][0] is world:
            return _GROUP_CACHE[0][1]
        group = dist.new_group(backend="gloo", timeout=timeout)
        if not isinstance(group, dist.ProcessGroup):  # None only outside the group
            raise CheckpointError("dist.new_group returned no group for this rank")
        _GROUP_CACHE[:] = [(world, group)]
        return group


class _Coord:
    """The few collectives a checkpoint needs, over the checkpoint group; local without one."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.rank = dist.get_rank(group) if group is not None else 0
        self.size = dist.get_world_size(group) if group is not None else 1

    @property
    def is_coordinator(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if self.group is None:
            return obj
        box: list[Any] = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        value: T = box[0]
        return value

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on rank 0 (an empty list elsewhere)."""
        if self.group is None:
            return [obj]
        out: list[Any] | None = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, group=self.group, group_dst=0)
        return list(out) if out is not None else []

    def all_gather(self, obj: T) -> list[T]:
        if self.group is None:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out


# -- staging -----------------------------------------------------------------------------


def _sharded_tensor_type() -> type | None:
    try:
        from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    except ImportError:  # pragma: no cover - present in every torch this project pins
        return None
    return ShardedTensor


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return None
    return DTensor


@dataclass
class StagingBreakdown:
    """Where the blocking part of one async save went, in seconds (caller's thread unless
    said otherwise). The save plan, DCP metadata, the write and the checksums run on the
    background thread and cost the caller nothing, so they have no field here.

    `wait_previous_s`: waiting for the previous save (and its staging barrier).
    `state_dict_s`: the `state_dict()` calls of the top-level `Stateful`s.
    `alloc_s`: allocating staging buffers (none when they are reused).
    `leaves_s`: deep-copying the small non-tensor leaves.
    `copy_s`: the tensor copies: on the caller's thread, or with `overlap_staging` on the
    staging thread (then the caller pays only `barrier_s`, its wait in `wait_staged()`).
    `other_s`: the rest of `save()` (walking the state dict, argument checks, handing the
    write to the background thread).
    """

    tensors: int = 0
    bytes: int = 0
    new_buffers: int = 0
    wait_previous_s: float = 0.0
    state_dict_s: float = 0.0
    alloc_s: float = 0.0
    leaves_s: float = 0.0
    copy_s: float = 0.0
    copy_on_caller: bool = True
    barrier_s: float = 0.0
    other_s: float = 0.0


@dataclass
class _Copy:
    """One tensor copy to make: `src` (live training state) into `dst` (staging buffer),
    with `src`'s version counter when it was handed to us (None: an inference tensor,
    which has none)."""

    dst: torch.Tensor
    src: torch.Tensor
    path: tuple[Any, ...]
    version: int | None


def _version_of(t: torch.Tensor) -> int | None:
    try:
        return int(t._version)
    except RuntimeError:  # inference tensors keep no version counter
        return None


def modified_since(copies: list[_Copy]) -> list[str]:
    """The paths of the sources an in-place op changed since their versions were taken.

    Every in-place op that goes through torch's dispatcher (optimizers, `add_`,
    `copy_`, foreach ops) bumps the version counter that `detach()` and `state_dict()`
    share with the parameter; writes that bypass it (`.data` in-place ops, kernels given
    raw pointers) are not seen."""
    return [
        "/".join(str(p) for p in c.path)
        for c in copies
        if c.version is not None and _version_of(c.src) != c.version
    ]


class _Stager:
    """Copies a state dict into CPU memory that training does not touch.

    Keeps its buffers between saves when `reuse` is set (keyed by the path of each tensor
    in the state dict; a changed shape, dtype or pinning gets a new buffer, and buffers no
    longer used are dropped at the end of each staging).

    `prepare` does everything but the tensor copies (state_dict() calls, buffers, leaves)
    and returns them as `_Copy`s; `copy` makes them, on any thread. `stage` is both.
    """

    def __init__(self, *, reuse: bool) -> None:
        self.reuse = reuse
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._used: dict[tuple[Any, ...], torch.Tensor] = {}
        self._copies: list[_Copy] = []
        self.bytes = 0
        self.breakdown = StagingBreakdown()
        self._sharded = _sharded_tensor_type()
        self._dtensor = _dtensor_type()

    def stage(self, state: Mapping[str, Any]) -> dict[str, Any]:
        staged, copies = self.prepare(state)
        self.copy(copies, self.breakdown)
        return staged

    def prepare(self, state: Mapping[str, Any]) -> tuple[dict[str, Any], list[_Copy]]:
        """The staged state dict over buffers not yet filled, and the copies that fill
        them. Until those copies are made, the caller must not modify the state."""
        self._used, self._copies, self.bytes = {}, [], 0
        self.breakdown = bd = StagingBreakdown()
        with torch.no_grad():
            staged: dict[str, Any] = {}
            for key, value in state.items():
                if isinstance(value, Stateful):
                    t = time.perf_counter()
                    value = value.state_dict()
                    bd.state_dict_s += time.perf_counter() - t
                staged[key] = self._copy(value, (key,))
        if self.reuse:
            self._buffers = self._used
        self._used = {}
        copies, self._copies = self._copies, []
        bd.tensors, bd.bytes = len(copies), self.bytes
        return staged, copies

    @staticmethod
    def copy(copies: list[_Copy], breakdown: StagingBreakdown) -> None:
        """Make the copies; CUDA ones non-blocking into pinned buffers, synchronised once.

        On the caller's thread they follow the training work already queued on the
        current stream. On another thread each device's copies go on the current stream of
        that thread for the device, which is the default stream, where training queues
        its work unless it chose a stream of its own (then call `stage` on its thread)."""
        t = time.perf_counter()
        devices: set[torch.device] = set()
        with torch.no_grad():
            for c in copies:
                if c.src.is_cuda:
                    c.dst.copy_(c.src, non_blocking=True)
                    devices.add(c.src.device)
                else:
                    c.dst.copy_(c.src)
            for device in devices:  # the non-blocking copies must have landed
                torch.cuda.synchronize(device)
        breakdown.copy_s += time.perf_counter() - t

    def _copy(self, obj: Any, path: tuple[Any, ...]) -> Any:
        if self._sharded is not None and isinstance(obj, self._sharded):
            return self._copy_sharded(obj, path)
        if self._dtensor is not None and isinstance(obj, self._dtensor):
            return self._copy_dtensor(obj, path)
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        if isinstance(obj, dict):
            return {k: self._copy(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._copy(v, (*path, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(self._copy(v, (*path, i)) for i, v in enumerate(obj))
        t = time.perf_counter()
        leaf = io.BytesIO(obj.getvalue()) if isinstance(obj, io.BytesIO) else copy.deepcopy(obj)
        self.breakdown.leaves_s += time.perf_counter() - t
        return leaf

    def _tensor(self, src: torch.Tensor, path: tuple[Any, ...]) -> torch.Tensor:
        """The staging buffer for `src` (reused or new); its copy is queued, not made."""
        src = src.detach()
        pin = src.is_cuda
        buf = self._buffers.get(path) if self.reuse else None
        if (
            buf is None
            or buf.shape != src.shape
            or buf.dtype != src.dtype
            or buf.is_pinned() != pin
        ):
            t = time.perf_counter()
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=pin)
            self.breakdown.alloc_s += time.perf_counter() - t
            self.breakdown.new_buffers += 1
        self._copies.append(_Copy(buf, src, path, _version_of(src)))
        self._used[path] = buf
        self.bytes += buf.numel() * buf.element_size()
        return buf

    def _copy_sharded(self, st: Any, path: tuple[Any, ...]) -> Any:
        """A new ShardedTensor over copies of the local shards, same global layout.

        Built with `_init_from_local_shards_and_global_metadata`, which does no
        communication (staging must not issue collectives on the caller's thread). It
        checks each local shard against the metadata (device, pinning, requires_grad), so
        the metadata is rewritten to what the copies are: on CPU, pinned or not, no grad.
        """
        from torch.distributed._shard.sharded_tensor.api import ShardedTensor
        from torch.distributed._shard.sharded_tensor.shard import Shard
        from torch.distributed.remote_device import _remote_device

        shards = [
            Shard(tensor=self._tensor(shard.tensor, (*path, "shard", i)), metadata=shard.metadata)
            for i, shard in enumerate(st.local_shards())
        ]
        meta = st.metadata()
        pinned = bool(shards) and shards[0].tensor.is_pinned()

        def on_cpu(md: Any) -> Any:
            placement = md.placement
            if placement is None or placement.device().type == "cpu":
                return md
            return dataclasses.replace(md, placement=_remote_device(f"rank:{placement.rank()}/cpu"))

        new_meta = dataclasses.replace(
            meta,
            shards_metadata=[on_cpu(md) for md in meta.shards_metadata],
            tensor_properties=dataclasses.replace(
                meta.tensor_properties, requires_grad=False, pin_memory=pinned
            ),
        )
        local = [Shard(tensor=s.tensor, metadata=on_cpu(s.metadata)) for s in shards]
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            local, new_meta, process_group=st._process_group
        )

    def _copy_dtensor(self, dt: Any, path: tuple[Any, ...]) -> Any:
        """A DTensor over a copy of the local tensor (same mesh, placements, shape).

        On CPU it is `detach()` (a new wrapper sharing nothing we write) with its local
        tensor replaced by the staged copy: no collective, one copy. On an accelerator,
        `to("cpu")` (as torch's own `_create_cpu_state_dict` does), unpinned.
        """
        if dt.device.type != "cpu":
            staged = dt.to("cpu")
            self.bytes += staged._local_tensor.numel() * staged._local_tensor.element_size()
            return staged
        staged = dt.detach()
        staged._local_tensor = self._tensor(dt._local_tensor, path)
        return staged


# -- files -------------------------------------------------------------------------------


def _crc32(path: Path) -> tuple[int, str]:
    """Size and CRC32 of a file (zlib releases the GIL on big chunks: cheap for training)."""
    crc, size = 0, 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(view):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return size, f"{crc:08x}"


def _describe(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        size, crc = _crc32(directory / name)
        out[name] = {"size": size, "crc32": crc}
    return out


def _step_of(path: Path) -> int | None:
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


def step_dir_name(step: int) -> str:
    """`step-0000000042`: zero-padded so names sort like steps."""
    return f"step-{step:010d}"


def read_marker(path: Path) -> dict[str, Any]:
    """The commit marker of a step directory; raises ValueError/OSError when unusable."""
    marker = load_marker(path / COMMIT_MARKER)  # bounded: a ValueError when it is not
    if not isinstance(marker, dict):
        raise ValueError("commit marker is not a JSON object")
    step = _step_of(path)
    if marker.get("step") != step:
        raise ValueError(f"commit marker says step {marker.get('step')!r}, directory {step}")
    if not isinstance(marker.get("files"), dict) or not isinstance(marker.get("extra"), dict):
        raise ValueError("commit marker lacks its file list or extra")
    return marker


# -- the manager -------------------------------------------------------------------------


@dataclass
class _InFlight:
    step: int
    final: Path
    future: Future[SaveResult]


class _PendingStaging:
    """An overlapped staging: its copies run on the staging thread. The caller's barrier
    (`wait_staged`) waits for them, then checks that nothing modified their sources
    meanwhile and sets `checked`; the background write commits only after that, and only
    when `error` is None."""

    def __init__(
        self, copies: list[_Copy], future: Future[None], breakdown: StagingBreakdown
    ) -> None:
        self.copies = copies
        self.future = future
        self.breakdown = breakdown
        self.checked = threading.Event()
        self.error: str | None = None


class CheckpointManager:
    """Save, commit, retain and restore DCP checkpoints under one directory.

    Construct it on every rank, after `init_process_group` when there is one (the
    constructor creates the checkpoint group, a collective). `save`, `wait`, `restore` and
    `close` are called from the training thread; `on_commit` is called from whichever
    thread commits (the background writer when async, the caller when synchronous) on
    every rank, once the checkpoint is durable and committed; an exception it raises is
    logged, never propagated.

    `keep_last`: committed checkpoints to keep (0 keeps all); older ones, and
    uncommitted step directories older than the newest commit, are deleted only after a
    newer commit succeeded. `verify`: "checksum" (default) re-reads every file at
    restore and compares CRC32s; "size" only compares sizes (for checkpoints too big to
    re-read on every restart). `reuse_staging_buffers`: keep the staging copy between
    saves (one extra copy of the state in host memory, for much cheaper stagings).
    `interval`: when the caller's next periodic save is due (`IntervalPolicy`; by default
    never): the caller asks it and tells it about each periodic save.

    `overlap_staging` (async only): `save()` returns once the staging copies are started
    on a staging thread, and the caller must call `wait_staged()` before anything modifies
    the saved state (the next training step: its forward when buffers or fused
    optimizers update there, else its optimizer step). Everything that collects a save
    (`save`, `wait`, `restore`, `broadcast` with a group, `close`) passes that barrier
    first. At the barrier every source tensor's version counter is compared with its value
    at `save()`: a source modified before the barrier (through torch's dispatcher) fails
    that save instead of committing a torn snapshot. A save commits only once the barrier
    is passed; if the program ends without passing it, the save does not commit.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        keep_last: int = 3,
        async_save: bool = True,
        process_group: dist.ProcessGroup | None = None,
        on_commit: Callable[[SaveResult], None] | None = None,
        verify: Literal["checksum", "size"] = "checksum",
        reuse_staging_buffers: bool = True,
        write_threads: int = 1,
        collective_timeout: timedelta = timedelta(minutes=10),
        interval: IntervalPolicy | None = None,
        overlap_staging: bool = False,
    ) -> None:
        if overlap_staging and not async_save:
            raise ValueError("overlap_staging=True needs async_save=True")
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0 (0 keeps all), got {keep_last}")
        if verify not in ("checksum", "size"):
            raise ValueError(f"verify must be 'checksum' or 'size', got {verify!r}")
        self.directory = Path(directory)
        self.interval = interval or IntervalPolicy()
        self.keep_last = keep_last
        self.async_save = async_save
        self.on_commit = on_commit
        #: Held from the commit marker's write through `on_commit`: a process that must
        #: leave with a save in flight (`os._exit`, not waiting for it) takes it first, so
        #: that a checkpoint is either committed and reported or neither.
        self.commit_lock = threading.Lock()
        self.verify = verify
        self.write_threads = max(1, write_threads)
        self.overlap_staging = overlap_staging
        if overlap_staging:
            _watch_exit()
        if dist.is_available() and dist.is_initialized():
            group = process_group or checkpoint_process_group(collective_timeout)
        elif process_group is not None:
            raise ValueError("a process_group was given but torch.distributed is not initialized")
        else:
            group = None
        self._coord = _Coord(group)
        self._stager = _Stager(reuse=reuse_staging_buffers)
        self._lock = threading.Lock()
        self._inflight: _InFlight | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._staging: _PendingStaging | None = None
        self._staging_executor: ThreadPoolExecutor | None = None
        self._live_tmp: set[Path] = set()
        self._seq = 0
        self._closed = False
        _quiet_no_dist_warning()
        # One token per manager, agreed by all ranks: they must write into one directory.
        self._token = self._coord.broadcast(secrets.token_hex(4))
        if self._coord.is_coordinator:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_stale()
        if group is not None:
            self._coord.broadcast(None)  # the others wait until the directory exists
        else:
            self.directory.mkdir(parents=True, exist_ok=True)

    # -- public API --------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], extra: dict[str, Any]) -> SaveResult:
        """Checkpoint `state` (a DCP state dict) as `step`, with `extra` in the marker.

        Async: waits for a save in flight (re-raising its failure, as `CheckpointError`),
        stages a copy, hands the write and commit to the background thread and returns
        with `total_s`/`bytes` None; `wait()` or `on_commit` give the final figures.
        Synchronous: returns once the checkpoint is committed. Every rank calls it.
        """
        t0 = time.perf_counter()
        if self._closed:
            raise CheckpointError("save() on a closed CheckpointManager")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        try:  # validate and freeze extra now: the caller may mutate it once we return
            extra_json = json.dumps(extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"extra must be JSON-serialisable: {exc}") from exc
        waited = time.perf_counter()
        self._collect_inflight(timeout=None)
        waited = time.perf_counter() - waited
        self._seq += 1
        tmp = self.directory / f".tmp-step-{step:010d}-{self._token}-{self._seq}"
        final = self.directory / step_dir_name(step)
        self._live_tmp.add(tmp)
        if not self.async_save:
            try:
                return self._write_and_commit(step, dict(state), tmp, extra_json, t0, None)
            finally:
                self._live_tmp.discard(tmp)
        try:
            staged, pending = self._stage(state)
        except BaseException:
            self._live_tmp.discard(tmp)
            raise
        blocking = time.perf_counter() - t0
        _account(self._stager.breakdown, waited, blocking)
        log.debug(
            "checkpoint step %d staged: %.1f MB in %.3fs", step, self._stager.bytes / 1e6, blocking
        )
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ett-checkpoint")
        future = self._executor.submit(
            self._background, step, staged, tmp, extra_json, t0, blocking, pending
        )
        with self._lock:
            self._inflight = _InFlight(step, final, future)
        return SaveResult(step=step, path=final, blocking_s=blocking, total_s=None, bytes=None)

    def wait_staged(self) -> float:
        """The staging barrier of `overlap_staging`: wait until the last save's copies
        have landed; returns the seconds waited (0 when none is pending). Call it before
        the state is next modified. A source modified since `save()` fails that save
        (logged here, raised by whatever collects it: the next `save`, `wait`...)."""
        pending, self._staging = self._staging, None
        if pending is None:
            return 0.0
        t = time.perf_counter()
        try:
            pending.future.result()
            changed = modified_since(pending.copies)
            if changed:
                pending.error = (
                    f"{', '.join(changed[:5])} modified while being staged (call "
                    "wait_staged() before the training step modifies the state)"
                )
        except BaseException as exc:
            pending.error = f"staging failed or was interrupted: {type(exc).__name__}: {exc}"
            raise
        finally:
            pending.breakdown.barrier_s = time.perf_counter() - t
            pending.copies = []  # no reference to training tensors beyond the barrier
            pending.checked.set()
        if pending.error is not None:
            log.error("checkpoint staging: %s; that save will not commit", pending.error)
        return pending.breakdown.barrier_s

    @property
    def staging_pending(self) -> bool:
        """Whether `wait_staged()` has a barrier to pass (an overlapped save's copies)."""
        return self._staging is not None

    @property
    def last_staging(self) -> StagingBreakdown:
        """Where the last async save's blocking time went (complete once its staging
        barrier is passed, with `overlap_staging`)."""
        return self._stager.breakdown

    def _stage(self, state: Mapping[str, Any]) -> tuple[dict[str, Any], _PendingStaging | None]:
        """The staged state dict; with `overlap_staging` its copies are still being made
        on the staging thread (the pending staging says when they are done)."""
        staged, copies = self._stager.prepare(state)
        breakdown = self._stager.breakdown
        if not self.overlap_staging:
            _Stager.copy(copies, breakdown)
            return staged, None
        breakdown.copy_on_caller = False
        if self._staging_executor is None:
            self._staging_executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ett-staging"
            )
        future = self._staging_executor.submit(_Stager.copy, copies, breakdown)
        self._staging = _PendingStaging(copies, future, breakdown)
        return staged, self._staging

    def wait(self, timeout: float | None = None) -> SaveResult | None:
        """Wait for the save in flight: its final result, or None when there is none.

        Raises `CheckpointError` if it failed (once; the slot is then free) and
        `TimeoutError` if it is still running after `timeout` seconds (it stays in flight).
        """
        return self._collect_inflight(timeout)

    @property
    def in_flight(self) -> bool:
        """Whether a save was begun and not yet collected (by `save`, `wait`, `broadcast`
        or `close`): the same on every rank, since only the training thread collects,
        at the same calls on each (whether its commit has finished may differ)."""
        with self._lock:
            return self._inflight is not None

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank, over the checkpoint group (as is without one): for
        a decision around a save that every rank must take alike (whether to leave after
        it). Collective: every rank calls it; `obj` must pickle.

        With a group it first waits for the save in flight, as `save` does (re-raising its
        failure): that save's background commit runs collectives on the same group, and
        two threads' collectives on one group would pair up differently on each rank."""
        if self._coord.group is not None:
            self._collect_inflight(timeout=None)
        return self._coord.broadcast(obj)

    def latest(self) -> Path | None:
        """The newest committed checkpoint (its marker present and readable).

        Cheap (no checksums): for discovery, e.g. to start the data pipeline at the saved
        cursor while the model is built. `restore` may still reject it and fall back.
        """
        for path in self._step_dirs():
            try:
                read_marker(path)
            except (OSError, ValueError):
                continue
            return path
        return None

    def latest_step(self) -> int | None:
        """The step of `latest()`, e.g. to tell whether the current step is saved already."""
        latest = self.latest()
        return None if latest is None else _step_of(latest)

    def restore(self, state: dict[str, Any]) -> RestoreResult | None:
        """Load the newest valid checkpoint into `state` in place (DCP load); None if none.

        Every rank calls it. Invalid checkpoints are skipped (logged as warnings and
        listed in the result). Raises `CheckpointError` when a DCP load failed part-way
        and no older checkpoint could be loaded over it (the state may be half-loaded).
        """
        if self._closed:
            raise CheckpointError("restore() on a closed CheckpointManager")
        try:
            self._collect_inflight(timeout=None)
        except CheckpointError as exc:
            log.error("the save in flight failed before restore: %s", exc)
        coord = self._coord
        candidates: list[str] = coord.broadcast(
            [str(p) for p in self._step_dirs()] if coord.is_coordinator else []
        )
        skipped: list[tuple[Path, str]] = []
        load_failed = False
        for name in candidates:
            path = Path(name)
            verdict: tuple[str | None, dict[str, Any] | None] = (None, None)
            if coord.is_coordinator:
                verdict = self._validate(path)
            reason, marker = coord.broadcast(verdict)
            if reason is None and marker is not None:
                error = self._load(state, path)
                errors = [e for e in coord.all_gather(error) if e is not None]
                if not errors:
                    log.info("restored checkpoint %s (step %d)", path, marker["step"])
                    return RestoreResult(
                        step=int(marker["step"]),
                        path=path,
                        extra=self._extra_for_me(marker),
                        skipped=skipped,
                    )
                load_failed = True
                reason = f"DCP load failed: {errors[0]}"
            assert reason is not None
            log.warning("checkpoint %s skipped: %s", path, reason)
            skipped.append((path, reason))
        if load_failed:
            raise CheckpointError(
                "no checkpoint could be loaded and a failed load may have modified the state "
                f"in place; skipped: {skipped}"
            )
        if skipped:
            log.warning(
                "no valid checkpoint in %s (%d skipped): starting from scratch",
                self.directory,
                len(skipped),
            )
        return None

    def close(self) -> None:
        """Wait for the save in flight and stop the background thread; idempotent.

        Re-raises a failure of that last save (after shutting down)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._collect_inflight(timeout=None)
        finally:
            self.wait_staged()  # in case collecting was interrupted before it
            for executor in (self._executor, self._staging_executor):
                if executor is not None:
                    executor.shutdown(wait=True)
            self._executor = self._staging_executor = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- saving ------------------------------------------------------------------------

    def _collect_inflight(self, timeout: float | None) -> SaveResult | None:
        self.wait_staged()
        with self._lock:
            inflight = self._inflight
        if inflight is None:
            return None
        try:
            result = inflight.future.result(timeout=timeout)
        except BaseException as exc:
            if not inflight.future.done():  # timed out (or interrupted): still in flight
                if isinstance(exc, TimeoutError):
                    raise TimeoutError(
                        f"checkpoint step {inflight.step} still in flight after {timeout}s"
                    ) from None
                raise
            with self._lock:
                self._inflight = None
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"checkpoint step {inflight.step} failed: {exc}") from exc
        with self._lock:
            self._inflight = None
        return result

    def _background(
        self,
        step: int,
        staged: dict[str, Any],
        tmp: Path,
        extra_json: str,
        t0: float,
        blocking: float,
        pending: _PendingStaging | None,
    ) -> SaveResult:
        try:
            if pending is not None:
                pending.future.result()  # the copies have landed: the staged state is whole
            return self._write_and_commit(step, staged, tmp, extra_json, t0, blocking, pending)
        except BaseException as exc:
            # Log it here too: nobody may call wait() for a while.
            log.error("checkpoint step %d failed in the background: %s", step, exc)
            raise
        finally:
            self._live_tmp.discard(tmp)

    def _write_and_commit(
        self,
        step: int,
        state: dict[str, Any],
        tmp: Path,
        extra_json: str,
        t0: float,
        blocking: float | None,
        pending: _PendingStaging | None = None,
    ) -> SaveResult:
        """DCP write of `state` into `tmp`, then commit. All ranks, same order of
        collectives: DCP's own (it raises on every rank when any rank fails), one gather
        of file checksums (or why this rank cannot commit), one broadcast of the
        coordinator's outcome. With an overlapped staging, the commit waits for the
        caller's barrier verdict, and the blocking time includes the barrier's wait."""
        coord = self._coord
        self._dcp_write(step, state, tmp)
        mine = self._describe_mine(tmp)
        if pending is not None:
            error = _await_verdict(pending)
            if error is not None:
                mine = f"rank {coord.rank}: {error}"
            assert blocking is not None
            blocking += pending.breakdown.barrier_s
        gathered = coord.gather((mine, extra_json))
        with self.commit_lock:  # the commit and its report, as one (see `commit_lock`)
            outcome = self._commit_outcome(step, tmp, gathered, extra_json, t0, blocking)
            error, size, total = coord.broadcast(outcome)
            if error is not None:
                raise CheckpointError(f"checkpoint step {step}: commit failed: {error}")
            if not coord.is_coordinator or total is None:
                total = time.perf_counter() - t0
            result = SaveResult(
                step=step,
                path=self.directory / step_dir_name(step),
                blocking_s=blocking if blocking is not None else total,
                total_s=total,
                bytes=size,
            )
            if coord.is_coordinator:
                self._retain()
            if self.on_commit is not None:
                try:
                    self.on_commit(result)
                except Exception:
                    log.exception("on_commit callback failed for checkpoint step %d", step)
        return result

    def _dcp_write(self, step: int, state: dict[str, Any], tmp: Path) -> None:
        """DCP's save into `tmp` (a collective); on failure the coordinator removes `tmp`."""
        coord = self._coord
        try:
            writer = FileSystemWriter(tmp, sync_files=True, thread_count=self.write_threads)
            dcp_save(
                state, storage_writer=writer, process_group=coord.group, no_dist=coord.group is None
            )
        except BaseException as exc:
            if coord.is_coordinator:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"checkpoint step {step}: DCP save failed: {exc}") from exc

    def _describe_mine(self, tmp: Path) -> dict[str, dict[str, Any]] | str:
        """Sizes and checksums of this rank's files, or why they cannot be read: a string,
        not an exception, because every rank must still reach the gather."""
        try:
            prefix = f"__{self._coord.rank}_"
            mine = sorted(n for n in os.listdir(tmp) if n.startswith(prefix))
            return _describe(tmp, mine)
        except OSError as exc:
            return f"rank {self._coord.rank}: {exc}"

    def _commit_outcome(
        self,
        step: int,
        tmp: Path,
        gathered: list[Any],
        extra_json: str,
        t0: float,
        blocking: float | None,
    ) -> tuple[str | None, int, float | None]:
        """(error, bytes, total seconds) of the coordinator's commit, to broadcast; never
        raises, so no rank is left waiting. Other ranks contribute a placeholder."""
        if not self._coord.is_coordinator:
            return (None, 0, None)
        try:
            size, total = self._commit(step, tmp, gathered, extra_json, t0, blocking)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            return (f"{type(exc).__name__}: {exc}", 0, None)
        return (None, size, total)

    def _commit(
        self,
        step: int,
        tmp: Path,
        gathered: list[Any],
        extra_json: str,
        t0: float,
        blocking: float | None,
    ) -> tuple[int, float]:
        """Coordinator: checksum what no rank did, rename into place, write the marker."""
        files: dict[str, dict[str, Any]] = {}
        extras = [json.loads(e) for _, e in gathered]
        for rank, (described, _) in enumerate(gathered):
            if isinstance(described, str):
                raise CheckpointError(f"not committed: {described}")
            if not isinstance(described, dict):
                raise CheckpointError(f"rank {rank} sent no file list")
            files.update(described)
        rest = sorted(n for n in os.listdir(tmp) if n not in files)
        files.update(_describe(tmp, rest))
        if _DCP_METADATA not in files:
            raise CheckpointError(f"DCP wrote no {_DCP_METADATA} in {tmp}")
        fsync_dir(tmp)
        final = self.directory / step_dir_name(step)
        replaced: Path | None = None
        if final.exists():  # an older attempt's checkpoint of this step (maybe invalid)
            replaced = self.directory / f".tmp-step-{step:010d}-{self._token}-replaced"
            shutil.rmtree(replaced, ignore_errors=True)
            os.rename(final, replaced)
            log.warning("checkpoint %s exists: replacing it", final)
        os.rename(tmp, final)
        fsync_dir(self.directory)
        size = sum(int(f["size"]) for f in files.values())
        total = time.perf_counter() - t0
        marker = {
            "format": MARKER_FORMAT,
            "step": step,
            "extra": json.loads(extra_json),
            # Only when ranks differ (per-rank RNG states, say): restore hands each rank
            # its own; "extra" stays rank 0's, what discovery reads.
            **({"rank_extras": extras} if any(e != extras[0] for e in extras) else {}),
            "bytes": size,
            "blocking_s": blocking if blocking is not None else total,
            "total_s": total,
            "time": time.time(),
            "world_size": self._coord.size,
            "torch": torch.__version__,
            "files": files,
        }
        atomic_write(final / COMMIT_MARKER, json.dumps(marker, indent=1, sort_keys=True).encode())
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
        return size, total

    def _retain(self) -> None:
        """Coordinator, after a commit: keep the newest `keep_last` committed checkpoints;
        drop uncommitted step directories and stale temp directories older than the
        newest commit. Failures here are logged, never raised: the save did commit."""
        try:
            committed: list[Path] = []
            for path in self._step_dirs():
                try:
                    read_marker(path)
                except (OSError, ValueError):
                    if committed:  # older than a commit: a save that never committed
                        log.info("removing uncommitted checkpoint %s", path)
                        shutil.rmtree(path, ignore_errors=True)
                    continue
                committed.append(path)
            if self.keep_last:
                for path in committed[self.keep_last :]:
                    log.info("retention: removing checkpoint %s", path)
                    shutil.rmtree(path, ignore_errors=True)
            self._remove_stale()
        except OSError as exc:
            log.warning("checkpoint retention in %s failed: %s", self.directory, exc)

    def _remove_stale(self) -> None:
        """Temp directories left by crashed saves: only those of a step no newer than the
        newest commit and last modified before it (a newer one may belong to a live save
        of another process, e.g. a trainer still running beside a publish step), and
        never one this process is writing."""
        newest = self.latest()
        if newest is None:
            return
        newest_step = _step_of(newest)
        assert newest_step is not None
        try:
            committed_at = (newest / COMMIT_MARKER).stat().st_mtime
            entries = list(os.scandir(self.directory))
        except OSError:
            return
        for entry in entries:
            m = _TMP_DIR.match(entry.name)
            path = Path(entry.path)
            if not m or path in self._live_tmp or int(m.group(1)) > newest_step:
                continue
            try:
                if entry.stat(follow_symlinks=False).st_mtime >= committed_at:
                    continue
            except OSError:
                continue
            log.info("removing stale checkpoint temp directory %s", path)
            shutil.rmtree(path, ignore_errors=True)

    # -- restoring ---------------------------------------------------------------------

    def _step_dirs(self) -> list[Path]:
        """Step directories, newest first."""
        try:
            entries = [Path(e.path) for e in os.scandir(self.directory) if e.is_dir()]
        except FileNotFoundError:
            return []
        steps = [(s, p) for p in entries if (s := _step_of(p)) is not None]
        return [p for _, p in sorted(steps, reverse=True)]

    def _validate(self, path: Path) -> tuple[str | None, dict[str, Any] | None]:
        """(reason it is invalid, None) or (None, marker). Never raises: on several ranks
        the others are waiting for the coordinator's verdict."""
        try:
            return self._check(path)
        except Exception as exc:
            return f"cannot validate: {type(exc).__name__}: {exc}", None

    def _check(self, path: Path) -> tuple[str | None, dict[str, Any] | None]:
        if not (path / COMMIT_MARKER).exists():
            return "no commit marker (the save never committed)", None
        try:
            marker = read_marker(path)
        except (OSError, ValueError) as exc:
            return f"unreadable commit marker: {exc}", None
        files: dict[str, Any] = marker["files"]
        if _DCP_METADATA not in files:
            return f"commit marker lists no {_DCP_METADATA}", None
        reason = next(filter(None, (listed_file_problem(path, name) for name in files)), None)
        if reason is None:
            reason = _size_mismatch(path, files)
        if reason is None and self.verify == "checksum":
            reason = _checksum_mismatch(path, files)
        if reason is None:
            reason = _unsafe_metadata(path, files)
        if reason is not None:
            return reason, None
        return None, marker

    def _extra_for_me(self, marker: dict[str, Any]) -> dict[str, Any]:
        """This rank's extra when the ranks saved different ones and the world size is
        unchanged; rank 0's otherwise."""
        extras = marker.get("rank_extras")
        if isinstance(extras, list) and len(extras) == self._coord.size:
            return dict(extras[self._coord.rank])
        return dict(marker["extra"])

    def _load(self, state: dict[str, Any], path: Path) -> str | None:
        try:
            dcp_load(
                state,
                storage_reader=SafeFileSystemReader(path),
                planner=SafeLoadPlanner(),
                process_group=self._coord.group,
                no_dist=self._coord.group is None,
            )
        except (Exception, CheckpointException) as exc:  # the latter is a BaseException
            return f"{type(exc).__name__}: {_first_line(exc)}"
        return None


def _account(breakdown: StagingBreakdown, waited: float, blocking: float) -> None:
    """Fill in the previous save's wait and what the named parts leave of `blocking`."""
    breakdown.wait_previous_s = waited
    named = waited + breakdown.state_dict_s + breakdown.alloc_s + breakdown.leaves_s
    if breakdown.copy_on_caller:
        named += breakdown.copy_s
    breakdown.other_s = max(0.0, blocking - named)


_EXITING = threading.Event()
_EXIT_WATCH = threading.Lock()
_exit_watched = False


def _watch_exit() -> None:
    """Have `_EXITING` set when the interpreter starts shutting down.

    At exit, Python joins the background writer (a `ThreadPoolExecutor` worker) from a
    threading-atexit hook, before the main thread counts as ended; a writer waiting for a
    barrier verdict would wait forever. `threading._register_atexit` (what
    concurrent.futures itself uses; called in reverse order, so ours runs before that
    join) lets it give up instead."""
    global _exit_watched
    with _EXIT_WATCH:
        register = getattr(threading, "_register_atexit", None)
        if _exit_watched or register is None:
            return
        register(_EXITING.set)
        _exit_watched = True


def _await_verdict(pending: _PendingStaging) -> str | None:
    """Background thread: the barrier's verdict on an overlapped staging (None: the staged
    copy is the state at save time). If the program ends before the caller passes the
    barrier, nobody can vouch for the copy: it is not committed."""
    while not pending.checked.wait(0.2):
        if _EXITING.is_set() or not threading.main_thread().is_alive():
            return "the program ended before the staging barrier (wait_staged) was passed"
    return pending.error


def _size_mismatch(path: Path, files: dict[str, Any]) -> str | None:
    """The first listed file that is missing or not the size the commit marker says."""
    for name, want in sorted(files.items()):
        file = path / name
        try:
            size = file.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != want.get("size"):
            return f"{name} has {size} bytes, the commit marker says {want.get('size')}"
    return None


def _checksum_mismatch(path: Path, files: dict[str, Any]) -> str | None:
    """The first listed file unreadable or whose CRC32 differs from the commit marker's."""
    for name, want in sorted(files.items()):
        try:
            crc = crc32_of(path / name, int(want.get("size", 0)))
        except (OSError, ValueError) as exc:  # UntrustedFileError: not a regular file
            return f"{name} unreadable: {exc}"
        if crc != want.get("crc32"):
            return f"{name} checksum {crc} differs from the commit marker's {want.get('crc32')}"
    return None


def _unsafe_metadata(path: Path, files: Mapping[str, Any]) -> str | None:
    """Why DCP's metadata file is refused; a CRC is no authentication, so it is read as
    untrusted input (`load_checkpoint_metadata`), and the data it points DCP at must be
    the marker's listed files, within their sizes."""
    try:
        metadata = load_checkpoint_metadata(path / _DCP_METADATA)
        storage = metadata.storage_data
        if not isinstance(storage, Mapping):
            return f"{_DCP_METADATA} refused: it gives no data locations"
        problem = storage_problem(storage, files)
        if problem is not None:
            return f"{_DCP_METADATA} refused: {problem}"
    except UnsafeCheckpointError as exc:
        return f"{_DCP_METADATA} refused: {exc}"
    except Exception as exc:
        return f"{_DCP_METADATA} unreadable: {type(exc).__name__}: {exc}"
    return None


def _quiet_no_dist_warning() -> None:
    """DCP warns on every single-process save and load that it assumes one process; we
    pass `no_dist=True` on purpose. Registered (idempotently) once per manager, because the
    warning is issued from the background thread, where `catch_warnings` would race."""
    warnings.filterwarnings("ignore", message=_NO_DIST_WARNING, category=UserWarning)


def _first_line(exc: BaseException) -> str:
    """DCP's CheckpointException carries every rank's traceback; a reason needs the error.

    Its message lists each failing rank's traceback, whose last line is the error."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if isinstance(exc, CheckpointException) and lines:
        return lines[-1].strip()
    return lines[0] if lines else type(exc).__name__
