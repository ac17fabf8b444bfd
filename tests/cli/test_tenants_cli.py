"""`airflow-ett tenants`: `check` in-process through `main`, the sync plan as a pure
function, and `sync` as a subprocess against a real, migrated Airflow metadata database
(SQLite), read back with `airflow pools list`."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import airflow_ett.cli as cli
from airflow_ett.cli.tenants import PoolRow, plan_pools, pool_description
from airflow_ett.embedded import venv_script
from airflow_ett.scheduling.tenants import load_tenants

if TYPE_CHECKING:
    from airflow_ett.ett.events import Event

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
    assert main_with_tenants(["tenants", "check", str(EXAMPLE), "--no-store"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    digest = load_tenants(EXAMPLE).digest
    assert lines[0] == f"tenants file {EXAMPLE}: valid, 4 tenant(s) (sha256 {digest[:12]})"
    rows = cells("\n".join(lines[1:-5]))
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
    # The fleet-wide knobs preemption runs by; --no-store: nothing about checkpoint saves.
    assert lines[-5:] == [
        "scheduling: a waiting task gains 1 priority point(s) per hour; GPU (train) tasks go "
        "to queue 'gpu', the others to 'cpu'",
        "scheduling: preemption counts free GPUs against 64 GPUs: capacity_gpus 64 (the "
        "quotas add up to 64)",
        "scheduling: preemption is off: the controller only logs what it would do",
        "scheduling: a preempted job may run again 30 s after its preemption (resume_after_s)",
        "scheduling: checkpoint_wait_price 0.25: a victim yields right after its next "
        "periodic checkpoint when the work that saves (GPU-seconds) is at least 0.25 x the "
        "waiting job's GPUs x its longer wait x its priority's weight (1 at the highest "
        "priority, 0 at the lowest), else at once, within its tenant's grace_s",
    ]


def test_check_prints_the_scheduling_knobs_the_file_sets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.toml"
    f.write_text(toml({"ads": (6, 2), "batch": (4, 0)})
                 + "[scheduling]\npreemption = true\nresume_after_s = 90.5\n"
                 "checkpoint_wait_price = 0\n")
    assert main_with_tenants(["tenants", "check", str(f), "--no-store"]) == 0
    assert capsys.readouterr().out.splitlines()[-4:] == [
        "scheduling: preemption counts free GPUs against 10 GPUs: the quotas' sum, 10 "
        "(capacity_gpus not set)",
        "scheduling: preemption is on: the controller preempts victims",
        "scheduling: a preempted job may run again 90.5 s after its preemption "
        "(resume_after_s)",
        "scheduling: checkpoint_wait_price 0: a victim whose next periodic checkpoint is "
        "known yields right after it, however long the waiting job waits; others at once, "
        "within their tenant's grace_s",
    ]


def test_check_warns_when_the_quotas_add_up_to_more_than_the_fleet(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.toml"
    f.write_text(toml({"ads": (6, 2), "batch": (4, 0)}) + "[scheduling]\ncapacity_gpus = 8\n")
    assert main_with_tenants(["tenants", "check", str(f), "--no-store"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"warning: tenants file {f}: the quotas add up to 10 GPUs, more than [scheduling] "
        "capacity_gpus 8: the guarantees cannot all be kept at once")
    f.write_text(toml({"ads": (6, 2), "batch": (4, 0)}) + "[scheduling]\ncapacity_gpus = 10\n")
    assert main_with_tenants(["tenants", "check", str(f), "--no-store"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_check_a_bad_file_is_one_line_on_stderr_and_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "t.toml"
    bad.write_text("[tenants.ads]\npriority = 1\nquota_gpus = -1\n")
    assert main_with_tenants(["tenants", "check", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"airflow-ett: error: tenants file {bad}: tenant 'ads': "
                            "quota_gpus: -1 is not a whole number of GPUs in [0, 1048576]\n")
    assert main_with_tenants(["tenants", "check", str(tmp_path / "none.toml")]) == 1
    assert capsys.readouterr().err.endswith("none.toml: not found\n")


# --- check against the ETT store: grace_s and the measured checkpoint saves ---------------

DAY = 86400.0
GRACE_FILE = """\
[tenants.ads]
priority = 100
quota_gpus = 8
grace_s = 30

[tenants.batch]
priority = 10
quota_gpus = 4

[tenants.eval]
priority = 10
quota_gpus = 2
grace_s = 60

