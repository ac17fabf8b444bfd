"""A job long enough to show the headline: a 15-minute training job through the
lifecycle DAG on the embedded Airflow, optimized and baseline one after the other.

    python -m bench.long_job [--steps 11000] [--step-sleep 0.06]

The small DLRM (batch 256, one data worker with a 2 s start, each step padded by
`--step-sleep` so that the job lasts about 15 minutes on this CPU), two injected failures
(an exception on attempt 1 at 30% of the steps, a SIGKILL on attempt 2 at 70%), the
automatic checkpoint interval (Young/Daly from the job's measured save cost and failure
history), two in-place restarts. `optimized` is the lifecycle with every optimization on
(prewarmed compile cache, fast batch, parallel init, async checkpoints, warm standby,
publishing on CPU after the GPU task); `baseline` has them all off (publishing inside the
train task). The optimized job runs first, on a cold compile cache (the model's first
job: its prewarm compiles), then the baseline, then, unless `--no-warm-row`, the
optimized job again on the cache the first run left (`optimized, warm`: the steady state
of a model's later jobs). Each is a fresh DAG run on the same embedded Airflow (SQLite,
LocalExecutor), its ETT read back from the store its listener, operators and trainer
wrote.

Targets (issue 13): optimized ETT% >= 90 and >= 20 points above the baseline. Prints both
Level-1 and Level-2 breakdowns.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore

COMPONENTS = ("scheduling", "initialization", "compilation", "effective_training",
              "wasted_training", "shutdown")
OFF = ("fast_batch", "parallel_init", "compile_cache", "async_checkpoint", "warm_standby",
       "standalone_publish")

DAGS = '''# the long job, optimized and baseline (parsed only if it says "airflow" and "DAG")
from airflow_ett.operators import training_job

JOB = dict(tenant="bench", model="dlrm_small", steps={steps}, checkpoint_interval="auto",
           restarts=2, retries=0,
           faults=[{{"kind": "raise", "at_step": {first}, "attempt": 1}},
                   {{"kind": "kill", "at_step": {second}, "attempt": 2}}],
           trainer_options={{"batch_size": 256, "num_workers": 1, "seed": 3,
                            "data_startup_latency_s": 2.0, "step_sleep_s": {sleep},
                            "log_every_s": 30.0, "hang_timeout_s": 300.0}})
optimized = training_job("long_optimized", **JOB)
baseline = training_job("long_baseline", optimizations={off!r}, **JOB)
'''


def run(af: EmbeddedAirflow, dag_id: str, timeout: float) -> dict[str, Any]:
    af.wait_for_dag(dag_id, timeout=120.0)
    af.unpause(dag_id)
    begin = time.monotonic()
    run_id = af.trigger(dag_id)
    state = af.wait_for_run(dag_id, run_id, timeout=timeout)
    if state != "success":
        raise SystemExit(f"{dag_id} {run_id}: {state}\n{af.log_tail('scheduler')}")
    with EttStore(f"sqlite:///{af.home}/ett.db") as store:
        summary = store.summary(job_id_for(dag_id, run_id))
    summary["trigger_to_end_s"] = time.monotonic() - begin
    return summary


def report(name: str, d: dict[str, Any]) -> None:
    ttr = ", ".join(f"{t:.1f}s" for t in d["ttr_s"])
    print(f"{name}: ETT% {d['ett_pct']:.1f}  E2E {d['e2e_s']:.0f}s  (trigger to end "
          f"{d['trigger_to_end_s']:.0f}s)")
    print(f"  Level 1: TTS {d['tts_s']:.1f}s  TTR {ttr}  NoF {d['nof']['total']}  "
          f"CSBT {d['csbt_s']:.2f}s over {d['checkpoints']['saves']} saves")
    for f in d["failures"]:
        stages = "  ".join(f"{k} {v:.2f}" for k, v in f["stages"].items())
        print(f"    {f['cause']:<12} TTR {f['ttr_s']:.2f}s: {stages}")
    print("  Level 2: " + "  ".join(f"{c} {d['components'][c]:.1f}s" for c in COMPONENTS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=11000)
    parser.add_argument("--step-sleep", type=float, default=0.06)
    parser.add_argument("--no-warm-row", action="store_true",
                        help="skip the third run (optimized again, on a warm cache)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-long-"))
    (root / "tmp").mkdir()
    (root / "dags").mkdir()
    (root / "dags" / "long_job.py").write_text(textwrap.dedent(DAGS.format(
        steps=args.steps, first=args.steps * 3 // 10, second=args.steps * 7 // 10,
        sleep=args.step_sleep, off={k: False for k in OFF})))
    print(f"# long job on an embedded Airflow, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()}, dlrm_small, {args.steps} steps padded "
          f"{args.step_sleep * 1000:.0f} ms, raise at {args.steps * 3 // 10} (attempt 1), "
          f"SIGKILL at {args.steps * 7 // 10} (attempt 2), auto checkpoint interval")
    timeout = 3 * 3600.0
    with EmbeddedAirflow(root / "home", root / "dags",
                         extra_env={"TMPDIR": str(root / "tmp")}) as af:
        af.migrate()
        af.start()
        af.wait_until_ready(180.0)
        results = {"optimized": run(af, "long_optimized", timeout),
                   "baseline": run(af, "long_baseline", timeout)}
        if not args.no_warm_row:
            results["optimized, warm"] = run(af, "long_optimized", timeout)
    for name, d in results.items():
        report(name, d)
    base = results["baseline"]["ett_pct"]
    for name in (n for n in results if n != "baseline"):
        ett = results[name]["ett_pct"]
        print(f"ETT% baseline {base:.1f} -> {name} {ett:.1f} ({ett - base:+.1f} points); "
              f"targets: >= 90 ({'met' if ett >= 90 else 'NOT met'}), >= +20 points "
              f"({'met' if ett - base >= 20 else 'NOT met'})")


if __name__ == "__main__":
    main()
