"""Every error of every command is one line on stderr with README's exit status (1: the
input or the world said no; 2: a usage error), never a traceback.

The class test runs the real entry point, `main(argv)`, in-process over the commands
crossed with hostile and edge arguments (a table, then hypothesis's combinations of
them) on a real SQLite store; the named members (`report --out` where no directory can
be, dates at and past the ends of time) are tested one by one too. `embedded`, `tenants
sync` and `preemption run` without `--once` are left out: they start or write a real
Airflow (tests/cli/test_tenants_cli.py, tests/embedded).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.cli import main
from airflow_ett.ett.events import event_to_json
from airflow_ett.ett.synthetic import JobSpec, simulate
from airflow_ett.store import EttStore, upgrade
from tests.rollup.scenarios import LO

DAY = "2026-11-28"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A store with one job, rolled up; a file, a directory, a tenants file, an events
    file; the settings pointed into the same place (report_dir, spool_dir), which is the
    working directory too (`--out ''` or `--out -` write reports there)."""
    root = tmp_path_factory.mktemp("world")
    cwd = os.getcwd()
    os.chdir(root)
    url = f"sqlite:///{root / 'ett.db'}"
    upgrade(url)
    events = simulate(JobSpec(job="j1", tenant="t1", submit_ts=LO + 3600))
    with EttStore(url) as store:
        store.insert_events(events)
    log = root / "events.jsonl"
    log.write_text("".join(event_to_json(e) + "\n" for e in events))
    tenants = root / "tenants.toml"
    tenants.write_text("[tenants.t1]\npriority = 1\nquota_gpus = 8\n")
    (root / "afile").write_text("x")
    env = {"AIRFLOW__ETT__REPORT_DIR": str(root / "reports"),
           "AIRFLOW__ETT__SPOOL_DIR": str(root / "spool"), "AIRFLOW__ETT__STORE_URL": url}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        assert run_cli(["rollup", "--date", DAY])[0] == 0
        yield {"url": url, "root": str(root), "log": str(log), "tenants": str(tenants),
               "file": str(root / "afile")}
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`main(argv)` with stdout and stderr caught; an exception other than SystemExit
    (argparse's usage errors) is what the class forbids, and is raised as it is."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def assert_one_error_line(code: int, err: str, argv: list[str]) -> None:
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    lines = err.splitlines()
    if code == 1:  # warnings may come before it (skipped lines of a file); one error, last
        errors = [line for line in lines if line.startswith("airflow-ett: error: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], (argv, err)
    elif code == 2:  # argparse: its usage, then one error line naming the argument
        assert lines[-1].startswith("airflow-ett") and ": error: " in lines[-1], (argv, err)
        assert sum(": error: " in line for line in lines) == 1, (argv, err)


def fill(argv: list[str], world: dict[str, str]) -> list[str]:
    return [a.format(**world) for a in argv]


# --- the named members ---------------------------------------------------------------------

@pytest.mark.parametrize(("out", "why"), [
    ("{file}", "{file} is not a directory"),
    ("{file}/sub/dir", "{file} is not a directory"),
    ("/dev/null", "/dev/null is not a directory"),
    ("/proc/self/ett-report", "no such file or directory"),  # procfs makes no directory
])
@pytest.mark.parametrize("fmt", ["text", "json", "csv", "html"])
def test_report_out_where_no_directory_can_be_is_one_line(
        world: dict[str, str], out: str, why: str, fmt: str) -> None:
    out, why = out.format(**world), why.format(**world)
    code, stdout, err = run_cli(["report", "--date", DAY, "--format", fmt, "--out", out])
    assert (code, stdout) == (1, "")
    assert err == (f"airflow-ett: error: --out {out}: the report cannot be written there: "
                   f"{why}\n")


def test_report_out_in_a_read_only_directory_is_one_line(world: dict[str, str],
                                                         tmp_path: Path) -> None:
    """Tests run as root here, for whom a mode of 0o555 means nothing: the directory is
    made read-only by a read-only bind mount in a mount namespace of the command's own
    (`unshare`), and the console script runs there. As another user, mode 0o555 does."""
    target = tmp_path / "ro"
    target.mkdir()
    argv = [sys.executable, "-m", "airflow_ett.cli", "report", "--date", DAY,
            "--format", "text", "--out", str(target / "day")]
    if os.geteuid() != 0:
        target.chmod(0o555)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        why = "permission denied"
    else:
        unshare = shutil.which("unshare")
        assert unshare is not None, "util-linux's unshare is needed to make a read-only bind"
        script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift '
                  '&& exec "$@"')
        done = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c",
                               script, "sh", str(target), *argv],
                              capture_output=True, text=True, timeout=120, check=False)
        why = "read-only file system"
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr == (f"airflow-ett: error: --out {target / 'day'}: the report cannot "
                           f"be written there: {why}\n")
    assert not (target / "day").exists()


