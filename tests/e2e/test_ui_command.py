"""README's second command: `airflow-ett embedded ui` (what `make ui` runs) starts the
Airflow UI with the plugin loaded, says where to log in, and on SIGTERM stops every
process it started."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from airflow_ett.embedded import free_port, venv_script

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

DAGS = Path(__file__).resolve().parents[2] / "dags"


def _processes_with_home(home: Path) -> list[int]:
    """Live processes whose environment has this AIRFLOW_HOME (what the command started)."""
    needle = f"AIRFLOW_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _wait_for_dag_details(base: str, token: str, dag_id: str,
                          deadline: float) -> dict[str, object]:
    request = urllib.request.Request(f"{base}/api/v2/dags/{dag_id}/details",
                                     headers={"Authorization": f"Bearer {token}"})
    while True:
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return dict(json.load(response))
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or time.monotonic() > deadline + 120:
                raise
        time.sleep(2.0)


def test_ui_command_serves_the_ui_with_the_plugin_and_stops_cleanly(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    cli = str(venv_script("airflow-ett"))
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_HOME"}
    proc = subprocess.Popen([cli, "embedded", "ui", "--port", str(port), "--home", str(home),
                             "--dags-folder", str(DAGS)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        while not any("password:" in line for line in lines):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
        said = "".join(lines)
        assert f"http://127.0.0.1:{port}" in said and "user:     admin" in said
        password = re.search(r"password: (\S+)", said)
        assert password is not None

        base = f"http://127.0.0.1:{port}"
        token_request = urllib.request.Request(
            f"{base}/auth/token", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"username": "admin", "password": password.group(1)}).encode())
        with urllib.request.urlopen(token_request, timeout=30) as response:
            token = json.load(response)["access_token"]
        plugins_request = urllib.request.Request(
            f"{base}/api/v2/plugins", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(plugins_request, timeout=30) as response:
            names = [p["name"] for p in json.load(response)["plugins"]]
        assert "airflow_ett" in names
        # The example DAGs arrive ready to trigger from the UI, with their documentation.
        for dag_id in ("ett_dlrm_demo", "ett_dlrm_baseline"):
            details = _wait_for_dag_details(base, token, dag_id, deadline)
            assert details["is_paused"] is False, details
            assert "Trigger form" in (details.get("doc_md") or ""), details
        assert _processes_with_home(home.resolve()), "no component runs with this home"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
    assert code == 0, "".join(lines) + (proc.stdout.read() if proc.stdout else "")
    assert _processes_with_home(home.resolve()) == []
