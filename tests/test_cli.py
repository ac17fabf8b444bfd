"""The `airflow-ett` command line, in-process through `main(argv)` and once through the
installed console script; store commands against a real SQLite file."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.ett.events import event_to_json
from airflow_ett.ett.synthetic import EXAMPLE_SPEC, InjectedFailure, JobSpec, simulate

EXAMPLE = Path(str(resources.files("airflow_ett") / "examples" / "demo_job.jsonl"))
REQUIRED_KEYS = {"ett_pct", "e2e_s", "tts_s", "ttr_s", "nof", "components", "csbt_s",
                 "shutdown_s"}


def write_events(path: Path, events: list[object]) -> Path:
    path.write_text("".join(event_to_json(e) + "\n" for e in events))  # type: ignore[arg-type]
    return path


def test_bundled_example_is_the_documented_spec() -> None:
    expected = "".join(event_to_json(e) + "\n" for e in simulate(EXAMPLE_SPEC))
    assert EXAMPLE.read_text() == expected


def test_compute_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compute", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "ETT% 55.08" in out
    for heading in ("Level 1", "Level 2", "effective_training", "TTR", "NoF    2"):
        assert heading in out


def test_compute_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compute", str(EXAMPLE), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) >= REQUIRED_KEYS
    assert d["nof"] == {"preemption": 1, "infra": 1, "application": 0, "unknown": 0,
                        "total": 2}
    assert len(d["ttr_s"]) == 2
    assert set(d["components"]) == {"scheduling", "initialization", "compilation",
                                     "effective_training", "wasted_training", "shutdown"}
    assert sum(d["components"].values()) == pytest.approx(d["e2e_s"], abs=1e-6)


def test_compute_several_jobs_and_selection(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    log = write_events(tmp_path / "two.jsonl", [
        *simulate(JobSpec(job="a")),
        *simulate(JobSpec(job="b", failures=(InjectedFailure(at_step=20),))),
    ])
    assert main(["compute", str(log), "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert [d["job"] for d in both] == ["a", "b"]
    assert main(["compute", str(log), "--json", "--job", "b"]) == 0
    assert json.loads(capsys.readouterr().out)["nof"]["total"] == 1
    assert main(["compute", str(log), "--job", "zzz"]) == 1
    assert "job 'zzz' is not in" in capsys.readouterr().err


def test_bad_lines_are_reported_and_good_ones_kept(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lines = EXAMPLE.read_text().splitlines()
    lines.insert(3, '{"type": "progress", "id": "x", "job": "j", "ts": "noon"}')
    log = tmp_path / "bad.jsonl"
    log.write_text("\n".join(lines) + "\n")
    assert main(["compute", str(log), "--json"]) == 0
    captured = capsys.readouterr()
    assert "line 4: field 'ts' = 'noon'" in captured.err
    assert json.loads(captured.out)["ett_pct"] == pytest.approx(55.076, abs=1e-3)
    assert main(["compute", str(log), "--strict"]) == 1
    assert "1 bad line(s)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compute", "/no/such/file.jsonl"], "events file not found: /no/such/file.jsonl"),
        (["compute", "{empty}"], "no valid events in"),
    ],
)
def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             argv: list[str], message: str) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    argv = [a.replace("{empty}", str(empty)) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_store_commands_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    assert main(["db", "upgrade", "--store-url", url]) == 0
    assert "is at revision" in capsys.readouterr().out

    assert main(["ingest", str(EXAMPLE), "--store-url", url]) == 0
    assert f"stored {len(simulate(EXAMPLE_SPEC))} new event(s)" in capsys.readouterr().out
    assert main(["ingest", str(EXAMPLE), "--store-url", url]) == 0
    assert "stored 0 new event(s)" in capsys.readouterr().out

    assert main(["runs", "list", "--store-url", url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["job"] for r in rows] == [EXAMPLE_SPEC.job]
    assert main(["runs", "list", "--store-url", url, "--tenant", "nobody"]) == 0
    assert "no runs match" in capsys.readouterr().out
    assert main(["runs", "list", "--store-url", url, "--since", "2026-11-28"]) == 0
    assert EXAMPLE_SPEC.job in capsys.readouterr().out

    assert main(["runs", "show", EXAMPLE_SPEC.job, "--store-url", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["ett_pct"] == pytest.approx(55.076, abs=1e-3)
    assert main(["runs", "show", "missing-run", "--store-url", url]) == 1
    assert "no run 'missing-run'" in capsys.readouterr().err


def test_spool_replay_delivers_to_the_store(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    spool = tmp_path / "spool"
    spool.mkdir()
    events = simulate(JobSpec(job="spooled"))
    write_events(spool / "spool-999999-dead.jsonl", events)
    assert main(["db", "upgrade", "--store-url", url]) == 0
    assert main(["spool", "replay", "--store-url", url, "--spool-dir", str(spool)]) == 0
    assert f"replayed {len(events)} event(s)" in capsys.readouterr().out

    from airflow_ett.store import EttStore

    store = EttStore(url)
    assert store.count_events("spooled") == len(events)
    store.close()


def test_unreachable_store_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql+psycopg2://postgres:secret@127.0.0.1:1/ett"
    assert main(["runs", "list", "--store-url", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("airflow-ett: error:")
    assert "secret" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.integration
def test_console_script_is_installed(tmp_path: Path) -> None:
    exe = shutil.which("airflow-ett")
    assert exe is not None
    done = subprocess.run([exe, "compute", str(EXAMPLE), "--json"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) >= REQUIRED_KEYS
    bad = subprocess.run([exe, "compute"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert bad.returncode == 2 and "usage:" in bad.stderr
