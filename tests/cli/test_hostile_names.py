"""Every command that prints names, given names made to attack a terminal, prints them
escaped: through `main(argv)` on a real SQLite store, off a terminal and on one (rich's
`FORCE_COLOR`), on stdout, on stderr and in `report.txt`.

A name here holds a clear-screen and colour escape, an OSC title change, a bell, the
bidi override U+202E with a forged tail, an isolate, a mark, a newline, a carriage return,
a formula and rich markup. None of it may reach the output as a character a terminal
obeys (only rich's own colour codes, on a terminal); each shows as its escape
(`console.terminal_text`), and markup as the brackets it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_ett.cli import main
from airflow_ett.console import terminal_text
from airflow_ett.ett.events import event_to_json
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.store import EttStore, upgrade
from tests.rollup.scenarios import LO

EVIL = ("\x1b[2J\x1b[31m\x1b]0;owned\x07\u202eFORGED\u2066\u200f\r\nfleet ETT% 99.9 "
        "=cmd|' /C calc'!A0 [red]m[/red]")
JOB, TENANT, MODEL = f"job{EVIL}", f"tenant{EVIL}", f"model{EVIL}"
DAY = "2026-11-28"
# What rich itself writes on a terminal, the only escapes allowed there: colours and
# styles (SGR), and the progress bar's cursor hiding and line redraws. (A hostile name's
# clear-screen is ESC [2J, its line return a bare CR: neither is among them.)
RICH = re.compile(r"\x1b\[[0-9;]*m|\x1b\[\?25[lh]|\r\x1b\[2K|\x1b\[1A\x1b\[2K")


def unsafe_lines(text: str, *, terminal: bool) -> list[str]:
    """The lines of `text` that hold a character a terminal would obey."""
    shown = RICH.sub("", text) if terminal else text
    return [line for line in shown.split("\n") if not line.isprintable()]


@pytest.fixture(params=[False, True], ids=["plain", "terminal"])
def terminal(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    if request.param:
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("TERM", "xterm-256color")
        monkeypatch.setenv("COLUMNS", "2000")  # no wrapping: each name stays on its line
    return bool(request.param)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A store holding one job of hostile names (a failure and a retry, on DAY), rolled
    up; the paths and files the commands are pointed at, some of hostile names too."""
    monkeypatch.setenv("AIRFLOW__ETT__REPORT_DIR", str(tmp_path / "reports"))
    components = tmp_path / "components.toml"
    components.write_text('[components.scheduling]\nowner = "[red]team[/red] :smile:"\n')
    monkeypatch.setenv("AIRFLOW__ETT__COMPONENTS_FILE", str(components))
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    events = simulate(JobSpec(job=JOB, tenant=TENANT, model=MODEL, dag_id=f"dag{EVIL}",
                              run_id=f"run{EVIL}", submit_ts=LO + 3600,
                              failures=(InjectedFailure(at_step=50, cause="infra"),)))
    with EttStore(url) as store:
        store.insert_events(events)
    assert main(["rollup", "--date", DAY, "--store-url", url]) == 0
    hostile_dir = tmp_path / f"dir{EVIL.replace('/', '_')}"
    hostile_dir.mkdir()
    log = hostile_dir / "events.jsonl"
    log.write_text("".join(event_to_json(e) + "\n" for e in events) + "not json\n")
    tenants = hostile_dir / "tenants.toml"
    tenants.write_text("[tenants.other]\npriority = 1\nquota_gpus = 8\n")
    upgrade(f"sqlite:///{hostile_dir / 'sim.db'}")
    yield {"url": url, "dir": str(hostile_dir), "log": str(log), "tenants": str(tenants),
           "out": str(hostile_dir / "out")}


