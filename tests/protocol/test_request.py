"""The preemption request file (`airflow_ett.protocol.request`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from airflow_ett.protocol import request as request_module
from airflow_ett.protocol.request import (
    CLAIMED_FILE,
    LEAVE_BY_MARGIN_S,
    REQUEST_FILE,
    PreemptRequest,
    RequestError,
    archive_claimed,
    archive_request,
    claim_request,
    is_claimed,
    leave_by_for,
    parse_request,
    read_claimed,
    read_request,
    resume_after_s,
    take_claimed,
    withdraw_request,
    write_request,
)
from tests.hostile import HOSTILE_JSON, in_thread

GOOD = PreemptRequest(victim="batch__r1", for_job="ads__r9", reason="preempted batch__r1: ...",
                      requested_at=1_800_000_000.0, grace_s=60.0, resume_after_s=5.0)


def test_a_request_round_trips_and_is_archived_once(tmp_path: Path) -> None:
    assert read_request(tmp_path) is None
    assert write_request(tmp_path, GOOD) == tmp_path / REQUEST_FILE
    assert read_request(tmp_path) == GOOD
    first = archive_request(tmp_path, now=1_800_000_000.0)
    assert first is not None and first.name == "preempt_request.20270115T080000.done.json"
    assert read_request(tmp_path) is None and archive_request(tmp_path) is None
    write_request(tmp_path, GOOD)
    second = archive_request(tmp_path, now=1_800_000_000.0)  # same second: another name
    assert second is not None and second != first and json.loads(second.read_text()) == (
        json.loads(GOOD.to_json()))


def test_a_now_request_leaves_by_its_request_time() -> None:
    assert GOOD.mode == "now" and GOOD.leave_by == GOOD.requested_at
    assert json.loads(GOOD.to_json())["version"] == 2


def test_an_at_checkpoint_request_round_trips(tmp_path: Path) -> None:
    at = 1_800_000_000.0
    request = PreemptRequest(victim="b", for_job="a", reason="r", requested_at=at,
                             grace_s=60.0, mode="at_checkpoint", leave_by=at + 200)
    write_request(tmp_path, request)
    assert read_request(tmp_path) == request
    assert json.loads((tmp_path / REQUEST_FILE).read_text())["mode"] == "at_checkpoint"


def test_a_version_1_file_is_still_read_as_a_now_request() -> None:
    v1 = {"victim": "b", "for_job": "a", "reason": "r", "requested_at": 1_800_000_000.0,
          "grace_s": 60.0, "resume_after_s": 5.0, "version": 1}
    got = parse_request(json.dumps(v1))
    assert (got.mode, got.leave_by, got.grace_s, got.version) == ("now", 1_800_000_000.0,
                                                                   60.0, 2)
    with pytest.raises(RequestError, match=r"unknown field\(s\) \['mode'\] in a version 1"):
        parse_request(json.dumps({**v1, "mode": "now"}))


def test_leave_by_is_the_expected_checkpoint_plus_a_margin() -> None:
    assert leave_by_for("now", 100.0, 50.0) == 100.0
    assert leave_by_for("at_checkpoint", 100.0, 50.0) == 150.0 + LEAVE_BY_MARGIN_S
    # the decision priced the whole wait: no fixed bound cuts it
    assert leave_by_for("at_checkpoint", 100.0, 5000.0) == 5100.0 + LEAVE_BY_MARGIN_S
    assert leave_by_for("at_checkpoint", 100.0, -3.0) == 100.0 + LEAVE_BY_MARGIN_S


def test_a_withdrawn_request_is_set_aside_and_kept(tmp_path: Path) -> None:
    assert withdraw_request(tmp_path) is None
    write_request(tmp_path, GOOD)
    aside = withdraw_request(tmp_path, now=1_800_000_000.0)
    assert aside is not None and aside.name == "preempt_request.20270115T080000.withdrawn.json"
    assert read_request(tmp_path) is None and parse_request(aside.read_text()) == GOOD
    assert withdraw_request(tmp_path) is None and archive_request(tmp_path) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"version": 3}, r"version: 3 is not one of \[1, 2\]"),
    ({"version": True}, r"version: True is not one of"),
    ({"mode": "later"}, r"mode: 'later' is not one of \['now', 'at_checkpoint'\]"),
    ({"victim": ""}, "victim: '' is not a non-empty text"),
    ({"reason": 7}, "reason: 7 is not a non-empty text"),
    ({"extra": 1}, r"unknown field\(s\) \['extra'\]"),
    ({"skip_save": "yes"}, r"skip_save: 'yes' is not true or false"),
    ({"skip_save": 1}, r"skip_save: 1 is not true or false"),
    ({"skip_save": True, "mode": "at_checkpoint"},
     r"skip_save: True in a 'at_checkpoint' request \(only a 'now' request"),
])
def test_a_bad_request_names_its_field(change: dict[str, object], message: str) -> None:
    raw = {**json.loads(GOOD.to_json()), **change}
    with pytest.raises(RequestError, match=message):
        parse_request(json.dumps(raw))


TIME = r"a Unix time in seconds in \[946684800, 4102444800\)"
BAD_NUMBERS = [
    ({"requested_at": float("nan")}, f"requested_at: nan is not {TIME}"),
    ({"requested_at": 1e300}, f"requested_at: 1e\\+300 is not {TIME}"),
    ({"requested_at": 1e300, "leave_by": 1e300}, f"requested_at: 1e\\+300 is not {TIME}"),
    ({"requested_at": 100.0, "leave_by": 100.0}, f"requested_at: 100.0 is not {TIME}"),
    ({"requested_at": 4102444800}, f"requested_at: 4102444800 is not {TIME}"),
    ({"requested_at": "1800000000"}, f"requested_at: '1800000000' is not {TIME}"),
    ({"requested_at": True}, f"requested_at: True is not {TIME}"),
    ({"leave_by": None}, f"leave_by: None is not {TIME}"),
    ({"leave_by": float("inf")}, f"leave_by: inf is not {TIME}"),
    ({"leave_by": 1e300}, f"leave_by: 1e\\+300 is not {TIME}"),
    ({"leave_by": 1_700_000_000.0}, r"leave_by: 1700000000.0 is before requested_at "
                                    r"1800000000.0"),
    ({"mode": "at_checkpoint", "leave_by": 1_800_000_000.0 + 86460.5},
     r"leave_by: 1800086460.5 is more than 86460 s after requested_at 1800000000.0 in an "
     r"'at_checkpoint' request"),
    ({"grace_s": -1}, r"grace_s: -1 is not a number of seconds in \[0, 86400\]"),
    ({"grace_s": True}, r"grace_s: True is not a number of seconds in \[0, 86400\]"),
    ({"grace_s": 1e308}, r"grace_s: 1e\+308 is not a number of seconds in \[0, 86400\]"),
    ({"grace_s": float("nan")}, r"grace_s: nan is not a number of seconds in \[0, 86400\]"),
    ({"resume_after_s": 1e12},
     r"resume_after_s: 1000000000000.0 is not a number of seconds in \[0, 86400\]"),
    ({"resume_after_s": -0.5},
     r"resume_after_s: -0.5 is not a number of seconds in \[0, 86400\]"),
    ({"resume_after_s": None},
     r"resume_after_s: None is not a number of seconds in \[0, 86400\]"),
]


@pytest.mark.parametrize(("change", "message"), BAD_NUMBERS)
def test_a_number_out_of_its_range_is_refused_naming_field_and_value(
        change: dict[str, object], message: str) -> None:
    raw = {**json.loads(GOOD.to_json()), **change}
    with pytest.raises(RequestError, match=f"^{message}$"):
        parse_request(json.dumps(raw))


def test_an_escalated_request_is_read_however_late_it_was_escalated() -> None:
    """The controller rewrites an overdue `at_checkpoint` request as `now` with `leave_by`
    then (snapshot.review_requests): days later if it was down meanwhile."""
    late = PreemptRequest(victim="b", for_job="a", reason="r", requested_at=1.8e9,
                          grace_s=86_400.0, mode="now", leave_by=1.8e9 + 5 * 86_400.0)
    assert parse_request(late.to_json()) == late


@settings(max_examples=200, deadline=None)
@given(at=st.floats(946_684_800.0, 4_102_444_800.0, exclude_max=True),
       wait=st.floats(0, 86_460.0), grace=st.floats(0, 86_400.0),
       resume=st.floats(0, 86_400.0))
def test_any_request_whose_numbers_are_in_range_is_read_back(
        at: float, wait: float, grace: float, resume: float) -> None:
    leave_by = at + wait
    assume(leave_by < 4_102_444_800.0 and leave_by - at <= 86_460.0)
    request = PreemptRequest(victim="b", for_job="a", reason="r", requested_at=at,
                             grace_s=grace, resume_after_s=resume, mode="at_checkpoint",
                             leave_by=leave_by)
    assert parse_request(request.to_json()) == request


def test_a_broken_file_is_ignored_not_fatal(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / REQUEST_FILE).write_text("{half", encoding="utf-8")
    assert read_request(tmp_path) is None
    assert "ignored: not valid JSON" in caplog.text
    (tmp_path / REQUEST_FILE).write_text("[1]", encoding="utf-8")
    assert read_request(tmp_path) is None
    with pytest.raises(RequestError, match="not a JSON object: list"):
        parse_request("[1]")


@pytest.mark.parametrize("reader", ["read_request", "read_claimed", "claim_request"])
@pytest.mark.parametrize(("kind", "make"), HOSTILE_JSON)
def test_a_hostile_request_is_ignored_at_once_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        reader: str, kind: str, make: Any) -> None:
    """What the trainer reads at every periodic save and the task every second: a FIFO or
    /dev/zero (which hung them), 200 MB (read and logged whole every second), not UTF-8 or
    5,000 levels deep (which crashed the trainer at every save and every retry). Each is
    no request, at once, and one short warning however often it is looked at."""
    monkeypatch.setattr(request_module, "_warned", {})
    make(tmp_path / (CLAIMED_FILE if reader == "read_claimed" else REQUEST_FILE))
    read = {"read_request": read_request, "read_claimed": read_claimed,
            "claim_request": lambda d: claim_request(d, since=0.0)}[reader]
    for _ in range(3):
        assert in_thread(lambda: read(tmp_path)) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and len(warnings[0]) < 400, warnings


def test_a_long_value_is_quoted_short(tmp_path: Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    """A request just under the size cap whose text is one long field: the error quotes
    the start of the value, not the value."""
    body = json.loads(GOOD.to_json()) | {"reason": "x" * 60_000}
    (tmp_path / REQUEST_FILE).write_text(json.dumps(body), encoding="utf-8")
    assert read_request(tmp_path) is None
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "reason: 'xxxx" in line and "(60,002 characters)" in line and len(line) < 400


def test_skip_save_round_trips_and_a_version_2_file_without_it_saves(tmp_path: Path) -> None:
    unsaved = PreemptRequest(victim="b", for_job="a", reason="r", requested_at=1.8e9,
                             grace_s=10.0, skip_save=True)
    write_request(tmp_path, unsaved)
    assert read_request(tmp_path) == unsaved
    assert json.loads((tmp_path / REQUEST_FILE).read_text())["skip_save"] is True
    raw = json.loads(GOOD.to_json())
    del raw["skip_save"]
    assert parse_request(json.dumps(raw)).skip_save is False
    v1 = {**raw, "version": 1}
    del v1["mode"], v1["leave_by"]
    assert parse_request(json.dumps(v1)).skip_save is False
    with pytest.raises(RequestError, match=r"unknown field\(s\) \['skip_save'\] in a version 1"):
        parse_request(json.dumps({**v1, "skip_save": False}))


AT = PreemptRequest(victim="b", for_job="a", reason="r", requested_at=1_800_000_000.0,
                    grace_s=60.0, mode="at_checkpoint", leave_by=1_800_000_100.0)


def test_the_trainer_claims_an_at_checkpoint_request_and_the_task_takes_it_once(
        tmp_path: Path) -> None:
    assert claim_request(tmp_path, since=0.0) is None  # none pending
    write_request(tmp_path, AT)
    assert claim_request(tmp_path, since=AT.requested_at + 1) is None  # not this attempt's
    assert read_request(tmp_path) == AT  # left where it was
    assert claim_request(tmp_path, since=AT.requested_at) == AT
    assert read_request(tmp_path) is None and read_claimed(tmp_path) == AT
    assert (tmp_path / CLAIMED_FILE).exists() and is_claimed(tmp_path, AT)
    other = PreemptRequest(victim="b", for_job="a", reason="r", requested_at=AT.requested_at + 5,
                           grace_s=60.0, mode="at_checkpoint", leave_by=AT.leave_by)
    assert not is_claimed(tmp_path, other) and take_claimed(tmp_path, other) is None
    done = take_claimed(tmp_path, AT, now=1_800_000_000.0)
    assert done is not None and done.name == "preempt_request.20270115T080000.done.json"
    assert parse_request(done.read_text()) == AT and read_claimed(tmp_path) is None
    assert take_claimed(tmp_path, AT) is None and archive_claimed(tmp_path) is None


def test_a_now_request_is_never_claimed(tmp_path: Path) -> None:
    write_request(tmp_path, GOOD)
    assert claim_request(tmp_path, since=0.0) is None
    assert read_request(tmp_path) == GOOD and read_claimed(tmp_path) is None


def test_claim_and_withdrawal_race_one_rename_wins(tmp_path: Path) -> None:
    """The race, made deterministic: whichever rename comes first wins, the other finds
    nothing. Claimed first: the withdrawal is None and the claimed request stands (the
    task's watcher sees it claimed, the controller keeps the victim yielding)."""
    write_request(tmp_path, AT)
    assert claim_request(tmp_path, since=0.0) == AT
    assert withdraw_request(tmp_path) is None
    assert is_claimed(tmp_path, AT) and not list(tmp_path.glob("*.withdrawn.json"))
    # withdrawn first: the trainer finds none and goes on
    (tmp_path / CLAIMED_FILE).unlink()
    write_request(tmp_path, AT)
    assert withdraw_request(tmp_path) is not None
    assert claim_request(tmp_path, since=0.0) is None and not is_claimed(tmp_path, AT)


def test_a_withdrawal_between_the_claims_read_and_rename_leaves_nothing_claimed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's rename lands after the trainer read the request but before its
    own rename: the trainer's rename fails, and it leaves on nothing."""
    import airflow_ett.protocol.request as module

    write_request(tmp_path, AT)
    real = module._parsed

    def withdrawn_right_after_the_read(path: Path, text: str, what: str
                                       ) -> PreemptRequest | None:
        got = real(path, text, what)
        withdraw_request(tmp_path)
        return got

    monkeypatch.setattr(module, "_parsed", withdrawn_right_after_the_read)
    assert claim_request(tmp_path, since=0.0) is None
    assert read_claimed(tmp_path) is None
    assert len(list(tmp_path.glob("*.withdrawn.json"))) == 1


def test_a_request_replaced_before_the_claim_is_put_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Withdrawn and a new request written between the trainer's read and its rename: the
    trainer took a request it did not read; it puts it back and leaves on nothing."""
    import airflow_ett.protocol.request as module

    write_request(tmp_path, AT)
    real = module._parsed
    newer = PreemptRequest(victim="b", for_job="c", reason="r2",
                           requested_at=AT.requested_at + 9, grace_s=60.0)

    def replaced_right_after_the_read(path: Path, text: str, what: str
                                      ) -> PreemptRequest | None:
        got = real(path, text, what)
        if path.name == REQUEST_FILE:
            withdraw_request(tmp_path)
            write_request(tmp_path, newer)
        return got

    monkeypatch.setattr(module, "_parsed", replaced_right_after_the_read)
    assert claim_request(tmp_path, since=0.0) is None
    monkeypatch.setattr(module, "_parsed", real)
    assert read_request(tmp_path) == newer and read_claimed(tmp_path) is None


@pytest.mark.parametrize(("asked", "resumes"), [
    (5.0, 5.0), (0.0, 0.0), (86_400.0, 86_400.0),  # the range's own values stand
    (1e12, 86_400.0), (float("inf"), 86_400.0),  # built past a day: a day
    (-3.0, 0.0), (float("nan"), 0.0),  # below it, or no number: at once
])
def test_resume_after_s_is_the_requests_own_within_its_range(asked: float,
                                                             resumes: float) -> None:
    """What the train task reschedules by: `parse_request` refuses a file outside the
    range, and a request built in code is brought into it, so the date never overflows."""
    request = PreemptRequest(victim="v", for_job="f", reason="r",
                             requested_at=1_800_000_000.0, grace_s=60.0, resume_after_s=asked)
    assert resume_after_s(request) == resumes
