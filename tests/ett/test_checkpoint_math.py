from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.ett.checkpoint_math import (
    CheckpointMathError,
    IntervalChoice,
    auto_interval,
    daly_interval,
    estimate_mtbf,
    interval_floor,
    unsaved_training_time,
    wasted_training_time,
    young_interval,
)

# Strictly positive, finite seconds: the domain every interval function accepts.
seconds = st.floats(0.01, 1e6)


def test_young_by_hand() -> None:
    # CSBT 2 s, MTBF 1 h: sqrt(2 * 2 * 3600) = 120 s
    assert young_interval(2.0, 3600.0) == pytest.approx(120.0)


def test_daly_by_hand() -> None:
    # d = 2, M = 3600: sqrt(14400) * (1 + sqrt(1/3600)/3 + (1/3600)/9) - 2
    expected = 120.0 * (1 + (1 / 60) / 3 + (1 / 3600) / 9) - 2.0
    assert daly_interval(2.0, 3600.0) == pytest.approx(expected)
    assert daly_interval(10.0, 4.0) == 4.0  # d >= 2M: checkpoint every MTBF


def test_daly_switches_to_mtbf_exactly_at_two_mtbf() -> None:
    # At d == 2M the series would give 2M * (1 + 1/3 + 1/9) - 2M = 8M/9; Daly's rule says
    # checkpoint every MTBF from d = 2M on, so the boundary itself already answers M.
    assert daly_interval(8.0, 4.0) == 4.0
    assert daly_interval(7.999, 4.0) == pytest.approx(8 * 4.0 / 9, rel=1e-3)
    # so the rule is not monotone in MTBF across the switch (Daly 2006 as published)
    assert daly_interval(200.0, 100.0) == 100.0
    assert daly_interval(200.0, 101.0) == pytest.approx(89.776, abs=1e-3)


@pytest.mark.parametrize(
    "call",
    [
        lambda: young_interval(2, 3600),
        lambda: daly_interval(2, 3600),
        lambda: daly_interval(10, 4),  # the d >= 2M branch returns the MTBF itself
        lambda: unsaved_training_time(2, 600),
        lambda: wasted_training_time(600, 3, 36_000, 18_000),
        lambda: estimate_mtbf(100, 4),
    ],
)
def test_integer_arguments_give_floats(call: Callable[[], float | None]) -> None:
    assert type(call()) is float


def test_wtt_by_hand() -> None:
    # 10 h of training, MTBF 5 h -> 2 failures; I = 600 s -> 60 saves of 3 s
    assert unsaved_training_time(2, 600.0) == 600.0
    assert wasted_training_time(600.0, 3.0, 36_000.0, 18_000.0) == pytest.approx(600 + 180)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((0, 600.0), 0.0),  # no failures: nothing lost
        ((0.5, 10.0), 2.5),  # an expected count may be fractional
        ((3, 1.0), 1.5),
    ],
)
def test_utt_by_hand(args: tuple[float, float], expected: float) -> None:
    assert unsaved_training_time(*args) == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((600.0, 0.0, 36_000.0, 18_000.0), 600.0),  # free saves: only the lost work
        ((600.0, 3.0, 0.0, 18_000.0), 0.0),  # no training, no waste
        ((100.0, 1.0, 1_000.0, 500.0), 100.0 + 10.0),  # 2 failures * 50 + 10 saves * 1
    ],
)
def test_wtt_edges_by_hand(args: tuple[float, float, float, float], expected: float) -> None:
    assert wasted_training_time(*args) == pytest.approx(expected)


@given(st.floats(0.01, 600), st.floats(60, 1e6))
def test_young_minimises_first_order_wtt(csbt: float, mtbf: float) -> None:
    best = young_interval(csbt, mtbf)
    train = 10 * mtbf
    at_best = wasted_training_time(best, csbt, train, mtbf)
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert at_best <= wasted_training_time(best * factor, csbt, train, mtbf) + 1e-6


@given(st.floats(0.01, 100), st.floats(1000, 1e6))
def test_daly_is_close_to_young_when_saves_are_short(csbt: float, mtbf: float) -> None:
    assert math.isclose(daly_interval(csbt, mtbf), young_interval(csbt, mtbf), rel_tol=0.2)


@given(seconds, seconds, st.floats(1.01, 10))
def test_intervals_grow_with_save_cost_and_mtbf(csbt: float, mtbf: float, k: float) -> None:
    # Dearer saves or rarer failures: checkpoint less often.
    assert young_interval(csbt * k, mtbf) >= young_interval(csbt, mtbf)
    assert young_interval(csbt, mtbf * k) >= young_interval(csbt, mtbf)
    assert daly_interval(csbt * k, mtbf) >= daly_interval(csbt, mtbf)
    if csbt < 2 * mtbf:
        # Daly's rule jumps at d = 2M (M just above, ~8M/9 just below: daly_interval(200, 100)
        # is 100, daly_interval(200, 101) ~89.8), so in MTBF it only grows within a regime.
        assert daly_interval(csbt, mtbf * k) >= daly_interval(csbt, mtbf)
    else:
        assert daly_interval(csbt, mtbf) == mtbf


