"""The pages as a real Airflow 3.3 loads them, in a fresh interpreter: loading the plugins
(what every Airflow process does) builds no web app and imports no FastAPI; Airflow's API
app (`airflow.api_fastapi.app.create_app`, what `airflow api-server` serves) mounts ours at
/ett, and there a request without credentials is 401 and one with a forged token 403,
answered by Airflow's own security code. Signed-in users: tests/e2e/test_ett_pages.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

_CHECK = """
import json, sys
from airflow import plugins_manager
plugins_manager.ensure_plugins_loaded()
out = {"loaded_web_app": "airflow_ett.plugin.web.app" in sys.modules,
       "loaded_fastapi": "fastapi" in sys.modules}
views, _ = plugins_manager._get_ui_plugins()
out["views"] = [v for v in views if v.get("url_route", "").startswith("ett")]
info = [p for p in plugins_manager.get_plugin_info() if p["name"] == "airflow_ett"][0]
out["fastapi_apps"] = info["fastapi_apps"]
from airflow.api_fastapi.app import create_app
from starlette.routing import Mount
app = create_app()
mounts = [r for r in app.routes if isinstance(r, Mount) and r.path == "/ett"]
out["mounted"] = len(mounts)
ours = [a["app"] for a in plugins_manager.get_fastapi_plugins()[0] if a["url_prefix"] == "/ett"]
out["same_app"] = len(ours) == 1 and mounts[0].app is ours[0]
from fastapi.testclient import TestClient
client = TestClient(app)
out["status"] = {p: client.get(p).status_code for p in
                 ["/ett/", "/ett/api/v1/fleet", "/ett/runs/d/r", "/ett/openapi.json",
                  "/ett/static/ett.js"]}
out["forged"] = client.get("/ett/api/v1/fleet",
                           headers={"Authorization": "Bearer not.a.token"}).status_code
print("RESULT " + json.dumps(out))
"""


def test_airflow_mounts_the_pages_only_in_its_api_app(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AIRFLOW__ETT__") and k != "AIRFLOW_CONFIG"}
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__ETT__STORE_URL=f"sqlite:///{tmp_path / 'ett.db'}")
    proc = subprocess.run([sys.executable, "-c", _CHECK], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    assert out["loaded_web_app"] is False and out["loaded_fastapi"] is False
    assert [(v["name"], v["destination"]) for v in out["views"]] == [
        ("ETT", "nav"), ("ETT breakdown", "dag_run")]
    assert out["fastapi_apps"] == [{"app": "fastapi.applications.FastAPI",
                                    "url_prefix": "/ett", "name": "ETT"}]
    assert out["mounted"] == 1 and out["same_app"] is True
    assert set(out["status"].values()) == {401}, out["status"]
    assert out["forged"] == 403
