from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.ett.checkpoint_math import (
    CheckpointMathError,
    auto_interval,
    daly_interval,
    estimate_mtbf,
    unsaved_training_time,
    wasted_training_time,
    young_interval,
)


def test_young_by_hand() -> None:
    # CSBT 2 s, MTBF 1 h: sqrt(2 * 2 * 3600) = 120 s
    assert young_interval(2.0, 3600.0) == pytest.approx(120.0)


def test_daly_by_hand() -> None:
    # d = 2, M = 3600: sqrt(14400) * (1 + sqrt(1/3600)/3 + (1/3600)/9) - 2
    expected = 120.0 * (1 + (1 / 60) / 3 + (1 / 3600) / 9) - 2.0
    assert daly_interval(2.0, 3600.0) == pytest.approx(expected)
    assert daly_interval(10.0, 4.0) == 4.0  # d >= 2M: checkpoint every MTBF


def test_wtt_by_hand() -> None:
    # 10 h of training, MTBF 5 h -> 2 failures; I = 600 s -> 60 saves of 3 s
    assert unsaved_training_time(2, 600.0) == 600.0
    assert wasted_training_time(600.0, 3.0, 36_000.0, 18_000.0) == pytest.approx(600 + 180)


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


def test_auto_interval_uses_history_and_clamps() -> None:
    choice = auto_interval(2.0, train_s=36_000.0, failures=10)  # MTBF 3600
    assert choice.method == "daly" and choice.mtbf_s == 3600.0
    assert choice.interval_s == pytest.approx(daly_interval(2.0, 3600.0))
    assert auto_interval(2.0, 36_000.0, 0).method == "max"  # no failures: longest interval
    assert auto_interval(2.0, 36_000.0, 0, max_s=900).interval_s == 900
    assert auto_interval(0.001, 100.0, 50, min_s=30).interval_s == 30
    assert estimate_mtbf(100.0, 4) == 25.0
    assert estimate_mtbf(100.0, 0) is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: young_interval(-1, 10), "csbt_s must be a finite number > 0, got -1"),
        (lambda: daly_interval(1, math.inf), "mtbf_s must be a finite number > 0, got inf"),
        (lambda: auto_interval(1, 10, 1, min_s=100, max_s=10), "min_s (100.0) must be <="),
        (lambda: auto_interval(1, 10, 1, method="magic"), "method must be 'daly' or 'young'"),
        (lambda: estimate_mtbf(10, -1), "failures must be >= 0, got -1"),
    ],
)
def test_bad_arguments_are_named(call: object, message: str) -> None:
    with pytest.raises(CheckpointMathError) as info:
        call()  # type: ignore[operator]
    assert message in str(info.value)