@given(seconds, st.floats(0, 600), st.floats(0, 1e6), seconds, st.floats(1.01, 10))
def test_wtt_grows_with_save_cost_and_failure_rate(
    interval: float, csbt: float, train: float, mtbf: float, k: float
) -> None:
    base = wasted_training_time(interval, csbt, train, mtbf)
    assert wasted_training_time(interval, csbt * k, train, mtbf) >= base
    assert wasted_training_time(interval, csbt, train, mtbf / k) >= base  # failures more often
    assert wasted_training_time(interval, csbt, train * k, mtbf) >= base


def test_auto_interval_uses_history_and_clamps() -> None:
    choice = auto_interval(2.0, train_s=36_000.0, failures=10, min_s=30.0)  # MTBF 3600
    assert choice == IntervalChoice(daly_interval(2.0, 3600.0), "daly", 3600.0, 2.0)
    assert estimate_mtbf(100.0, 4) == 25.0
    assert estimate_mtbf(100.0, 0) == 100.0  # failure-free so far: as if one were due now
    assert estimate_mtbf(0.0, 0) is None  # nothing trained: no history at all
    assert estimate_mtbf(0.0, 3) == 0.0


def test_with_no_failure_yet_the_interval_starts_at_the_floor_and_grows_with_time() -> None:
    # The failure-free time stands in for the MTBF: one failure's worth of history at
    # every point, so the first failure never costs more than the interval then in force.
    chosen = [auto_interval(0.5, train_s=t, failures=0, min_s=30.0)
              for t in (0.0, 60.0, 1800.0, 3600.0, 36_000.0)]
    assert [c.method for c in chosen] == ["min", "min", "daly", "daly", "daly"]
    assert chosen[0] == IntervalChoice(30.0, "min", None, 0.5)
    assert chosen[2].interval_s == daly_interval(0.5, 1800.0)  # ~42 s
    assert chosen[4].interval_s == daly_interval(0.5, 36_000.0)  # ~190 s
    intervals = [c.interval_s for c in chosen]
    assert intervals == sorted(intervals) and intervals[-1] < 3600.0
    # continuous at the first failure: T failure-free seconds or one failure in T
    assert (auto_interval(0.5, 900.0, 0, min_s=30.0).interval_s
            == auto_interval(0.5, 900.0, 1, min_s=30.0).interval_s)


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        # no failure yet: the failure-free time is the MTBF estimate
        ((2.0, 36_000.0, 0), {}, IntervalChoice(daly_interval(2.0, 36_000.0), "daly",
                                                36_000.0, 2.0)),
        ((2.0, 36_000.0, 0), {"max_s": 300}, IntervalChoice(300.0, "max", 36_000.0, 2.0)),
        # nothing trained yet: the floor (30 s unless given), MTBF unknown
        ((2.0, 0.0, 0), {}, IntervalChoice(30.0, "min", None, 2.0)),
        ((2.0, 0.0, 0), {"min_s": 60}, IntervalChoice(60.0, "min", None, 2.0)),
        # failures but no training time yet: MTBF 0 says nothing either: the floor
        ((2.0, 0.0, 3), {}, IntervalChoice(30.0, "min", 0.0, 2.0)),
        # free saves: checkpoint as often as allowed (30 s)
        ((0.0, 100.0, 2), {}, IntervalChoice(30.0, "min", 50.0, 0.0)),
        # the optimum (~1.4 s) is below the floor: floor 30 s
        ((0.001, 100.0, 50), {}, IntervalChoice(30.0, "min", 2.0, 0.001)),
        ((0.001, 100.0, 50), {"min_s": 10}, IntervalChoice(10.0, "min", 2.0, 0.001)),
        # an MTBF of exactly 1 s is still a history to optimise for
        (
            (0.001, 5.0, 5),
            {"min_s": 0.01},
            IntervalChoice(daly_interval(0.001, 1.0), "daly", 1.0, 0.001),
        ),
        # the optimum above the ceiling: clamped to it
        ((2.0, 36_000.0, 10), {"max_s": 60}, IntervalChoice(60.0, "max", 3600.0, 2.0)),
        # Young: sqrt(2 * 2 * 3600) = 120 exactly; 120 on either bound is not clamped
        ((2.0, 36_000.0, 10), {"method": "young"}, IntervalChoice(120.0, "young", 3600.0, 2.0)),
        (
            (2.0, 36_000.0, 10),
            {"method": "young", "max_s": 120},
            IntervalChoice(120.0, "young", 3600.0, 2.0),
        ),
        (
            (2.0, 36_000.0, 10),
            {"method": "young", "min_s": 120, "max_s": 120},
            IntervalChoice(120.0, "young", 3600.0, 2.0),
        ),
        (
            (2.0, 36_000.0, 10),
            {"method": "young", "min_s": 121},
            IntervalChoice(121.0, "min", 3600.0, 2.0),
        ),
        # csbt 1 s is an ordinary save cost, not a special case
        (
            (1.0, 36_000.0, 10),
            {"method": "young"},
            IntervalChoice(math.sqrt(7200), "young", 3600.0, 1.0),
        ),
    ],
)
def test_auto_interval_choices(
    args: tuple[float, float, int], kwargs: dict[str, object], expected: IntervalChoice
) -> None:
    choice = auto_interval(*args, **{"min_s": 30.0, **kwargs})  # type: ignore[arg-type]
    assert choice == expected
    assert type(choice.interval_s) is float and type(choice.csbt_s) is float


