"""Each rank's own step time and the straggler (`ett/attribution/stragglers.py`): worked
out by hand, through the whole attribution (rank events never move ETT), then as
properties: rank labels do not matter, equal ranks name nobody, one consistently slow
rank is named whatever the others' noise."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.attribution.stragglers import (
    MIN_REPORTS,
    RankStepTimes,
    rank_step_times,
)
from airflow_ett.ett.events import (
    EventError,
    JobSubmitted,
    RankSteps,
    event_to_json,
    parse_line,
    with_rank,
)
from airflow_ett.ett.synthetic import JobSpec, simulate

T0 = 1_780_000_000.0


def reports(rank: int, per_step_s: list[float], *, attempt: str = "1", steps: int = 10,
            wait_s: float = 0.0) -> list[RankSteps]:
    """One report per value: `steps` steps, each `per_step_s` of the rank's own time."""
    out, t = [], T0
    for i, own in enumerate(per_step_s):
        span = steps * (own + wait_s)
        out.append(with_rank(RankSteps(
            id=f"r{rank}.{attempt}.{i}", job="j", ts=t + span, attempt=attempt, start_ts=t,
            step_start=i * steps, step_end=(i + 1) * steps, busy_s=steps * own,
            wait_s=steps * wait_s), rank))
        t += span
    return out  # type: ignore[return-value]


def figures(events: list[RankSteps]) -> RankStepTimes:
    out = rank_step_times(events)
    assert out is not None
    return out


def test_a_rank_the_others_wait_for_is_named_with_what_it_cost() -> None:
    # 4 ranks at 100 ms a step; rank 2 at 150 ms in every report but its warm-up, which
    # is left out (a first report of 900 ms changes nothing).
    events = [e for r in (0, 1, 3) for e in reports(r, [0.5, 0.1, 0.1, 0.1, 0.1])]
    events += reports(2, [0.9, 0.15, 0.15, 0.15, 0.15])
    out = figures(events)
    assert [(r.rank, r.reports, r.steps) for r in out.ranks] == [
        (0, 4, 40), (1, 4, 40), (2, 4, 40), (3, 4, 40)]
    assert out.ranks[2].busy_step_us == pytest.approx(150_000)
    (s,) = out.stragglers
    assert (s.attempt, s.rank, s.slow_share) == ("1", 2, 1.0)
    assert s.others_step_us == pytest.approx(100_000)
    assert s.lost_us == pytest.approx(4 * 10 * 50_000, abs=2)  # 4 steady reports of 10


def test_two_ranks_are_each_compared_with_the_other() -> None:
    out = figures(reports(0, [0.1] * 5) + reports(1, [0.1, 0.2, 0.2, 0.2, 0.2]))
    assert [s.rank for s in out.stragglers] == [1]
    assert out.stragglers[0].others_step_us == pytest.approx(100_000)


@pytest.mark.parametrize(("slow", "why"), [
    ([0.1, 0.108, 0.108, 0.108, 0.108], "8% slower is within the 10% band"),
    ([0.1, 0.2, 0.1, 0.2, 0.1], "slow in half its steps: not consistently"),
    ([0.1, 0.2, 0.2], "two steady reports prove nothing"),
])
def test_nobody_is_named_without_a_consistent_slowdown(slow: list[float], why: str) -> None:
    out = figures(reports(0, [0.1] * 5) + reports(1, [0.1] * 5) + reports(2, slow))
    assert out.stragglers == (), why


def test_a_straggler_is_an_attempts_and_the_ranks_pool_every_attempt() -> None:
    # Rank 1 is slow on the first attempt's host only; the retry runs elsewhere.
    events = (reports(0, [0.1] * 5, attempt="1") + reports(1, [0.1] + [0.3] * 4, attempt="1")
              + reports(0, [0.1] * 5, attempt="2") + reports(1, [0.1] * 5, attempt="2"))
    out = figures(events)
    assert [(s.attempt, s.rank) for s in out.stragglers] == [("1", 1)]
    assert out.ranks[1].reports == 8  # both attempts' steady reports
    assert out.ranks[1].busy_step_us == pytest.approx(100_000)  # the median of 4x0.3, 4x0.1


