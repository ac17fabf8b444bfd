"""Text that reaches the store obeys one rule on both backends, checked where it enters:
SQLite stores a NUL that PostgreSQL refuses, and neither driver can encode a lone
surrogate (a file name that is not UTF-8, passed on the command line). Events have the
rule already (`ett.events.check_string`); here the components file's owners, the CLI's
name filters and the store URL, each through `main(argv)` on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.store import EttStore
from tests.rollup.scenarios import job_a, job_b

DAY = "2026-11-28"


@pytest.fixture
def components(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "components.toml"
    monkeypatch.setenv("AIRFLOW__ETT__COMPONENTS_FILE", str(path))
    return path


def test_an_owner_with_nul_is_refused_at_load_and_nothing_is_stored(
        store_url: str, components: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with EttStore(store_url) as store:
        store.insert_events([*job_a(), *job_b()])
    components.write_text('[components.shutdown]\nowner = "pub\\u0000lishing"\n')
    assert main(["rollup", "--date", DAY, "--store-url", store_url]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"airflow-ett: error: components file {components}: component 'shutdown', field "
        "'owner': 'pub\\x00lishing' is not a team name (it holds a control or format "
        "character)"]
    with EttStore(store_url) as store:
        assert store.daily.days() == []


def test_a_printable_owner_of_any_script_is_stored_and_read_back_alike(
        store_url: str, components: Path, capsys: pytest.CaptureFixture[str]) -> None:
    owner = "Veröffentlichung 出版 [red]team[/red] 'quoted'"
    components.write_text(f'[components.shutdown]\nowner = "{owner}"\n')
    with EttStore(store_url) as store:
        store.insert_events([*job_a(), *job_b()])
    assert main(["rollup", "--date", DAY, "--store-url", store_url]) == 0
    with EttStore(store_url) as store:
        day = store.daily.day(DAY)
        assert day is not None and owner in [t.team for t in day.teams]
        assert owner in {r["key"] for r in store.daily.group_rows(DAY, "team")}


@pytest.mark.parametrize("argv", [
    ["runs", "list", "--tenant", "t\x00"],
    ["runs", "list", "--model", "m\udcff"],
    ["runs", "list", "--dag-id", "d\x00"],
    ["runs", "show", "job\udcff"],
    ["runs", "show", "job\x00"],
    ["report", "--date", DAY, "--tenant", "t\x00"],
], ids=["tenant-nul", "model-surrogate", "dag-nul", "run-surrogate", "run-nul",
        "report-tenant-nul"])
def test_a_name_no_event_can_carry_is_a_usage_error_on_both_backends(
        store_url: str, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """SQLite answered "no runs match" and PostgreSQL's driver raised; a surrogate was a
    UnicodeEncodeError traceback on both."""
    with pytest.raises(SystemExit) as done:
        main([*argv, "--store-url", store_url])
    assert done.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("airflow-ett ") and "error: argument " in err[-1]
    assert ("contains a NUL character" in err[-1]
            or "contains a lone surrogate" in err[-1]), err


def test_a_store_url_that_is_not_text_is_one_line(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    for command in (["runs", "list"], ["db", "upgrade"], ["rollup", "--date", DAY]):
        assert main([*command, "--store-url", f"sqlite:///{tmp_path}/\udcff.db"]) == 1
        err = capsys.readouterr().err
        assert err == ("airflow-ett: error: ETT store URL: contains a lone surrogate (not "
                       "valid Unicode text)\n")
