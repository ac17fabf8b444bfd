"""The preemption request file (`airflow_ett.scheduling.request`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ett.scheduling.request import (
    LEAVE_BY_MARGIN_S,
    REQUEST_FILE,
    PreemptRequest,
    RequestError,
    archive_request,
    leave_by_for,
    mark_left,
    parse_request,
    read_request,
    take_left_mark,
    withdraw_request,
    write_request,
)

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
    v1 = {"victim": "b", "for_job": "a", "reason": "r", "requested_at": 100.0,
          "grace_s": 60.0, "resume_after_s": 5.0, "version": 1}
    got = parse_request(json.dumps(v1))
    assert (got.mode, got.leave_by, got.grace_s, got.version) == ("now", 100.0, 60.0, 2)
    with pytest.raises(RequestError, match=r"unknown field\(s\) \['mode'\] in a version 1"):
        parse_request(json.dumps({**v1, "mode": "now"}))


def test_leave_by_is_the_expected_checkpoint_plus_a_margin_within_the_wait() -> None:
    assert leave_by_for("now", 100.0, 50.0, 900.0) == 100.0
    assert leave_by_for("at_checkpoint", 100.0, 50.0, 900.0) == 150.0 + LEAVE_BY_MARGIN_S
    # a decision's estimate past the fleet's wait is cut to it
    assert leave_by_for("at_checkpoint", 100.0, 5000.0, 900.0) == 1000.0 + LEAVE_BY_MARGIN_S
    assert leave_by_for("at_checkpoint", 100.0, -3.0, 900.0) == 100.0 + LEAVE_BY_MARGIN_S


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
    ({"leave_by": None}, r"leave_by: None is not a number of seconds"),
    ({"leave_by": 1_700_000_000.0}, r"leave_by: 1700000000.0 is before requested_at"),
    ({"victim": ""}, "victim: '' is not a non-empty text"),
    ({"reason": 7}, "reason: 7 is not a non-empty text"),
    ({"grace_s": -1}, r"grace_s: -1 is not a number of seconds >= 0"),
    ({"grace_s": True}, r"grace_s: True is not a number of seconds"),
    ({"requested_at": float("nan")}, r"requested_at: nan is not a number of seconds"),
    ({"extra": 1}, r"unknown field\(s\) \['extra'\]"),
])
def test_a_bad_request_names_its_field(change: dict[str, object], message: str) -> None:
    raw = {**json.loads(GOOD.to_json()), **change}
    with pytest.raises(RequestError, match=message):
        parse_request(json.dumps(raw))


def test_a_broken_file_is_ignored_not_fatal(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / REQUEST_FILE).write_text("{half", encoding="utf-8")
    assert read_request(tmp_path) is None
    assert "ignored: not JSON" in caplog.text
    (tmp_path / REQUEST_FILE).write_text("[1]", encoding="utf-8")
    assert read_request(tmp_path) is None
    with pytest.raises(RequestError, match="not a JSON object: list"):
        parse_request("[1]")


def test_the_trainers_note_that_it_left_speaks_for_its_request_once(tmp_path: Path) -> None:
    assert not take_left_mark(tmp_path, GOOD)
    mark_left(tmp_path, GOOD, step=40)
    later = PreemptRequest(victim="b", for_job="a", reason="r",
                           requested_at=GOOD.requested_at + 1, grace_s=1.0)
    assert not take_left_mark(tmp_path, later)  # another request's note: not this one's
    assert not (tmp_path / "preempt_left.json").exists()  # and gone
    mark_left(tmp_path, GOOD, step=40)
    assert take_left_mark(tmp_path, GOOD) and not take_left_mark(tmp_path, GOOD)
    (tmp_path / "preempt_left.json").write_text("{half", encoding="utf-8")
    assert not take_left_mark(tmp_path, GOOD)