@given(
    st.floats(0, 600), st.floats(0, 1e6), st.integers(0, 1000), st.sampled_from(["daly", "young"])
)
def test_auto_interval_stays_within_bounds(
    csbt: float, train: float, failures: int, method: str
) -> None:
    choice = auto_interval(csbt, train, failures, min_s=30, max_s=3600, method=method)
    assert 30 <= choice.interval_s <= 3600
    assert choice.method in ("min", "max", method)
    if choice.method == method:
        assert choice.mtbf_s is not None
        optimum = daly_interval if method == "daly" else young_interval
        assert choice.interval_s == optimum(csbt, choice.mtbf_s)


def test_the_floor_is_set_by_what_a_save_costs() -> None:
    # a save costing 0.3 s may come every 3 s (a tenth of the time between saves) ...
    assert interval_floor(0.3) == pytest.approx(3.0)
    assert interval_floor(0.3, max_share=0.05) == pytest.approx(6.0)
    # ... but not before the one in flight has committed
    assert interval_floor(0.3, save_s=4.5) == 4.5
    # a dear save, a long floor: no fixed 30 s either way
    assert interval_floor(12.0, save_s=20.0) == pytest.approx(120.0)


@given(st.floats(1e-6, 600), st.floats(0, 600), st.floats(1e-3, 1.0))
def test_a_save_never_costs_more_than_its_share_of_the_floor(
        cost: float, save: float, share: float) -> None:
    floor = interval_floor(cost, save, max_share=share)
    assert floor >= save and cost / floor <= share * (1 + 1e-9)


# The message is the contract: it names the argument, the bound and the value given.
GT0 = "must be a finite number > 0, got"
GE0 = "must be a finite number >= 0, got"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: young_interval(-1, 10), f"csbt_s {GT0} -1"),
        (lambda: young_interval(0, 10), f"csbt_s {GT0} 0"),
        (lambda: young_interval(1, 0), f"mtbf_s {GT0} 0"),
        (lambda: young_interval(1, math.nan), f"mtbf_s {GT0} nan"),
        (lambda: young_interval(Fraction(1), 10), f"csbt_s {GT0} Fraction(1, 1)"),  # type: ignore[arg-type]
        (lambda: daly_interval(0, 10), f"csbt_s {GT0} 0"),
        (lambda: daly_interval(1, math.inf), f"mtbf_s {GT0} inf"),
        (lambda: daly_interval(1, -2.5), f"mtbf_s {GT0} -2.5"),
        (lambda: unsaved_training_time(-1, 10), f"failures {GE0} -1"),
        (lambda: unsaved_training_time(1, 0), f"interval_s {GT0} 0"),
        (lambda: unsaved_training_time(1, math.inf), f"interval_s {GT0} inf"),
        (lambda: wasted_training_time(0, 1, 1, 1), f"interval_s {GT0} 0"),
        (lambda: wasted_training_time(1, -1, 1, 1), f"csbt_s {GE0} -1"),
        (lambda: wasted_training_time(1, 1, -1, 1), f"train_s {GE0} -1"),
        (lambda: wasted_training_time(1, 1, 1, 0), f"mtbf_s {GT0} 0"),
        (lambda: estimate_mtbf(-1, 1), f"train_s {GE0} -1"),
        (lambda: estimate_mtbf(math.nan, 1), f"train_s {GE0} nan"),
        (lambda: estimate_mtbf(10, -1), "failures must be >= 0, got -1"),
        (lambda: auto_interval(-1, 10, 1, min_s=30), f"csbt_s {GE0} -1"),
        (lambda: auto_interval(1, -10, 1, min_s=30), f"train_s {GE0} -10"),
        (lambda: auto_interval(1, 10, -1, min_s=30), "failures must be >= 0, got -1"),
        (lambda: auto_interval(1, 10, 1, min_s=0), f"min_s {GT0} 0"),
        (lambda: interval_floor(0), f"cost_s {GT0} 0"),
        (lambda: interval_floor(1, -1), f"save_s {GE0} -1"),
        (lambda: interval_floor(1, max_share=2), "max_share must be <= 1, got 2"),
        (lambda: auto_interval(1, 10, 1, max_s=math.inf, min_s=30), f"max_s {GT0} inf"),
        (
            lambda: auto_interval(1, 10, 1, min_s=100, max_s=10),
            "min_s (100.0) must be <= max_s (10.0)",
        ),
        (
            lambda: auto_interval(1, 10, 1, method="magic", min_s=30),
            "method must be 'daly' or 'young', got 'magic'",
        ),
    ],
)
def test_bad_arguments_are_named(call: Callable[[], object], message: str) -> None:
    with pytest.raises(CheckpointMathError) as info:
        call()
    assert str(info.value) == message
