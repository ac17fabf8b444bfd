"""One rank of the two-process checkpoint test (run under `torchrun --nproc-per-node 2`).

usage: torchrun --nproc-per-node 2 _checkpoint_dist_child.py OUT_DIR

What the trainer will checkpoint, on CPU with gloo: a TorchRec DistributedModelParallel
EmbeddingBagCollection sharded table-wise (each rank owns one table, as ShardedTensors)
with a fused RowWiseAdagrad applied in backward, a DTensor sharded over both ranks, and a
plain tensor that differs per rank. The save is asynchronous and, while it is in flight,
both ranks keep training (DMP's all-to-alls) and all-reducing on the default group: the
write is delayed a little in the background so that DCP's collectives certainly overlap
them. Then the state is mutated, restored by a fresh manager, and compared bitwise with
the values at save time. Each rank writes `OUT_DIR/rank<r>.json`; any failure exits 1.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def _local(obj: Any) -> list[torch.Tensor]:
    """Clones of what this rank holds of a tensor-like value."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(obj, ShardedTensor):
        return [s.tensor.detach().clone() for s in obj.local_shards()]
    if isinstance(obj, DTensor):
        return [obj.to_local().detach().clone()]
    if isinstance(obj, torch.Tensor):
        return [obj.detach().clone()]
    return []


def _snapshot(tree: Any, prefix: str = "") -> dict[str, list[torch.Tensor]]:
    out: dict[str, list[torch.Tensor]] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_snapshot(v, f"{prefix}/{k}"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(_snapshot(v, f"{prefix}/{i}"))
    else:
        tensors = _local(tree)
        if tensors:
            out[prefix] = tensors
    return out


def _views(model: Any, optimizer: Any, dtensor: Any, mine: torch.Tensor) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": optimizer.state_dict(),
            "dtensor": dtensor, "mine": mine}


def _sharded_model(world: int) -> tuple[Any, Any]:
    """Two tables on the meta device, one per rank (table-wise), with RowWiseAdagrad fused
    into backward: (the DistributedModelParallel, its fused optimizer)."""
    import torchrec
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.types import Topology
    from torchrec.distributed.types import ShardingType
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=64,
                                 feature_names=[f"f{i}"]) for i in range(2)]
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    apply_optimizer_in_backward(torchrec.optim.RowWiseAdagrad, ebc.parameters(),
                                {"lr": 0.05})
    constraints = {t.name: ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value])
                   for t in tables}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu"), constraints=constraints)
    plan = planner.collective_plan(ebc, [EmbeddingBagCollectionSharder()], dist.group.WORLD)
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan)
    return model, model.fused_optimizer


def _check_restored(restored: Any, rank: int, got: dict[str, list[torch.Tensor]],
                    expected: dict[str, list[torch.Tensor]]) -> None:
    """The restore found step 5 with this rank's own extra, and every value bitwise equal."""
    assert restored is not None, "nothing restored"
    assert restored.step == 5 and restored.skipped == [], restored
    assert restored.extra == {"step": 5, "rank_extra": rank}, restored.extra  # its own
    assert got.keys() == expected.keys(), (sorted(got), sorted(expected))
    mismatched = [k for k in expected
                  if len(got[k]) != len(expected[k])
                  or not all(torch.equal(a, b)
                             for a, b in zip(got[k], expected[k], strict=True))]
    assert not mismatched, f"differ after restore: {mismatched}"


def _train_with_collectives(train_step: Callable[[], None], committed_at: list[float]) -> int:
    """60 steps, each with an all-reduce on the default group, the same count on every
    rank; returns 1 if the save had not committed yet at the first one."""
    x = torch.ones(1)
    inflight_seen = 0
    for i in range(60):
        train_step()
        dist.all_reduce(x)
        time.sleep(0.03)
        if i == 0:
            inflight_seen = int(not committed_at)
    return inflight_seen


def main() -> int:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torchrec import KeyedJaggedTensor

    import airflow_ett.trainer.checkpoint as ckpt

    out = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    report: dict[str, Any] = {"rank": rank}
    model, optimizer = _sharded_model(world)

    mesh = init_device_mesh("cpu", (world,))
    dtensor = distribute_tensor(torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4),
                                mesh, [Shard(0)])
    # Different per rank, under a key of its own (a shared key would be deduplicated as a
    # replicated tensor). Big enough (32 MB) that the write takes a while.
    mine = torch.randn(8 * 1024 * 1024, generator=torch.Generator().manual_seed(100 + rank))

    gen = torch.Generator().manual_seed(1000 + rank)

    def train_step() -> None:
        lengths = torch.randint(0, 4, (2 * 8,), generator=gen)
        values = torch.randint(0, 64, (int(lengths.sum()),), generator=gen)
        kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=values, lengths=lengths)
        pooled = model(kjt)
        pooled.values().pow(2).sum().backward()  # the fused optimizer steps in backward

    for _ in range(5):
        train_step()

    def state() -> dict[str, Any]:
        return {"model": model, "optim": optimizer, "dtensor": dtensor,
                "per_rank": {f"rank{rank}": mine}}

    expected = _snapshot(_views(model, optimizer, dtensor, mine))
    report["sharded_keys"] = sorted(k for k in expected if "/model/" in k or "/optim/" in k)

    committed_at: list[float] = []
    manager = ckpt.CheckpointManager(out / "ckpt", keep_last=2, async_save=True,
                                     on_commit=lambda r: committed_at.append(time.monotonic()))
    real_save = ckpt.commit.dcp_save

    def delayed_save(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)  # let the main thread get well into its collectives first
        return real_save(*args, **kwargs)

    ckpt.commit.dcp_save = delayed_save  # type: ignore[assignment]
    result = manager.save(5, state(), {"step": 5, "rank_extra": rank})
    report["blocking_s"] = result.blocking_s

    # Training goes on at once, with collectives on the default group, while the save is
    # in flight. Both ranks do exactly the same number of collectives.
    with torch.no_grad():
        mine.add_(1.0)
        dtensor.to_local().add_(1.0)
    loop_start = time.monotonic()
    inflight_seen = _train_with_collectives(train_step, committed_at)
    loop_end = time.monotonic()
    final = manager.wait(timeout=60)
    ckpt.commit.dcp_save = real_save  # type: ignore[assignment]
    assert final is not None and final.total_s is not None and final.bytes
    report.update(
        inflight_at_first_collective=inflight_seen,
        committed_during_loop=bool(committed_at) and committed_at[0] < loop_end,
        loop_s=loop_end - loop_start,
        total_s=final.total_s,
        bytes=final.bytes,
        staging_threads=sorted(t.name for t in threading.enumerate()),
    )
    manager.close()

    # A fresh manager (as after a restart) restores into the mutated live objects.
    restorer = ckpt.CheckpointManager(out / "ckpt", async_save=True)
    restored = restorer.restore(state())
    restorer.close()
    _check_restored(restored, rank, _snapshot(_views(model, optimizer, dtensor, mine)),
                    expected)
    report.update(compared=len(expected), ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # no atexit: a peer may be stuck in a collective
    sys.exit(code)
