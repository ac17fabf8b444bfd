"""How long a checkpoint save holds up training: ours against stock `dcp.async_save`.

One state (big float32 parameters plus their Adam state, 384 MiB by default), measured
side by side in one run, repetitions interleaved (order rotated) so drift hits every
variant alike. Blocking = the time the caller is held; "total" = until durable.

  copy floor    a plain copy of the state (`clone()` of each tensor: allocates)
  warm copy     `copy_` into buffers allocated once: the least any snapshot of the state
                into kept buffers can cost on the caller's thread
  sync dcp      `dcp.save` with `sync_files=True`: a durable synchronous save
  sync manager  `CheckpointManager(async_save=False)`: plus checksums and the commit
  stock         `dcp.async_save` as a user calls it (torch's default: a new
                `DefaultStager` per call, thread executor), and with a `DefaultStager`
                kept across saves (it then reuses its staging storages)
  ours          `CheckpointManager(async_save=True)`, reused buffers (and "fresh": without)
  in a step     a training step (forward, backward, Adam) after the save, so that
                overlapping staging can be measured honestly: the step alone; ours and
                stock with staging on a thread and the barrier before `optimizer.step()`
                (`wait_staged()` / `synchronize_staging()`); ours with its barrier before
                the forward (the only place that is safe for every model: loop.py's
                sharded tables update in backward). Cost = step with save - step alone,
                which also charges the contention of the staging thread.

With `--device cuda` (the default where CUDA is available) the state lives on the GPU:
the copy floor is then the state copied to host memory (`.to("cpu")`), the warm copy is
`copy_` into kept pinned host buffers, ours stages into pinned buffers (`checkpoint/staging.py`),
and "stock pinned" is `async_save` with a kept `DefaultStager` staging into pinned memory
with non-blocking copies (torchtitan's "async_with_pinned_mem" without its checkpoint
process); every timing synchronizes the device first. Stock with
`AsyncCheckpointerType.PROCESS` needs an initialised process group (torch 2.13): its row
says it is skipped. Every variant starts after an untimed `os.sync()` and after the
previous save committed. Medians over the repetitions.

Targets (issue 13): ours' blocking <= 0.5x stock `dcp.async_save` and <= 1.0x the copy
floor.

usage: python bench/checkpoint_blocking.py [--param-mb 128] [--reps 5] [--dir DIR]
       [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from airflow_ett.trainer.checkpoint import CheckpointManager, StagingBreakdown

Results = dict[str, list[float]]
_ON_CUDA: list[bool] = [False]  # set by build(): whether timings must wait for the GPU


@dataclasses.dataclass
class Bench:
    """The state, where to write, and the per-variant measurements."""

    model: nn.ParameterList
    optim: torch.optim.Optimizer
    weights: list[torch.Tensor]
    root: Path
    device: torch.device
    results: Results = dataclasses.field(default_factory=dict)
    breakdowns: dict[str, list[StagingBreakdown]] = dataclasses.field(default_factory=dict)

    @property
    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optim": self.optim}

    def add(self, key: str, value: float) -> None:
        self.results.setdefault(key, []).append(value)

    def writer(self, name: str) -> FileSystemWriter:
        target = self.root / name
        shutil.rmtree(target, ignore_errors=True)
        return FileSystemWriter(target, sync_files=True)

    def forward_backward(self) -> None:
        """Reads every parameter, writes every gradient; mutates no saved tensor."""
        loss = sum((p * w).sum() for p, w in zip(self.model, self.weights, strict=True))
        assert isinstance(loss, torch.Tensor)
        loss.backward()  # type: ignore[no-untyped-call]

    def optimizer_step(self) -> None:
        self.optim.step()
        self.optim.zero_grad(set_to_none=False)


def build(param_mb: int, root: Path, device: torch.device) -> Bench:
    """Four big parameters of `param_mb` MB in all, one Adam step (state = 2x params)."""
    numel = param_mb * 1024 * 1024 // 4 // 4
    _ON_CUDA[0] = device.type == "cuda"
    model = nn.ParameterList([nn.Parameter(torch.randn(numel, device=device))
                              for _ in range(4)])
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    bench = Bench(model, optim, [torch.randn(numel, device=device) for _ in range(4)], root,
                  device)
    bench.forward_backward()
    bench.optimizer_step()
    return bench


def tensors_of(bench: Bench) -> list[torch.Tensor]:
    out = list(bench.model.state_dict().values())
    for st in bench.optim.state_dict()["state"].values():
        out.extend(v for v in st.values() if isinstance(v, torch.Tensor))
    return out


def settle() -> None:
    """Wait for the device's queued work, so that a time read after it is the work's."""
    if _ON_CUDA[0]:
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> float:
    settle()
    t0 = time.perf_counter()
    fn()
    settle()
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--param-mb", type=int, default=128,
                        help="parameter MB; the Adam state adds twice that (default 128)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write (default: a temporary directory)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where the state lives (auto: cuda when available)")
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    if args.param_mb < 1:
        parser.error(f"--param-mb must be >= 1, got {args.param_mb}")
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    return args


# -- the variants ------------------------------------------------------------------------


def copy_variants(bench: Bench) -> list[Callable[[int], None]]:
    """A plain copy of the state where a checkpoint copies it to: beside it on CPU, to
    host memory from a GPU (fresh pageable memory; kept pinned buffers for the warm copy,
    the transfer's best case)."""
    tensors = tensors_of(bench)
    on_gpu = bench.device.type == "cuda"
    kept = [torch.empty(t.shape, dtype=t.dtype, pin_memory=on_gpu) for t in tensors]
    for k, t in zip(kept, tensors, strict=True):
        k.copy_(t)

    def copy_floor(rep: int) -> None:
        copies: list[torch.Tensor] = []
        bench.add("copy", timed(lambda: copies.extend(
            t.to("cpu") if on_gpu else t.clone() for t in tensors)))

    def warm_copy(rep: int) -> None:
        bench.add("warm_copy", timed(
            lambda: [k.copy_(t, non_blocking=on_gpu) for k, t in zip(kept, tensors,
                                                                     strict=True)]))

    return [copy_floor, warm_copy]


def sync_variants(bench: Bench, sync_mgr: CheckpointManager) -> list[Callable[[int], None]]:
    def sync_dcp(rep: int) -> None:
        writer = bench.writer("dcp")
        bench.add("sync_dcp", timed(
            lambda: dcp_save(bench.state, storage_writer=writer, no_dist=True)))

    def sync_manager(rep: int) -> None:
        bench.add("sync_manager", sync_mgr.save(rep, bench.state, {"rep": rep}).blocking_s)

    return [sync_dcp, sync_manager]


def stock_variants(bench: Bench, kept: DefaultStager, pinned: DefaultStager | None
                   ) -> list[Callable[[int], None]]:
    def stock(key: str, stager: DefaultStager | None) -> Callable[[int], None]:
        def run(rep: int) -> None:
            writer = bench.writer(key)
            settle()
            t0 = time.perf_counter()
            future = dcp_async_save(bench.state, storage_writer=writer, no_dist=True,
                                    async_stager=stager)
            bench.add(f"{key}_blocking", time.perf_counter() - t0)
            assert isinstance(future, Future)
            future.result()
            bench.add(f"{key}_total", time.perf_counter() - t0)
        return run

    variants = [stock("stock", None), stock("stock_kept", kept)]
    if pinned is not None:
        variants.append(stock("stock_pinned", pinned))
    return variants


def ours_variants(bench: Bench, async_mgr: CheckpointManager, fresh_mgr: CheckpointManager
                  ) -> list[Callable[[int], None]]:
    def ours(key: str, manager: CheckpointManager) -> Callable[[int], None]:
        def run(rep: int) -> None:
            settle()
            res = manager.save(rep, bench.state, {"rep": rep})
            bench.breakdowns.setdefault(key, []).append(manager.last_staging)
            done = manager.wait()
            assert done is not None and done.total_s is not None
            bench.add(f"{key}_blocking", res.blocking_s)
            bench.add(f"{key}_total", done.total_s)
        return run

    return [ours("ours", async_mgr), ours("fresh", fresh_mgr)]


def step_variants(bench: Bench, managers: dict[str, CheckpointManager]
                  ) -> list[Callable[[int], None]]:
    """One training step each, with the save (if any) just before it."""
    overlap_mgr, fwd_mgr = managers["overlap"], managers["overlap_fwd"]
    async_mgr = managers["async_step"]

    def step_alone(rep: int) -> None:
        settle()
        t0 = time.perf_counter()
        bench.forward_backward()
        bench.optimizer_step()
        settle()
        bench.add("step", time.perf_counter() - t0)

    def ours_before_optimizer(rep: int) -> None:
        settle()
        t0 = time.perf_counter()
        overlap_mgr.save(rep, bench.state, {"rep": rep})
        bench.forward_backward()
        bench.add("ov_barrier", overlap_mgr.wait_staged())
        bench.optimizer_step()
        settle()
        bench.add("ov_step", time.perf_counter() - t0)
        bench.breakdowns.setdefault("ov", []).append(overlap_mgr.last_staging)
        done = overlap_mgr.wait()
        assert done is not None
        bench.add("ov_waited", done.blocking_s)

    def ours_before_forward(rep: int) -> None:
        settle()
        t0 = time.perf_counter()
        fwd_mgr.save(rep, bench.state, {"rep": rep})
        fwd_mgr.wait_staged()
        bench.forward_backward()
        bench.optimizer_step()
        settle()
        bench.add("ovf_step", time.perf_counter() - t0)
        done = fwd_mgr.wait()
        assert done is not None
        bench.add("ovf_waited", done.blocking_s)

    def ours_in_step(rep: int) -> None:
        settle()
        t0 = time.perf_counter()
        async_mgr.save(rep, bench.state, {"rep": rep})
        bench.forward_backward()
        bench.optimizer_step()
        settle()
        bench.add("ours_step", time.perf_counter() - t0)
        async_mgr.wait()

    return [step_alone, ours_before_optimizer, ours_before_forward, ours_in_step]


def stock_step_variants(bench: Bench, stager: DefaultStager) -> list[Callable[[int], None]]:
    """Stock `async_save` before a training step: as a user calls it, and with staging on
    a thread (`use_async_staging`) and its barrier before the optimizer step."""

    def stock_in_step(rep: int) -> None:
        writer = bench.writer("stock_step")
        settle()
        t0 = time.perf_counter()
        future = dcp_async_save(bench.state, storage_writer=writer, no_dist=True)
        bench.forward_backward()
        bench.optimizer_step()
        settle()
        bench.add("stock_step", time.perf_counter() - t0)
        assert isinstance(future, Future)
        future.result()

    def stock_async_staging(rep: int) -> None:
        writer = bench.writer("stock_staging")
        settle()
        t0 = time.perf_counter()
        response = dcp_async_save(bench.state, storage_writer=writer, no_dist=True,
                                  async_stager=stager)
        launched = time.perf_counter() - t0
        bench.forward_backward()
        bench.add("st_barrier", launched + timed(stager.synchronize_staging))
        bench.optimizer_step()
        settle()
        bench.add("st_step", time.perf_counter() - t0)
        assert isinstance(response, AsyncSaveResponse)  # what a staging on a thread returns
        response.upload_completion.result()

    return [stock_in_step, stock_async_staging]


def run_reps(variants: list[Callable[[int], None]], reps: int, bench: Bench) -> None:
    """Each variant once per repetition, in an order rotated so that none always goes
    first; numbered from 1, step 0 being the cold saves."""
    for rep in range(reps):
        shift = rep % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            os.sync()  # untimed: no variant pays for the previous one's writeback
            variant(rep + 1)
        r = {k: v[-1] for k, v in bench.results.items()}
        print(f"  rep {rep}: copy {r['copy']:.3f}s  stock {r['stock_blocking']:.3f}s  "
              f"ours {r['ours_blocking']:.3f}s  overlapped (waited) {r['ov_waited']:.3f}s  "
              f"step {r['step']:.3f}s", flush=True)


def main() -> None:
    args = parse_args()
    # a timeout's SIGTERM (bench/gpu_check.sh) still removes the gigabytes written below
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavail")
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    bench = build(args.param_mb, root, torch.device(args.device))
    state_bytes = sum(t.numel() * t.element_size() for t in tensors_of(bench))
    print(f"{datetime.datetime.now().isoformat(timespec='seconds')}  {machine()}")
    print(f"state: {len(tensors_of(bench))} tensors, {state_bytes / 2**20:.0f} MiB; writing to "
          f"{root}; {args.reps} repetitions, medians; torch threads {torch.get_num_threads()}")
    managers = {
        "async": CheckpointManager(root / "async", keep_last=1),
        "fresh": CheckpointManager(root / "fresh", keep_last=1, reuse_staging_buffers=False),
        "sync": CheckpointManager(root / "sync", keep_last=1, async_save=False),
        "overlap": CheckpointManager(root / "overlap", keep_last=1, overlap_staging=True),
        "overlap_fwd": CheckpointManager(root / "overlap_fwd", keep_last=1,
                                         overlap_staging=True),
        "async_step": CheckpointManager(root / "async_step", keep_last=1),
    }
    kept = DefaultStager(StagingOptions(False, False, False, False))
    staging = DefaultStager(StagingOptions(False, False, True, False))
    pinned = (DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                           use_async_staging=False,
                                           use_non_blocking_copy=True))
              if bench.device.type == "cuda" else None)
    variants = [
        *copy_variants(bench), *sync_variants(bench, managers["sync"]),
        *stock_variants(bench, kept, pinned),
        *ours_variants(bench, managers["async"], managers["fresh"]),
        *step_variants(bench, managers), *stock_step_variants(bench, staging),
    ]
    try:
        for variant in variants:  # the cold round: allocations, thread start-up; not counted
            variant(0)
        bench.results.clear()
        bench.breakdowns.clear()
        run_reps(variants, args.reps, bench)
    finally:
        for m in managers.values():
            m.close()
        kept.close()
        staging.close()
        if pinned is not None:
            pinned.close()
        shutil.rmtree(root, ignore_errors=True)
    report(bench, state_bytes)


