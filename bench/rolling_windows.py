"""Rolling windows of a running job on the run API (issue 26, point 4: p95 under 50 ms).

    python bench/rolling_windows.py                  # in process, then a real API server
    python bench/rolling_windows.py --no-server --reps 20
    python bench/rolling_windows.py --jitter 0.1 --ranks 8   # step times that vary, ranks

One SQLite store, one run, running jobs that report as a trainer does (a progress span
about every second: `trainer/progress.py`, `emit/progress.py`), a checkpoint every 30
minutes and one infra failure half-way, aged 10 minutes to 24 hours (600 to 88,000
events). Windows: the default `[ett] rolling_windows`, 5, 15 and 60 minutes. With
`--jitter`, spans last more or less than their second (still back to back, so a job's
ideal step time moves as it reports); with `--ranks N`, N ranks send their own step times
every 10 s (`rank_steps`, decision 0033: ~70k events a day at 8 ranks).

1. In process, per job, `--reps` times each, order rotated (what the route computes,
   without HTTP):
   - baseline: the run's figures without windows (`data.run(..., windows_min=())`);
   - stock way: those, plus each window attributed on its own, as the model offered it
     before (`attribute_window(events, now - N min, now)`: every stage again per window);
   - ours: the run's figures with its windows (`data.run(..., windows_min=(5, 15, 60))`:
     one attribution, cut three times by `last_windows`);
   and the train task's gauges: one `WindowReporter.tick` (store read, attribution,
   30 gauges), the cost each `[ett] rolling_metrics_interval_s` in the task's process.
   The store keeps each job's events and attribution between asks (`store.follow`,
   decision 0034), so two more columns: `first`, a job's first ask in a process (read
   and attributed whole: also what an event older than the re-read margin costs), and
   `live`, a twin of the job still reporting: before each ask the next 10 s of its
   events are stored (what a running job's page, asking every 10 s, meets); after them
   its figures are checked equal to one pass over all its stored events
   (`attribute_job(store.job_events(job), now)`).
2. Through a real API server (`airflow_ett.embedded`: dag-processor and api-server, the
   plugin from its entry point, admin's bearer token, one kept-alive connection):
   `GET /ett/api/v1/runs/{d}/{r}` (the JSON with the windows) and the run page, per job,
   `--requests` timed after one warm-up, and the API of each live twin (10 s of events
   stored, untimed, before each request); Airflow's own `GET /api/v2/dags/{d}/dagRuns/{r}`
   as the stock peer (the "vs stock" column: p95 over its p95).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pages import Client, Route, time_route, token

TARGET_MS = 50.0
#: `[ett] rollup_silent_after_s`'s default, given so that no request reads airflow.cfg.
SILENT_S = 86400.0
WINDOWS = (5, 15, 60)
DAG = "bench_rolling"
#: Running jobs: (run id, age in seconds). One progress event a second.
AGES = (("age_10m", 600), ("age_1h", 3600), ("age_6h", 6 * 3600), ("age_24h", 24 * 3600))

_DAG_FILE = f'''"""A DAG for the rolling-window benchmark: it only has to exist (the store has its
runs)."""
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(dag_id={DAG!r}, schedule=None, catchup=False, tags=["ett-bench"]):
    EmptyOperator(task_id="noop")
'''


def job_events(run_id: str, age_s: int, now: float, *, jitter: float = 0.0,
               ranks: int = 0) -> list[Any]:
    """A job submitted `age_s` ago that trains still: steps of 1 s, a progress event per
    step, a checkpoint every 30 min, an infra failure half-way; its last event just now.
    `jitter`: each span lasts up to that share more or less (spans still back to back: the
    ideal step time moves as they come); `ranks`: each of that many ranks sends its step
    report every 10 s (`rank_steps`, decision 0033)."""
    from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
    from airflow_ett.jobs import job_id_for

    def spec(submit: float) -> JobSpec:
        return JobSpec(job=job_id_for(DAG, run_id), tenant="ads-ranking", model="dlrm_small",
                       dag_id=DAG, run_id=run_id, submit_ts=submit, world_size=8,
                       steps=10 * age_s, step_s=1.0, progress_every=1,
                       checkpoint_every=1800, running_until_step=age_s,
                       failures=(InjectedFailure(at_step=age_s // 2, cause="infra",
                                                 detection_s=60.0, reschedule_s=120.0),))

    # the failure and the start-up make it longer than its steps: shift it to end at `now`
    if not jitter and not ranks:
        last = max(e.ts for e in simulate(spec(0.0)))
        return simulate(spec(now - last - 0.5))
    rng = random.Random(run_id)
    events = _jittered(simulate(spec(0.0)), jitter, rng)
    events += _rank_reports(events, ranks, rng)
    return _shifted(events, now - max(e.ts for e in events) - 0.5)


def _shifted(events: list[Any], by: float) -> list[Any]:
    return [msgspec.structs.replace(e, **{name: getattr(e, name) + by for name in e.TIME_FIELDS
                                          if getattr(e, name) is not None})
            for e in events]


def _jittered(events: list[Any], jitter: float, rng: random.Random) -> list[Any]:
    """Spans lasting `1 ± jitter` times as long, each starting where the last one ended."""
    from airflow_ett.ett.events import Progress

    out: list[Any] = []
    shift = 0.0
    ends: dict[tuple[str, float], float] = {}  # (attempt, original end) -> new end
    for e in events:
        if not isinstance(e, Progress) or not jitter:
            out.append(_shifted([e], shift)[0])
            continue
        took = (e.ts - e.start_ts) * (1.0 + rng.uniform(-jitter, jitter))
        start = ends.get((e.attempt, e.start_ts), e.start_ts + shift)
        out.append(msgspec.structs.replace(e, start_ts=start, ts=start + took))
        ends[(e.attempt, e.ts)] = start + took
        shift += took - (e.ts - e.start_ts)
    return out


def _rank_reports(events: list[Any], ranks: int, rng: random.Random) -> list[Any]:
    """Every rank's report of its own time over each 10 progress spans of an attempt."""
    from airflow_ett.ett.events import Progress, RankSteps, with_rank

    out: list[Any] = []
    spans: dict[str, list[Any]] = {}
    for e in events:
        if isinstance(e, Progress):
            spans.setdefault(e.attempt, []).append(e)
    for attempt, mine in spans.items():
        for i in range(0, len(mine) - 9, 10):
            first, last = mine[i], mine[i + 9]
            took = last.ts - first.start_ts
            for rank in range(ranks):
                busy = took * rng.uniform(0.85, 0.95)
                out.append(with_rank(RankSteps(
                    id=f"{first.job}-rs-{attempt}-{i}-{rank}", job=first.job, ts=last.ts,
                    attempt=attempt, start_ts=first.start_ts, step_start=first.step_start,
                    step_end=last.step_end, busy_s=busy, wait_s=took - busy), rank))
    return out


