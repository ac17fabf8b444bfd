"""From the final checkpoint's commit to the process's exit: the trainer against a bare
process that has imported torch and torchrec.

    python -m bench.shutdown [--runs 3]

Measured in one run, each a fresh process, alternating:

  bare exit     `import torch, torchrec`, then a normal interpreter exit: from the line it
                prints when done to the moment its parent reaps it. What any PyTorch
                program pays to leave (the stock behaviour).
  bare _exit    the same, leaving with `os._exit`: the floor.
  trainer       `python -m airflow_ett.trainer` (dlrm_small, 60 steps, async checkpoints,
                compile off): from the commit of its final checkpoint (the `checkpoint_saved`
                event with `final`, stamped when the commit marker was written) to the moment
                its parent reaps it: the final phases' bookkeeping, teardown (data workers,
                checkpoint writer, emitter flush) and the exit, during all of which a real job
                still holds its GPUs.

Target (issue 13): trainer <= 1.5x the bare exit.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from airflow_ett.ett.events import CheckpointSaved, read_events
from bench._jobs import write_config

BARE = "import torch, torchrec, sys; print('ready', flush=True)"


def bare(fast: bool) -> float:
    code = BARE + ("; import os; os._exit(0)" if fast else "")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    ready = time.time()
    proc.wait()
    return time.time() - ready


def trainer(root: Path) -> float:
    config = write_config(root, model="dlrm_small", steps=60, batch_size=256, num_workers=1,
                          compile=False, checkpoint_interval=20)
    proc = subprocess.run([sys.executable, "-m", "airflow_ett.trainer", "--config",
                           str(config), "--job-id", "shutdown"], cwd=root,
                          capture_output=True, text=True, check=False)
    reaped = time.time()
    assert proc.returncode == 0, proc.stderr[-2000:]
    (final,) = [e for e in read_events(str(root / "events.jsonl")).events
                if isinstance(e, CheckpointSaved) and e.final]
    return reaped - final.ts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"# shutdown, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"medians of {args.runs}")
    got: dict[str, list[float]] = {"bare exit": [], "bare _exit": [], "trainer": []}
    for _ in range(args.runs):
        got["bare exit"].append(bare(fast=False))
        got["bare _exit"].append(bare(fast=True))
        got["trainer"].append(trainer(Path(tempfile.mkdtemp(prefix="shutdown-"))))
    med = {k: statistics.median(v) for k, v in got.items()}
    for name, values in got.items():
        print(f"  {name:<11} {med[name]:6.3f}s  [{' '.join(f'{v:.3f}' for v in values)}]")
    print(f"trainer / bare exit: {med['trainer'] / med['bare exit']:.2f} (target <= 1.5); "
          f"trainer / bare _exit: {med['trainer'] / med['bare _exit']:.1f}")


if __name__ == "__main__":
    main()
