"""`JobSummary`, the typed contract of a job's numbers: its JSON form keeps the keys the
JSON always had, survives a round trip, and refuses what it cannot read by name."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from airflow_ett.ett.attribution import JobAttribution, attribute_job
from airflow_ett.ett.events import Event
from airflow_ett.ett.summary import (
    COMPACT_KEYS,
    FIRST_VERSION,
    SUMMARY_VERSION,
    JobSummary,
    SummaryError,
)
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from tests.ett.strategies import soups, specs

# The keys of `JobAttribution.to_dict()` before `JobSummary` existed, in their order: the
# JSON of `compute --json`, `runs show --json` and the store's cache. A field may be added
# to the end (the compatibility rule of docs/decisions/0009-job-summary.md), never dropped.
TOP_KEYS = [
    "job", "tenant", "model", "dag_id", "run_id", "provisional", "started", "submitted_at",
    "ended_at", "ett_pct", "e2e_s", "effective_s", "tts_s", "ttr_s", "ttr_from_detection_s",
    "nof", "in_loop_waste_s", "shutdown_s", "csbt_s", "components", "phases", "phases_raw",
    "phase_components", "tts_phases", "failures", "attempts", "rates", "checkpoints",
    "model_available_after_release_s", "warnings", "world_size", "synthetic", "slow_steps",
    "rank_steps",
]
SLOW_KEYS = ["ideal_step_s", "effective_steps", "steady_steps", "spans", "slow_spans",
             "lost_s", "lost_pct_of_effective"]
FAILURE_KEYS = ["attempt", "cause", "at", "during_tts", "ttr_s", "detection_s",
                "ttr_from_detection_s", "stages", "phases"]
ATTEMPT_KEYS = ["attempt", "start", "end", "status", "cause", "exit_code", "inferred",
                "effective_s", "message"]
RATES_KEYS = ["attempts", "attempts_without_preemption", "failures_per_attempt",
              "failures_per_attempt_without_preemption"]
CHECKPOINT_KEYS = ["saves", "final_saves", "blocking_s", "total_s", "bytes"]

# Two failures, checkpoints and a final save: every nested list of the summary holds rows.
RICH = JobSpec(steps=30, checkpoint_every=5, final_checkpoint_s=2.0, failures=(
    InjectedFailure(at_step=1, cause="infra", detection_s=1.0),
    InjectedFailure(at_step=17, cause="preemption", detection_s=2.0, reschedule_s=3.0),
))


def _rich() -> JobAttribution:
    return attribute_job(simulate(RICH))


def test_the_json_form_has_todays_keys_in_todays_order() -> None:
    d = _rich().summary().to_dict()
    assert list(d) == TOP_KEYS
    assert d["failures"] and all(list(f) == FAILURE_KEYS for f in d["failures"])
    assert d["attempts"] and all(list(a) == ATTEMPT_KEYS for a in d["attempts"])
    assert list(d["rates"]) == RATES_KEYS
    assert list(d["slow_steps"]) == SLOW_KEYS
    assert list(d["checkpoints"]) == CHECKPOINT_KEYS
    # the struct holds nothing the JSON leaves out but its version
    assert [f for f in JobSummary.__struct_fields__ if f != "version"] == TOP_KEYS


def test_the_summary_says_what_the_attribution_says() -> None:
    r = _rich()
    s = r.summary()
    assert s.e2e_s == r.e2e_us / 1e6 and s.effective_s == r.effective_us / 1e6
    assert s.ett_pct == r.ett_pct and s.started is r.started
    assert s.failure_count == len(r.failures) == s.nof["total"] == 2
    assert s.ttr_s == [f.ttr_s for f in s.failures if f.ttr_s is not None]
    assert [f.cause for f in s.failures] == ["infra", "preemption"]
    assert s.checkpoints.saves == r.checkpoint_saves > 0
    assert s.blocking_per_save_s == pytest.approx(s.csbt_s / s.checkpoints.saves)
    assert s.rates.attempts == len(r.attempts) == len(s.attempts) == 3
    assert s.version == SUMMARY_VERSION


def test_no_save_means_no_blocking_per_save() -> None:
    s = attribute_job(simulate(JobSpec(steps=3, checkpoint_every=0,
                                       final_checkpoint_s=0.0))).summary()
    assert s.checkpoints.saves == 0 and s.blocking_per_save_s is None


def _round_trips(summary: JobSummary) -> None:
    as_stored = json.dumps(summary.to_dict(), separators=(",", ":"))  # as the store writes
    assert JobSummary.from_json(as_stored) == summary
    assert JobSummary.from_dict(json.loads(as_stored)) == summary
    assert JobSummary.from_json(summary.to_json()) == summary
    assert json.loads(summary.to_json()) == json.loads(as_stored)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_round_trip_of_simulated_jobs(spec: JobSpec) -> None:
    events = simulate(spec)
    _round_trips(attribute_job(events).summary())
    _round_trips(attribute_job(events[: len(events) // 2], now=events[-1].ts).summary())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(soups())
def test_round_trip_of_any_events(events: list[Event]) -> None:
    _round_trips(attribute_job(events, now=1_000.0).summary())


def test_version_one_writes_no_version_key_and_reads_one_without_it() -> None:
    s = _rich().summary()
    assert FIRST_VERSION == SUMMARY_VERSION == 1 and "version" not in s.to_dict()
    assert JobSummary.from_dict({**s.to_dict(), "version": 1}) == s


@pytest.mark.parametrize("version", [SUMMARY_VERSION + 1, 0, "1", True, None])
def test_a_version_this_code_does_not_read_is_refused_by_name(version: object) -> None:
    with pytest.raises(SummaryError, match=r"field 'version': .* not a version this code"):
        JobSummary.from_dict({**_rich().summary().to_dict(), "version": version})


def test_a_newer_minor_addition_is_ignored() -> None:
    d = _rich().summary().to_dict()
    d["added_later"] = 1
    d["checkpoints"] = {**d["checkpoints"], "added_later": 2}
    assert JobSummary.from_dict(d) == _rich().summary()


@pytest.mark.parametrize(("change", "field", "value"), [
    ({"ett_pct": None}, "$.ett_pct", "None"),
    ({"components": {"scheduling": "1e999"}}, "$.components[...]", "{'scheduling': '1e999'}"),
    ({"started": 1}, "$.started", "1"),
    ({"failures": [{"attempt": "a"}]}, "$.failures[0]", "{'attempt': 'a'}"),
])
def test_a_row_that_does_not_fit_names_the_field_and_the_value(
        change: dict[str, Any], field: str, value: str) -> None:
    with pytest.raises(SummaryError) as err:
        JobSummary.from_dict({**_rich().summary().to_dict(), **change})
    message = str(err.value)
    assert "\n" not in message and f"`{field}`" in message and f"value {value}" in message


def test_a_row_with_a_key_missing_is_refused() -> None:
    d = _rich().summary().to_dict()
    del d["rates"]
    with pytest.raises(SummaryError, match="missing required field `rates`"):
        JobSummary.from_dict(d)


@pytest.mark.parametrize("payload", [b"[1]", b"{", b"null"])
def test_what_is_not_a_summary_at_all(payload: bytes) -> None:
    with pytest.raises(SummaryError):
        JobSummary.from_json(payload)


def test_compact_form_for_the_manifest() -> None:
    s = _rich().summary()
    compact = s.compact()
    assert tuple(compact) == COMPACT_KEYS
    assert compact == {k: s.to_dict()[k] for k in COMPACT_KEYS}
    msgspec.json.encode(compact)  # plain JSON values


def test_the_summary_carries_the_run_and_each_failures_detection_ttr() -> None:
    r = attribute_job(simulate(replace(RICH, dag_id="ranking_v7", run_id="scheduled__x")))
    s = r.summary()
    assert (s.dag_id, s.run_id) == ("ranking_v7", "scheduled__x")
    assert [f.ttr_from_detection_s for f in s.failures] == [
        f.ttr_from_detection_s for f in r.failures]
    assert any(f.ttr_from_detection_s is not None for f in s.failures)


def _refusal(data: object) -> str:
    with pytest.raises(SummaryError) as err:
        JobSummary.from_dict(data)
    return str(err.value)


def _rich_dict(**changes: Any) -> dict[str, Any]:
    return {**_rich().summary().to_dict(), **changes}


def test_what_is_not_an_object_is_named() -> None:
    assert _refusal([1]) == "a job summary is a JSON object, got [1]"
    with pytest.raises(SummaryError) as err:
        JobSummary.from_json(b"{")
    assert str(err.value) == "job summary is not JSON: Input data was truncated"


# A value is quoted whole up to 80 characters of repr; a longer one is cut to 80 with "...".
_80 = "x" * 78  # repr: 80 characters
_81 = "x" * 79


@pytest.mark.parametrize(("data", "message"), [
    (_rich_dict(version=_80),
     f"job summary field 'version': '{_80}' is not a version this code reads (1..1)"),
    (_rich_dict(version=_81),
     f"job summary field 'version': '{_81[:76]}... is not a version this code reads (1..1)"),
    # the job is named; a field missing from the top level has no path, hence no value
    ({k: v for k, v in _rich_dict().items() if k != "rates"},
     "job summary of 'job-1': Object missing required field `rates`"),
    (_rich_dict(job="j" * 100, ett_pct=None),
     f"job summary of '{'j' * 76}...: Expected `float`, got `null` - at `$.ett_pct`; "
     "value None"),
    # the value is found through lists as well as objects
    (_rich_dict(warnings=["", 5]),
     "job summary of 'job-1': Expected `str`, got `int` - at `$.warnings[1]`; value 5"),
])
def test_a_refusal_names_the_job_the_field_and_the_value(data: object, message: str) -> None:
    assert _refusal(data) == message
