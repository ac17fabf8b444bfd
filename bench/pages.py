"""The ETT pages and their JSON API through a real Airflow API server, with about 20,000
runs in the store (issue 10: p95 under 300 ms per request; p50/p95 per route).

    python bench/pages.py                        # 14 days x 1430 jobs: ~20,000 runs
    python bench/pages.py --days 2 --jobs-per-day 10000 --requests 20

One run, so that the ratios compare like with like:

1. a fresh SQLite ETT store gets `airflow-ett fleet simulate` (UTC days ending yesterday)
   and `airflow-ett rollup` of every simulated day and today (what the nightly DAG
   stores), as the CLI does it;
2. an embedded Airflow (`airflow_ett.embedded`) starts its dag-processor and API server
   (the plugin from its entry point; nothing else is needed to serve pages), parsing one
   small DAG file per simulated DAG id, so that the auth manager knows the fleet's DAGs;
   one manual run per DAG is triggered (it stays queued: no scheduler) for the stock call;
3. each route is asked `--requests` times over one kept-alive HTTP connection per user
   (bearer tokens from Airflow's `POST /auth/token`), after one warm-up request; the run
   routes each time for another run, drawn from the store.

Users: `admin`, and users of tests/plugin/web/restricted_auth.py (Airflow's
SimpleAuthManager, except that they may not read some DAGs): `viewer` may not read the
three `sim_ads_ranking_*` DAGs (a third of the jobs), so their fleet is the merge of the
readable DAGs' stored parts (`rollup/parts.py`). The pages keep recent restricted days in
the process, so only a user's first look pays that; the "first look" rows time one
request each of users seen nowhere before: `broad<i>` may read every DAG but the i-th,
`team<i>` only the DAGs of tenant i (a team lead's view), `ops<i>` every DAG but one that
sends no ETT events.

Stock: Airflow's own `GET /api/v2/version`, `GET /api/v2/dags?limit=50` (its DAG list) and
`GET /api/v2/dags/{dag_id}/dagRuns/{run_id}` (what the UI's run page asks first); the
"vs stock" column divides a route's p95 by the p95 of that DAG-run call.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.embedded.auth import PASSWORD_FILE

TARGET_MS = 300.0
SEED = 11
#: DAGs that send no ETT events (a maintenance DAG, say): parsed, never in the store.
OTHER_DAGS = ("bench_maintenance_0", "bench_maintenance_1", "bench_maintenance_2")
AUTH_MODULE = "ett_bench_restricted_auth"
RESTRICTED_AUTH = Path(__file__).resolve().parents[1] / "tests/plugin/web/restricted_auth.py"
#: restricted_auth.DENY_ENV, not imported: the file is copied onto the API server's path.
DENY_ENV = "ETT_TEST_DAG_DENY"

_DAG_FILE = '''"""A DAG for the ETT page benchmark: it only has to exist (the store has its
runs)."""
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(dag_id={dag_id!r}, schedule=None, catchup=False, tags=["ett-bench"]):
    EmptyOperator(task_id="noop")
'''


def _cli() -> str:
    return str(Path(sys.executable).with_name("airflow-ett"))


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def sim_dag_ids() -> list[str]:
    """The DAG ids `fleet simulate` gives its jobs (`rollup/simulate.py`)."""
    from airflow_ett.rollup.simulate import TENANTS

    return sorted(f"sim_{t.name}_{m.name}".replace("-", "_") for t in TENANTS for m in t.models)


def fill(url: str, days: int, jobs_per_day: int, today: dt.date) -> dict[str, Any]:
    """Simulate and roll up the fleet with the CLI; the store's counts and the seconds."""
    start = today - dt.timedelta(days=days)
    began = time.perf_counter()
    for cmd in (["db", "upgrade"],
                ["fleet", "simulate", "--days", str(days), "--jobs-per-day", str(jobs_per_day),
                 "--seed", str(SEED), "--start", start.isoformat(), "--tz", "UTC"]):
        subprocess.run([_cli(), *cmd, "--store-url", url], check=True, capture_output=True)
    simulated = time.perf_counter()
    subprocess.run([_cli(), "rollup", "--from", start.isoformat(), "--to", today.isoformat(),
                    "--tz", "UTC", "--store-url", url], check=True, capture_output=True)
    rolled = time.perf_counter()
    import sqlalchemy as sa

    from airflow_ett.store import EttStore
    from airflow_ett.store.schema import daily_jobs, jobs

    with EttStore(url) as store:
        events = store.count_events()
        with store.engine.connect() as conn:
            runs = conn.scalar(sa.select(sa.func.count()).select_from(jobs))
            rows = conn.scalar(sa.select(sa.func.count()).select_from(daily_jobs))
            sample = [(str(j), d, r) for j, d, r in conn.execute(
                sa.select(jobs.c.job, jobs.c.dag_id, jobs.c.run_id).order_by(jobs.c.job))]
        stored_days = len(store.daily.days())
    return {"runs": runs, "events": events, "job_rows": rows, "days": stored_days,
            "first": start, "simulate_s": simulated - began, "rollup_s": rolled - simulated,
            "jobs": sample}


