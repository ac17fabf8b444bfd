"""One compile in a fresh process, measured: the child that compile-cache tests and
`bench/compile_cache.py` start.

A compile is measured in a process of its own (torch keeps compiled code, kernels and
cache lookups in memory: a second compile in one process says nothing). This module
builds a small model from plain torch modules, activates a `CompileCache`, compiles,
runs a few training steps (forward, backward, optimizer: the backward graph is compiled
too), optionally saves the cache, and
prints one line `COMPILE_PROBE {json}` with the timings, the `CacheLoad` and
`compile_counters()`.

With the cache on, the parts are compiled as the trainer's `compile_dense` does it:
ahead of time, or loaded precompiled from the entry (`CompileCache.precompile`);
`--compile jit` compiles them with `nn.Module.compile` instead (dynamo on every start,
the warm path of issue 3). `breakdown` in the output says where a compile's seconds
went: the restore's steps (`CacheLoad.breakdown`), loading the precompiled forwards,
dynamo's and inductor's phases and the serializing of what was compiled ahead of time
(`compile_phase_seconds`), the first step's forward and backward, and with `--save` the
save.

Models (plain torch, no torchrec, so they compile the same on any host):

* `mlp`: 16 -> 64 -> 64 -> 1 with the loss inside the compiled module; a cold compile is
  ~15-20 s on the 2-core build machine, short enough for tests.
* `dlrm-dense`: a stand-in for the DLRM dense part with the shapes of the reference
  job: dense arch 13 -> 512 -> 256 -> 64, 8 pooled embedding tables of 64 dims (plain
  `nn.EmbeddingBag`, eager, as torchrec's are never compiled), DLRM's pairwise-dot
  interaction (64 + 36 features), over arch -> 512 -> 256 -> 1. Like the trainer, the
  dense arch, interaction and over arch are compiled as three modules.

`--device cuda` builds the model and batch on the GPU (Triton kernels; the key carries
the compute capability) and synchronizes before each time it reads. `--help`: the rest.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import NotRequired, TypedDict

_T0 = time.perf_counter()

import torch  # noqa: E402  (import time is part of what we report)
from torch import nn  # noqa: E402

from airflow_ett.trainer.compile_cache import (  # noqa: E402
    CacheLoad,
    CompileCache,
    cache_key,
    compile_counters,
    compile_phase_seconds,
    device_kind,
    format_counters,
)

IMPORT_S = time.perf_counter() - _T0
MARKER = "COMPILE_PROBE "


class ProbeResult(TypedDict):
    """The probe's one output line (after `MARKER`), which `main` writes and the
    compile-cache tests and `bench/compile_cache.py` read."""

    key: str
    import_s: float
    load: dict[str, object]  # the `CacheLoad`, as `dataclasses.asdict` gives it
    # with a compile (not --no-compile):
    first_step_s: NotRequired[float]
    install_s: NotRequired[float]
    compile_s: NotRequired[float]
    breakdown: NotRequired[dict[str, float]]
    step_s: NotRequired[float | None]
    losses: NotRequired[list[float]]
    counters: NotRequired[dict[str, int]]
    needs_save: NotRequired[bool]
    # with --save:
    entry: NotRequired[str]
    save_s: NotRequired[float]


class SmallMLP(nn.Module):
    """The test model: tiny, fixed shapes, loss in the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.net(x).squeeze(-1)
        return nn.functional.binary_cross_entropy_with_logits(logits, y)


class MLP(nn.Module):
    """Linear+ReLU layers, like torchrec's `MLP`/`DenseArch`/`OverArch`.

    A module class of our own on purpose: `nn.Sequential(...).compile()` is a silent no-op
    in torch 2.13 (its frames live in torch/nn, which dynamo skips: no graph, no error),
    while `compile()` of a module defined outside torch traces the Sequential inside it.
    """

    def __init__(self, sizes: list[int], *, last_relu: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(a, b))
            if last_relu or i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


class Interaction(nn.Module):
    """DLRM's interaction: the dense vector plus the upper-triangle pairwise dots."""

    rows: torch.Tensor
    cols: torch.Tensor

    def __init__(self, num_features: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_features, num_features, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        combined = torch.cat([dense.unsqueeze(1), pooled], dim=1)  # B x F x D
        dots = torch.bmm(combined, combined.transpose(1, 2))
        return torch.cat([dense, dots[:, self.rows, self.cols]], dim=1)


class DenseDLRM(nn.Module):
    """A DLRM whose sparse part is plain EmbeddingBags; see the module docstring."""

    def __init__(self, tables: int = 8, rows: int = 1000, dim: int = 64) -> None:
        super().__init__()
        self.tables = tables
        self.rows = rows
        self.embeddings = nn.ModuleList(
            nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables)
        )
        self.dense_arch = MLP([13, 512, 256, dim], last_relu=True)
        self.inter_arch = Interaction(tables + 1)
        pairs = (tables + 1) * tables // 2
        self.over_arch = MLP([dim + pairs, 512, 256, 1], last_relu=False)

    def dense_parts(self) -> list[nn.Module]:
        return [self.dense_arch, self.inter_arch, self.over_arch]

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pooled = torch.stack([emb(ids[:, t]) for t, emb in enumerate(self.embeddings)], dim=1)
        features = self.inter_arch(self.dense_arch(dense), pooled)
        logits = self.over_arch(features).squeeze(-1)
        return nn.functional.binary_cross_entropy_with_logits(logits, y)


