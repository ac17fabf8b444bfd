"""A real Airflow with the ETT pages, for the end-to-end page tests (API and browser).

`ett_site(tmp)` starts the dag-processor and the API server (no scheduler: nothing needs
to run, the DAG runs only have to exist) of an embedded Airflow whose auth manager is
tests/plugin/web/restricted_auth.py (copied alone onto the components' PYTHONPATH), with
two users of Airflow's SimpleAuthManager:

  admin   role admin
  viewer  role viewer, who may not read DAG ett_pages_secret

Two DAG files (ett_pages_ranking, ett_pages_secret) are parsed; a manual run of the
ranking DAG is triggered (it stays queued) and the ETT store gets tests/plugin/web/
fleet.py's jobs, the still-running one under that real run id, rolled up over the days
from two days ago to today (UTC), as the nightly DAG would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_ett.embedded import EmbeddedAirflow
from airflow_ett.embedded.auth import PASSWORD_FILE
from airflow_ett.rollup import day_of, day_window
from airflow_ett.store import EttStore, upgrade
from tests.airflow_db import migrate
from tests.plugin.web import fleet as fleet_data
from tests.plugin.web import restricted_auth

VIEWER = "viewer"
AUTH_MODULE = "ett_test_restricted_auth"

_DAG_FILE = '''"""A DAG for the ETT page tests: it only has to exist (the store has its runs)."""
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(dag_id={dag_id!r}, schedule=None, catchup=False, tags=["ett-pages-test"]):
    EmptyOperator(task_id="noop")
'''


@dataclass
class Site:
    af: EmbeddedAirflow
    store_url: str
    fleet: fleet_data.Fleet
    run_id: str  # the real Airflow run of ett_pages_ranking, still running in the store

    @property
    def url(self) -> str:
        return self.af.api_url

    def password(self, user: str) -> str:
        passwords = json.loads((self.af.home / PASSWORD_FILE).read_text(encoding="utf-8"))
        return str(passwords[user])

    def token(self, user: str) -> str:
        """A bearer token from Airflow's `POST /auth/token`, as an API client logs in."""
        body = json.dumps({"username": user, "password": self.password(user)}).encode()
        status, answer = self.request("POST", "/auth/token", body=body,
                                      headers={"Content-Type": "application/json"})
        assert status in (200, 201) and isinstance(answer, dict), (status, answer)
        return str(answer["access_token"])

    def get(self, path: str, token: str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return self.request("GET", path, token=token, headers=headers)

    def request(self, method: str, path: str, *, token: str | None = None,
                headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, Any]:
        """One request; the status and the body (JSON parsed, else text)."""
        request = urllib.request.Request(self.url + path, data=body, method=method)
        for key, value in {"Accept": "application/json", **(headers or {})}.items():
            request.add_header(key, value)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw, kind = response.status, response.read(), response.headers.get(
                    "content-type", "")
        except urllib.error.HTTPError as exc:
            status, raw, kind = exc.code, exc.read(), exc.headers.get("content-type", "")
        text = raw.decode("utf-8", errors="replace")
        return status, json.loads(text) if "json" in kind and text else text


def quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@contextlib.contextmanager
def ett_site(tmp: Path) -> Iterator[Site]:
    dags = tmp / "dags"
    dags.mkdir()
    for dag_id in (fleet_data.DAG_A, fleet_data.DAG_SECRET):
        (dags / f"{dag_id}.py").write_text(_DAG_FILE.format(dag_id=dag_id), encoding="utf-8")
    url = f"sqlite:///{tmp / 'ett.db'}"
    upgrade(url)
    # The auth manager module alone on PYTHONPATH, not the repository root: the root holds
    # airflow_ett.egg-info, and Airflow would find the plugin's entry point twice.
    auth_path = tmp / "auth_manager"
    auth_path.mkdir()
    shutil.copy(restricted_auth.__file__, auth_path / f"{AUTH_MODULE}.py")
    env = {
        "AIRFLOW__ETT__STORE_URL": url,
        "AIRFLOW__ETT__ROLLUP_TIMEZONE": "UTC",
        "AIRFLOW__CORE__AUTH_MANAGER": f"{AUTH_MODULE}.RestrictedAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"admin:admin,{VIEWER}:viewer",
        restricted_auth.DENY_ENV: f"{VIEWER}:{fleet_data.DAG_SECRET}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(auth_path),
                                                    os.environ.get("PYTHONPATH")])),
    }
    with EmbeddedAirflow(tmp / "home", dags, extra_env=env) as af:
        migrate(af)
        af.start(["dag-processor", "api-server"])
        af.wait_until_ready(240.0)
        for dag_id in (fleet_data.DAG_A, fleet_data.DAG_SECRET):
            af.wait_for_dag(dag_id, timeout=180.0)
        run_id = af.trigger(fleet_data.DAG_A)
        now = time.time()
        lo1 = day_window(day_of(now, "UTC"), "UTC").lo - 2 * 86400
        with EttStore(url) as store:
            fleet = fleet_data.seed(store, lo1, now, running_run_id=run_id)
        yield Site(af=af, store_url=url, fleet=fleet, run_id=run_id)
