"""Time to recover of an in-place restart: a cold process against the warm standby.

    python -m bench.recovery [--steps 900] [--rounds 1]

The demo's model (dlrm_small, batch 256, compiled through a prewarmed compile cache, one
data worker with a 2 s start, 20 ms steps, a checkpoint every 50 steps) fails twice: an
application error after step 330 of attempt 1 and a SIGKILL after step 630 of attempt 2,
and is restarted in place by the launcher the train operator uses, in the same run:

  cold      `warm_standby` off: each restart is a new trainer process (Python, torch and
            torchrec imports, model build, compile-cache load, compile on the fast
            batch, restore, data start). This is also what a user's stock in-place
            restart is: torchrun's `--max-restarts` starts a new worker process too.
  standby   `warm_standby` on: the next attempt's process was started once the running
            one had stepped, and has warmed up beside it; a restart tells it to go.

For each failure the recovery is broken down into the ETT model's stages (detection,
shutdown, rescheduling, startup, restore, replay; DESIGN section 1) from the events the
runs wrote, and TTR is set against its floor, checkpoint restore + replay (what any
restart from a checkpoint must pay). Target (issue 13): TTR <= 2x (restore + replay)
with the standby. The spare's resident memory is sampled while it waits.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import read_events
from airflow_ett.trainer.launcher import AttemptOutcome, run_attempts
from bench._jobs import fresh_host_env, record, write_config

STAGES = ("detection", "shutdown", "rescheduling", "startup", "restore", "replay")


def _spare_rss(stop: threading.Event, samples: list[int]) -> None:
    """The largest resident set of any waiting spare (`--standby` process), sampled."""
    me = psutil.Process()
    while not stop.wait(0.5):
        for child in me.children(recursive=True):
            try:
                if "--standby" in child.cmdline():
                    samples.append(child.memory_info().rss)
            except psutil.Error:
                continue


def run(root: Path, name: str, steps: int, standby: bool) -> dict[str, Any]:
    write_config(root, model="dlrm_small", steps=steps, batch_size=256, num_workers=1,
                 data_startup_latency_s=2.0, step_sleep_s=0.02, compile=True,
                 compile_cache_dir=str(root / "cache"), checkpoint_interval=50, seed=3,
                 optimizations={"warm_standby": standby}, faults=[
                     {"kind": "raise", "at_step": steps * 11 // 30, "attempt": 1},
                     {"kind": "kill", "at_step": steps * 21 // 30, "attempt": 2}])
    config = root / "job.json"
    env = fresh_host_env()
    with (root / "prewarm.log").open("w") as log:  # as the lifecycle DAG's prewarm task
        run_attempts(config, f"{name}-prewarm", max_attempts=1, cwd=root, env=env,
                     extra_args=["--prewarm"], stdout=log)
    record(root, name, None, "job_submitted", tenant="bench", model="dlrm_small")

    def report(outcome: AttemptOutcome) -> None:
        record(root, name, outcome.attempt_id, "attempt_ended",
               status=outcome.exit_class.status, cause=outcome.exit_class.cause,
               exit_code=outcome.exit_code, detected_ts=outcome.ended, ts=outcome.ended)

    rss: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_spare_rss, args=(stop, rss), daemon=True)
    sampler.start()
    with (root / "trainer.log").open("w") as log:
        result = run_attempts(config, name, max_attempts=3, cwd=root, env=env, stdout=log,
                              report_unreported=report, warm_standby=standby)
    stop.set()
    sampler.join()
    assert result.succeeded, (root / "trainer.log").read_text()[-3000:]
    record(root, name, None, "job_ended", status="success")
    events = [e for e in read_events(str(root / "events.jsonl")).events if e.job == name]
    d = attribute_job(events).to_dict()
    d["spare_rss_mb"] = max(rss) / 2**20 if rss else None
    return d


def _line(name: str, failure: dict[str, Any]) -> str:
    stages = failure["stages"]
    floor = stages["restore"] + stages["replay"]
    return (f"  {name:<8} {failure['cause']:<12} TTR {failure['ttr_s']:6.2f}s  "
            + "  ".join(f"{s} {stages[s]:5.2f}" for s in STAGES)
            + f"  | /(restore+replay) {failure['ttr_s'] / floor:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--rounds", type=int, default=1, help="cold/standby pairs")
    args = parser.parse_args()
    print(f"# recovery, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{psutil.cpu_count()} CPUs, dlrm_small, {args.steps} steps, 2 failures")
    ratios: dict[str, list[float]] = {"cold": [], "standby": []}
    ttrs: dict[str, list[float]] = {"cold": [], "standby": []}
    for round_ in range(args.rounds):
        for name, standby in (("cold", False), ("standby", True)):
            root = Path(tempfile.mkdtemp(prefix=f"recovery-{name}-"))
            started = time.monotonic()
            d = run(root, f"{name}-{round_}", args.steps, standby)
            print(f"round {round_ + 1} {name}: ETT% {d['ett_pct']:.1f}, E2E {d['e2e_s']:.1f}s, "
                  f"ran {time.monotonic() - started:.0f}s"
                  + (f", spare RSS {d['spare_rss_mb']:.0f} MiB"
                     if d["spare_rss_mb"] else ""))
            for failure in d["failures"]:
                print(_line(name, failure))
                floor = failure["stages"]["restore"] + failure["stages"]["replay"]
                ratios[name].append(failure["ttr_s"] / floor)
                ttrs[name].append(failure["ttr_s"])
    cold, warm = statistics.median(ttrs["cold"]), statistics.median(ttrs["standby"])
    print(f"median TTR: cold {cold:.2f}s, standby {warm:.2f}s: standby/cold "
          f"{warm / cold:.2f}")
    print(f"median TTR / (restore + replay): cold {statistics.median(ratios['cold']):.2f}, "
          f"standby {statistics.median(ratios['standby']):.2f} (target <= 2)")


if __name__ == "__main__":
    main()
