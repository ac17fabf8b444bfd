from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.rollup.figures import percentile, share_pct


@pytest.mark.parametrize(("values", "pct", "expected"), [
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 2, 3, 4], 90, 3.7),  # rank 2.7: 3 + 0.7 * (4 - 3)
    ([10], 90, 10),
    ([5, 1, 3], 0, 1),
    ([5, 1, 3], 100, 5),
    ([], 50, None),
])
def test_percentiles_by_hand(values: list[float], pct: float, expected: float | None) -> None:
    got = percentile(values, pct)
    assert got == (None if expected is None else pytest.approx(expected))


@given(st.lists(st.floats(0, 1e6), min_size=1), st.floats(0, 100))
def test_a_percentile_lies_within_the_values(values: list[float], pct: float) -> None:
    p = percentile(values, pct)
    assert p is not None and min(values) <= p <= max(values) * (1 + 1e-12)


def test_bad_percentile_and_empty_shares() -> None:
    with pytest.raises(ValueError, match="pct: 101"):
        percentile([1.0], 101)
    assert share_pct(5, 0) == 0.0 and share_pct(1, 4) == 25.0
