"""The lifecycle DAGs on a real embedded Airflow: baseline vs optimized, ETT side by side.

    python -m bench.lifecycle_dags

One embedded Airflow (SQLite, LocalExecutor, scheduler + dag-processor + triggerer + API
server as processes, its own TMPDIR so no compile output of earlier runs is found) runs,
one after the other: `ett_dlrm_demo` with a cold compile cache (the model's first job),
`ett_dlrm_baseline` (every optimization off), and `ett_dlrm_demo` again (the steady
state: the cache is warm). Each run's ETT comes from the store its listener, operators
and trainer wrote to; trigger-to-end times from Airflow's REST API.
"""

from __future__ import annotations

import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.jobs import job_id_for
from airflow_ett.store import EttStore

DAGS = Path(__file__).resolve().parents[1] / "dags"
COMPONENTS = ("scheduling", "initialization", "compilation", "effective_training",
              "wasted_training", "shutdown")


def run(af: EmbeddedAirflow, dag_id: str) -> tuple[dict[str, Any], float]:
    af.wait_for_dag(dag_id, timeout=120.0)
    af.unpause(dag_id)
    begin = time.monotonic()
    run_id = af.trigger(dag_id)
    state = af.wait_for_run(dag_id, run_id, timeout=900.0)
    elapsed = time.monotonic() - begin
    if state != "success":
        raise SystemExit(f"{dag_id} {run_id}: {state}")
    with EttStore(f"sqlite:///{af.home}/ett.db") as store:
        return store.summary(job_id_for(dag_id, run_id)), elapsed


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-lifecycle-"))
    (root / "tmp").mkdir()
    print(f"# lifecycle DAGs on an embedded Airflow, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()}, dlrm_small, 400 steps, SIGKILL at step 330")
    with EmbeddedAirflow(root / "home", DAGS, extra_env={"TMPDIR": str(root / "tmp")}) as af:
        af.migrate()
        af.start()
        af.wait_until_ready(180.0)
        runs = {
            "demo (cold cache)": run(af, "ett_dlrm_demo"),
            "baseline": run(af, "ett_dlrm_baseline"),
            "demo (warm cache)": run(af, "ett_dlrm_demo"),
        }
    names = list(runs)
    print(f"{'':<26}" + "".join(f"{n:>20}" for n in names))

    def row(label: str, values: list[str]) -> None:
        print(f"{label:<26}" + "".join(f"{v:>20}" for v in values))

    summaries = [runs[n][0] for n in names]
    row("trigger -> run end (s)", [f"{runs[n][1]:.1f}" for n in names])
    row("E2E (s)", [f"{s['e2e_s']:.1f}" for s in summaries])
    row("ETT%", [f"{s['ett_pct']:.1f}" for s in summaries])
    row("TTS (s)", [f"{s['tts_s']:.1f}" for s in summaries])
    row("TTR (s)", [" ".join(f"{t:.1f}" for t in s["ttr_s"]) for s in summaries])
    row("NoF", [str(s["nof"]["total"]) for s in summaries])
    for component in COMPONENTS:
        row(f"  {component} (s)", [f"{s['components'][component]:.1f}" for s in summaries])
    row("CSBT (s)", [f"{s['csbt_s']:.3f}" for s in summaries])
    row("shutdown (s)", [f"{s['shutdown_s']:.1f}" for s in summaries])
    row("cache_prewarm (s)", [f"{s['phases'].get('cache_prewarm', 0.0):.1f}"
                              for s in summaries])
    row("model avail. after release", [
        "in GPU task" if s["model_available_after_release_s"] in (None, 0.0)
        else f"{s['model_available_after_release_s']:.1f} s" for s in summaries])
    base, warm = summaries[1], summaries[2]
    print(f"optimized (warm) vs baseline: ETT% {base['ett_pct']:.1f} -> {warm['ett_pct']:.1f}, "
          f"E2E {base['e2e_s']:.1f} -> {warm['e2e_s']:.1f} s "
          f"({warm['e2e_s'] / base['e2e_s']:.2f}x)")


if __name__ == "__main__":
    main()
