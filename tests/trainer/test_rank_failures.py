"""The root cause of a multi-rank attempt: the pure rule, the records it reads, and the
class the launcher gives the attempt from it (no processes here: tests/trainer/
test_multirank.py runs torchrun)."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.protocol.exits import ExitRecord
from airflow_ett.trainer.launcher import classify_ranks, exit_records
from airflow_ett.trainer.rank_failures import (
    ExitRecordError,
    RankOutcome,
    parse_exit_record,
    root_cause,
    tier,
)
from tests.hostile import in_thread

T = 1_800_000_000.0


def ok(rank: int) -> RankOutcome:
    return RankOutcome(rank, 0, None, None)


def raised(rank: int, at: float, sigterm: float | None = None) -> RankOutcome:
    return RankOutcome(rank, 1, at, sigterm, "RuntimeError: x", "application")


def silent(rank: int, sigterm: float | None = None) -> RankOutcome:
    return RankOutcome(rank, None, None, sigterm)


def test_a_silent_death_comes_before_the_errors_of_the_peers_it_took_down() -> None:
    # rank 1 SIGKILLed; rank 0 failed in its next collective, then got torchrun's SIGTERM
    outcomes = [raised(0, T + 0.02, sigterm=T + 0.1), silent(1)]
    assert root_cause(outcomes) == silent(1)
    cls = classify_ranks(1, outcomes)
    assert (cls.cause, cls.retryable, cls.reported_by_child) == ("infra", True, False)
    assert cls.description.startswith("rank 1: killed without a word")


def test_the_earliest_failure_is_the_cause_and_its_peers_follow() -> None:
    outcomes = [raised(0, T + 0.9), RankOutcome(1, 1, T, None, "InjectedFault: boom",
                                                "application")]
    assert root_cause(outcomes) == outcomes[1]
    cls = classify_ranks(1, outcomes)
    assert (cls.cause, cls.retryable) == ("application", True)
    # rank 0 reported this very cause itself: nothing more to report
    assert cls.reported_by_child
    assert "InjectedFault: boom" in cls.description and "1 other rank" in cls.description


def test_a_bad_config_on_any_rank_is_never_retried() -> None:
    outcomes = [raised(0, T), RankOutcome(1, 78, T + 5, None)]
    cls = classify_ranks(1, outcomes)
    assert (cls.cause, cls.retryable) == ("application", False)


def test_ranks_that_left_on_sigterm_are_a_preemption_whatever_their_exit_code() -> None:
    outcomes = [RankOutcome(0, 75, T + 3, T + 1, None, "preemption"),
                RankOutcome(1, 1, T + 2, T + 1, "RuntimeError: peer gone", "application")]
    cls = classify_ranks(1, outcomes)
    assert (cls.cause, cls.retryable) == ("preemption", True)
    assert cls.reported_by_child  # rank 0 said preemption itself


def test_no_record_or_no_failed_rank_leaves_torchrun_s_exit_code_to_say_it() -> None:
    assert classify_ranks(1, []).description == "the training code raised"
    assert classify_ranks(0, [ok(0), ok(1)]).status == "success"


def test_a_hang_on_one_rank_is_infra() -> None:
    outcomes = [RankOutcome(1, 70, T, None, "hung after step 3", "infra"), silent(0, T + 1)]
    assert classify_ranks(1, outcomes).cause == "infra"
    assert tier(silent(0, T + 1)) == "terminated"  # SIGTERMed while it waited: not silent


# -- properties ------------------------------------------------------------------------

times = st.floats(min_value=T, max_value=T + 100, allow_nan=False)
codes = st.sampled_from([None, 0, 1, 70, 75, 78, -signal.SIGTERM])


@st.composite
def outcome_lists(draw: st.DrawFn) -> list[RankOutcome]:
    n = draw(st.integers(1, 6))
    out = []
    for rank in range(n):
        code = draw(codes)
        failed_at = None if code in (None, 0) else draw(times)
        sigterm = draw(st.none() | times)
        out.append(RankOutcome(rank, code, failed_at, sigterm))
    return out


@given(outcome_lists(), st.randoms())
def test_the_verdict_does_not_depend_on_the_order_records_are_read(
        outcomes: list[RankOutcome], rnd: object) -> None:
    shuffled = list(outcomes)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert root_cause(shuffled) == root_cause(outcomes)
    assert classify_ranks(1, shuffled) == classify_ranks(1, outcomes)


@given(outcome_lists(), st.lists(st.tuples(st.sampled_from([1, 75, None, -15]),
                                           st.floats(0, 50)), max_size=4))
def test_a_consequence_sigterm_after_the_first_failure_never_becomes_the_cause(
        outcomes: list[RankOutcome], consequences: list[tuple[int | None, float]]) -> None:
    first = root_cause(outcomes)
    if first is None or tier(first) == "terminated":
        return  # no failure of its own to follow
    added = [RankOutcome(100 + i, code,
                         None if code is None else T + 200 + delay, T + 150 + delay)
             for i, (code, delay) in enumerate(consequences)]
    assert root_cause([*outcomes, *added]) == first


@given(outcome_lists())
def test_a_bad_config_anywhere_means_no_retry(outcomes: list[RankOutcome]) -> None:
    cls = classify_ranks(1, outcomes)
    if any(tier(o) == "bad_config" for o in outcomes):
        assert not cls.retryable
    if root_cause(outcomes) is not None:
        assert cls.status == "failed" and cls.cause is not None


# -- the records -----------------------------------------------------------------------

def record(**changes: object) -> dict[str, object]:
    return {"v": 1, "state": "exited", "rank": 1, "exit_code": 1, "failed_at": T,
            "sigterm_at": None, "error": "E: x", **changes}


def test_a_record_is_read_field_by_field() -> None:
    got = parse_exit_record(record(), rank=1)
    assert got == RankOutcome(1, 1, T, None, "E: x", None)
    # still `running`: its exit never ran, whatever else the record says
    assert parse_exit_record(record(state="running"), rank=1).exit_code is None


@pytest.mark.parametrize(("changes", "message"), [
    ({"v": 2}, "v = 2"),
    ({"state": "done"}, "state = 'done'"),
    ({"rank": 0}, "rank = 0: its file is rank 1's"),
    ({"rank": -1}, "rank = -1"),
    ({"rank": True}, "rank = True"),
    ({"exit_code": "1"}, "exit_code = '1'"),
    ({"failed_at": float("nan")}, "failed_at = nan"),
    ({"sigterm_at": "soon"}, "sigterm_at = 'soon'"),
    ({"error": 3}, "error = 3"),
])
def test_a_bad_record_names_the_field_and_value(changes: dict[str, object],
                                                 message: str) -> None:
    with pytest.raises(ExitRecordError, match=message.replace("(", r"\(")):
        parse_exit_record(record(**changes), rank=1)


def test_unreadable_records_are_warned_about_and_read_as_silent(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "rank0.json").write_text(json.dumps(record(rank=0, exit_code=0)))
    (tmp_path / "rank1.json").write_text("{not json")
    (tmp_path / "rank2.json").write_text(json.dumps([1, 2]))
    os.mkfifo(tmp_path / "rank4.json")  # a plain open would block the launcher
    (tmp_path / "rank5.json").symlink_to("/dev/zero")
    (tmp_path / "rank6.json").write_text("[" * 5000 + "]" * 5000)
    with caplog.at_level(logging.WARNING, logger="airflow_ett.trainer"):
        got = in_thread(lambda: exit_records(tmp_path, 7))
    # 3: no file at all; 4-6 cannot be used
    assert [o.exit_code for o in got] == [0, None, None, None, None, None, None]
    assert "rank1.json: not valid JSON" in caplog.text
    assert "rank4.json: not a regular file (a FIFO): rank 4 counts as silent" in caplog.text
    assert "rank5.json: not a regular file (a character device)" in caplog.text
    assert "rank6.json: nested deeper than" in caplog.text
    assert "rank2.json ignored (exit record: must be a JSON object" in caplog.text
    assert exit_records(tmp_path / "none", 2) == []  # no record at all: []


def test_the_trainer_side_writes_what_the_launcher_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    rec = ExitRecord()
    rec.start(str(tmp_path))
    assert exit_records(tmp_path, 4)[3] == RankOutcome(3)  # running: silent so far
    rec.sigterm(T)
    rec.failed(T + 1, "RuntimeError: peer gone")
    rec.reported("application")
    rec.exit(1)
    rec.exit(0)  # the first exit stands
    got = exit_records(tmp_path, 4)[3]
    assert got == RankOutcome(3, 1, T + 1, T, "RuntimeError: peer gone", "application",
                              reported=True)
    assert tier(got) == "terminated"
    assert not list(tmp_path.glob(".*tmp"))  # written by rename: no leftovers


def test_a_sigterm_before_the_trainer_loop_still_kills_but_is_on_record(
        tmp_path: Path) -> None:
    """torchrun SIGTERMs the ranks still starting when a peer fails: such a rank dies of
    it as before, and its record says it was terminated, not silently killed."""
    import subprocess
    import sys

    code = ("import os, signal, time\n"
            "from airflow_ett.protocol.exits import die_on_sigterm_recorded, exit_record\n"
            "exit_record.start()\n"
            "die_on_sigterm_recorded()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", code], timeout=60, check=False,
                          env={"ETT_EXIT_DIR": str(tmp_path), "RANK": "1",
                               "PATH": "/usr/bin:/bin"}, cwd=Path(__file__).parents[2],
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGTERM, done.stderr
    (got,) = [o for o in exit_records(tmp_path, 2) if o.rank == 1]
    assert got.exit_code == -signal.SIGTERM and got.sigterm_at is not None
    assert tier(got) == "terminated"
