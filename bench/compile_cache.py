"""Compile cache: cold compile vs warm from the cache, each in a fresh process.

Model: a dense stand-in for the DLRM dense part (the project's torchrec model compiles
the same three modules): dense arch 13 -> 512 -> 256 -> 64, 8 pooled embedding tables of
64 dims (plain `nn.EmbeddingBag`, eager), DLRM's pairwise-dot interaction, over arch
100 -> 512 -> 256 -> 1; batch 512; forward + backward + SGD step. Plain torch modules, not
torchrec; see `airflow_ett.trainer.compile_probe`.

Per round, in fresh processes (`python -m airflow_ett.trainer.compile_probe`):

0. cold with torch's defaults and no CompileCache at all: the baseline a job has today;
1. cold: empty cache root and inductor dir; compile ahead of time (as `compile_dense`
   does with a cache), 3 steps, save the entry; C++ headers precompiled, as in 0 (target,
   issue 25: within 1.05x of 0);
2. warm: a new empty inductor dir, `CompileCache.activate` restores the archived
   inductor dir (its built kernels) and reads the precompiled forwards; each is loaded
   with its guards, no dynamo trace; the artifacts are not loaded (not needed); headers
   not precompiled (they would be rebuilt on a fresh host), the kernels found all the
   same (their keys leave the switch out);
3. cold, jit / 4. warm, jit: the same with `nn.Module.compile` (`--compile jit`), the path
   of issue 3: dynamo traces on every start, the artifacts and the archive feed
   AOTAutograd's and inductor's caches; headers off on both sides (the FX graph cache
   keys on the switch);
5. with `--artifacts-only`: warm jit from the artifacts alone (what the portable
   mega-cache gives on CPU: why the inductor dir is stored too).

"compile" = `activate` (cache restore, plus the import of torch's compiler that any
compile pays) + installing the compiled forwards (loading precompiled ones) + the first
training step (dynamo, AOT, inductor, C++ build, first run). Python start and
`import torch` are reported apart (the same in every mode); so is the cold row's save.
The breakdown table gives the median seconds of each step: the restore's
(`CacheLoad.breakdown`; on a miss the vector-ISA probe runs on a thread, its row then
being its start plus what the first forward waited for it, and the probe's own
seconds on its thread below it), `install`, dynamo's and inductor's own phases and the
serializing of what was compiled ahead of time (`compile_phase_seconds`, nested in the
others: `inductor_load` runs inside `install` on the precompiled path and inside the
first forward otherwise), the first forward and backward, and the save. Every child gets its own
fresh TMPDIR, so no host-global state (inductor's default dir, its precompiled headers)
carries from one process to the next: each run is a fresh host except for the shared
cache root. With `--pch`, two more runs show what a warm process costs on a fresh host
when inductor's precompiled C++ headers are left on (`CompileCache` turns them off for a
hit; see `trainer/compile_cache/inductor.py`).

Targets, each printed with its verdict:

* issue 13: warm at most 5% of cold (issue 3's was 10%). Both ratios are printed; the
  honest one is against 0.
* issue 25, point 4: the model's first job no slower than without the cache: the cold
  row's precompile plus its save (what a prewarm or a first job pays) within 1.05x of
  0, each round's pair measured side by side (median of the rounds' ratios), with what
  the save and the serializing of the precompiled forwards took within it, and the CPU
  vector-ISA probe (on its own thread, beside the compiler's import and dynamo's
  tracing: its seconds there, and what the compile waited for it).
* issue 25, point 5: a warm start's compile adds at most 0.2 s to the time-to-start
  critical path, not only its duration. With `--tts-runs N` (default 3; 0 skips it),
  N pairs of warm `dlrm_small` jobs through the launcher (`bench/_jobs.py`, as
  bench/time_to_start.py runs them: everything optimized, each attempt on a fresh host,
  the cache prewarmed once), one with `compile` on and one with it off, in alternating
  order, a data-pipeline start of `--tts-latency` seconds (default 2: the trainer's
  `data_startup_latency_s`, the wait during which torch's compiler is imported on a
  thread): the median over the pairs of TTS(on) - TTS(off), and of the same without
  `trainer_init` (process start to the data pipeline's creation: it ends before
  anything the compile setting changes, and its run-to-run spread, +-0.3-0.6 s on the
  2-core VM, would otherwise swamp a 0.2 s target); the verdict is on the second.

usage: python bench/compile_cache.py [--rounds N] [--pch] [--artifacts-only]
       [--model dlrm-dense|mlp] [--device auto|cpu|cuda] [--tts-runs N]
       [--tts-latency S]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench._jobs, as a script

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
    step = statistics.median(r["step_s"] for r in runs) * 1000
    first = statistics.median(r["install_s"] + r["first_step_s"] for r in runs)
    ratios = " ".join(f"{med / b:>7.1%}" for b in baselines)
    c = runs[0]["counters"]
    hits = f"{c['fx_graph_cache_hits']}/{c['fx_graph_cache_hits'] + c['fx_graph_cache_misses']}"
    each = " ".join(f"{s:.1f}" for s in compile_s)
    return (
        f"{label:<30} {med:>8.2f} {ratios} {activate:>9.2f} {first:>11.2f} {imp:>8.2f}"
        f" {step:>7.1f}  {hits:>7}  [{each}]"
    )


def run_round(work: Path, i: int, common: list[str], artifacts_only: bool,
              results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One round of every mode, appended to `results`; returns the entry's sizes."""
    root = work / f"root{i}"
    off = ["--cache", "off"]
    results["default"].append(probe(work, f"default{i}", work / "unused", *common, *off))
    cold = probe(work, f"cold{i}", root, *common, "--save")
    results["cold"].append(cold)
    manifest = json.loads((Path(cold["entry"]) / "manifest.json").read_text())
    sizes = {
        "artifacts": manifest["artifacts"]["size"] if manifest["artifacts"] else 0,
        "archive": manifest["inductor_dir"]["size"],
        "unpacked": manifest["inductor_dir"]["unpacked_bytes"],
        "files": manifest["inductor_dir"]["files"],
        "precompiled": manifest["precompiled"]["size"] if manifest["precompiled"] else 0,
    }
    results["warm"].append(probe(work, f"warm{i}", root, *common))
    jit = ["--compile", "jit"]
    root_jit = work / f"root-jit{i}"
    results["cold-jit"].append(probe(work, f"coldjit{i}", root_jit, *common, *jit, "--save"))
    results["warm-jit"].append(probe(work, f"warmjit{i}", root_jit, *common, *jit))
    if artifacts_only:
        results["artifacts"].append(
            probe(work, f"art{i}", root_jit, *common, *jit, "--cache", "artifacts-only"))
    for mode in results.keys() - {"default", "cold", "cold-jit"}:
        load = results[mode][-1]["load"]
        if not load["hit"] or load["reason"]:
            raise SystemExit(f"{mode} run {i} did not use the cache: {load}")
    counters = results["warm"][-1]["counters"]
    if counters["precompiled_loaded"] == 0 or counters["precompiled_fallbacks"]:
        raise SystemExit(f"warm run {i} did not run its precompiled forwards: {counters}")
    return sizes