# -- the report --------------------------------------------------------------------------

ROWS = [
    ("copy floor (clone every tensor)", "copy"),
    ("warm copy (copy_ into kept bufs)", "warm_copy"),
    ("sync dcp.save, fsynced", "sync_dcp"),
    ("sync manager (fsync+commit)", "sync_manager"),
    ("stock async_save, blocking", "stock_blocking"),
    ("stock async_save, total", "stock_total"),
    ("stock kept stager, blocking", "stock_kept_blocking"),
    ("stock kept stager, total", "stock_kept_total"),
    ("stock pinned (torchtitan-like)", "stock_pinned_blocking"),
    ("stock pinned, total", "stock_pinned_total"),
    ("ours, blocking (reused buffers)", "ours_blocking"),
    ("ours, total", "ours_total"),
    ("ours fresh buffers, blocking", "fresh_blocking"),
    ("ours fresh buffers, total", "fresh_total"),
    ("step alone (fwd+bwd+Adam)", "step"),
    ("step after ours (copy in save)", "ours_step"),
    ("step after stock async_save", "stock_step"),
    ("step, ours overlapped, barrier", "ov_step"),
    ("  before optimizer: waited", "ov_waited"),
    ("  of which barrier wait", "ov_barrier"),
    ("step, ours overlapped, barrier", "ovf_step"),
    ("  before forward: waited", "ovf_waited"),
    ("step, stock async staging", "st_step"),
    ("  waited (launch + barrier)", "st_barrier"),
]


