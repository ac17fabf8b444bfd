"""An owner's model on an owner's files beside the bundled DLRM: every optimization holds.

    python -m bench.owner_model [--steps 240] [--rows 20000] [--step-sleep 0.08]

Three jobs, side by side in one run: the bundled `dlrm_small` on its generated log, and
the two-tower example (`airflow_ett/examples/two_tower.py`, written as an owner writes a
model) over the generated Criteo-layout TSV and over the same rows as Parquet. Each is run
four ways through the launcher the train task uses:

- `baseline`: every optimization off (serial init, no fast batch, cold compile, blocking
  checkpoints, cold restarts): the stock way;
- `optimized`: every optimization on, after a prewarm (as the lifecycle DAG's prewarm
  task): its TTS against the critical-path bound (trainer init, then the longer of the
  data pipeline's start and model creation + compile), its checkpoint blocking per save
  against the baseline's;
- `cold-kill` and `standby-kill`: optimized, SIGKILLed once mid-run, restarted in place
  by the launcher the train task uses, cold or handed to the warm standby: TTR and its
  ratio; and their final weights against the
  `optimized` run's, which must be bitwise equal (the resume is exact).

Every run gets a fresh host TMPDIR and inductor dir: warmth can only come from the
compile cache. The data pipeline's start gets `--data-latency` of connection time in
every job, so that its overlap with compilation shows at realistic proportions.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import torch

from airflow_ett.examples.make_data import NUM_EMBEDDINGS, make
from airflow_ett.trainer.config import load_config
from airflow_ett.trainer.final_state import load_final_state
from bench._jobs import run_job, write_config

OPTIMIZATIONS = ("fast_batch", "parallel_init", "compile_cache", "async_checkpoint",
                 "warm_standby")
ALL_ON = dict.fromkeys(OPTIMIZATIONS, True)
ALL_OFF = dict.fromkeys(OPTIMIZATIONS, False)


def jobs(data: Path) -> dict[str, dict[str, Any]]:
    """The three models' own fields."""
    sparse = {f"cat_{i}": NUM_EMBEDDINGS[i] for i in range(26)}
    owner = {"model": "airflow_ett.examples.two_tower:build",
             "model_config": {"embedding_dim": 16, "tower": [128, 64]}}
    return {
        "dlrm_small (generated)": {"model": "dlrm_small"},
        "two-tower (TSV)": {**owner, "data": {
            "format": "criteo_tsv", "paths": str(data / "day_*.tsv"),
            "schema": {"sparse": sparse}}},
        "two-tower (Parquet)": {**owner, "data": {
            "format": "parquet", "paths": str(data / "day_*.parquet"),
            "dense_transform": "log1p", "schema": {
                "dense": [f"int_{i}" for i in range(13)], "encoding": "hex",
                "sparse": sparse}}},
    }


@dataclass
class Figures:
    tts_base: float
    tts_opt: float
    bound: float
    block_base: float
    block_opt: float
    ttr_cold: float
    ttr_standby: float
    bitwise: bool


def _run(root: Path, name: str, fields: dict[str, Any], opts: dict[str, bool], *,
         steps: int, latency: float, kill_at: int | None, sleep: float) -> tuple[Any, Path]:
    write_config(root, steps=steps, batch_size=256, num_workers=1, seed=5,
                 step_sleep_s=sleep,
                 data_startup_latency_s=latency, compile=True,
                 compile_cache_dir=str(root / "cache"), checkpoint_interval=50,
                 optimizations=opts, **fields,
                 faults=[] if kill_at is None else [
                     {"kind": "kill", "at_step": kill_at, "attempt": 1}])
    result, ett = run_job(root, name, max_attempts=3, prewarm=opts["compile_cache"],
                          in_place=kill_at is not None, warm_standby=opts["warm_standby"])
    assert result.succeeded, (root / "trainer.log").read_text()[-3000:]
    return ett, root / "job.json"


def measure(label: str, fields: dict[str, Any], steps: int, latency: float,
            sleep: float) -> Figures:
    tmp = Path(tempfile.mkdtemp(prefix="owner-bench-"))
    kill = steps * 2 // 3
    common: dict[str, Any] = {"steps": steps, "latency": latency, "sleep": sleep}
    base, _ = _run(tmp / "base", "base", fields, ALL_OFF, kill_at=None, **common)
    opt, opt_cfg = _run(tmp / "opt", "opt", fields, ALL_ON, kill_at=None, **common)
    cold, cold_cfg = _run(tmp / "cold", "cold", fields, {**ALL_ON, "warm_standby": False},
                          kill_at=kill, **common)
    warm, warm_cfg = _run(tmp / "warm", "warm", fields, ALL_ON, kill_at=kill, **common)
    raw = {k: v / 1e6 for k, v in opt.phases_raw_us.items()}
    bound = raw.get("trainer_init", 0) + max(
        raw.get("data_pipeline_init", 0), raw.get("model_creation", 0) + raw.get("compile", 0))
    want = load_final_state(load_config(opt_cfg))
    bitwise = all(
        all(torch.equal(want[k], got[k]) for k in want)
        for got in (load_final_state(load_config(c)) for c in (cold_cfg, warm_cfg)))
    figures = Figures(
        tts_base=base.tts_us / 1e6, tts_opt=opt.tts_us / 1e6, bound=bound,
        block_base=base.summary().blocking_per_save_s or 0.0,
        block_opt=opt.summary().blocking_per_save_s or 0.0,
        ttr_cold=cold.to_dict()["failures"][0]["ttr_s"],
        ttr_standby=warm.to_dict()["failures"][0]["ttr_s"],
        bitwise=bitwise)
    print(f"  {label:<24} TTS base {figures.tts_base:5.1f}s opt {figures.tts_opt:5.1f}s "
          f"bound {figures.bound:5.1f}s | blocking/save base {figures.block_base:.3f}s "
          f"opt {figures.block_opt:.3f}s | TTR cold {figures.ttr_cold:5.1f}s standby "
          f"{figures.ttr_standby:5.1f}s | bitwise {figures.bitwise}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--data-latency", type=float, default=2.0)
    parser.add_argument("--step-sleep", type=float, default=0.08,
                        help="padding per step: the kill must come after the spare is warm "
                             "(it starts at the first step and warms up in about 10 s here)")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="owner-data-"))
    make(data, rows=args.rows, files=2, seed=7, npy=False)
    print(f"# owner model vs DLRM, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()}, {psutil.cpu_count()} CPUs, {args.steps} steps of 256, "
          f"{args.rows} rows, data latency {args.data_latency:.1f}s, step padding "
          f"{args.step_sleep:.2f}s")
    results = {label: measure(label, fields, args.steps, args.data_latency, args.step_sleep)
               for label, fields in jobs(data).items()}
    print("model                      opt/bound  opt/base TTS  blocking opt/base  "
          "TTR standby/cold  bitwise")
    for label, f in results.items():
        print(f"{label:<26} {f.tts_opt / f.bound:9.2f}  {f.tts_opt / f.tts_base:12.2f}  "
              f"{f.block_opt / max(f.block_base, 1e-9):17.2f}  "
              f"{f.ttr_standby / f.ttr_cold:16.2f}  {f.bitwise}")


if __name__ == "__main__":
    main()
