"""Time-window attribution: a job's time inside `[lo, hi)`, for rollups over days.

The hand-made numbers were worked out on paper from the spec; the property says that the
windows of any partition of time add up to the whole job, to the microsecond."""

from __future__ import annotations

import itertools
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import (
    JobAttribution,
    WindowAttribution,
    attribute_job,
    attribute_window,
    clip_to_window,
    last_windows,
)
from airflow_ett.ett.events import Event
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.ett.timeline import to_s, to_us
from tests.ett.strategies import NOW, soups, specs

DAY = 86_400.0
MIDNIGHT = 1_780_012_800.0  # 2026-05-29T00:00:00Z, a multiple of DAY
# queued [M-20, M-10); trainer_init [M-10, M-5); 40 steps of 1 s [M-5, M+35);
# final checkpoint [M+35, M+37); teardown [M+37, M+40): E2E 60 s, 20 before midnight.
ACROSS_MIDNIGHT = JobSpec(submit_ts=MIDNIGHT - 20, queue_s=10.0, startup=(("trainer_init", 5.0),),
                          steps=40, step_s=1.0, progress_every=4, checkpoint_every=0,
                          final_checkpoint_s=2.0, teardown_s=3.0)


def seconds(w: WindowAttribution) -> dict[str, float]:
    return {c: s for c, s in w.components_s.items() if s}


def test_a_job_across_midnight_splits_by_time() -> None:
    events = simulate(ACROSS_MIDNIGHT)
    before = attribute_window(events, MIDNIGHT - DAY, MIDNIGHT)
    after = attribute_window(events, MIDNIGHT, MIDNIGHT + DAY)
    assert seconds(before) == {"scheduling": 10.0, "initialization": 5.0,
                               "effective_training": 5.0}
    assert seconds(after) == {"effective_training": 35.0, "shutdown": 5.0}
    assert (before.e2e_in_window_s, after.e2e_in_window_s) == (20.0, 40.0)
    assert before.phases_s == {"queued": 10.0, "trainer_init": 5.0, "effective_steps": 5.0}
    assert after.phases_s == {"effective_steps": 35.0, "final_checkpoint": 2.0,
                              "teardown": 3.0}
    assert before.ett_pct == 25.0
    assert after.ett_pct == 87.5
    assert (before.job, before.tenant, before.provisional) == ("job-1", "ads-ranking", False)
    assert (before.lo_us, before.hi_us) == (1_779_926_400_000_000, 1_780_012_800_000_000)


def test_a_window_before_or_after_the_job_is_zero() -> None:
    r = attribute_job(simulate(ACROSS_MIDNIGHT))
    for lo, hi in ((MIDNIGHT - DAY, MIDNIGHT - 20), (MIDNIGHT + 40, MIDNIGHT + DAY)):
        w = clip_to_window(r, lo, hi)
        assert w.components_us == dict.fromkeys(COMPONENTS, 0)
        assert w.phases_us == {}
        assert w.e2e_in_window_us == 0
        assert w.ett_pct == 0.0


def test_a_window_covering_the_job_is_the_whole_job() -> None:
    events = simulate(JobSpec(failures=(InjectedFailure(at_step=40, cause="infra"),)))
    r = attribute_job(events)
    w = attribute_window(events, r.submitted_at - 1, r.ended_at + 1)
    assert w.components_us == r.components_us
    assert w.phases_us == r.phases_us
    assert w.e2e_in_window_us == r.e2e_us
    assert w.ett_pct == r.ett_pct
    exact = clip_to_window(r, r.submitted_at, r.ended_at)
    assert (exact.components_us, exact.e2e_in_window_us) == (r.components_us, r.e2e_us)


def test_a_window_inside_one_segment_takes_just_its_share() -> None:
    w = attribute_window(simulate(ACROSS_MIDNIGHT), MIDNIGHT + 1.25, MIDNIGHT + 1.5)
    assert w.components_us == {**dict.fromkeys(COMPONENTS, 0), "effective_training": 250_000}
    assert w.e2e_in_window_us == 250_000


@pytest.mark.parametrize(("lo", "hi", "message"), [
    (math.nan, 1.0, "lo must be finite Unix seconds, got nan"),
    (0.0, math.inf, "hi must be finite Unix seconds, got inf"),
    (-math.inf, 1.0, "lo must be finite Unix seconds, got -inf"),
    (2.0, 2.0, "hi must be after lo, got lo=2.0 hi=2.0"),
    (3.0, 2.0, "hi must be after lo, got lo=3.0 hi=2.0"),
    ("0", 2.0, "lo must be Unix seconds (a number), got '0'"),
    (0.0, True, "hi must be Unix seconds (a number), got True"),
])
def test_bad_windows_are_refused_by_name(lo: float, hi: float, message: str) -> None:
    events = simulate(ACROSS_MIDNIGHT)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        attribute_window(events, lo, hi)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        clip_to_window(attribute_job(events), lo, hi)


@st.composite
def cuts(draw: st.DrawFn, r: JobAttribution) -> list[float]:
    """1..6 consecutive windows over [submit - margin, end + margin): the inner cut points
    anywhere, or exactly on a segment boundary (where an off-by-one would show)."""
    margin = draw(st.sampled_from([0.0, 0.5, 3.0, DAY]))
    lo, hi = r.submitted_at - margin, r.ended_at + margin
    if not lo < hi:  # a job of zero length, exactly covered
        hi = lo + 1.0
    boundaries = [to_s(s) for s in r.timeline.starts] or [lo]
    anywhere = st.floats(lo, hi, allow_nan=False, allow_infinity=False)
    inner = draw(st.lists(st.one_of(anywhere, st.sampled_from(boundaries)), max_size=5))
    return sorted({lo, hi, *(p for p in inner if lo < p < hi)})


