"""The interval arithmetic of airflow_ett/ett/timeline.py, checked against brute force:
attribution sums what `totals` returns to the microsecond and lets `resolve_overlaps`
decide which phase owns a moment, so both are pinned here on their own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.ett.timeline import Timeline, resolve_overlaps


@st.composite
def timelines(draw: st.DrawFn) -> Timeline:
    """Sorted, disjoint segments with gaps, around zero (negative times are microseconds
    like any others)."""
    t = draw(st.integers(-1_000, 1_000))
    out = Timeline()
    for _ in range(draw(st.integers(0, 8))):
        start = t + draw(st.integers(0, 300))
        t = start + draw(st.integers(1, 300))
        out.add(start, t, draw(st.sampled_from("abc")))
    return out


def _brute_totals(tl: Timeline, lo: int | None, hi: int | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for s, e, label in tl.segments():
        overlap = min(e, hi if hi is not None else e) - max(s, lo if lo is not None else s)
        if overlap > 0:
            out[label] = out.get(label, 0) + overlap
    return out


bounds = st.one_of(st.none(), st.integers(-1_500, 4_000))


@settings(max_examples=200, deadline=None)
@given(timelines(), bounds, bounds)
def test_totals_are_the_time_of_each_label_inside_the_bounds(
        tl: Timeline, lo: int | None, hi: int | None) -> None:
    assert tl.totals(lo, hi) == _brute_totals(tl, lo, hi)


def _tl(*segments: tuple[int, int, str]) -> Timeline:
    out = Timeline()
    for s, e, label in segments:
        out.add(s, e, label)
    return out


TL = _tl((-500, -200, "a"), (0, 10, "b"), (20, 30, "a"))


@pytest.mark.parametrize(("lo", "hi", "expected"), [
    (None, None, {"a": 310, "b": 10}),
    (None, 5, {"a": 300, "b": 5}),  # open below: everything before `hi`, however early
    (5, None, {"b": 5, "a": 10}),  # open above: everything after `lo`
    (-300, 25, {"a": 105, "b": 10}),
    (10, 20, {}),  # a gap
    (5, 5, {}),  # an empty window holds no label, not a label with 0 us
    (8, 3, {}),  # nor does an inverted one
])
def test_totals_of_a_window(lo: int | None, hi: int | None, expected: dict[str, int]) -> None:
    assert TL.totals(lo, hi) == expected


def test_add_merges_back_to_back_time_of_one_label_and_drops_empty_time() -> None:
    tl = _tl((0, 5, "a"), (5, 9, "a"), (9, 9, "b"), (9, 12, "b"), (14, 15, "b"))
    assert list(tl.segments()) == [(0, 9, "a"), (9, 12, "b"), (14, 15, "b")]


def test_a_timeline_whose_columns_disagree_is_refused_not_truncated() -> None:
    broken = Timeline(starts=[0, 5], ends=[5], labels=["a", "b"])
    with pytest.raises(ValueError, match="shorter"):
        list(broken.segments())


RANKS = {"low": 0, "high": 1}


@pytest.mark.parametrize(("intervals", "expected"), [
    # the lowest rank wins wherever it is active
    ([(0, 10, "high"), (2, 5, "low")], [(0, 2, "high"), (2, 5, "low"), (5, 10, "high")]),
    ([(0, 10, "low"), (2, 5, "high")], [(0, 10, "low")]),
    # equal ranks: the one that started last (the innermost) wins, however long it runs
    ([(0, 10, "low"), (2, 5, "low2")], [(0, 2, "low"), (2, 5, "low2"), (5, 10, "low")]),
    ([(0, 4, "low"), (2, 10, "low2")], [(0, 2, "low"), (2, 10, "low2")]),
    ([(2, 10, "low2"), (0, 4, "low")], [(0, 2, "low"), (2, 10, "low2")]),
    # equal ranks, started together: the lower tie-break, then the name
    ([(0, 4, "low2"), (0, 4, "low")], [(0, 4, "low")]),
    # gaps stay gaps
    ([(0, 2, "low"), (5, 6, "high")], [(0, 2, "low"), (5, 6, "high")]),
    ([], []),
])
def test_resolve_overlaps_gives_each_moment_one_winner(
        intervals: list[tuple[int, int, str]], expected: list[tuple[int, int, str]]) -> None:
    tl = resolve_overlaps(intervals, rank=lambda label: RANKS[label.rstrip("2")],
                          tie=lambda label: 0)
    assert list(tl.segments()) == expected