[tenants.infer]
priority = 50
quota_gpus = 2
preemptible = false
grace_s = 10
"""


def saves(job: str, tenant: str | None, totals: Sequence[float], *, at: float,
          final_s: float | None = None) -> list[Event]:
    """A job of `tenant` (None: its job_submitted never arrived) that committed a periodic
    checkpoint save of each of `totals` seconds, one a minute up to `at`, then a final
    save of `final_s`."""
    from airflow_ett.ett.events import CheckpointSaved, JobSubmitted

    first = at - 60.0 * len(totals)
    out: list[Event] = []
    if tenant is not None:
        out.append(JobSubmitted(id=f"{job}/submit", job=job, ts=first - 600, tenant=tenant))
    for i, total in enumerate(totals):
        ts = first + 60.0 * (i + 1)
        out.append(CheckpointSaved(id=f"{job}/ckpt{i}", job=job, ts=ts, attempt="a1",
                                   start_ts=ts - total, step=i, cursor=i, blocking_s=0.5,
                                   total_s=total))
    if final_s is not None:
        out.append(CheckpointSaved(id=f"{job}/final", job=job, ts=at + 60 + final_s,
                                   attempt="a1", start_ts=at + 60, step=len(totals),
                                   cursor=len(totals), blocking_s=final_s, total_s=final_s,
                                   final=True))
    return out


@pytest.fixture
def measured_store(tmp_path: Path) -> str:
    """A real SQLite ETT store holding the checkpoint saves of a few tenants' jobs."""
    from airflow_ett.store import EttStore, upgrade

    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    now = time.time()
    with EttStore(url) as store:
        store.insert_events([
            # ads, two jobs: p90 of 10, 20, ..., 100 is 91 s, past its 30 s grace. Their
            # final saves (shutdown, never a preemption) do not count.
            *saves("ads-1", "ads", [10.0, 30.0, 50.0, 70.0, 90.0], at=now - DAY,
                   final_s=4000.0),
            *saves("ads-2", "ads", [20.0, 40.0, 60.0, 80.0, 100.0], at=now - 3600.0,
                   final_s=4000.0),
            # ... and one job of 8 days ago, out of the default 7-day window.
            *saves("ads-old", "ads", [5000.0, 5000.0], at=now - 8 * DAY),
            # batch (default grace 120 s): p90 of 50, 60 is 59 s.
            *saves("batch-1", "batch", [50.0, 60.0], at=now - 7200.0),
            # infer: long saves, but it is never preempted.
            *saves("infer-1", "infer", [500.0], at=now - 7200.0),
            # a tenant the file does not name, and a job whose tenant is not known
            *saves("other-1", "other", [9999.0], at=now - 7200.0),
            *saves("lost-1", None, [9999.0], at=now - 7200.0),
        ])
    return url


def grace_lines(out: str) -> list[str]:
    """What `check` says after the "scheduling:" lines: the checkpoint saves."""
    lines = out.splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("scheduling: "))
    return lines[last + 1:]


def test_check_warns_of_a_grace_shorter_than_the_measured_saves(
        measured_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.toml"
    f.write_text(GRACE_FILE)
    assert main_with_tenants(["tenants", "check", str(f), "--store-url", measured_store]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert grace_lines(captured.out) == [
        "warning: tenant ads: grace_s 30 s is shorter than its jobs' p90 checkpoint save of "
        "91 s (10 saves, last 7 days): a job preempted at once is killed before its "
        "checkpoint commits and loses its work since the last one; raise grace_s, or lower "
        "[scheduling] checkpoint_wait_price (now 0.25), so that victims wait for their next "
        "checkpoint more often",
        "tenant batch: grace_s 120 s covers its jobs' p90 checkpoint save of 59 s (2 saves, "
        "last 7 days)",
        "tenant eval: no non-final checkpoint save of its jobs in the ETT store (last 7 "
        "days): grace_s 60 s not checked",
        "tenant infer: its jobs' p90 checkpoint save of 500 s (1 save, last 7 days); not "
        "preemptible, so its grace_s 10 s never applies",
    ]

    # A longer window takes the 8-day-old job's saves in: 12 saves, p90 at rank 9.9.
    assert main_with_tenants(["tenants", "check", str(f), "--store-url", measured_store,
                              "--days", "9"]) == 0
    assert grace_lines(capsys.readouterr().out)[0].startswith(
        "warning: tenant ads: grace_s 30 s is shorter than its jobs' p90 checkpoint save of "
        "4510 s (12 saves, last 9 days)")

    # A grace that holds the p90 save: no warning.
    f.write_text(GRACE_FILE.replace("grace_s = 30", "grace_s = 91"))
    assert main_with_tenants(["tenants", "check", str(f), "--store-url", measured_store]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out
    assert grace_lines(out)[0] == ("tenant ads: grace_s 91 s covers its jobs' p90 checkpoint "
                                   "save of 91 s (10 saves, last 7 days)")


def test_check_reads_the_store_of_the_settings(
        measured_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.toml"
    f.write_text(GRACE_FILE)
    monkeypatch.setenv("AIRFLOW__ETT__STORE_URL", measured_store)
    assert main_with_tenants(["tenants", "check", str(f)]) == 0
    assert grace_lines(capsys.readouterr().out)[0].startswith("warning: tenant ads: ")


def test_check_without_a_store_says_so_in_one_line_and_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.toml"
    f.write_text(GRACE_FILE)
    missing = tmp_path / "no" / "ett.db"
    assert main_with_tenants(["tenants", "check", str(f), "--store-url",
                              f"sqlite:///{missing}"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert grace_lines(captured.out) == [
        f"checkpoint saves: not read, so no grace_s is checked against them: ETT store "
        f"sqlite:///{missing} does not exist (no file {missing}): run `airflow-ett db "
        "upgrade` to create it, or check [ett] store_url / --store-url"]
    assert not missing.parent.exists()  # a check creates no store

    empty = tmp_path / "empty.db"  # a database without the store's tables
    sqlite3.connect(empty).close()
    assert main_with_tenants(["tenants", "check", str(f), "--store-url",
                              f"sqlite:///{empty}"]) == 0
    [line] = grace_lines(capsys.readouterr().out)
    assert line.startswith("checkpoint saves: not read, so no grace_s is checked against "
                           f"them: ETT store sqlite:///{empty}: schema missing or out of date")


def test_check_no_store_never_opens_one(
        measured_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.toml"
    f.write_text(GRACE_FILE)
    for url in (measured_store, "nosuchdb://x"):
        assert main_with_tenants(["tenants", "check", str(f), "--no-store",
                                  "--store-url", url]) == 0
        captured = capsys.readouterr()
        assert captured.err == ""
        assert grace_lines(captured.out) == []


def test_check_days_must_be_a_whole_number_of_at_least_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main_with_tenants(["tenants", "check", str(EXAMPLE), "--days", "0"])
    assert exit_.value.code == 2
    assert "--days: must be a whole number in [1, 3660], got '0'" in capsys.readouterr().err


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