def check_windows_sum_to_job(r: JobAttribution, points: list[float]) -> None:
    windows = [clip_to_window(r, a, b) for a, b in itertools.pairwise(points)]
    assert 1 <= len(windows) <= 6
    assert [(w.lo, w.hi) for w in windows] == list(itertools.pairwise(points))
    for w in windows:
        assert sum(w.components_us.values()) == w.e2e_in_window_us
        assert sum(w.phases_us.values()) == w.e2e_in_window_us
    for c in COMPONENTS:
        assert sum(w.components_us[c] for w in windows) == r.components_us[c], c
    phases: dict[str, int] = {}
    for w in windows:
        for p, us in w.phases_us.items():
            phases[p] = phases.get(p, 0) + us
    assert phases == {p: us for p, us in r.phases_us.items() if us}
    assert sum(w.e2e_in_window_us for w in windows) == r.e2e_us


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs, st.data())
def test_windows_of_a_partition_sum_to_the_simulated_job(spec: JobSpec,
                                                         data: st.DataObject) -> None:
    r = attribute_job(simulate(spec))
    check_windows_sum_to_job(r, data.draw(cuts(r)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(soups(), st.data())
def test_windows_of_a_partition_sum_to_any_job(events: list[Event], data: st.DataObject) -> None:
    r = attribute_job(events, now=NOW)
    check_windows_sum_to_job(r, data.draw(cuts(r)))


# -- rolling windows: a job's last minutes ----------------------------------------------------

def test_the_last_windows_of_a_job_end_at_its_end_and_hold_min_span_e2e() -> None:
    r = attribute_job(simulate(ACROSS_MIDNIGHT))  # E2E 60 s, ends at M+40
    ten, whole, longer = last_windows(r, [10.0, 60.0, 600.0])
    assert (ten.lo, ten.hi) == (MIDNIGHT + 30, MIDNIGHT + 40)
    assert seconds(ten) == {"effective_training": 5.0, "shutdown": 5.0}
    assert ten.ett_pct == 50.0 and ten.e2e_in_window_s == 10.0
    # a window as long as the job, or longer, holds the whole job and no more
    for w in (whole, longer):
        assert (w.components_us, w.e2e_in_window_us) == (r.components_us, r.e2e_us)
    assert (longer.lo, longer.hi) == (MIDNIGHT + 40 - 600, MIDNIGHT + 40)
    assert last_windows(r, []) == ()


def test_a_running_job_s_last_windows_end_at_the_now_it_was_attributed_at() -> None:
    spec = JobSpec(submit_ts=MIDNIGHT, queue_s=10.0, startup=(), steps=400, step_s=1.0,
                   progress_every=4, checkpoint_every=0, running_until_step=100)
    now = MIDNIGHT + 200.5  # 90.5 s after the last progress: the job looks stalled
    r = attribute_job(simulate(spec), now=now)
    assert r.provisional and r.ended_at == now
    (w,) = last_windows(r, [60.0])
    assert (w.lo, w.hi, w.e2e_in_window_s) == (now - 60, now, 60.0)
    assert w.components_us["effective_training"] == 0  # no new data in the last minute
    assert w.provisional


@pytest.mark.parametrize("span", [0.0, -1.0, 1e-7, math.nan, math.inf, True, "60"])
def test_a_bad_span_is_refused_by_name(span: float) -> None:
    r = attribute_job(simulate(ACROSS_MIDNIGHT))
    with pytest.raises(ValueError, match=r"^a window's span must be .*, got "):
        last_windows(r, [60.0, span])


spans = st.lists(st.one_of(st.sampled_from([0.25, 1.0, 7.5, 60.0, 300.0, 3600.0]),
                           st.floats(1e-3, 1e5, allow_nan=False, allow_infinity=False)),
                 min_size=1, max_size=4)


def check_last_windows(r: JobAttribution, spans_s: list[float]) -> None:
    windows = last_windows(r, spans_s)
    end = to_us(r.ended_at)
    assert len(windows) == len(spans_s)
    for span, w in zip(spans_s, windows, strict=True):
        assert (w.hi_us, w.hi_us - w.lo_us) == (end, to_us(span))
        # the components sum to the window's length, clipped to the job's life
        assert sum(w.components_us.values()) == w.e2e_in_window_us == min(to_us(span),
                                                                          r.e2e_us)
        assert sum(w.phases_us.values()) == w.e2e_in_window_us
        assert all(us >= 0 for us in w.components_us.values())
    # a longer window holds everything a shorter one does
    by_length = sorted(windows, key=lambda w: w.hi_us - w.lo_us)
    for short, long in itertools.pairwise(by_length):
        for c in COMPONENTS:
            assert short.components_us[c] <= long.components_us[c], c


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs, spans)
def test_last_windows_sum_to_their_span_clipped_to_the_simulated_job(
        spec: JobSpec, spans_s: list[float]) -> None:
    check_last_windows(attribute_job(simulate(spec)), spans_s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(soups(), spans, st.sampled_from([NOW, NOW + 0.5, NOW + 3600.0]))
def test_last_windows_sum_to_their_span_clipped_to_any_job(
        events: list[Event], spans_s: list[float], now: float) -> None:
    check_last_windows(attribute_job(events, now=now), spans_s)
