"""The checkpoint's collectives, over a gloo process group of its own.

Every checkpoint collective (DCP's plans and write results, the commit's gather and
broadcast, restore's verdicts) goes through `checkpoint_process_group()`, created once per
default group and shared by managers, or a group the caller passes. Training's own
collectives run on the default group from the main thread while a save's run from the
background thread; on one group the ranks could interleave the two streams differently
and wait on each other forever (`dcp.async_save` on the default group did: decision 0028).
Without torch.distributed, `_Coord` is local: every step is this process's alone.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import TypeVar, cast

import torch.distributed as dist

from airflow_ett.trainer.checkpoint.results import CheckpointError

T = TypeVar("T")

_GROUP_LOCK = threading.Lock()
#: (default group, checkpoint group)
_GROUP_CACHE: list[tuple[dist.ProcessGroup | None, dist.ProcessGroup]] = []


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
        box: list[T] = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on rank 0 (an empty list elsewhere)."""
        if self.group is None:
            return [obj]
        out: list[object] | None = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, group=self.group, group_dst=0)
        # Every rank passed a T: the collective filled each slot with one.
        return cast("list[T]", out) if out is not None else []

    def all_gather(self, obj: T) -> list[T]:
        if self.group is None:
            return [obj]
        out: list[object] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return cast("list[T]", out)  # every slot filled with a rank's T
