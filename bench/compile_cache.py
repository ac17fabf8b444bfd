"""Compile cache: cold compile vs warm from the cache, each in a fresh process.

Model: a dense stand-in for the DLRM dense part (the project's torchrec model compiles
the same three modules): dense arch 13 -> 512 -> 256 -> 64, 8 pooled embedding tables of
64 dims (plain `nn.EmbeddingBag`, eager), DLRM's pairwise-dot interaction, over arch
100 -> 512 -> 256 -> 1; batch 512; forward + backward + SGD step. Plain torch modules, not
torchrec; see `airflow_ett.trainer.compile_probe`.

Per round, in fresh processes (`python -m airflow_ett.trainer.compile_probe`):

0. cold with torch's defaults and no CompileCache at all: the baseline a job has today;
1. cold: empty cache root and inductor dir; compile, 3 steps, save the entry (this runs
   with CompileCache's settings: C++ header precompiling off, so it is slower than 0);
2. warm: a new empty inductor dir, `CompileCache.activate` restores the archived inductor
   dir and loads the portable artifacts, then compile;
3. artifacts only: the same, but only `torch.compiler.load_cache_artifacts` (what the
   portable mega-cache alone gives on CPU: why the inductor dir is stored too).

"compile" = `activate` (cache restore, plus inductor's import that any compile pays) +
the first training step (dynamo, AOT, inductor, C++ build, first run). Python start and
`import torch` are reported apart (the same in every mode). Every child gets its own
fresh TMPDIR, so no host-global state (inductor's default dir, its precompiled headers)
carries from one process to the next: each run is a fresh host except for the shared
cache root. With `--pch`, two more runs show what a warm process costs on a fresh host
when inductor's precompiled C++ headers are left on (the default `CompileCache` turns
them off; see its module docstring).

Target: warm at most 10% of cold. Both ratios are printed; the honest one is against 0.

usage: python bench/compile_cache.py [--rounds N] [--pch] [--model dlrm-dense|mlp]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_ett._proc import run as run_tree

PROBE = "airflow_ett.trainer.compile_probe"


def probe(work: Path, name: str, root: Path, *args: str) -> dict[str, Any]:
    """One fresh process, with its own TMPDIR and inductor dir."""
    tmp = work / f"{name}-tmp"
    tmp.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    }
    env["TMPDIR"] = str(tmp)
    start = time.perf_counter()
    proc = run_tree(  # a timeout ends the probe's whole tree (inductor's compile workers)
        [sys.executable, "-m", PROBE, "--root", str(root), "--local-dir", str(work / name), *args],
        env=env,
        timeout=900,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("COMPILE_PROBE "))
    result: dict[str, Any] = json.loads(line.removeprefix("COMPILE_PROBE "))
    result["process_s"] = wall
    return result


def row(label: str, runs: list[dict[str, Any]], baselines: list[float]) -> str:
    compile_s = [r["compile_s"] for r in runs]
    med = statistics.median(compile_s)
    activate = statistics.median(r["load"]["seconds"] for r in runs)
    first = statistics.median(r["first_step_s"] for r in runs)
    imp = statistics.median(r["import_s"] for r in runs)
    ratios = " ".join(f"{med / b:>7.1%}" for b in baselines)
    c = runs[0]["counters"]
    hits = f"{c['fx_graph_cache_hits']}/{c['fx_graph_cache_hits'] + c['fx_graph_cache_misses']}"
    each = " ".join(f"{s:.1f}" for s in compile_s)
    return (
        f"{label:<30} {med:>8.2f} {ratios} {activate:>9.2f} {first:>10.2f} {imp:>8.2f}"
        f"  {hits:>7}  [{each}]"
    )


LABELS = {
    "default": "cold, torch defaults, no cache",
    "cold": "cold, CompileCache (saves)",
    "warm": "warm (artifacts + dir)",
    "artifacts": "warm (artifacts only)",
    "cold-pch": "cold, cache, PCH on",
    "warm-pch": "warm, PCH on, fresh host",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="dlrm-dense", choices=["dlrm-dense", "mlp"])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--pch", action="store_true", help="also measure with PCH left on")
    args = parser.parse_args()
    common = ["--model", args.model, "--batch", str(args.batch)]

    import torch

    print(
        f"# compile cache, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, python {platform.python_version()}"
    )
    print(f"# model {args.model}, batch {args.batch}, {args.rounds} round(s), fresh process each")
    results: dict[str, list[dict[str, Any]]] = {
        "default": [],
        "cold": [],
        "warm": [],
        "artifacts": [],
    }
    sizes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-compile-cache-") as tmp:
        work = Path(tmp)
        for i in range(args.rounds):
            root = work / f"root{i}"
            results["default"].append(
                probe(work, f"default{i}", work / "unused", *common, "--cache", "off")
            )
            cold = probe(work, f"cold{i}", root, *common, "--save")
            results["cold"].append(cold)
            manifest = json.loads((Path(cold["entry"]) / "manifest.json").read_text())
            sizes = {
                "artifacts": manifest["artifacts"]["size"] if manifest["artifacts"] else 0,
                "archive": manifest["inductor_dir"]["size"],
                "unpacked": manifest["inductor_dir"]["unpacked_bytes"],
                "files": manifest["inductor_dir"]["files"],
            }
            results["warm"].append(probe(work, f"warm{i}", root, *common))
            results["artifacts"].append(
                probe(work, f"art{i}", root, *common, "--cache", "artifacts-only")
            )
            for mode in ("warm", "artifacts"):
                load = results[mode][-1]["load"]
                if not load["hit"] or load["reason"]:
                    raise SystemExit(f"{mode} run {i} did not use the cache: {load}")
        if args.pch:
            root = work / "root-pch"
            results["cold-pch"] = [
                probe(work, "cold-pch", root, *common, "--save", "--precompiled-headers")
            ]
            results["warm-pch"] = [probe(work, "warm-pch", root, *common, "--precompiled-headers")]

    default = statistics.median(r["compile_s"] for r in results["default"])
    cold = statistics.median(r["compile_s"] for r in results["cold"])
    print(
        f"{'mode':<30} {'compile s':>8} {'/default':>7} {'/cold':>7} {'restore s':>9}"
        f" {'1st step s':>10} {'import s':>8}  {'fx hits':>7}  [each run]"
    )
    for mode, runs in results.items():
        print(row(LABELS[mode], runs, [default, cold]))
    steady = statistics.median(r["step_s"] for r in results["cold"])
    print(
        f"entry: artifacts {sizes['artifacts'] / 1e6:.2f} MB, inductor dir archive "
        f"{sizes['archive'] / 1e6:.2f} MB ({sizes['unpacked'] / 1e6:.2f} MB, "
        f"{sizes['files']} files unpacked); steady step {steady * 1000:.1f} ms"
    )
    warm = statistics.median(r["compile_s"] for r in results["warm"])
    for name, base in (("torch-defaults cold", default), ("CompileCache cold", cold)):
        verdict = "met" if warm / base <= 0.10 else "NOT met"
        print(f"warm / {name}: {warm / base:.1%}; target <= 10%: {verdict}")


if __name__ == "__main__":
    main()
