"""The `airflow-ett` command line, in-process through `main(argv)` and once through the
installed console script; store commands against a real SQLite file."""

from __future__ import annotations

import json
import os
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
        (["compute", "/no/such/file.jsonl"], "events file /no/such/file.jsonl: not found"),
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


# --- first-hour rough edges (issue 8, point 10) ---------------------------------------------


def test_version_prints_the_installed_distributions_version(
        capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"airflow-ett {version('airflow-ett')}"


@pytest.mark.parametrize("command", ["compute", "ingest"])
def test_unreadable_events_files_say_why(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         command: str) -> None:
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_text(EXAMPLE.read_text(), encoding="utf-16")
    gz = tmp_path / "events.jsonl.gz"
    import gzip

    gz.write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    fifo, zero = tmp_path / "fifo.jsonl", tmp_path / "zero.jsonl"
    os.mkfifo(fifo)  # an open would block, a read of /dev/zero never end: both refused
    zero.symlink_to("/dev/zero")
    cases = {str(tmp_path): "not a regular file (a directory)",
             str(utf16): "is UTF-16, not UTF-8",
             str(gz): "is gzip-compressed, not UTF-8",
             str(fifo): "not a regular file (a FIFO)",
             str(zero): "not a regular file (a character device)",
             str(tmp_path / "nope.jsonl"): ": not found"}
    for path, message in cases.items():
        assert main([command, path, "--store-url", f"sqlite:///{tmp_path}/ett.db"]
                    if command == "ingest" else [command, path]) == 1
        err = capsys.readouterr().err
        assert message in err and path in err, err
        assert len(err.strip().splitlines()) == 1


def test_a_line_that_is_not_utf8_is_one_bad_line(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    lines = EXAMPLE.read_bytes().splitlines(keepends=True)
    lines.insert(2, b'{"type": "progress", "job": "caf\xe9"}\n')  # Latin-1, not UTF-8
    log = tmp_path / "latin1.jsonl"
    log.write_bytes(b"".join(lines))
    assert main(["compute", str(log), "--json"]) == 0
    captured = capsys.readouterr()
    assert "line 3:" in captured.err and "utf-8" in captured.err.lower()
    assert json.loads(captured.out)["ett_pct"] == pytest.approx(55.076, abs=1e-3)


def test_a_bom_loses_no_line_in_a_file_or_on_stdin(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    with_bom = b"\xef\xbb\xbf" + EXAMPLE.read_bytes()
    log = tmp_path / "bom.jsonl"
    log.write_bytes(with_bom)
    assert main(["compute", str(log), "--strict", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ett_pct"] == pytest.approx(55.076, abs=1e-3)

    stdin = io.TextIOWrapper(io.BytesIO(with_bom), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["compute", "-", "--strict", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ett_pct"] == pytest.approx(55.076, abs=1e-3)

    # A text stream with no bytes underneath gets the same treatment.
    monkeypatch.setattr("sys.stdin", io.StringIO(with_bom.decode("utf-8")))
    assert main(["compute", "-", "--strict"]) == 0


def test_skipped_lines_exit_0_with_a_count_and_strict_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What README's "Using it" says, held here."""
    lines = EXAMPLE.read_text().splitlines()
    lines[5:5] = ["not json", '{"type": "nonsense"}']
    log = tmp_path / "two-bad.jsonl"
    log.write_text("\n".join(lines) + "\n")
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    assert main(["db", "upgrade", "--store-url", url]) == 0
    capsys.readouterr()
    assert main(["ingest", str(log), "--store-url", url]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipped 2 bad line(s) of {len(lines)} in {log}" in err
    assert main(["compute", str(log), "--strict"]) == 1
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    using = readme.split("## Using it", 1)[1].split("\n## ", 1)[0]
    using = " ".join(using.split())
    for said in ("and the exit status stays 0", "With `--strict` any bad line is exit status 1",
                 "2 for a usage error"):
        assert said in using


@pytest.mark.parametrize("value", ["-1", "0", "ten", "1.5", "100001", "9" * 30, "1" * 5000])
def test_limit_must_be_positive(capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as done:
        main(["runs", "list", "--limit", value, "--store-url", "sqlite:////nonexistent/x.db"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --limit: must be a whole number in [1, 100000], got {value!r}" in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1


@pytest.mark.parametrize(("argv", "says"), [
    (["runs", "list", "--since", "1e300"],
     "argument --since: not a time from 2000 to 2100 UTC: '1e300' (Unix seconds in "
     "[946684800, 4102444800))"),
    (["runs", "list", "--until", "9999-12-31"],
     "argument --until: not a time from 2000 to 2100 UTC: '9999-12-31'"),
    (["runs", "list", "--since", "0"], "argument --since: not a time from 2000 to 2100 UTC"),
    (["compute", str(EXAMPLE), "--now", "1e300"], "argument --now: not a time from 2000"),
    (["tenants", "check", "x.toml", "--days", "10000000000"],
     "argument --days: must be a whole number in [1, 3660], got '10000000000'"),
    (["preemption", "run", "--interval", "1000000000000"],
     "argument --interval: must be a whole number in [1, 3600], got '1000000000000'"),
    (["simulate-preemption", "--from", "2026-01-01", "--to", "2026-01-02",
      "--capacity", "1048577"],
     "argument --capacity: must be a whole number in [1, 1048576], got '1048577'"),
    (["simulate-preemption", "--from", "2026-01-01", "--to", "2026-01-02",
      "--high-priority", "2147483648"],
     "argument --high-priority: must be a whole number in [-2147483648, 2147483647], got "
     "'2147483648'"),
    (["embedded", "run", "d", "--timeout", "1e308"],
     "argument --timeout: must be a number of seconds > 0 and <= 86400, got '1e308'"),
])
def test_numeric_options_out_of_their_range_are_one_usage_error(
        capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert says in capsys.readouterr().err


def test_the_cli_bounds_repeat_the_events_and_tenants_bounds() -> None:
    from airflow_ett.cli import common
    from airflow_ett.ett.events import TS_MAX, TS_MIN
    from airflow_ett.scheduling.limits import MAX_GPUS

    assert (common.TS_MIN, common.TS_MAX, common.MAX_GPUS) == (TS_MIN, TS_MAX, MAX_GPUS)
    assert common.time_arg("2026-11-28T10:00Z") == 1_795_860_000.0
    assert common.time_arg(str(TS_MIN)) == TS_MIN


@pytest.mark.parametrize(("argv", "option"), [
    (["runs", "list", "--since", "nan"], "--since"),
    (["compute", str(EXAMPLE), "--now", "inf"], "--now"),
    (["embedded", "run", "d", "--timeout", "-5"], "--timeout"),
    (["embedded", "ui", "--port", "70000"], "--port"),
])
def test_other_numeric_options_are_validated(capsys: pytest.CaptureFixture[str],
                                             argv: list[str], option: str) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err and argv[-1] in err


def test_read_only_commands_create_no_database(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'not' / 'yet' / 'ett.db'}"
    for argv in (["runs", "list"], ["runs", "show", "some-run"], ["ingest", str(EXAMPLE)]):
        assert main([*argv, "--store-url", url]) == 1
        err = capsys.readouterr().err
        assert "does not exist" in err and "airflow-ett db upgrade" in err, err
        assert "unavailable" not in err
    assert list(tmp_path.iterdir()) == []  # neither the file nor its folders
    assert main(["db", "upgrade", "--store-url", url]) == 0  # the one command that creates
    assert (tmp_path / "not" / "yet" / "ett.db").is_file()


def test_a_plain_postgresql_url_gets_the_installed_driver() -> None:
    from airflow_ett.store.engine import make_engine, parse_url

    for scheme in ("postgresql", "postgres"):
        assert parse_url(f"{scheme}://u@h/db").drivername == "postgresql+psycopg2"
        engine = make_engine(f"{scheme}://u@h/db")
        assert engine.dialect.driver == "psycopg2"
        engine.dispose()


# --- odd values already stored (issue 8, point 3) -------------------------------------------


def _odd_store(tmp_path: Path) -> str:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'ett.db'}"
    assert main(["db", "upgrade", "--store-url", url]) == 0
    assert main(["ingest", str(EXAMPLE), "--store-url", url]) == 0
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # as an older, laxer version could have left them
        conn.exec_driver_sql("INSERT INTO ett_jobs (job, tenant, submitted_ts, ended_ts, "
                             "status, last_event_ts, version) VALUES "
                             "('odd-far', 't', 1795856400000000.0, 9e999, 'success', "
                             "1795856400000000.0, 1)")
        conn.exec_driver_sql("INSERT INTO ett_jobs (job, submitted_ts, status, "
                             "last_event_ts, version) VALUES ('odd-neg', -9e999, 'running', "
                             "0, 1)")
    engine.dispose()
    return url


def test_runs_list_shows_an_out_of_range_time_raw(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    url = _odd_store(tmp_path)
    capsys.readouterr()
    assert main(["runs", "list", "--store-url", url]) == 0
    out = capsys.readouterr().out
    assert "1795856400000000.0" in out and "-inf" in out
    assert "2026-11-28 09:00:00" in out  # the good row is still there, formatted
    assert main(["runs", "list", "--store-url", url, "--json"]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)}  # strict JSON
    assert rows["odd-far"]["ended_ts"] == "inf" and rows["odd-neg"]["submitted_ts"] == "-inf"


def test_runs_show_renders_a_cached_summary_with_odd_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlalchemy as sa

    url = _odd_store(tmp_path)
    payload = json.dumps({"job": "odd-far", "ett_pct": None, "e2e_s": float("inf"),
                          "tts_s": float("nan"), "nof": {"total": 0}, "rates": {},
                          "failures": [], "checkpoints": {}, "components": {
                              "scheduling": "1e999"}, "phases": {"x": float("nan"), "y": 2.0},
                          "phase_components": {}})
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO ett_summaries (job, version, computed_at, "
                             "provisional, payload) VALUES ('odd-far', 1, 0, 0, :p)"),
                     {"p": payload})
    engine.dispose()
    capsys.readouterr()
    assert main(["runs", "show", "odd-far", "--store-url", url]) == 0
    out = capsys.readouterr().out
    assert "ETT% -" in out and "E2E inf s" in out and "TTS    nan s" in out
    assert main(["runs", "show", "odd-far", "--store-url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["e2e_s"] == "inf"


def test_utc_text_never_raises() -> None:
    from airflow_ett.cli.common import utc_text

    assert utc_text(1795856400.0) == "2026-11-28 09:00:00"
    for odd in (1.7e15, float("nan"), float("inf"), -1e20, "noon", 10**400):
        assert utc_text(odd) in (str(odd), repr(odd))
    assert utc_text(None) == "-"


# --- imports: `compute` loads neither SQLAlchemy nor Airflow (issue 9) ----------------------

_COMPUTE_IMPORTS = """
import contextlib, io, json, sys
from airflow_ett.cli import main
codes = []
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    codes.append(main(["compute", sys.argv[1], "--json"]))
    codes.append(main(["compute", sys.argv[1] + ".missing"]))  # the error path too
heavy = ("sqlalchemy", "alembic", "airflow", "torch")
print(json.dumps({"codes": codes, "loaded": sorted(
    m for m in sys.modules if m.split(".")[0] in heavy)[:5]}))
"""


@pytest.mark.integration
def test_compute_imports_neither_sqlalchemy_nor_airflow(tmp_path: Path) -> None:
    # A fresh interpreter: in this one, other tests have imported the store long ago.
    import sys

    done = subprocess.run([sys.executable, "-c", _COMPUTE_IMPORTS, str(EXAMPLE)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["codes"] == [0, 1]
    assert result["loaded"] == [], f"`airflow-ett compute` imported {result['loaded']}"


# --- output through rich, plain off a terminal (issue 9) -----------------------------------


def test_compute_output_is_plain_text_when_not_a_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["compute", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.isascii()
    lines = out.splitlines()
    assert all(line == line.rstrip() for line in lines)
    # The tables' plain form, as the README quotes it.
    assert "  component               time  share" in lines
    assert "  effective_training  25.0 min  55.1%" in lines
    assert "  total               45.4 min" in lines
    assert "  phase                   time  share  component" in lines
    assert "  effective_steps     25.0 min  55.1%  effective_training" in lines


def test_compute_on_a_terminal_draws_rich_tables(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich's own switch: stdout counts as a terminal
    monkeypatch.setenv("TERM", "xterm-256color")
    assert main(["compute", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" in out and "╭" in out
    assert "ETT% 55.08" in out and "NoF    2" in out


def test_compute_of_several_jobs_separates_them_by_one_blank_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    log = write_events(tmp_path / "two.jsonl", [*simulate(JobSpec(job="a")),
                                                *simulate(JobSpec(job="b"))])
    assert main(["compute", str(log)]) == 0
    out = capsys.readouterr().out
    first, second = out.split("\n\njob b ")
    assert first.startswith("job a ") and "\n\n\n" not in out
    assert second.splitlines()[-1].startswith("  ")  # ends in its Level 3 table
