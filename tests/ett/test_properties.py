"""Invariants of the attribution, checked on generated jobs.

Two generators: `jobs()` plays realistic lifecycles through the simulator (needed for the
causal property "a failure never raises ETT%"); `soups()` draws arbitrary valid events,
in any combination a buggy or foreign trainer could send, for the properties that must
hold whatever arrives.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import EFFECTIVE_LABEL, JobAttribution, attribute_job
from airflow_ett.ett.events import (
    Event,
)
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.ett.timeline import to_s, to_us
from tests.ett.strategies import NOW, failure, soups, specs


def check_partition(r: JobAttribution) -> None:
    assert sum(r.components_us.values()) == r.e2e_us
    assert sum(r.phases_us.values()) == r.e2e_us
    assert all(v >= 0 for v in r.components_us.values())
    assert 0.0 <= r.ett_pct <= 100.0
    # the timeline covers [submitted, ended) exactly, without gaps or overlaps
    segs = list(r.timeline.segments())
    if segs:
        assert segs[0][0] * 1e-6 == r.submitted_at or r.e2e_us == 0
        assert all(a[1] == b[0] for a, b in itertools.pairwise(segs))


def check_levels_agree(r: JobAttribution) -> None:
    """Level 1 windows tile the same timeline Level 2 labels."""
    level1 = r.tts_us + sum(r.ttr_us) + r.effective_us + r.in_loop_waste_us + r.shutdown_us
    assert level1 == r.e2e_us
    for f in r.failures:
        if f.ttr_us is not None:
            assert sum(f.phases_us.values()) == f.ttr_us
            assert sum(f.stages_us.values()) == f.ttr_us
            assert EFFECTIVE_LABEL not in f.phases_us
            assert 0 <= f.detection_us <= f.ttr_us
    assert EFFECTIVE_LABEL not in r.tts_phases_us
    assert sum(r.tts_phases_us.values()) == r.tts_us
    assert r.nof["total"] == len(r.failures)


def check_rows_agree(r: JobAttribution) -> None:
    """The attempt and failure rows, and the dict's timeline, tell the same story as the
    totals."""
    # effective time happens inside attempts only, and each row gets its own share
    assert sum(to_us(a.effective_s) for a in r.attempts) == r.effective_us
    assert r.nof["total"] == sum(a.status == "failed" for a in r.attempts)
    for f in r.failures:
        # a failure is either part of TTS (no TTR, no detection of its own) or a recovery
        assert f.during_tts is (f.ttr_us is None)
        if f.during_tts:
            assert (f.detection_us, f.stages_us, f.phases_us) == (0, {}, {})
    d = r.to_dict(include_timeline=True)
    assert "timeline" not in r.to_dict()
    rows = d["timeline"]
    # seconds since submission, back to back from 0 to E2E, each with its component
    assert [row[0] for row in rows[:1]] == [0.0] * bool(rows)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(rows))
    assert rows[-1][1] == pytest.approx(to_s(r.e2e_us)) if rows else r.e2e_us == 0
    per_label: dict[str, float] = {}
    for start, end, component, label in rows:
        assert component == r.phase_components[label]
        per_label[label] = per_label.get(label, 0.0) + end - start
    assert per_label == pytest.approx({k: to_s(v) for k, v in r.phases_us.items()})


def shuffled_with_duplicates(events: list[Event], seed: int) -> list[Event]:
    rng = random.Random(seed)
    out = events + rng.sample(events, k=len(events) // 2)
    rng.shuffle(out)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_simulated_jobs_partition_and_agree(spec: JobSpec) -> None:
    r = attribute_job(simulate(spec))
    check_partition(r)
    check_levels_agree(r)
    check_rows_agree(r)
    # every step's data is new exactly once: effective time is the step time, whatever failed
    assert r.effective_us == round(spec.steps * spec.step_s * 1e6)
    assert r.nof["total"] == len({(f.at_step, i) for i, f in enumerate(spec.failures)
                                  if f.at_step <= spec.steps})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(soups(), st.integers(0, 2**32))
def test_any_events_partition_agree_and_ignore_order(events: list[Event], seed: int) -> None:
    r = attribute_job(events, now=NOW)
    check_partition(r)
    check_levels_agree(r)
    check_rows_agree(r)
    again = attribute_job(shuffled_with_duplicates(events, seed), now=NOW)
    assert again.to_dict(include_timeline=True) == r.to_dict(include_timeline=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs, st.integers(0, 2**32))
def test_simulated_order_independence(spec: JobSpec, seed: int) -> None:
    events = simulate(spec)
    assert attribute_job(shuffled_with_duplicates(events, seed)).to_dict(
        include_timeline=True
    ) == attribute_job(events).to_dict(include_timeline=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs, failure)
def test_adding_a_failure_never_raises_ett(spec: JobSpec, extra: InjectedFailure) -> None:
    before = attribute_job(simulate(spec))
    after = attribute_job(simulate(replace(spec, failures=(*spec.failures, extra))))
    assert after.ett_pct <= before.ett_pct + 1e-9
    assert after.e2e_us >= before.e2e_us
    assert after.nof["total"] >= before.nof["total"]
