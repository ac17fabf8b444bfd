"""A job's own trainer config, trained once outside Airflow without faults: the weights a
recovered job must end with, bitwise (no lost or repeated samples)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch


def reference_weights(job_dir: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """Train `job_dir/trainer.json` again in `tmp/ref`, without faults, pacing or events."""
    from airflow_ett.trainer.config import load_config
    from airflow_ett.trainer.final_state import load_final_state

    config = json.loads((job_dir / "trainer.json").read_text())
    config.update({"checkpoint_dir": str(tmp / "ref" / "ckpt"), "step_sleep_s": 0.0})
    for managed in ("events_file", "compile_cache_dir", "faults"):  # faults: same weights
        config.pop(managed, None)
    path = tmp / "ref" / "trainer.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "airflow_ett.trainer", "--config", str(path), "--job-id", "ref",
         "--attempt-number", "1"], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "AIRFLOW__ETT__DISABLED": "True"}, cwd=path.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return load_final_state(load_config(path))


def assert_same_weights(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor],
                        what: str) -> None:
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), f"{name} differs {what}"
