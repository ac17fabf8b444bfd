"""The preemption request file (`airflow_ett.scheduling.request`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_ett.scheduling.request import (
    REQUEST_FILE,
    PreemptRequest,
    RequestError,
    archive_request,
    parse_request,
    read_request,
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


@pytest.mark.parametrize(("change", "message"), [
    ({"version": 2}, "version: 2 is not 1"),
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