@pytest.mark.parametrize("command", [
    ["rollup", "--date", "{day}"], ["report", "--date", "{day}"],
    ["rollup", "--from", "2026-11-27", "--to", "{day}"], ["report", "--from", "{day}",
                                                          "--to", "2026-11-28"],
    ["fleet", "simulate", "--start", "{day}", "--days", "1", "--jobs-per-day", "1"],
    ["simulate-preemption", "--from", "{day}", "--to", "2026-11-28"],
])
@pytest.mark.parametrize("day", ["9999-12-31", "0001-01-01", "1999-12-31", "2100-01-01"])
def test_a_day_no_event_can_fall_in_is_a_usage_error(world: dict[str, str], command: list[str],
                                                     day: str) -> None:
    argv = [a.format(day=day) for a in command]
    code, out, err = run_cli(argv)
    assert code == 2 and out == ""
    option = argv[argv.index(day) - 1]
    assert err.splitlines()[-1].endswith(
        f"error: argument {option}: {day} is not a day events can fall in (2000-01-01 to "
        "2099-12-31)"), err


@pytest.mark.parametrize(("day", "tz"), [
    ("2099-12-31", "Etc/GMT+12"),  # the day ends 2100-01-01 12:00 UTC
    ("2000-01-01", "Pacific/Kiritimati"),  # UTC+14: it starts in 1999
    ("2099-12-31", "UTC"), ("2000-01-01", "America/St_Johns"),
])
def test_the_first_and_last_days_roll_up_and_report_in_any_time_zone(
        world: dict[str, str], day: str, tz: str) -> None:
    for command in (["rollup", "--date", day, "--tz", tz], ["report", "--date", day,
                                                            "--tz", tz]):
        code, out, err = run_cli(command)
        assert code == 0 and err.strip() in ("", "rollup days: 1/1"), (command, err)
        assert f"{day} ({tz})" in out


# --- the class: every command, hostile and edge arguments ----------------------------------

NASTY = ["", " ", "-", "--", "\x1b[2J", "\u202e", "\udcff", "x" * 5000, "%s%n", "'", "../..",
         "/dev/null", "/proc/self/mem", "{file}", "{root}", "{file}/x"]
NUMBERS = ["0", "-1", "1e308", "-1e308", "nan", "inf", "9" * 40, "1.5", "2147483648", "x"]
TIMES = ["0", "1e308", "9999-12-31T23:59:59+23:59", "0001-01-01T00:00:00-23:59", "nan",
         "2026-02-30", "2026-11-28T25:00"]
DATES = ["9999-12-31", "0001-01-01", "2026-02-29", "2026-13-01", "26-11-28", "2000-01-01",
         "2099-12-31", DAY]
TZS = ["UTC", "Etc/GMT+12", "Etc/GMT-14", "Mars/Olympus", "", "../../etc/passwd",
       "/etc/localtime", "\x1b", "\udcff", "posixrules", "EST5EDT"]
URLS = ["{url}", "sqlite:///{file}/x.db", "bogus://", "", "sqlite:///{root}",
        "sqlite:///{file}", "sqlite:///\udcff", "mysql://x/y", "postgresql://u:p@127.0.0.1:1/x",
        "sqlite://", "sqlite:///:memory:", "postgres://a@b@c/d"]