def report(bench: Bench, state_bytes: int) -> None:
    """Medians and ranges per variant, the breakdown of ours, then ratios and targets."""
    med = {k: statistics.median(v) for k, v in bench.results.items() if v}
    print(f"\n{'variant':<34}{'median s':>10}{'min s':>9}{'max s':>9}")
    for label, key in ROWS:
        if key in med:
            vals = bench.results[key]
            print(f"{label:<34}{med[key]:>10.3f}{min(vals):>9.3f}{max(vals):>9.3f}")
    print(f"{'stock PROCESS executor':<34}  skipped: needs an initialised process group")
    if "stock_pinned_blocking" not in med:
        print(f"{'stock pinned (torchtitan-like)':<34}  skipped: the state is not on a GPU")
    print(f"\nthroughput: copy floor {state_bytes / med['copy'] / 2**30:.2f} GiB/s, warm copy "
          f"{state_bytes / med['warm_copy'] / 2**30:.2f} GiB/s, durable write "
          f"{state_bytes / med['sync_dcp'] / 2**30:.2f} GiB/s")
    print_breakdown(bench.breakdowns)
    print_ratios(med)


def print_breakdown(breakdowns: dict[str, list[StagingBreakdown]]) -> None:
    fields = ["wait_previous_s", "state_dict_s", "alloc_s", "leaves_s", "copy_s", "barrier_s",
              "other_s"]
    print("\nwhere ours' blocking goes (medians, ms; plan, metadata and write run on the "
          "background thread: 0 here)")
    print(f"{'':<30}" + "".join(f"{f.removesuffix('_s'):>14}" for f in fields))
    labels = {"ours": "ours (copy on caller)", "fresh": "ours fresh buffers",
              "ov": "overlapped (copy on thread)"}
    for key, label in labels.items():
        if breakdowns.get(key):
            vals = [statistics.median(getattr(b, f) for b in breakdowns[key]) * 1e3
                    for f in fields]
            print(f"{label:<30}" + "".join(f"{v:>14.2f}" for v in vals))