class Client:
    """One user's kept-alive HTTP connection to the API server (as a browser keeps one)."""

    def __init__(self, base: str, token: str | None) -> None:
        parts = urllib.parse.urlsplit(base)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._token = token
        self._conn = http.client.HTTPConnection(self._host, self._port, timeout=120)

    def get(self, path: str, accept: str = "application/json") -> tuple[int, bytes, float]:
        """Status, body and milliseconds from sending the request to the body's last byte."""
        headers = {"Accept": accept}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        for attempt in (1, 2):
            began = time.perf_counter()
            try:
                self._conn.request("GET", path, headers=headers)
                response = self._conn.getresponse()
                body = response.read()
            except (http.client.HTTPException, ConnectionError):
                self._conn.close()  # the server closed a kept-alive connection: once more
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=120)
                if attempt == 2:
                    raise
                continue
            return response.status, body, (time.perf_counter() - began) * 1000.0
        raise AssertionError("unreachable")

    def post_json(self, path: str, payload: object) -> Any:
        self._conn.request("POST", path, body=json.dumps(payload).encode(),
                           headers={"Content-Type": "application/json"})
        response = self._conn.getresponse()
        body = response.read()
        if response.status not in (200, 201):
            raise RuntimeError(f"POST {path}: {response.status} {body[:500]!r}")
        return json.loads(body)

    def close(self) -> None:
        self._conn.close()


@dataclass
class Route:
    name: str
    user: str
    stock: bool
    ms: list[float] = field(default_factory=list)

    def p(self, q: float) -> float:
        xs = sorted(self.ms)
        if len(xs) == 1:
            return xs[0]
        return statistics.quantiles(xs, n=100, method="inclusive")[round(q) - 1]


def _check(path: str, status: int, body: bytes, must_not: tuple[str, ...] = ()) -> None:
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {body[:800]!r}")
    text = body.decode("utf-8", errors="replace")
    for hidden in must_not:
        if hidden in text:
            raise RuntimeError(f"GET {path}: shows {hidden!r}, which the user may not read")


def time_route(route: Route, client: Client, paths: list[str], *, warm: str | None,
               accept: str = "application/json", must_not: tuple[str, ...] = ()) -> Route:
    """Ask `warm` once untimed (None: no warm-up), then each of `paths`, timed."""
    if warm is not None:
        status, body, _ = client.get(warm, accept)
        _check(warm, status, body, must_not)
    for path in paths:
        status, body, ms = client.get(path, accept)
        _check(path, status, body, must_not)
        route.ms.append(ms)
    return route