#: A live twin's step: the events of this many seconds are stored before each ask.
LIVE_STEP_S = 10.0


class Live:
    """A twin of a job still reporting: its last events held back, stored `LIVE_STEP_S`
    at a time (`step`)."""

    def __init__(self, run_id: str, events: list[Any], held_s: float) -> None:
        self.run_id = run_id
        cut = max(e.ts for e in events) - held_s
        self.stored = [e for e in events if e.ts <= cut]
        self.held = sorted((e for e in events if e.ts > cut), key=lambda e: e.ts)
        self.until = cut

    def step(self, store: Any) -> None:
        self.until += LIVE_STEP_S
        batch = [e for e in self.held if e.ts <= self.until]
        self.held = self.held[len(batch):]
        store.insert_events(batch)


def fill(url: str, now: float, held_s: float, **shape: Any
         ) -> tuple[dict[str, int], dict[str, Live]]:
    from airflow_ett.store import EttStore, upgrade

    upgrade(url)
    counts, lives = {}, {}
    with EttStore(url) as store:
        for run_id, age in AGES:
            events = job_events(run_id, age, now, **shape)
            store.insert_events(events)
            counts[run_id] = len(events)
            live = lives[run_id] = Live(f"{run_id}_live",
                                        job_events(f"{run_id}_live", age, now, **shape), held_s)
            store.insert_events(live.stored)
    return counts, lives


def _ms(fn: Callable[[float], None]) -> float:
    began = time.perf_counter()
    fn(time.time())
    return (time.perf_counter() - began) * 1000.0


def p95(xs: list[float]) -> float:
    return statistics.quantiles(sorted(xs), n=100, method="inclusive")[94] if len(xs) > 1 \
        else xs[0]


class _NullStats:
    def gauge(self, stat: str, value: float, *args: Any, **kwargs: Any) -> None: ...

    def timing(self, stat: str, dt: Any, *args: Any, **kwargs: Any) -> None: ...

    def incr(self, stat: str, *args: Any, **kwargs: Any) -> None: ...


def _no(conf: object = None) -> bool:
    return False