LABELS = {
    "default": "cold, torch defaults, no cache",
    "cold": "cold, precompile (saves)",
    "warm": "warm, precompiled + kernels",
    "cold-jit": "cold, jit (saves)",
    "warm-jit": "warm, jit (artifacts + dir)",
    "artifacts": "warm, jit (artifacts only)",
    "cold-pch": "cold, headers on throughout",
    "warm-pch": "warm, headers on, fresh host",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="dlrm-dense", choices=["dlrm-dense", "mlp"])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--pch", action="store_true", help="also measure with PCH left on")
    parser.add_argument("--artifacts-only", action="store_true",
                        help="also measure a warm jit start from the artifacts alone")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where each probe compiles and trains (auto: cuda when available)")
    parser.add_argument("--tts-runs", type=int, default=3,
                        help="pairs of warm jobs, compile on and off, for what the compile "
                        "adds to the time to start (0: skip)")
    parser.add_argument("--tts-latency", type=float, default=2.0,
                        help="the jobs' data-pipeline start, seconds (data_startup_latency_s)")
    args = parser.parse_args()

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    common = ["--model", args.model, "--batch", str(args.batch), "--device", device]

    print(
        f"# compile cache, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, python {platform.python_version()}"
    )
    print(f"# model {args.model}, batch {args.batch}, on {device}, {args.rounds} round(s), "
          "fresh process each")
    modes = ["default", "cold", "warm", "cold-jit", "warm-jit"]
    results: dict[str, list[dict[str, Any]]] = {
        mode: [] for mode in modes + (["artifacts"] if args.artifacts_only else [])
    }
    sizes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-compile-cache-") as tmp:
        work = Path(tmp)
        for i in range(args.rounds):
            sizes = run_round(work, i, common, args.artifacts_only, results)
        if args.pch:
            root = work / "root-pch"
            results["cold-pch"] = [
                probe(work, "cold-pch", root, *common, "--save", "--headers", "on")
            ]
            results["warm-pch"] = [probe(work, "warm-pch", root, *common, "--headers", "on")]

    default = statistics.median(r["compile_s"] for r in results["default"])
    cold = statistics.median(r["compile_s"] for r in results["cold"])
    print(
        f"{'mode':<30} {'compile s':>8} {'/default':>7} {'/cold':>7} {'restore s':>9}"
        f" {'install+1st':>11} {'import s':>8} {'step ms':>7}  {'fx hits':>7}  [each run]"
    )
    for mode, runs in results.items():
        print(row(LABELS[mode], runs, [default, cold]))
    steady = statistics.median(r["step_s"] for r in results["cold"])
    print(
        f"entry: artifacts {sizes['artifacts'] / 1e6:.2f} MB, precompiled forwards "
        f"{sizes['precompiled'] / 1e6:.2f} MB, inductor dir archive "
        f"{sizes['archive'] / 1e6:.2f} MB ({sizes['unpacked'] / 1e6:.2f} MB, "
        f"{sizes['files']} files unpacked); steady step {steady * 1000:.1f} ms"
    )
    print_breakdown(results)
    warm = statistics.median(r["compile_s"] for r in results["warm"])
    warm_jit = statistics.median(r["compile_s"] for r in results["warm-jit"])
    print(f"warm precompiled / warm jit (issue 3's path): {warm / warm_jit:.2f}")
    for name, base in (("torch-defaults cold", default), ("CompileCache cold", cold)):
        verdict = "met" if warm / base <= 0.05 else "NOT met"
        print(f"warm / {name}: {warm / base:.1%}; target <= 5%: {verdict}")
    print_cold_verdict(results)
    if args.tts_runs > 0:
        print_critical_path(args.tts_runs, args.tts_latency)


