"""What moved a fleet ratio, group by group: the contributions add up to the change
exactly, whatever the groups, their sizes or the periods' lengths."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.rollup.shift_share import Amounts, contributions, ratio_pct


def _change(before: dict[str, Amounts], after: dict[str, Amounts]) -> float:
    a, b = ratio_pct(after), ratio_pct(before)
    assert a is not None and b is not None
    return a - b


def test_a_group_that_got_worse_carries_the_change_and_a_steady_bad_one_nothing() -> None:
    before = {"steady_bad": Amounts(50, 100), "good": Amounts(10, 100)}
    after = {"steady_bad": Amounts(50, 100), "good": Amounts(30, 100)}
    moved = contributions(before, after)
    assert [c.group for c in moved] == ["good", "steady_bad"]
    assert moved[0].points == pytest.approx(10.0)  # fleet 30% -> 40%: all of it
    assert moved[0].rate == pytest.approx(10.0) and moved[0].mix == pytest.approx(0.0)
    assert moved[1].points == pytest.approx(0.0)  # always bad: it moved nothing
    assert (moved[0].before_pct, moved[0].after_pct) == (10.0, 30.0)


def test_growth_of_a_group_worse_than_the_fleet_is_a_mix_effect() -> None:
    before = {"bad": Amounts(20, 100), "good": Amounts(0, 100)}  # fleet 10%
    after = {"bad": Amounts(60, 300), "good": Amounts(0, 100)}  # same rates, bad grew: 15%
    moved = {c.group: c for c in contributions(before, after)}
    assert moved["bad"].rate == pytest.approx(0.0)
    # the bad one's weight grew, the good one's shrank: each is half of the 5 points
    assert moved["bad"].points == pytest.approx(2.5) == moved["good"].points


def test_entered_and_left_groups_count_by_their_distance_from_the_old_fleet() -> None:
    before = {"old": Amounts(10, 100), "gone": Amounts(40, 100)}  # fleet 25%
    after = {"old": Amounts(10, 100), "new": Amounts(45, 100)}  # fleet 27.5%
    moved = {c.group: c for c in contributions(before, after)}
    assert moved["new"].before_pct is None and moved["gone"].after_pct is None
    assert moved["new"].points == pytest.approx(0.5 * (45 - 25))
    assert moved["gone"].points == pytest.approx(-0.5 * (40 - 25))
    assert sum(c.points for c in moved.values()) == pytest.approx(2.5)


def test_no_whole_in_either_period_has_no_split() -> None:
    assert contributions({}, {"a": Amounts(1, 2)}) == []
    assert contributions({"a": Amounts(1, 2)}, {"a": Amounts(0, 0)}) == []
    assert ratio_pct({}) is None


_amounts = st.builds(Amounts, part=st.floats(0, 1e6), whole=st.floats(1e-3, 1e6)).map(
    lambda a: Amounts(min(a.part, a.whole), a.whole))
_periods = st.dictionaries(st.sampled_from("abcdefgh"), _amounts, min_size=1, max_size=8)


@given(_periods, _periods, st.floats(0.01, 100))
def test_contributions_add_up_to_the_change_for_any_groups(
        before: dict[str, Amounts], after: dict[str, Amounts], scale: float) -> None:
    moved = contributions(before, after)
    change = _change(before, after)
    assert math.isclose(sum(c.points for c in moved), change, abs_tol=1e-6)
    for c in moved:
        assert math.isclose(c.rate + c.mix, c.points, abs_tol=1e-9)
    # a period's length does not matter: the baseline scaled (a week for a day) splits alike
    longer = {g: Amounts(a.part * scale, a.whole * scale) for g, a in before.items()}
    again = {c.group: c.points for c in contributions(longer, after)}
    for c in moved:
        assert math.isclose(again[c.group], c.points, abs_tol=1e-6)