def token(site_url: str, home: Path, user: str) -> str:
    passwords = json.loads((home / PASSWORD_FILE).read_text(encoding="utf-8"))
    client = Client(site_url, None)
    try:
        answer = client.post_json("/auth/token", {"username": user,
                                                  "password": passwords[user]})
    finally:
        client.close()
    return str(answer["access_token"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=14, help="simulated days (default 14)")
    parser.add_argument("--jobs-per-day", type=int, default=1430,
                        help="simulated jobs a day (default 1430: 20,020 runs in 14 days)")
    parser.add_argument("--requests", type=int, default=40,
                        help="timed requests per route (default 40)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    today = dt.datetime.now(dt.UTC).date()
    tmp = Path(tempfile.mkdtemp(prefix="ett-bench-pages-"))
    try:
        run(args, today, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, today: dt.date, tmp: Path) -> None:
    url = f"sqlite:///{tmp / 'ett.db'}"
    print(f"# ETT pages through a real API server, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} "
          f"UTC, {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; SQLite store; {args.requests} timed requests per "
          "route after one warm-up, one kept-alive connection per user", flush=True)
    f = fill(url, args.days, args.jobs_per_day, today)
    print(f"store: {f['runs']:,} runs, {f['events']:,} events (SYNTHETIC: airflow-ett fleet "
          f"simulate --days {args.days} --jobs-per-day {args.jobs_per_day} --seed {SEED}); "
          f"{f['days']} days rolled up, {f['job_rows']:,} job-day rows; simulate "
          f"{f['simulate_s']:.0f} s, rollup {f['rollup_s']:.0f} s", flush=True)

    dag_ids = sim_dag_ids()
    deny = user_denials(dag_ids)
    dags = tmp / "dags"
    dags.mkdir()
    for dag_id in (*dag_ids, *OTHER_DAGS):
        (dags / f"{dag_id}.py").write_text(_DAG_FILE.format(dag_id=dag_id), encoding="utf-8")
    auth_path = tmp / "auth_manager"
    auth_path.mkdir()
    shutil.copy(RESTRICTED_AUTH, auth_path / f"{AUTH_MODULE}.py")
    users = ["admin:admin", *(f"{u}:viewer" for u in deny if u != "admin")]
    env = {
        "AIRFLOW__ETT__STORE_URL": url,
        "AIRFLOW__ETT__ROLLUP_TIMEZONE": "UTC",
        "AIRFLOW__CORE__AUTH_MANAGER": f"{AUTH_MODULE}.RestrictedAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(users),
        DENY_ENV: ",".join(f"{u}:{'|'.join(sorted(d))}" for u, d in deny.items() if d),
        # Only the auth manager's own directory: the repository root holds
        # airflow_ett.egg-info, and Airflow would find the plugin's entry point twice.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(auth_path),
                                                    os.environ.get("PYTHONPATH")])),
    }
    began = time.perf_counter()
    with EmbeddedAirflow(tmp / "home", dags, extra_env=env) as af:
        af.migrate()
        af.start(["dag-processor", "api-server"])
        af.wait_until_ready(240.0)
        for dag_id in (*dag_ids, *OTHER_DAGS):
            af.wait_for_dag(dag_id, timeout=240.0)
        airflow_runs = [(d, af.trigger(d)) for d in dag_ids]
        print(f"airflow: dag-processor + api-server up, {len(dag_ids) + len(OTHER_DAGS)} "
              "DAGs parsed, "
              f"{len(airflow_runs)} runs triggered in {time.perf_counter() - began:.0f} s",
              flush=True)
        measure(args, af, f, airflow_runs, deny)


def user_denials(dag_ids: list[str]) -> dict[str, frozenset[str]]:
    """Each user and the DAGs they may not read: `admin` none; `viewer` the ads-ranking
    tenant's three (a third of the jobs); `broad<i>` DAG i only (they read the other
    ten); `team<i>` every DAG but those of tenant i (a team lead's view); `ops<i>` one of
    `OTHER_DAGS` (every DAG with ETT jobs readable)."""
    tenant_of = {d: t.name.replace("-", "_") for t in _tenants() for d in dag_ids
                 if d.startswith(f"sim_{t.name.replace('-', '_')}_")}
    teams = sorted(set(tenant_of.values()))
    out: dict[str, frozenset[str]] = {
        "admin": frozenset(),
        "viewer": frozenset(d for d in dag_ids if tenant_of[d] == "ads_ranking")}
    out.update({f"broad{i}": frozenset({d}) for i, d in enumerate(dag_ids)})
    out.update({f"team{i}": frozenset(d for d in dag_ids if tenant_of[d] != team)
                for i, team in enumerate(teams)})
    out.update({f"ops{i}": frozenset({d}) for i, d in enumerate(OTHER_DAGS)})
    return out


def _tenants() -> tuple[Any, ...]:
    from airflow_ett.rollup.simulate import TENANTS

    return TENANTS


def hidden(denied: frozenset[str]) -> tuple[str, ...]:
    """What must not be in a page of a user who may not read `denied`: one of its DAG ids
    as a JSON value, or in a run link's path."""
    return tuple(f'"{d}"' for d in denied) + tuple(f"{d}/" for d in denied)