def _ways(store: Any, run_id: str, live: Live) -> dict[str, Callable[[float], None]]:
    """What part 1 times for one job, by column."""
    from airflow_ett.ett.attribution import attribute_window
    from airflow_ett.jobs import job_id_for
    from airflow_ett.plugin.web import data
    from airflow_ett.plugin.window_metrics import WindowReporter

    job = job_id_for(DAG, run_id)

    def baseline(now: float) -> None:
        data.run(store, DAG, run_id, now=now, windows_min=(), silent_after_s=SILENT_S)

    def stock(now: float) -> None:
        data.run(store, DAG, run_id, now=now, windows_min=(), silent_after_s=SILENT_S)
        events = store.job_events(job)
        for m in WINDOWS:
            attribute_window(events, now - 60 * m, now, now=now)

    def ours(now: float, run: str = run_id) -> None:
        found = data.run(store, DAG, run, now=now, windows_min=WINDOWS,
                         silent_after_s=SILENT_S)
        assert found is not None and len(found.windows) == len(WINDOWS)

    reporter = WindowReporter(job, lambda: store)

    def tick(now: float) -> None:
        assert reporter.tick(WINDOWS) == 3 * 10

    def first(now: float) -> None:
        store.follow.forget(job)  # as a process that never read it
        ours(now)

    def live_ask(now: float) -> None:
        ours(now, live.run_id)

    return {"baseline": baseline, "stock": stock, "ours": ours, "tick": tick,
            "first": first, "live": live_ask}


def _same_as_one_pass(store: Any, live: Live) -> bool:
    from airflow_ett.ett.attribution import attribute_job
    from airflow_ett.jobs import job_id_for

    now = time.time()
    job = job_id_for(DAG, live.run_id)
    found = store.follow.attribution(job, now)
    return found is not None and found.attribution == attribute_job(store.job_events(job),
                                                                    now=now)


def in_process(url: str, counts: dict[str, int], lives: dict[str, Live], reps: int) -> None:
    from airflow_ett.plugin import metrics
    from airflow_ett.store import EttStore

    metrics.airflow_stats = _NullStats  # the gauges are made, and sent nowhere
    metrics.backend_drops_tags = _no
    print(f"1. in process, {reps} reps each, order rotated; ms median / p95")
    print(f"{'job':<9}{'events':>8}{'baseline':>16}{'stock way':>16}{'ours':>16}"
          f"{'stock/base':>11}{'ours/base':>10}{'windows ms':>11}{'tick ms':>14}"
          f"{'first ms':>10}{'live':>16}")
    with EttStore(url) as store:
        for run_id, _ in AGES:
            live = lives[run_id]
            ways = _ways(store, run_id, live)
            ms: dict[str, list[float]] = {k: [] for k in ways}
            names = [k for k in ways if k != "live"]
            for i in range(reps + 1):
                order = names[i % len(names):] + names[:i % len(names)]
                live.step(store)  # its next 10 s, stored before its ask (untimed)
                for name in [*order, "live"]:
                    took = _ms(ways[name])
                    if i > 0:  # the first round warms caches up
                        ms[name].append(took)
            same = _same_as_one_pass(store, live)
            med = {k: statistics.median(v) for k, v in ms.items()}
            print(f"{run_id:<9}{counts[run_id]:>8,}"
                  + "".join(f"{med[k]:>8.1f} /{p95(ms[k]):>6.1f}"
                            for k in ("baseline", "stock", "ours"))
                  + f"{med['stock'] / med['baseline']:>10.2f}x"
                  + f"{med['ours'] / med['baseline']:>9.2f}x"
                  + f"{med['ours'] - med['baseline']:>11.2f}"
                  + f"{med['tick']:>8.1f} /{p95(ms['tick']):>5.0f}"
                  + f"{med['first']:>10.0f}"
                  + f"{med['live']:>8.1f} /{p95(ms['live']):>6.1f}", flush=True)
            if not same:
                raise RuntimeError(f"{live.run_id}: the figures kept differ from one pass")
    print("windows ms: ours - baseline (medians), what the three windows add to the route; "
          "tick: one send of the gauges in the train task's process; first: a job's first "
          "ask (median); live: the twin, 10 s of events stored before each ask; after them "
          "its figures were checked equal to one pass over all its events", flush=True)


def time_live(route: Route, client: Client, live: Live, store: Any, path: str,
              requests: int) -> Route:
    """One warm-up, then `requests` asks, each after the next 10 s of events (untimed)."""
    client.get(path, "*/*")
    for _ in range(requests):
        live.step(store)
        status, body, took = client.get(path, "*/*")
        if status != 200 or b'"minutes":60' not in body:
            raise RuntimeError(f"GET {path}: {status}, no 60-minute window")
        route.ms.append(took)
    return route


