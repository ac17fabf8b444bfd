"""Staging: the copy of the training state that a save writes, made off the training path.

`dcp.async_save`'s default stager fails on the ShardedTensors TorchRec uses for sharded
tables, so a save stages by itself (decision 0028): `state_dict()` of every top-level
`Stateful`, then every tensor copied into CPU memory training never touches (plain
tensors, each local shard of a ShardedTensor rebuilt with the same global metadata on
CPU, a DTensor's local tensor) and the small non-tensor leaves deep-copied. With CUDA the
buffers are pinned and the copies non-blocking, synchronised once. With
`reuse_staging_buffers` the buffers are kept from one save to the next (the previous save
has always finished before the next staging starts), which takes the blocking part of a
save below a plain `clone()` of the state (bench/RESULTS.md, "Checkpoint blocking").

Overlapped staging (`overlap_staging`): the copies run on a staging thread and the
caller passes a barrier (`_PendingStaging.pass_barrier`) before training next modifies the
state. The barrier compares every source tensor's version counter with its value at
`save()` (`modified_since`), so a state modified too early fails the save rather than
commits a torn snapshot; the background write asks for that verdict (`_await_verdict`)
before it commits, and gives up when the program ends before the barrier (`_watch_exit`).
`StagingBreakdown` says where the caller's blocking time went.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch
from torch.distributed.checkpoint.stateful import Stateful

from airflow_ett.trainer.checkpoint.results import StateDict

if TYPE_CHECKING:
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    from torch.distributed.tensor import DTensor

log = logging.getLogger("airflow_ett.trainer.checkpoint")

#: Where a value sits in a state dict: the keys (and list indices) leading to it.
KeyPath: TypeAlias = tuple[object, ...]


def _sharded_tensor_type() -> type[ShardedTensor] | None:
    try:
        from torch.distributed._shard.sharded_tensor.api import ShardedTensor
    except ImportError:  # pragma: no cover - present in every torch this project pins
        return None
    return ShardedTensor


def _dtensor_type() -> type[DTensor] | None:
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
    path: KeyPath
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
        self._buffers: dict[KeyPath, torch.Tensor] = {}
        self._used: dict[KeyPath, torch.Tensor] = {}
        self._copies: list[_Copy] = []
        self.bytes = 0
        self.breakdown = StagingBreakdown()
        self._sharded = _sharded_tensor_type()
        self._dtensor = _dtensor_type()

    def stage(self, state: StateDict) -> StateDict:
        staged, copies = self.prepare(state)
        self.copy(copies, self.breakdown)
        return staged

    def prepare(self, state: StateDict) -> tuple[StateDict, list[_Copy]]:
        """The staged state dict over buffers not yet filled, and the copies that fill
        them. Until those copies are made, the caller must not modify the state."""
        self._used, self._copies, self.bytes = {}, [], 0
        self.breakdown = bd = StagingBreakdown()
        with torch.no_grad():
            staged: StateDict = {}
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

    def _copy(self, obj: object, path: KeyPath) -> object:
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

    def _tensor(self, src: torch.Tensor, path: KeyPath) -> torch.Tensor:
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

    def _copy_sharded(self, st: ShardedTensor, path: KeyPath) -> ShardedTensor:
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

        def on_cpu(md: ShardMetadata) -> ShardMetadata:
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

    def _copy_dtensor(self, dt: DTensor, path: KeyPath) -> DTensor:
        """A DTensor over a copy of the local tensor (same mesh, placements, shape).

        On CPU it is `detach()` (a new wrapper sharing nothing we write) with its local
        tensor replaced by the staged copy: no collective, one copy. On an accelerator,
        `to("cpu")` (as torch's own `_create_cpu_state_dict` does), unpinned.
        """
        from torch.distributed.tensor import DTensor

        # A DTensor's ops return DTensors (torch types them as plain tensors).
        if dt.device.type != "cpu":
            on_cpu = dt.to("cpu")
            assert isinstance(on_cpu, DTensor)
            self.bytes += on_cpu._local_tensor.numel() * on_cpu._local_tensor.element_size()
            return on_cpu
        staged = dt.detach()
        assert isinstance(staged, DTensor)
        staged._local_tensor = self._tensor(dt._local_tensor, path)
        return staged


def _account(breakdown: StagingBreakdown, waited: float, blocking: float) -> None:
    """Fill in the previous save's wait and what the named parts leave of `blocking`."""
    breakdown.wait_previous_s = waited
    named = waited + breakdown.state_dict_s + breakdown.alloc_s + breakdown.leaves_s
    if breakdown.copy_on_caller:
        named += breakdown.copy_s
    breakdown.other_s = max(0.0, blocking - named)


# -- overlapped staging: the barrier and its verdict ---------------------------------------


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

    def pass_barrier(self) -> float:
        """The caller's side of the barrier: wait for the copies, record the verdict and
        release the background write; returns the seconds waited."""
        t = time.perf_counter()
        try:
            self.future.result()
            changed = modified_since(self.copies)
            if changed:
                self.error = (
                    f"{', '.join(changed[:5])} modified while being staged (call "
                    "wait_staged() before the training step modifies the state)"
                )
        except BaseException as exc:
            self.error = f"staging failed or was interrupted: {type(exc).__name__}: {exc}"
            raise
        finally:
            self.breakdown.barrier_s = time.perf_counter() - t
            self.copies = []  # no reference to training tensors beyond the barrier
            self.checked.set()
        if self.error is not None:
            log.error("checkpoint staging: %s; that save will not commit", self.error)
        return self.breakdown.barrier_s


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
