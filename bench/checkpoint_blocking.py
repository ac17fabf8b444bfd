"""How long a checkpoint save holds up training: synchronous durable save vs async staging.

One state (big float32 parameters plus their Adam state, at least 256 MB), measured side
by side in one run, repetitions interleaved so drift hits every variant alike:

  copy floor   a plain in-memory copy of the same tensors (`clone()` of each): what any
               staged snapshot must at least cost, since it copies every byte once
  sync dcp     `dcp.save` with `sync_files=True` (every file fsynced): the blocking time
               of a durable synchronous save, the baseline
  sync manager `CheckpointManager(async_save=False)`: the same plus checksums and the
               atomic commit (what the trainer pays with async checkpointing off)
  async        `CheckpointManager(async_save=True)`: `blocking_s` (the staging copy) and
               `total_s` (until committed, write in the background). The first save
               allocates its staging buffers ("cold"); later ones reuse them.
  async fresh  the same with `reuse_staging_buffers=False`: every staging allocates,
               i.e. what a stager without a buffer cache would cost

Every variant starts after an (untimed) `os.sync()`, so none pays for the writeback or
the deletions of the one before it.

Targets (issue 3): async blocking <= 1.5x the copy floor and <= 15% of the synchronous
durable save. Medians over the repetitions.

usage: python bench/checkpoint_blocking.py [--param-mb 128] [--reps 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from airflow_ett.trainer.checkpoint import CheckpointManager


def build_state(param_mb: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Four big parameters of `param_mb` MB in all, one Adam step (state = 2x params)."""
    numel = param_mb * 1024 * 1024 // 4 // 4
    model = nn.ParameterList([nn.Parameter(torch.randn(numel)) for _ in range(4)])
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optim.step()
    optim.zero_grad()
    return model, optim


def tensors_of(model: nn.Module, optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = list(model.state_dict().values())
    for st in optim.state_dict()["state"].values():
        out.extend(v for v in st.values() if isinstance(v, torch.Tensor))
    return out


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def machine() -> str:
    mem = "?"
    try:
        with open("/proc/meminfo") as fh:
            mem = f"{int(fh.readline().split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, {mem} RAM, "
            f"Python {platform.python_version()}, torch {torch.__version__}, "
            f"CUDA {'yes' if torch.cuda.is_available() else 'no'}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--param-mb", type=int, default=128,
                        help="parameter MB; the Adam state adds twice that (default 128)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write (default: a temporary directory)")
    return parser.parse_args()