def first_looks(af: EmbeddedAirflow, deny: dict[str, frozenset[str]]) -> list[Route]:
    """Each restricted user's first fleet request, timed alone: nothing of their DAG set
    is in the pages' cache yet, so every shown day is merged again from its readable parts
    (no warm-up: that is the point)."""
    routes = []
    for label, prefix in (("all DAGs but one", "broad"), ("one tenant's DAGs", "team"),
                          ("all but a non-ETT DAG", "ops")):
        cold = Route(f"ETT fleet API, first look: {label}", f"{prefix}*", False)
        for user in (u for u in deny if u.startswith(prefix)):
            client = Client(af.api_url, token(af.api_url, af.home, user))
            try:
                time_route(cold, client, ["/ett/api/v1/fleet"], warm=None,
                           must_not=hidden(deny[user]))
            finally:
                client.close()
        routes.append(cold)
    return routes


def measure(args: argparse.Namespace, af: EmbeddedAirflow, f: dict[str, Any],
            airflow_runs: list[tuple[str, str]], deny: dict[str, frozenset[str]]) -> None:
    n = args.requests
    rng = random.Random(SEED)
    clients = {u: Client(af.api_url, token(af.api_url, af.home, u))
               for u in ("admin", "viewer")}
    jobs = [j for j in f["jobs"] if j[1] and j[2]]

    def run_paths(prefix: str, user: str) -> tuple[str, list[str]]:
        """A warm-up run and `n` others, of DAGs the user may read."""
        pool = [j for j in jobs if j[1] not in deny[user]]
        picked = [f"{prefix}/{_q(d)}/{_q(r)}?job={_q(j)}" for j, d, r in
                  rng.sample(pool, n + 1)]
        return picked[0], picked[1:]

    html = "text/html"
    routes: list[Route] = []
    for user, client in clients.items():
        stock = [f"/api/v2/dags/{_q(d)}/dagRuns/{_q(r)}" for d, r in airflow_runs
                 if d not in deny[user]]
        paths = [stock[i % len(stock)] for i in range(n)]
        routes.append(time_route(Route("stock GET /api/v2/dags/{d}/dagRuns/{r}", user, True),
                                 client, paths, warm=paths[0]))
    for path in ("/api/v2/version", "/api/v2/dags?limit=50"):
        routes.append(time_route(Route(f"stock GET {path}", "admin", True), clients["admin"],
                                 [path] * n, warm=path))
    for user, client in clients.items():
        must_not = hidden(deny[user])
        for name, path, accept in (
                ("ETT fleet page     /ett/", "/ett/", html),
                ("ETT fleet API      /ett/api/v1/fleet", "/ett/api/v1/fleet", "*/*"),
                ("ETT fleet API      /ett/api/v1/fleet?figures=true",
                 "/ett/api/v1/fleet?figures=true", "*/*")):
            routes.append(time_route(Route(name, user, False), client, [path] * n, warm=path,
                                     accept=accept, must_not=must_not))
        for name, prefix, accept in (("ETT run page       /ett/runs/{d}/{r}", "/ett/runs", html),
                                     ("ETT run API        /ett/api/v1/runs/{d}/{r}",
                                      "/ett/api/v1/runs", "*/*")):
            warm, paths = run_paths(prefix, user)
            routes.append(time_route(Route(name, user, False), client, paths, warm=warm,
                                     accept=accept))
    routes.extend(first_looks(af, deny))
    for client in clients.values():
        client.close()
    report(routes)


def report(routes: list[Route]) -> None:
    stock = next(r for r in routes if r.stock and "dagRuns" in r.name and r.user == "admin")
    base = stock.p(95)
    print(f"{'route':<52}{'user':>8}{'n':>4}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}"
          f"{'vs stock':>10}  p95<{TARGET_MS:.0f}ms")
    for r in routes:
        ok = "-" if r.stock else ("yes" if r.p(95) < TARGET_MS else "NO")
        print(f"{r.name:<52}{r.user:>8}{len(r.ms):>4}{r.p(50):>9.1f}{r.p(95):>9.1f}"
              f"{max(r.ms):>9.1f}{r.p(95) / base:>9.1f}x  {ok}")
    ours = [r for r in routes if not r.stock]
    missed = [r for r in ours if r.p(95) >= TARGET_MS]
    print(f"vs stock: p95 / p95 of Airflow's GET dagRuns/{{run_id}} as admin ({base:.1f} ms). "
          + ("every ETT route: p95 under 300 ms" if not missed else
             f"{len(missed)} route(s) at or over 300 ms p95: "
             + "; ".join(f"{' '.join(r.name.split())} ({r.user})" for r in missed)))


if __name__ == "__main__":
    main()