def test_waits_are_reported_per_step() -> None:
    out = figures(reports(0, [0.1] * 4, wait_s=0.05) + reports(1, [0.15] * 4))
    assert out.ranks[0].wait_step_us == pytest.approx(50_000)
    assert out.ranks[1].wait_step_us == 0


def test_rank_reports_go_through_the_attribution_and_leave_ett_alone() -> None:
    events = list(simulate(JobSpec(steps=200)))
    before = attribute_job(events)
    assert before.summary().rank_steps is None
    extra = [msgspec.structs.replace(e, job=events[0].job)
             for r in (0, 1) for e in reports(r, [0.1] + [0.1 + 0.3 * r] * 4)]
    after = attribute_job([*extra, *events])
    assert after.components_us == before.components_us
    assert after.e2e_us == before.e2e_us and after.timeline == before.timeline
    summary = after.summary()
    assert summary.rank_steps is not None
    assert [s.rank for s in summary.rank_steps.stragglers] == [1]
    assert summary.rank_steps.stragglers[0].slowdown == pytest.approx(4.0)
    again = type(summary).from_json(summary.to_json())
    assert again == summary


def test_a_rank_report_round_trips_and_bad_values_name_the_field() -> None:
    (e,) = reports(3, [0.1])
    assert parse_line(event_to_json(e)) == e and '"v":2' in event_to_json(e)
    good = event_to_json(reports(0, [0.1])[0])
    for old, new, field in (('"step_end":10', '"step_end":0', "step_end"),
                            ('"busy_s":1.0', '"busy_s":-1.0', "busy_s"),
                            ('"busy_s":1.0', '"busy_s":NaN', "busy_s")):
        assert old in good
        with pytest.raises(EventError, match=f"'{field}'"):
            parse_line(good.replace(old, new))


def test_no_report_no_figures_and_a_lone_rank_names_nobody() -> None:
    assert rank_step_times([]) is None
    out = figures(reports(0, [0.1, 0.5, 0.5, 0.5]))
    assert out.stragglers == () and len(out.ranks) == 1


_STEADY = st.lists(st.floats(0.05, 0.2), min_size=MIN_REPORTS + 1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(world=st.integers(2, 8), data=st.data())
def test_property_rank_labels_do_not_matter(world: int, data: st.DataObject) -> None:
    times = [data.draw(_STEADY) for _ in range(world)]
    perm = data.draw(st.permutations(range(world)))
    out = figures([e for r in range(world) for e in reports(r, times[r])])
    swapped = figures([e for r in range(world) for e in reports(perm[r], times[r])])
    assert {(perm[s.rank], s.lost_us) for s in out.stragglers} == {
        (s.rank, s.lost_us) for s in swapped.stragglers}
    assert sorted((perm[r.rank], r.busy_step_us) for r in out.ranks) == sorted(
        (r.rank, r.busy_step_us) for r in swapped.ranks)


@settings(max_examples=60, deadline=None)
@given(world=st.integers(2, 8), noise=st.lists(st.floats(0.0, 0.05), min_size=40,
                                                max_size=40),
       slow=st.integers(0, 7), factor=st.floats(1.3, 4.0))
def test_property_one_consistently_slow_rank_is_named_and_equal_ranks_name_nobody(
        world: int, noise: list[float], slow: int, factor: float) -> None:
    slow %= world
    base = [[0.1 * (1 + noise[(r * 5 + i) % 40]) for i in range(5)] for r in range(world)]
    assert figures([e for r in range(world) for e in reports(r, base[r])]).stragglers == ()
    base[slow] = [t * factor for t in base[slow]]
    out = figures([e for r in range(world) for e in reports(r, base[r])])
    assert [s.rank for s in out.stragglers] == [slow]
    assert 0 < out.stragglers[0].lost_us <= sum(10 * 1e6 * t for t in base[slow][1:])


def test_a_submitted_job_alone_has_no_rank_figures() -> None:
    job = attribute_job([JobSubmitted(id="s", job="j", ts=T0)])
    assert job.rank_steps is None