def print_ratios(med: dict[str, float]) -> None:
    """What the caller waits for, against the targets; then what a step loses in all
    (the wait plus the staging thread's and the background write's contention)."""
    waits = {
        "ours (copy in save)": med["ours_blocking"],
        "ours overlapped, barrier before optimizer": med["ov_waited"],
        "ours overlapped, barrier before forward": med["ovf_waited"],
        "stock kept stager": med["stock_kept_blocking"],
        "stock async staging, barrier before optimizer": med["st_barrier"],
    }
    if "stock_pinned_blocking" in med:
        waits["stock pinned (torchtitan-like)"] = med["stock_pinned_blocking"]
    print("\nwaited / stock async_save (target <= 0.5), / copy floor (target <= 1.0)")
    for label, cost in waits.items():
        vs_stock = cost / med["stock_blocking"]
        vs_copy = cost / med["copy"]
        verdict = "met" if vs_stock <= 0.5 and vs_copy <= 1.0 else "NOT met"
        print(f"  {label:<46}{cost:>7.3f}s  /stock {vs_stock:6.3f}  /copy {vs_copy:6.3f}  "
              f"/stock kept {cost / med['stock_kept_blocking']:6.3f}  "
              f"/warm copy {cost / med['warm_copy']:6.3f}  {verdict}")
    step = med["step"]
    print(f"\nstep slowdown, step with save - step alone ({step:.3f}s), background write "
          "included")
    for label, key in (("ours (copy in save)", "ours_step"),
                       ("ours overlapped, barrier before optimizer", "ov_step"),
                       ("ours overlapped, barrier before forward", "ovf_step"),
                       ("stock async_save", "stock_step"),
                       ("stock async staging, barrier before optimizer", "st_step")):
        cost = med[key] - step
        print(f"  {label:<46}{cost:>7.3f}s  /stock async_save's "
              f"{cost / max(med['stock_step'] - step, 1e-9):6.3f}")
    print(f"\nours total / stock total {med['ours_total'] / med['stock_total']:.3f}; ours "
          f"blocking / sync dcp.save {med['ours_blocking'] / med['sync_dcp']:.3f}")


if __name__ == "__main__":
    main()