def build(name: str, batch: int, device: torch.device | None = None
          ) -> tuple[nn.Module, dict[str, nn.Module], tuple[torch.Tensor, ...]]:
    """The model, the modules to compile (by a name stable across processes), and one
    fixed batch, on `device` (default CPU)."""
    device = device or torch.device("cpu")
    torch.manual_seed(0)
    model: nn.Module
    if name == "mlp":
        model = SmallMLP()
        parts: dict[str, nn.Module] = {"mlp": model}
        batch_tensors: tuple[torch.Tensor, ...] = (torch.randn(batch, 16), torch.rand(batch))
    elif name == "dlrm-dense":
        dlrm = DenseDLRM()
        ids = torch.randint(0, dlrm.rows, (batch, dlrm.tables, 4))
        model = dlrm
        parts = dict(zip(("dense_arch", "inter_arch", "over_arch"), dlrm.dense_parts(),
                         strict=True))
        batch_tensors = (torch.randn(batch, 13), ids, torch.rand(batch))
    else:
        raise SystemExit(f"unknown model {name!r}")
    return model.to(device), parts, tuple(t.to(device) for t in batch_tensors)


def settle(device: torch.device) -> None:
    """Wait for the GPU's queued work before a time is read (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compile_parts(parts: dict[str, nn.Module], cache: CompileCache | None) -> float:
    """Compile each part as `compile_dense` does (through `cache.precompile` when given,
    else `nn.Module.compile`); returns the seconds spent loading precompiled forwards."""
    start = time.perf_counter()
    for name, part in parts.items():
        if cache is not None:
            cache.precompile(part, name)
        else:
            part.compile()
    return time.perf_counter() - start


def train_steps(model: nn.Module, batch: tuple[torch.Tensor, ...], steps: int,
                device: torch.device
                ) -> tuple[list[float], list[float], dict[str, float]]:
    """`steps` (at least one) SGD steps; each step's seconds, each loss, and the first
    step's breakdown: dynamo's and inductor's phases so far, its forward and backward."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times: list[float] = []
    losses: list[float] = []
    first: dict[str, float] = {}
    first_forward_s = 0.0
    for step in range(max(1, steps)):
        settle(device)
        t = time.perf_counter()
        loss = model(*batch)
        settle(device)
        if step == 0:
            first_forward_s = time.perf_counter() - t
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        settle(device)
        times.append(time.perf_counter() - t)
        losses.append(float(loss.detach()))
        if step == 0:
            first = {**compile_phase_seconds(), "first_forward": first_forward_s,
                     "first_backward": times[0] - first_forward_s}
    return times, losses, first


#: `--headers` as `CompileCache(cpu_precompiled_headers=...)`.
_HEADERS: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


def model_config(name: str, batch: int, extra: dict[str, object]) -> dict[str, object]:
    return {"probe_model": name, "batch": batch, **extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="shared compile cache root")
    parser.add_argument("--local-dir", help="inductor cache dir (default: per key in $TMPDIR)")
    parser.add_argument("--model", choices=["mlp", "dlrm-dense"], default="mlp")
    parser.add_argument(
        "--cache",
        choices=["on", "artifacts-only", "off"],
        default="on",
        help="off: no CompileCache at all, torch's defaults in a fresh --local-dir",
    )
    parser.add_argument("--save", action="store_true", help="save the cache after the steps")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--config-extra", default="{}", help="JSON merged into the config")
    parser.add_argument("--no-compile", action="store_true", help="activate only")
    parser.add_argument(
        "--compile",
        choices=["precompiled", "jit"],
        default="precompiled",
        help="with the cache on: ahead of time / precompiled (as compile_dense) or "
        "nn.Module.compile (dynamo traces on every start)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the model and batch live (default cpu)")
    parser.add_argument(
        "--headers",
        choices=["auto", "on", "off"],
        help="inductor's C++ header precompiling: auto (CompileCache's default: torch's "
        "setting for a miss, off for a hit), on or off throughout (default: auto, off with "
        "--compile jit, whose FX graph cache entries are keyed on it)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    device = torch.device(args.device)

    extra = json.loads(args.config_extra)
    if not isinstance(extra, dict):
        parser.error("--config-extra: must be a JSON object")
    key = cache_key(model_config(args.model, args.batch, extra), device_kind(device))
    cache = CompileCache(
        args.root,
        local_dir=args.local_dir,
        restore_inductor_dir=args.cache == "on",
        cpu_precompiled_headers=_HEADERS[args.headers or
                                         ("off" if args.compile == "jit" else "auto")],
        defer_artifacts=args.compile == "precompiled",
    )
    if args.cache == "off":
        if args.local_dir is None or args.save:
            parser.error("--cache off needs --local-dir and cannot --save")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.local_dir
        load = CacheLoad(key, False, False, False, 0.0, "cache off")
    else:
        load = cache.activate(key)
    result: ProbeResult = {"key": key, "import_s": IMPORT_S, "load": asdict(load)}
    if not args.no_compile:
        model, parts, batch = build(args.model, args.batch, device)
        precompile = args.cache == "on" and args.compile == "precompiled"
        install_s = compile_parts(parts, cache if precompile else None)
        times, losses, first = train_steps(model, batch, args.steps, device)
        breakdown = {**load.breakdown, "install": install_s, **first}
        counters = compile_counters()
        result.update({
            "first_step_s": times[0],
            "install_s": install_s,
            "compile_s": load.seconds + install_s + times[0],
            "breakdown": breakdown,
            "step_s": statistics.median(times[1:]) if len(times) > 1 else None,
            "losses": losses,
            "counters": counters,
        })
        logging.info("compiled: %s", format_counters(counters))
        result["needs_save"] = cache.needs_save()
        if args.save:
            t = time.perf_counter()
            result["entry"] = str(cache.save(key))
            result["save_s"] = time.perf_counter() - t
            breakdown["save"] = result["save_s"]
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