# (argv, the exit status, what stdout must show escaped). {url} ... are the fixture's.
COMMANDS = [
    (["runs", "list", "--store-url", "{url}"], 0, [JOB, TENANT, MODEL]),
    (["runs", "show", JOB, "--store-url", "{url}"], 0, [JOB, TENANT]),
    (["report", "--date", DAY, "--store-url", "{url}"], 0, [JOB, TENANT, "[red]team[/red]"]),
    (["report", "--date", DAY, "--tenant", TENANT, "--store-url", "{url}"], 0, [TENANT]),
    (["report", "--date", DAY, "--store-url", "{url}", "--out", "{out}"], 0, ["{out}"]),
    (["rollup", "--date", DAY, "--store-url", "{url}"], 0, []),
    (["compute", "{log}"], 0, [JOB, TENANT]),
    (["ingest", "{log}", "--store-url", "{url}"], 0, []),
    (["simulate-preemption", "--from", DAY, "--to", DAY, "--tenants", "{tenants}",
      "--store-url", "{url}"], 1, [TENANT, "{tenants}"]),
    (["tenants", "check", "{tenants}", "--no-store"], 0, ["{tenants}"]),
    (["spool", "replay", "--spool-dir", "{dir}/spool", "--store-url", "{url}"], 0,
     ["{dir}/spool"]),
    (["db", "upgrade", "--store-url", "sqlite:///{dir}/new.db"], 0, ["{dir}"]),
    (["fleet", "simulate", "--days", "1", "--jobs-per-day", "1", "--start", DAY,
      "--store-url", "sqlite:///{dir}/sim.db"], 0, ["{dir}"]),
    # errors: one line on stderr, the name in it escaped
    (["runs", "show", f"missing{EVIL}", "--store-url", "{url}"], 1, []),
    (["compute", "{dir}/missing.jsonl"], 1, []),
    (["compute", "{log}", "--job", f"other{EVIL}"], 1, []),
    (["report", "--date", DAY, "--tenant", f"nobody{EVIL}", "--store-url", "{url}"], 1, []),
    (["report", "--date", DAY, "--store-url", "{url}", "--out", "{log}"], 1, []),
    (["report", "--date", DAY, "--store-url", "sqlite:///{dir}/none.db"], 1, []),
    (["tenants", "check", "{dir}/none.toml", "--no-store"], 1, []),
]


@pytest.mark.parametrize(("argv", "code", "names"), COMMANDS,
                         ids=[" ".join(a[:2]) + f"-{i}" for i, (a, _, _) in
                              enumerate(COMMANDS)])
def test_every_command_prints_hostile_names_escaped(
        home: dict[str, str], terminal: bool, capsys: pytest.CaptureFixture[str],
        argv: list[str], code: int, names: list[str]) -> None:
    argv = [a.format(**home) if "{" in a and "[red]" not in a else a for a in argv]
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert unsafe_lines(out, terminal=terminal) == []
    assert unsafe_lines(err, terminal=terminal) == []
    shown = RICH.sub("", out)
    for name in names:
        assert terminal_text(name.format(**home) if "{" in name and "[red]" not in name
                             else name) in shown
    if code:  # one error line, the last (skipped bad lines of a file are said before it)
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1 and err.splitlines()[-1] == errors[0]
        assert "Traceback" not in err


def test_report_txt_holds_the_names_escaped(home: dict[str, str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--date", DAY, "--store-url", home["url"], "--out", home["out"],
                 "--format", "text"]) == 0
    text = (Path(home["out"]) / "report.txt").read_text()
    assert unsafe_lines(text, terminal=False) == []
    assert terminal_text(JOB) in text
    # the forged line stays inside the job's cell: no line of the report starts with it
    assert not any(line.startswith("fleet ETT% 99.9") for line in text.splitlines())


def test_csv_on_a_terminal_is_escaped_and_in_a_pipe_is_data(
        home: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["report", "--date", DAY, "--store-url", home["url"], "--format", "csv"]
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert main(argv) == 0
    assert "\x1b[2J" in capsys.readouterr().out  # the data as it is, for a program
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert main(argv) == 0
    assert unsafe_lines(capsys.readouterr().out, terminal=True) == []


def test_a_usage_error_quoting_what_was_typed_is_escaped(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["runs", "list", f"--bogus{EVIL}"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert unsafe_lines(err, terminal=False) == []
    assert terminal_text(f"--bogus{EVIL}") in err


def test_the_preemption_controller_prints_what_it_read_escaped(
        home: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`preemption run --once` with a tenants file it cannot read, named by a hostile path:
    its note quotes the path. (Airflow's logger, which writes the same error to the log
    before, is Airflow's: its lines are not this command's output.)"""
    missing = f"{home['dir']}/missing.toml"
    monkeypatch.setenv("AIRFLOW__ETT__TENANTS_FILE", missing)
    assert main(["preemption", "run", "--once", "--store-url", home["url"]]) == 0
    out = capsys.readouterr().out
    note = out[out.index("no tenant policy in force"):]
    assert unsafe_lines(note, terminal=False) == []
    assert terminal_text(missing) in note