def through_server(url: str, tmp: Path, requests: int, lives: dict[str, Live]) -> None:
    from airflow_ett.embedded import EmbeddedAirflow
    from airflow_ett.store import EttStore

    dags = tmp / "dags"
    dags.mkdir()
    (dags / f"{DAG}.py").write_text(_DAG_FILE, encoding="utf-8")
    env = {"AIRFLOW__ETT__STORE_URL": url, "AIRFLOW__ETT__ROLLUP_TIMEZONE": "UTC"}
    began = time.perf_counter()
    with EmbeddedAirflow(tmp / "home", dags, extra_env=env) as af:
        af.migrate()
        af.start(["dag-processor", "api-server"])
        af.wait_until_ready(240.0)
        af.wait_for_dag(DAG, timeout=240.0)
        stock_run = af.trigger(DAG)
        print(f"2. a real API server: dag-processor + api-server up, stock run triggered in "
              f"{time.perf_counter() - began:.0f} s; {requests} timed requests per route "
              "after one warm-up, one kept-alive connection (admin)", flush=True)
        client = Client(af.api_url, token(af.api_url, af.home, "admin"))
        try:
            stock_path = f"/api/v2/dags/{DAG}/dagRuns/{stock_run}"
            routes = [time_route(Route("stock GET /api/v2/dags/{d}/dagRuns/{r}", "admin",
                                       True), client, [stock_path] * requests,
                                 warm=stock_path)]
            for run_id, _ in AGES:
                for name, path, accept in (
                        (f"ETT run API  {run_id}", f"/ett/api/v1/runs/{DAG}/{run_id}", "*/*"),
                        (f"ETT run page {run_id}", f"/ett/runs/{DAG}/{run_id}", "text/html")):
                    routes.append(time_route(Route(name, "admin", False), client,
                                             [path] * requests, warm=path, accept=accept))
                    status, body, _ = client.get(path, accept)
                    needle = b'"minutes":60' if accept == "*/*" else b'id="run-window-60"'
                    if status != 200 or needle not in body:
                        raise RuntimeError(f"GET {path}: {status}, no 60-minute window")
            with EttStore(url) as store:
                for run_id, _ in AGES:
                    live = lives[run_id]
                    routes.append(time_live(
                        Route(f"ETT run API  {run_id} live", "admin", False), client, live,
                        store, f"/ett/api/v1/runs/{DAG}/{live.run_id}", requests))
        finally:
            client.close()
    base = routes[0].p(95)
    print(f"{'route':<30}{'n':>4}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'vs stock':>10}"
          f"  p95<{TARGET_MS:.0f}ms")
    for r in routes:
        ok = "-" if r.stock else ("yes" if r.p(95) < TARGET_MS else "NO")
        print(f"{r.name:<30}{len(r.ms):>4}{r.p(50):>9.1f}{r.p(95):>9.1f}{max(r.ms):>9.1f}"
              f"{r.p(95) / base:>9.1f}x  {ok}")
    print(f"vs stock: p95 / p95 of Airflow's GET dagRuns/{{run_id}} ({base:.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15, help="in-process reps (default 15)")
    parser.add_argument("--requests", type=int, default=40,
                        help="timed requests per route (default 40)")
    parser.add_argument("--no-server", action="store_true", help="part 1 only")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="spans last up to this share more or less (default 0: 1 s each)")
    parser.add_argument("--ranks", type=int, default=0,
                        help="ranks sending step reports every 10 s (default 0: none)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ett-bench-rolling-"))
    try:
        url = f"sqlite:///{tmp / 'ett.db'}"
        now = time.time()
        print(f"# rolling windows {', '.join(f'{m} min' for m in WINDOWS)}, "
              f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
              f"{os.cpu_count()} cores, Python {platform.python_version()}; SQLite store",
              flush=True)
        held_s = LIVE_STEP_S * (args.reps + args.requests + 4)
        counts, lives = fill(url, now, held_s, jitter=args.jitter, ranks=args.ranks)
        print("store: " + ", ".join(f"{r} {n:,} events" for r, n in counts.items())
              + f"; each job's live twin with its last {held_s:.0f} s held back"
              + (f"; spans +-{args.jitter:.0%}" if args.jitter else "")
              + (f"; {args.ranks} ranks' step reports" if args.ranks else ""), flush=True)
        in_process(url, counts, lives, args.reps)
        if not args.no_server:
            through_server(url, tmp, args.requests, lives)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
