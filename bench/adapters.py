"""What each adapter costs a training step, against the same step without it.

A training step is a torch matmul chain calibrated to ~20 ms on one thread. For each
adapter the per-step work it adds is run around that step, exactly as the library calls
it, recording into a real SQLite ETT store through the emitter:

- `loop`: `ett.begin_step()` and `ett.step(...)` (`airflow_ett.adapters.job`);
- `torchrec`: `EttTrainPipeline.progress()` over TorchRec's `TrainPipelineBase` (the
  step is the pipeline's: a DLRM-style module whose forward runs the matmul chain);
- `lightning`: `EttLightningCallback.on_train_batch_start/end` (Lightning calls nothing
  else per step; the trainer they read is a stand-in holding `global_step`, since a
  whole `fit` per measured step is not a paired measurement);
- `hf`: `EttHFCallback.on_step_begin/on_step_end` with Transformers' own
  `TrainingArguments`, `TrainerState` and `TrainerControl`.

Three ways side by side, from one run: the baseline (the step alone), the stock way a user
would record without us (a JSON line per step written and flushed to an events file by
hand), and ours. Paired design, as `bench/emitter.py`: each pair is one step without and
one with, in random order, back to back; the figure is the median per-pair difference as
a share of the median step, with a bootstrap 95% interval. Target: ours under 0.5 %.
Also the extra in microseconds and as a share of 20 ms (the calibration lands within a few
ms of it), and the low-noise figure: the same pairs around an empty step, which leaves the
calls' own cost. Interleaving breaks the adapters' span coalescing (the step between two
of ours is not one of ours), so every measured step sends an event: the worst case.

usage: python -m bench.adapters [--pairs N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from airflow_ett.adapters.job import EttJob
from airflow_ett.emit import Emitter
from airflow_ett.protocol.env import TrainerEnv

Step = Callable[[], None]


def _calibrated() -> tuple[Step, int]:
    torch.set_num_threads(1)  # as bench/emitter.py: two threads made steps swing 10x here
    size = 192
    a, b = torch.randn(size, size), torch.randn(size, size)

    def compute(k: int) -> None:
        c = a
        for _ in range(k):
            c = torch.tanh(c @ b)

    def timed(k: int) -> float:
        runs = []
        for _ in range(7):
            t0 = time.perf_counter()
            compute(k)
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    compute(50)
    k = 10
    while timed(k) < 0.020:
        k *= 2
    k = max(1, round(k * 0.020 / timed(k)))
    return (lambda: compute(k)), k


def _paired(pairs: int, base: Step, other: Step) -> tuple[float, float, float, float]:
    """(median base step s, median extra s, CI low, CI high) over `pairs` pairs."""
    rng = random.Random(7)
    diffs, bases = [], []
    for _ in range(pairs):
        took = {}
        for which in rng.sample((0, 1), 2):
            t0 = time.perf_counter()
            (other if which else base)()
            took[which] = time.perf_counter() - t0
        diffs.append(took[1] - took[0])
        bases.append(took[0])
    boots = sorted(statistics.median(random.Random(i).choices(diffs, k=len(diffs)))
                   for i in range(200))
    return statistics.median(bases), statistics.median(diffs), boots[5], boots[194]


def _stock(events: Path) -> Callable[[Step], Step]:
    """The stock way: a JSON event line per step, written and flushed by hand."""
    out = events.open("a", encoding="utf-8")
    state = {"step": 0}

    def wrap(step: Step) -> Step:
        def run() -> None:
            t0 = time.time()
            step()
            state["step"] += 1
            out.write(json.dumps({"type": "progress", "job": "bench", "attempt": "1",
                                  "ts": time.time(), "start_ts": t0,
                                  "step_start": state["step"] - 1,
                                  "step_end": state["step"]}) + "\n")
            out.flush()
        return run
    return wrap


def _loop(job: EttJob, step: Step) -> Step:
    count = {"n": 0}

    def run() -> None:
        job.begin_step()
        step()
        count["n"] += 1
        job.step(count["n"], count["n"] * 64)
    return run


def _torchrec(job: EttJob, step: Step) -> tuple[Step, Step]:
    """(the pipeline's step alone, the same through EttTrainPipeline)."""
    from torchrec.distributed.train_pipeline import TrainPipelineBase

    from airflow_ett.adapters.torchrec import EttTrainPipeline

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            step()
            loss = (self.w * batch).sum()
            return loss, loss.detach()

    def batches() -> Any:
        while True:
            yield torch.ones(4)

    def pipeline() -> TrainPipelineBase[Any, Any]:
        model = Model()
        return TrainPipelineBase(model, torch.optim.SGD(model.parameters(), lr=0.0),
                                 torch.device("cpu"))

    plain, it_plain = pipeline(), batches()
    ours, it_ours = EttTrainPipeline(pipeline(), job, samples_per_step=4), batches()
    ours.progress(it_ours)  # the pipeline's start-up, outside the measurement
    plain.progress(it_plain)
    return (lambda: plain.progress(it_plain)), (lambda: ours.progress(it_ours))


def _lightning(job: EttJob, step: Step) -> Step:
    from airflow_ett.adapters.lightning import EttLightningCallback

    callback = EttLightningCallback(job, samples_per_step=64)
    trainer = SimpleNamespace(global_step=0, accumulate_grad_batches=1, should_stop=False)
    callback._first = False
    module: Any = None

    def run() -> None:
        callback.on_train_batch_start(trainer, module, None, trainer.global_step)  # type: ignore[arg-type]
        step()
        trainer.global_step += 1
        callback.on_train_batch_end(trainer, module, {"loss": None}, None,  # type: ignore[arg-type]
                                    trainer.global_step)
    return run


def _hf(job: EttJob, step: Step, root: Path) -> Step:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from airflow_ett.adapters.hf import EttHFCallback

    callback = EttHFCallback(job, samples_per_step=64)
    args = TrainingArguments(output_dir=str(root / "hf"), report_to=[], use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    callback._first = False

    def run() -> None:
        callback.on_step_begin(args, state, control)
        step()
        state.global_step += 1
        callback.on_step_end(args, state, control)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=600)
    args = parser.parse_args()
    step, k = _calibrated()
    print(f"adapters bench: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} CPUs; "
          f"step: {k} x (192x192 matmul + tanh), one torch thread; {args.pairs} pairs each")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        from airflow_ett.store import upgrade

        url = f"sqlite:///{root / 'ett.db'}"
        upgrade(url)
        emitter = Emitter("bench/run", "1.1", sink=url, spool_dir=root / "spool")
        job = EttJob(TrainerEnv("bench/run", "1.1"), emitter=emitter)
        stock = _stock(root / "stock.jsonl")

        def cases(work: Step) -> dict[str, tuple[Step, Step]]:
            plain_pipeline, ours_pipeline = _torchrec(job, work)
            return {"loop": (work, _loop(job, work)),
                    "torchrec": (plain_pipeline, ours_pipeline),
                    "lightning": (work, _lightning(job, work)),
                    "hf": (work, _hf(job, work, root))}

        def empty() -> None:
            """No work: what is left of a pair's difference is the calls' own cost."""

        print(f"  {'adapter':<10} {'baseline step':>14} {'stock (JSON line)':>18} "
              f"{'ours':>9}   ours, 95% CI          ours per step          calls alone")
        bare = cases(empty)
        for name, (base, ours) in cases(step).items():
            b, d_stock, _, _ = _paired(args.pairs, base, stock(base))
            _, d_ours, lo, hi = _paired(args.pairs, base, ours)
            _, d_calls, _, _ = _paired(args.pairs * 5, *bare[name])
            print(f"  {name:<10} {b * 1e3:11.2f} ms {d_stock / b * 100:+15.3f} % "
                  f"{d_ours / b * 100:+7.3f} %   [{lo / b * 100:+.3f} %, {hi / b * 100:+.3f} %]"
                  f"   {d_ours * 1e6:+6.1f} us = {d_ours / 0.020 * 100:+.3f} % of 20 ms"
                  f"   {d_calls * 1e6:5.1f} us")
        emitter.close(30.0)
        stats = emitter.stats()
        print(f"  events written to the store: {stats.written:,} (spooled "
              f"{stats.overflowed:,})")


if __name__ == "__main__":
    main()
