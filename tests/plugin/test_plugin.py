"""The plugin and the provider config as a real Airflow 3 sees them (fresh processes).

Each subprocess starts Airflow (about 2 s here), so there are three: the CLI's plugin
list, one interpreter that checks plugin import errors and Airflow's `[ett]` values
against ours, and the CLI's config lookup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_ett.provider import CONFIG_DEFAULTS

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.integration


@pytest.fixture
def airflow_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a fresh Airflow installation in tmp_path/airflow_home."""
    home = tmp_path / "airflow_home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AIRFLOW__ETT__") and k != "AIRFLOW_CONFIG"
    }
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def run(args: list[str], env: dict[str, str], cwd: Path) -> str:
    proc = subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_airflow_plugins_cli_lists_airflow_ett(airflow_env: dict[str, str], tmp_path: Path) -> None:
    out = run([str(BIN / "airflow"), "plugins", "--output", "json"], airflow_env, tmp_path)
    plugins = json.loads(out[out.index("[") :])
    ours = [p for p in plugins if p["name"] == "airflow_ett"]
    assert len(ours) == 1, f"airflow_ett not in {[p['name'] for p in plugins]}"
    assert "airflow-ett==" in ours[0]["source"]
    assert "airflow_ett.plugin:AirflowEttPlugin" in ours[0]["source"]


_CHECK = """
import json, os, sys
from airflow import plugins_manager
from airflow.configuration import conf
from airflow.providers_manager import ProvidersManager
from airflow_ett.settings import EttSettings

names = [p["name"] for p in plugins_manager.get_plugin_info()]
ours = EttSettings.load()
print(json.dumps({
    "plugins": names,
    "import_errors": plugins_manager.get_import_errors(),
    "provider": "airflow-ett" in ProvidersManager().providers,
    "airflow": {k: conf.get("ett", k) for k in sys.argv[1:]},
    "typed": [conf.getboolean("ett", "disabled"), conf.getfloat("ett", "emit_timeout")],
    "ours": {"store_url": ours.store_url, "disabled": str(ours.disabled),
             "spool_dir": str(ours.spool_dir), "emit_timeout": str(ours.emit_timeout),
             "work_dir": str(ours.work_dir)},
    "ours_typed": [ours.disabled, ours.emit_timeout],
    "heavy": sorted(m for m in ("torch", "torchrec", "fbgemm_gpu") if m in sys.modules),
}))
"""


def test_plugin_loads_cleanly_and_airflow_reads_ett_config_as_we_do(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    home = Path(airflow_env["AIRFLOW_HOME"])
    # One value from each source: store_url default, spool_dir from airflow.cfg,
    # emit_timeout and disabled from the environment (over airflow.cfg).
    (home / "airflow.cfg").write_text(
        "[core]\nload_examples = False\n\n[ett]\nspool_dir = /srv/ett/spool\n"
        "emit_timeout = 9\ndisabled = false\n",
        encoding="utf-8",
    )
    airflow_env["AIRFLOW__ETT__EMIT_TIMEOUT"] = "0.25"
    airflow_env["AIRFLOW__ETT__DISABLED"] = "True"
    out = run([str(BIN / "python"), "-c", _CHECK, *CONFIG_DEFAULTS], airflow_env, tmp_path)
    result = json.loads(out.strip().splitlines()[-1])

    assert "airflow_ett" in result["plugins"]
    assert result["import_errors"] == {}
    assert result["provider"], "ProvidersManager does not list airflow-ett"
    assert result["heavy"] == [], "loading the plugin imported torch/torchrec"
    assert result["airflow"] == {
        "store_url": f"sqlite:///{home}/ett.db",  # provider default, {AIRFLOW_HOME} expanded
        "disabled": "True",
        "spool_dir": "/srv/ett/spool",
        "emit_timeout": "0.25",
        "work_dir": f"{home}/ett_work",
        "rollup_timezone": "UTC",
        "components_file": "",
        "rollup_recompute_days": "2",
        "rollup_catchup_days": "30",
        "report_dir": f"{home}/ett_reports",
        "whatif_cut_pct": "50",
        "whatif_start_s": "60",
        "rollup_silent_after_s": "86400",
        "tenants_file": "",
        "rolling_windows": "5,15,60",
        "rolling_metrics_interval_s": "60",
    }
    assert result["typed"] == [True, 0.25]
    assert result["ours_typed"] == result["typed"]
    assert result["ours"]["store_url"] == result["airflow"]["store_url"]
    assert result["ours"]["spool_dir"] == result["airflow"]["spool_dir"]
    assert result["ours"]["work_dir"] == result["airflow"]["work_dir"]


def test_airflow_config_cli_shows_the_provider_default(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    out = run(
        [str(BIN / "airflow"), "config", "get-value", "ett", "store_url"], airflow_env, tmp_path
    )
    assert out.strip().splitlines()[-1] == f"sqlite:///{airflow_env['AIRFLOW_HOME']}/ett.db"