def run_reps(variants: list[Callable[[int], None]], reps: int,
             results: dict[str, list[float]]) -> None:
    """Each variant once per repetition, in an order rotated so that none always goes
    first; numbered from 1, step 0 being the cold save."""
    for rep in range(reps):
        shift = rep % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            os.sync()  # untimed: no variant pays for the previous one's writeback
            variant(rep + 1)
        print(f"  rep {rep}: copy {results['copy'][-1]:.3f}s  "
              f"sync dcp {results['sync_dcp'][-1]:.3f}s  "
              f"async blocking {results['async_blocking'][-1]:.3f}s", flush=True)


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavail")

    model, optim = build_state(args.param_mb)
    tensors = tensors_of(model, optim)
    state_bytes = sum(t.numel() * t.element_size() for t in tensors)
    state = {"model": model, "optim": optim}
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    print(f"{datetime.datetime.now().isoformat(timespec='seconds')}  {machine()}")
    print(f"state: {len(tensors)} tensors, {state_bytes / 2**20:.0f} MiB; writing to {root}; "
          f"{args.reps} repetitions, medians")

    results: dict[str, list[float]] = {k: [] for k in (
        "copy", "sync_dcp", "sync_manager", "async_blocking", "async_total",
        "fresh_blocking", "fresh_total")}
    async_mgr = CheckpointManager(root / "async", keep_last=1, async_save=True)
    fresh_mgr = CheckpointManager(root / "fresh", keep_last=1, async_save=True,
                                  reuse_staging_buffers=False)
    sync_mgr = CheckpointManager(root / "sync", keep_last=1, async_save=False)
    cold: list[tuple[float, float]] = []

    def copy_floor(rep: int) -> None:
        copies: list[torch.Tensor] = []
        t0 = time.perf_counter()
        copies.extend(t.clone() for t in tensors)
        results["copy"].append(time.perf_counter() - t0)

    def sync_dcp(rep: int) -> None:
        target = root / f"dcp-{rep}"
        writer = FileSystemWriter(target, sync_files=True)
        results["sync_dcp"].append(timed(
            lambda: dcp_save(state, storage_writer=writer, no_dist=True)))
        shutil.rmtree(target)

    def sync_manager(rep: int) -> None:
        results["sync_manager"].append(sync_mgr.save(rep, state, {"rep": rep}).blocking_s)

    def async_manager(rep: int) -> None:
        res = async_mgr.save(rep, state, {"rep": rep})
        done = async_mgr.wait()
        assert done is not None and done.total_s is not None
        if not cold:
            cold.append((res.blocking_s, done.total_s))
        else:
            results["async_blocking"].append(res.blocking_s)
            results["async_total"].append(done.total_s)

    def fresh_manager(rep: int) -> None:
        res = fresh_mgr.save(rep, state, {"rep": rep})
        done = fresh_mgr.wait()
        assert done is not None and done.total_s is not None
        results["fresh_blocking"].append(res.blocking_s)
        results["fresh_total"].append(done.total_s)

    variants = [copy_floor, sync_dcp, sync_manager, async_manager, fresh_manager]
    try:
        async_manager(0)  # the cold save: allocates the reused staging buffers
        run_reps(variants, args.reps, results)
    finally:
        for m in (async_mgr, fresh_mgr, sync_mgr):
            m.close()
        shutil.rmtree(root, ignore_errors=True)
    report(results, cold, state_bytes)


def report(results: dict[str, list[float]], cold: list[tuple[float, float]],
           state_bytes: int) -> None:
    """Medians and ranges per variant, then the ratios against their targets."""
    med = {k: statistics.median(v) for k, v in results.items() if v}
    rng = {k: (min(v), max(v)) for k, v in results.items() if v}
    print()
    print(f"{'variant':<32}{'median s':>10}{'min s':>9}{'max s':>9}")
    rows = [
        ("copy floor (clone every tensor)", "copy"),
        ("sync dcp.save, fsynced", "sync_dcp"),
        ("sync manager (fsync+commit)", "sync_manager"),
        ("async blocking (reused buffers)", "async_blocking"),
        ("async total", "async_total"),
        ("async fresh-buffers blocking", "fresh_blocking"),
        ("async fresh-buffers total", "fresh_total"),
    ]
    for label, key in rows:
        if key in med:
            print(f"{label:<32}{med[key]:>10.3f}{rng[key][0]:>9.3f}{rng[key][1]:>9.3f}")
    print(f"{'async first save (cold) blocking':<32}{cold[0][0]:>10.3f}")
    print(f"{'async first save (cold) total':<32}{cold[0][1]:>10.3f}")
    print()
    blocking = med["async_blocking"]
    print(f"throughput: copy {state_bytes / med['copy'] / 2**30:.2f} GiB/s, "
          f"durable write {state_bytes / med['sync_dcp'] / 2**30:.2f} GiB/s")
    checks = [
        ("async blocking / copy floor", blocking / med["copy"], 1.5),
        ("async blocking / sync dcp.save", blocking / med["sync_dcp"], 0.15),
        ("async blocking / sync manager", blocking / med["sync_manager"], None),
        ("fresh blocking / copy floor", med["fresh_blocking"] / med["copy"], 1.5),
        ("fresh blocking / sync dcp.save", med["fresh_blocking"] / med["sync_dcp"], 0.15),
        ("cold blocking / copy floor", cold[0][0] / med["copy"], None),
    ]
    for label, ratio, target in checks:
        verdict = "" if target is None else (
            f"  target <= {target:g}: {'met' if ratio <= target else 'NOT met'}")
        print(f"{label:<34}{ratio:>7.3f}{verdict}")


if __name__ == "__main__":
    main()
