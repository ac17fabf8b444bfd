"""`airflow-ett simulate-preemption`: the recorded jobs of a store replayed under each
policy (the simulation itself is tests/scheduling/test_fleet_sim.py's)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.store import upgrade

TENANTS = """
[scheduling]
capacity_gpus = 256

[tenants.ads-ranking]
priority = 100
quota_gpus = 128
borrow_limit_gpus = 128
min_run_s = 0

[tenants.feed-recs]
priority = 50
quota_gpus = 64
borrow_limit_gpus = 192
min_run_s = 0
"""


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[str, Path]:
    url = f"sqlite:///{tmp_path}/ett.db"
    upgrade(url)
    assert main(["fleet", "simulate", "--days", "1", "--jobs-per-day", "40", "--seed", "4",
                 "--start", "2026-11-20", "--tz", "UTC", "--store-url", url]) == 0
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS, encoding="utf-8")
    return url, tenants


def test_the_recorded_jobs_are_replayed_under_each_policy(
        fleet: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    url, tenants = fleet
    capsys.readouterr()
    assert main(["simulate-preemption", "--from", "2026-11-20", "--to", "2026-11-20",
                 "--tenants", str(tenants), "--store-url", url]) == 0
    out = capsys.readouterr().out
    replayed = int(re.search(r"^(\d+) recorded job\(s\) submitted 2026-11-20 to 2026-11-20 "
                             r"\(UTC\), on 256 GPUs", out, re.M).group(1))  # type: ignore[union-attr]
    assert 0 < replayed <= 40
    assert re.search(r"^left out, tenants not in the file: .*search \(\d+\)", out, re.M)
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in ("none", "classic", "stage_aware")}
    assert set(rows) == {"none", "classic", "stage_aware"}
    assert rows["none"][1] == "0.0"  # no preemption loses nothing to it
    for policy in rows.values():
        assert policy[-1].endswith(f"/{replayed}")  # every replayed job is counted


def test_bad_requests_are_one_line(fleet: tuple[str, Path], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url, tenants = fleet
    capsys.readouterr()
    assert main(["simulate-preemption", "--from", "2026-11-21", "--to", "2026-11-20",
                 "--tenants", str(tenants), "--store-url", url]) == 1
    assert "--to: 2026-11-20 is before --from: 2026-11-21" in capsys.readouterr().err
    assert main(["simulate-preemption", "--from", "2026-10-01", "--to", "2026-10-02",
                 "--tenants", str(tenants), "--store-url", url]) == 1
    assert "no recorded job to replay in those days" in capsys.readouterr().err
    monkeypatch.delenv("AIRFLOW__ETT__TENANTS_FILE", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    assert main(["simulate-preemption", "--from", "2026-11-20", "--to", "2026-11-20",
                 "--store-url", url]) == 1
    assert "no tenants file: pass --tenants FILE" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[tenants.x]\npriority = 1\n", encoding="utf-8")
    assert main(["simulate-preemption", "--from", "2026-11-20", "--to", "2026-11-20",
                 "--tenants", str(bad), "--store-url", url]) == 1
    assert "tenant 'x': quota_gpus: missing" in capsys.readouterr().err
