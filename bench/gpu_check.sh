#!/usr/bin/env bash
# The GPU paths, checked in one short run on a machine with CUDA (issue 13, part 6):
# the trainer on CUDA with 1 process (and 2 under torchrun when two GPUs are there, NCCL),
# a cold and a warm compile through the compile cache (the GPU's cache keys), async
# checkpoints with pinned staging, a SIGKILL restored by the warm standby, and the same
# ratios the CPU benches print. Meant to finish in under 5 minutes; each step has its own
# timeout and the script goes on after a failed one, so one run says as much as it can.
#
#   bash bench/gpu_check.sh [OUT_DIR]        (PYTHON=... to choose the interpreter)
#   GPU_CHECK_DEVICE=cpu bash bench/gpu_check.sh   (the same steps on CPU: a dry run of
#                                                  the script itself, where no GPU is)
#
# Needs torch with CUDA and psutil; the trainer's steps (recovery, two ranks) also need
# torchrec and fbgemm-gpu built for that torch and CUDA (the CUDA `fbgemm-gpu`, not
# `fbgemm-gpu-cpu`): without them those steps are skipped with the reason, and the
# checkpoint and compile benches (plain torch) still run. This project is found through
# PYTHONPATH (set below); Airflow is not needed.
# Status: run on CPU only (GPU_CHECK_DEVICE=cpu); no GPU has been lent yet (issue 13).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
OUT="${1:-${OUT:-/tmp/ett-gpu-check}}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 DEVICE
failed=()

step() {  # step NAME SECONDS CMD...: run, log to $OUT/NAME.log, note a failure
    local name="$1" seconds="$2"; shift 2
    printf '\n== %s (limit %ss)\n' "$name" "$seconds"
    if ! timeout "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"; then
        failed+=("$name")
    fi
}

step environment 60 "$PY" - <<'EOF'
import os
import sys
import psutil  # noqa: F401  (airflow_ett._proc, which the compile bench uses)
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda",
      torch.version.cuda, "| GPUs", torch.cuda.device_count(), "| device", os.environ["DEVICE"])
if os.environ["DEVICE"] == "cuda":
    assert torch.cuda.is_available(), "no CUDA device: nothing to check here"
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name} {p.total_memory / 2**30:.0f} GiB")
EOF
if [ "${#failed[@]}" -gt 0 ]; then
    echo "gpu_check: the environment is not ready (above); stopping"
    exit 1
fi
# The trainer needs torchrec and fbgemm-gpu; the benches of plain torch do not.
trainer_missing=""
if "$PY" -c 'import fbgemm_gpu, torchrec' >/dev/null 2>&1; then
    "$PY" -c 'import fbgemm_gpu, torchrec; print("torchrec", torchrec.__version__,
        "| fbgemm_gpu", getattr(fbgemm_gpu, "__version__", "?"))'
else
    trainer_missing="$("$PY" -c 'import fbgemm_gpu, torchrec' 2>&1 | tail -n 1)"
    echo "trainer steps will be skipped: $trainer_missing"
fi

# Checkpoints: stock async_save, ours, pinned staging; ratios in one run.
# (256 MB of parameters + Adam = 768 MiB on a GPU; 32 MB on a CPU dry run, to fit the limit)
step checkpoint 90 "$PY" bench/checkpoint_blocking.py --reps 3 \
    --param-mb "$([ "$DEVICE" = cuda ] && echo 256 || echo 32)" --device "$DEVICE"

# Compile cache: a cold compile, then a warm start in a fresh process, on the GPU.
step compile_cache 240 "$PY" bench/compile_cache.py --rounds 1 --device "$DEVICE"

# The trainer on CUDA: dlrm_small, one process, a SIGKILL restored cold and by the spare.
if [ -n "$trainer_missing" ]; then
    echo "recovery: skipped ($trainer_missing)"
else
    step recovery 240 "$PY" -m bench.recovery --steps 900
fi

# Two processes under torchrun (NCCL), when two GPUs are there: shard, train, save, resume.
if [ -n "$trainer_missing" ]; then
    echo "torchrun_2: skipped ($trainer_missing)"
elif [ "$DEVICE" = cuda ] && \
        [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    step torchrun_2 120 "$PY" - <<'EOF'
import json, os, subprocess, sys, tempfile
from pathlib import Path
root = Path(tempfile.mkdtemp(prefix="gpu-2rank-"))
cfg = {"model": "dlrm_small", "steps": 200, "batch_size": 512, "checkpoint_dir": "ckpt",
       "checkpoint_interval": 50, "events_file": "events.jsonl", "num_workers": 1,
       "compile": True, "compile_cache_dir": "cache",
       "faults": [{"kind": "kill", "at_step": 120, "attempt": 1}]}
(root / "job.json").write_text(json.dumps(cfg))
torchrun = str(Path(sys.executable).with_name("torchrun"))
for attempt in (1, 2):
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m",
                           "airflow_ett.trainer", "--config", "job.json", "--job-id", "g2",
                           "--attempt-number", str(attempt)], cwd=root, timeout=110)
    print("attempt", attempt, "exit", done.returncode)
from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import read_events
d = attribute_job(read_events(str(root / "events.jsonl")).events).to_dict()
print(json.dumps({k: d[k] for k in ("ett_pct", "tts_s", "ttr_s", "csbt_s", "world_size")}))
EOF
else
    echo "torchrun_2: skipped (fewer than two GPUs)"
fi

printf '\ngpu_check: logs in %s; failed: %s\n' "$OUT" "${failed[*]:-none}"
[ "${#failed[@]}" -eq 0 ]
