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

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import EFFECTIVE_LABEL, JobAttribution, attribute_job
from airflow_ett.ett.events import (
    Event,
)
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
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
