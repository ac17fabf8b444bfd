"""`airflow-ett tenants`: `check` in-process through `main`, the sync plan as a pure
function, and `sync` as a subprocess against a real, migrated Airflow metadata database
(SQLite), read back with `airflow pools list`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import pytest

import airflow_ett.cli as cli
from airflow_ett.cli.tenants import PoolRow, plan_pools, pool_description
from airflow_ett.embedded import venv_script
from airflow_ett.scheduling.tenants import load_tenants

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = Path(str(resources.files("airflow_ett.scheduling") / "tenants.example.toml"))


def main_with_tenants(argv: Sequence[str]) -> int:
    return cli.main(argv)


CLI = [str(venv_script("airflow-ett"))]


def cells(text: str) -> list[list[str]]:
    """A plain table's rows, split at its column gaps (two blanks or more)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def toml(tenants: dict[str, tuple[int, int]]) -> str:
    """A tenants file of (quota_gpus, borrow_limit_gpus) per tenant."""
    return "".join(f"[tenants.{name}]\npriority = 10\nquota_gpus = {quota}\n"
                   f"borrow_limit_gpus = {borrow}\n"
                   for name, (quota, borrow) in tenants.items())


# --- check -------------------------------------------------------------------------------


def test_check_prints_the_effective_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_with_tenants(["tenants", "check", str(EXAMPLE)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    digest = load_tenants(EXAMPLE).digest
    assert lines[0] == f"tenants file {EXAMPLE}: valid, 4 tenant(s) (sha256 {digest[:12]})"
    rows = cells("\n".join(lines[1:-1]))
    assert rows[0] == ["tenant", "priority", "quota_gpus", "borrow_limit_gpus", "pool slots",
                       "preemptible", "min_run_s", "grace_s", "max_preemptions_per_day",
                       "pool"]
    assert rows[1:] == [
        ["ads-ranking", "100", "24", "16", "40", "true", "900", "60", "1",
         "ett_tenant_ads-ranking"],
        # defaults filled in: min_run_s 600, grace_s 120, max_preemptions_per_day 2
        ["feed-recs", "80", "16", "16", "32", "true", "600", "120", "2", "ett_tenant_feed-recs"],
        ["foundation-models", "50", "16", "0", "16", "false", "600", "120", "2",
         "ett_tenant_foundation-models"],
        ["ml-platform-ci", "10", "8", "24", "32", "true", "0", "30", "10",
         "ett_tenant_ml-platform-ci"],
        ["total", "64", "56", "120"],
    ]
    assert lines[-1] == ("scheduling: a waiting task gains 1 priority point(s) per hour; GPU "
                         "(train) tasks go to queue 'gpu', the others to 'cpu'")


def test_check_a_bad_file_is_one_line_on_stderr_and_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "t.toml"
    bad.write_text("[tenants.ads]\npriority = 1\nquota_gpus = -1\n")
    assert main_with_tenants(["tenants", "check", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"airflow-ett: error: tenants file {bad}: tenant 'ads': "
                            "quota_gpus: -1 is not a whole number >= 0\n")
    assert main_with_tenants(["tenants", "check", str(tmp_path / "none.toml")]) == 1
    assert capsys.readouterr().err.endswith("none.toml: not found\n")


def test_sync_without_a_file_or_setting_says_how_to_give_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    # No [ett] tenants_file in this session's environment (tests/conftest.py drops them).
    assert main_with_tenants(["tenants", "sync"]) == 1
    assert capsys.readouterr().err == ("airflow-ett: error: no tenants file: give FILE, or "
                                       "set [ett] tenants_file (AIRFLOW__ETT__TENANTS_FILE)\n")


# --- the plan ----------------------------------------------------------------------------


def test_the_plan_creates_resizes_updates_and_lists_pools_it_no_longer_names(
        tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text(toml({"new": (2, 0), "bigger": (4, 4), "split": (6, 2), "same": (1, 1)}))
    config = load_tenants(f)
    same = config.get("same")

    def row(name: str, slots: int, description: str = "x") -> PoolRow:
        return PoolRow(name, slots, description, include_deferred=False)

    existing = {
        "ett_tenant_bigger": row("ett_tenant_bigger", 4),
        "ett_tenant_split": row("ett_tenant_split", 8, "quota 4 + borrow 4"),
        "ett_tenant_same": row("ett_tenant_same", 2, pool_description(same)),
        "ett_tenant_gone": row("ett_tenant_gone", 3),
        "default_pool": row("default_pool", 128),
        "etl": row("etl", 4),
    }
    changes, gone = plan_pools(config, existing)
    assert [(c.action, c.pool, c.old_slots, c.slots) for c in changes] == [
        ("create", "ett_tenant_new", None, 2),
        ("resize", "ett_tenant_bigger", 4, 8),
        ("update", "ett_tenant_split", 8, 8),
        ("ok", "ett_tenant_same", 2, 2),
    ]
    assert [r.name for r in gone] == ["ett_tenant_gone"]  # only our prefix, never deleted
    assert pool_description(config.get("split")) == (
        "managed by airflow-ett tenants sync: tenant 'split', quota 6 + borrow 2 = 8 GPUs; "
        "edit the tenants file, not this pool")


# --- sync against a real Airflow metadata database ----------------------------------------


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One `airflow db migrate` for the module; each test works on a copy of its file."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = _airflow_env(home)
    done = subprocess.run([str(venv_script("airflow")), "db", "migrate"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return home / "airflow.db"


def _airflow_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AIRFLOW__ETT__") and k != "AIRFLOW_CONFIG"}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    return env


@pytest.fixture
def airflow_env(migrated_db: Path, tmp_path: Path) -> dict[str, str]:
    """The environment of an Airflow installation with its own migrated database."""
    home = tmp_path / "airflow-home"
    home.mkdir()
    shutil.copyfile(migrated_db, home / "airflow.db")
    return _airflow_env(home)


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)


def sync(env: dict[str, str], file: Path, *options: str) -> list[str]:
    done = run_cli(env, "tenants", "sync", str(file), *options)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def pools(env: dict[str, str]) -> dict[str, tuple[int, str]]:
    """Airflow's pools as its own CLI lists them: name -> (slots, description)."""
    done = subprocess.run([str(venv_script("airflow")), "pools", "list", "-o", "json"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return {p["pool"]: (int(p["slots"]), p["description"]) for p in json.loads(done.stdout)}


@pytest.mark.integration
def test_sync_creates_a_pool_per_tenant_and_a_second_run_changes_nothing(
        airflow_env: dict[str, str], tmp_path: Path) -> None:
    f = tmp_path / "tenants.toml"
    shutil.copyfile(EXAMPLE, f)
    first = sync(airflow_env, f)
    assert first[0] == f"tenants file {f}: 4 tenant(s)"
    assert cells("\n".join(first[1:])) == [
        ["action", "pool", "slots", "quota + borrow"],
        ["create", "ett_tenant_ads-ranking", "40", "24 + 16"],
        ["create", "ett_tenant_feed-recs", "32", "16 + 16"],
        ["create", "ett_tenant_foundation-models", "16", "16 + 0"],
        ["create", "ett_tenant_ml-platform-ci", "32", "8 + 24"],
        ["synced: 4 created, 0 unchanged"],
    ]
    config = load_tenants(f)
    expected = {p.pool: (p.limit_gpus, pool_description(p)) for p in config.tenants.values()}
    assert pools(airflow_env) == {"default_pool": (128, "Default pool"), **expected}

    second = sync(airflow_env, f)
    assert [row[0] for row in cells("\n".join(second[1:-1]))] == ["action", "ok", "ok", "ok",
                                                                  "ok"]
    assert second[-1] == "nothing to change: the 4 pool(s) already match the file"
    assert pools(airflow_env) == {"default_pool": (128, "Default pool"), **expected}


@pytest.mark.integration
def test_sync_resizes_updates_and_leaves_the_pool_of_a_removed_tenant(
        airflow_env: dict[str, str], tmp_path: Path) -> None:
    f = tmp_path / "tenants.toml"
    f.write_text(toml({"ads": (8, 4), "batch": (4, 0), "eval": (2, 2)}))
    # Without FILE, sync reads [ett] tenants_file.
    first = run_cli({**airflow_env, "AIRFLOW__ETT__TENANTS_FILE": str(f)}, "tenants", "sync")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.splitlines()[-1] == "synced: 3 created, 0 unchanged"

    # ads grows, eval's quota and borrowing change but not their sum, batch leaves the file.
    f.write_text(toml({"ads": (10, 4), "eval": (3, 1), "research": (1, 0)}))
    dry = sync(airflow_env, f, "--dry-run")
    assert cells("\n".join(dry[2:5])) == [
        ["would resize", "ett_tenant_ads", "12 -> 14", "10 + 4"],
        ["would update", "ett_tenant_eval", "4", "3 + 1"],
        ["would create", "ett_tenant_research", "1", "1 + 0"],
    ]
    assert dry[-1] == ("dry run: 1 to create, 1 to resize, 1 description to update, "
                       "0 unchanged; nothing written")

    out = sync(airflow_env, f)  # what the dry run planned is still to be done: it wrote nothing
    assert cells("\n".join(out[1:5])) == [
        ["action", "pool", "slots", "quota + borrow"],
        ["resize", "ett_tenant_ads", "12 -> 14", "10 + 4"],
        ["update", "ett_tenant_eval", "4", "3 + 1"],
        ["create", "ett_tenant_research", "1", "1 + 0"],
    ]
    assert out[5] == ("no longer in the file (left as they are; `airflow pools delete NAME` "
                      "once no task uses one):")
    assert cells("\n".join(out[6:8])) == [["pool", "slots"], ["ett_tenant_batch", "4"]]
    assert out[-1] == "synced: 1 created, 1 resized, 1 description updated, 0 unchanged"

    config = load_tenants(f)
    after = pools(airflow_env)
    assert after["ett_tenant_ads"] == (14, pool_description(config.get("ads")))
    assert after["ett_tenant_eval"] == (4, pool_description(config.get("eval")))
    assert after["ett_tenant_research"] == (1, pool_description(config.get("research")))
    assert after["ett_tenant_batch"][0] == 4  # left as it was, old description and all
    assert "tenant 'batch', quota 4 + borrow 0" in after["ett_tenant_batch"][1]


@pytest.mark.integration
def test_sync_on_a_database_without_airflows_tables_fails_in_one_line(
        tmp_path: Path) -> None:
    home = tmp_path / "airflow-home"
    home.mkdir()
    f = tmp_path / "tenants.toml"
    f.write_text(toml({"ads": (1, 0)}))
    done = run_cli(_airflow_env(home), "tenants", "sync", str(f))
    assert done.returncode == 1
    assert done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("airflow-ett: error: Airflow's pools could not be read or written: ")
    assert "slot_pool" in last