#: Issue 25: the cold prewarm within this much of torch's default cold compile, and a
#: warm start's compile adding at most this many seconds to the time to start.
COLD_TARGET = 1.05
CRITICAL_PATH_TARGET_S = 0.2


def print_cold_verdict(results: dict[str, list[dict[str, Any]]]) -> None:
    """The cold row's precompile and save against torch's default cold compile of the
    same round (point 4), and what the save, the serializing and the vector-ISA probe
    took within it."""
    pairs = list(zip(results["default"], results["cold"], strict=True))
    with_save = statistics.median((c["compile_s"] + c["save_s"]) / d["compile_s"]
                                  for d, c in pairs)
    alone = statistics.median(c["compile_s"] / d["compile_s"] for d, c in pairs)
    verdict = "met" if with_save <= COLD_TARGET else "NOT met"
    print(f"cold (precompile + save) / torch default cold: {with_save:.2f}x (compile alone "
          f"{alone:.2f}x); target <= {COLD_TARGET:.2f}x: {verdict}")

    def median(step: str) -> float:
        return float(statistics.median(r["breakdown"].get(step, 0.0) for r in results["cold"]))

    print(f"  within the cold row: save {median('save'):.2f}s, serialize "
          f"{median('serialize'):.2f}s; vector-ISA settle {median('vec_isa'):.2f}s on the "
          f"critical path (its start in activate, the compile's wait for it), the probe "
          f"{median('vec_isa_probe'):.2f}s on its thread")