# Each command with the kinds of value its options take: (argv prefix, {option: pool}).
GRAMMAR: list[tuple[list[str], dict[str, list[str]]]] = [
    (["compute", "{log}"], {"--job": NASTY, "--now": TIMES}),
    (["compute"], {"": NASTY}),
    (["ingest"], {"": NASTY, "--store-url": URLS}),
    (["db", "upgrade"], {"--store-url": URLS}),
    (["runs", "list"], {"--since": TIMES, "--until": TIMES, "--tenant": NASTY,
                        "--model": NASTY, "--dag-id": NASTY, "--limit": NUMBERS,
                        "--store-url": URLS}),
    (["runs", "show"], {"": NASTY, "--now": TIMES, "--store-url": URLS}),
    (["rollup"], {"--date": DATES, "--tz": TZS, "--store-url": URLS}),
    (["rollup", "--from", "2026-11-27"], {"--to": DATES}),
    (["report"], {"--date": DATES, "--tz": TZS, "--tenant": NASTY, "--out": NASTY,
                  "--format": ["text", "json", "csv", "html", "xml"], "--store-url": URLS}),
    (["report", "--compare", DAY], {"": [*DATES, *NASTY, f"{DAY}..2026-11-27", "..",
                                         f"{DAY}..{DAY}..{DAY}", f"..{DAY}"],
                                    "--format": ["text", "json", "csv", "html"]}),
    (["spool", "replay"], {"--spool-dir": NASTY, "--store-url": URLS}),
    (["fleet", "simulate", "--jobs-per-day", "1", "--days", "1"],
     {"--start": DATES, "--tz": TZS, "--seed": NUMBERS, "--store-url": URLS}),
    (["tenants", "check", "--no-store"], {"": [*NASTY, "{tenants}"], "--days": NUMBERS}),
    (["tenants", "check", "{tenants}"], {"--store-url": URLS, "--days": NUMBERS}),
    (["tenants", "sync", "--dry-run"], {"": ["{file}", "/nonexistent", "{root}"]}),
    (["simulate-preemption", "--from", DAY, "--to", DAY],
     {"--tenants": [*NASTY, "{tenants}"], "--capacity": NUMBERS, "--high-priority": NUMBERS,
      "--store-url": URLS}),
    (["preemption", "run", "--once"], {"--store-url": URLS}),
]

TABLE = [([*prefix, *([option] if option else []), value])
         for prefix, options in GRAMMAR for option, pool in options.items() for value in pool]


def run_and_check(argv: list[str], world: dict[str, str]) -> None:
    filled = [a.format(**world) if a.count("{") == 1 else a for a in argv]
    code, _, err = run_cli(filled)
    assert_one_error_line(code, err, filled)


@pytest.mark.parametrize("argv", TABLE, ids=[ascii(" ".join(a))[:80] for a in TABLE])
def test_every_command_with_each_edge_argument(world: dict[str, str], argv: list[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__ETT__TENANTS_FILE", raising=False)
    run_and_check(argv, world)


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    prefix, options = draw(st.sampled_from(GRAMMAR))
    chosen = draw(st.lists(st.sampled_from(sorted(options)), unique=True, min_size=1))
    argv = list(prefix)
    for option in chosen:
        argv += [*([option] if option else []), draw(st.sampled_from(options[option]))]
    return argv


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=command_lines())
def test_any_combination_of_them(world: dict[str, str], argv: list[str]) -> None:
    run_and_check(argv, world)


def test_a_harness_error_keeps_its_log_tail_under_the_one_error_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded harness's errors carry the log lines of what failed (a DAG's import
    error): they follow the error line, indented and escaped (a log's colours included).
    The harness itself is stood in for: starting a real Airflow to fail an import is
    tests/embedded/test_embedded.py's (test_import_error_is_reported_with_its_text)."""
    import airflow_ett.cli.embedded as embedded_cli
    from airflow_ett.embedded import DagImportError

    def refuse(*_: object, **__: object) -> None:
        raise DagImportError("DAG 'x' is not loaded; import errors:\nTraceback (most recent "
                             "call last):\n\x1b[31mNameError: boom\x1b[0m")

    monkeypatch.setattr(embedded_cli, "_embedded", refuse)
    code, _, err = run_cli(["embedded", "run", "x", "--dags-folder", str(tmp_path)])
    assert code == 1
    assert err.splitlines() == [
        "airflow-ett: error: DAG 'x' is not loaded; import errors:",
        "  Traceback (most recent call last):",
        "  \\x1b[31mNameError: boom\\x1b[0m"]