def print_critical_path(runs: int, latency: float) -> None:
    """What a warm start's compile adds to the time to start (point 5): TTS with compile
    on minus TTS with it off, paired runs, median; see the module docstring."""
    from bench._jobs import run_job, write_config
    from bench.time_to_start import ON

    print(f"# time to start, warm, compile on vs off: dlrm_small, batch 512, data-pipeline "
          f"start {latency:.1f}s, {runs} pair(s)")
    diffs: list[float] = []
    after_init: list[float] = []
    compiles: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-tts-") as tmp:
        work = Path(tmp)
        prewarmed = False
        for run in range(runs):
            tts: dict[str, float] = {}
            past_init: dict[str, float] = {}
            for mode in ("on", "off") if run % 2 == 0 else ("off", "on"):
                root = work / f"{mode}{run}"
                write_config(root, model="dlrm_small", steps=3, batch_size=512, num_workers=1,
                             data_startup_latency_s=latency, compile=mode == "on",
                             compile_cache_dir=str(work / "cache"), checkpoint_interval=1000,
                             optimizations=ON)
                prewarm = mode == "on" and not prewarmed
                result, ett = run_job(root, f"tts-{mode}-{run}", max_attempts=1,
                                      prewarm=prewarm)
                prewarmed = prewarmed or prewarm
                if not result.succeeded:
                    raise SystemExit((root / "trainer.log").read_text()[-3000:])
                raw = {k: v / 1e6 for k, v in ett.phases_raw_us.items()}
                tts[mode] = ett.tts_us / 1e6
                past_init[mode] = tts[mode] - raw.get("trainer_init", 0.0)
                if mode == "on":
                    compiles.append(raw.get("compile", 0.0))
                print(f"  compile {mode:<3} run {run + 1}: TTS {tts[mode]:6.2f}s   (" + ", ".join(
                    f"{k} {raw.get(k, 0):.2f}s" for k in (
                        "trainer_init", "data_pipeline_init", "model_creation", "compile",
                        "first_batch")) + ")")
            diffs.append(tts["on"] - tts["off"])
            after_init.append(past_init["on"] - past_init["off"])
    added = statistics.median(after_init)
    verdict = "met" if added <= CRITICAL_PATH_TARGET_S else "NOT met"
    print(f"TTS compile on - off: median {statistics.median(diffs):+.2f}s of {runs}: "
          f"{' '.join(f'{d:+.2f}' for d in diffs)} (trainer_init's spread included)")
    print(f"compile adds {added:.2f}s to the critical path (TTS less trainer_init, compile "
          f"on - off, median of {runs}: {' '.join(f'{d:+.2f}' for d in after_init)}; the "
          f"compile phase itself {statistics.median(compiles):.2f}s); target <= "
          f"{CRITICAL_PATH_TARGET_S}s: {verdict}")


BREAKDOWN = {
    "import_compiler": "restore: import torch's compiler modules",
    "manifest": "restore: manifest",
    "archive": "restore: inductor dir archive",
    "precompiled_read": "restore: precompiled forwards read",
    "artifacts": "restore: portable artifacts",
    "vec_isa": "restore: vector-ISA settle, and waits for it",
    "vec_isa_probe": "  vector-ISA probe, on its thread",
    "install": "install forwards (load / module.compile)",
    "dynamo_trace": "  dynamo trace",
    "guard_build": "  guard build",
    "aot_autograd_inductor": "  AOTAutograd + inductor (backend)",
    "inductor_load": "  inductor load of compiled output",
    "serialize": "  serialize the precompiled forwards",
    "first_forward": "first forward",
    "first_backward": "first backward",
    "save": "save the entry (after the steps)",
}


def print_breakdown(results: dict[str, list[dict[str, Any]]]) -> None:
    """Median seconds of each step per mode (a blank where the mode has no such step)."""
    modes = [m for m in ("default", "cold", "warm", "warm-jit") if results.get(m)]
    print(f"{'breakdown (median s)':<42}" + "".join(f"{m:>10}" for m in modes))
    for key, label in BREAKDOWN.items():
        cells = []
        for mode in modes:
            values = [r["breakdown"][key] for r in results[mode] if key in r["breakdown"]]
            cells.append(f"{statistics.median(values):>10.3f}" if values else f"{'':>10}")
        print(f"{label:<42}" + "".join(cells))


if __name__ == "__main__":
    main()
