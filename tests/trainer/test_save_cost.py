"""What a save costs the loop (`trainer/save_cost.py`): the steps beside a background save
against the steady ones, on a clock the test drives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_ett.trainer.save_cost import COST_SAMPLE, MIN_STEADY, MeasuredSave, SaveCost, typical


def _steps(meter: SaveCost, clock: list[float], durations: list[float], *, saving: bool
           ) -> list[MeasuredSave | None]:
    out = []
    for took in durations:
        clock[0] += took
        out.append(meter.step_ended(clock[0], saving=saving))
    return out


def _save(meter: SaveCost, clock: list[float], step: int, call_s: float,
          blocking_s: float, *, in_flight: bool = True) -> MeasuredSave | None:
    started = clock[0]
    clock[0] += call_s
    return meter.save_returned(step, started, clock[0], blocking_s, in_flight=in_flight)


def test_a_background_save_costs_its_blocking_plus_the_steps_it_slowed() -> None:
    meter, clock = SaveCost(), [100.0]
    assert _steps(meter, clock, [5.0], saving=False) == [None]  # the first: start-up
    _steps(meter, clock, [0.10, 0.11, 0.09, 0.10, 0.10, 0.10], saving=False)
    _save(meter, clock, 7, call_s=0.05, blocking_s=0.04)
    # three steps while it is written, the fourth during which it commits, 0.05 s slower
    # each; the call's time is no step's
    assert _steps(meter, clock, [0.15, 0.15, 0.15], saving=True) == [None] * 3
    [save] = _steps(meter, clock, [0.15], saving=False)
    assert save is not None and meter.last == save
    assert (save.step, save.steps, save.blocking_s) == (7, 4, 0.04)
    assert save.slowdown_s == pytest.approx(0.20)
    assert save.cost_s == pytest.approx(0.24)
    assert save.duration_s == pytest.approx(0.05 + 0.60)
    # the steps after the commit are steady again
    assert _steps(meter, clock, [0.10, 0.10], saving=False) == [None, None]


def test_a_save_committed_inside_its_call_costs_its_blocking() -> None:
    meter, clock = SaveCost(), [0.0]
    _steps(meter, clock, [1.0] + [0.2] * MIN_STEADY, saving=False)
    save = _save(meter, clock, 6, call_s=0.5, blocking_s=0.5, in_flight=False)
    assert save is not None and (save.steps, save.slowdown_s, save.cost_s) == (0, 0.0, 0.5)
    assert save.duration_s == pytest.approx(0.5) and meter.last == save
    assert _steps(meter, clock, [0.2], saving=False) == [None]  # steady again


def test_without_a_steady_baseline_the_slowdown_is_unknown() -> None:
    meter, clock = SaveCost(), [0.0]
    _steps(meter, clock, [1.0] + [0.2] * (MIN_STEADY - 1), saving=False)
    _save(meter, clock, 4, call_s=0.01, blocking_s=0.01)
    _steps(meter, clock, [0.9, 0.9], saving=True)
    [save] = _steps(meter, clock, [0.2], saving=False)
    assert save is not None and save.slowdown_s is None and save.cost_s == 0.01


def test_a_save_still_in_flight_at_the_next_is_measured_up_to_it() -> None:
    meter, clock = SaveCost(), [0.0]
    _steps(meter, clock, [1.0] + [0.1] * MIN_STEADY, saving=False)
    _save(meter, clock, 6, call_s=0.01, blocking_s=0.01)
    _steps(meter, clock, [0.3, 0.3], saving=True)
    first = _save(meter, clock, 8, call_s=0.4, blocking_s=0.4)  # waited for the first
    assert first is not None and first == meter.last and first.step == 6
    assert meter.last.slowdown_s == pytest.approx(0.4)
    _steps(meter, clock, [0.1], saving=True)
    [save] = _steps(meter, clock, [0.1], saving=False)
    assert save is not None and save.step == 8 and save.steps == 2
    assert save.slowdown_s == pytest.approx(0.0)


@given(st.floats(0.01, 2.0), st.floats(0.0, 1.0), st.integers(1, 50), st.floats(0, 0.5))
def test_the_slowdown_is_the_extra_time_of_the_steps_beside_the_save(
        steady: float, extra: float, steps: int, blocking: float) -> None:
    meter, clock = SaveCost(), [0.0]
    _steps(meter, clock, [10.0] + [steady] * 20, saving=False)
    _save(meter, clock, 21, call_s=blocking, blocking_s=blocking)
    _steps(meter, clock, [steady + extra] * (steps - 1), saving=True)
    [save] = _steps(meter, clock, [steady + extra], saving=False)
    assert save is not None and save.steps == steps
    assert save.slowdown_s == pytest.approx(steps * extra, abs=1e-6)
    assert save.cost_s == pytest.approx(blocking + steps * extra, abs=1e-6)


def test_the_typical_save_is_the_median_of_the_latest() -> None:
    saves = [MeasuredSave(i, 0.01, slow, 3, 0.5) for i, slow in
             enumerate([9.0, 0.1, 0.3, None, 0.2, 5.0, 0.2])]
    latest = typical(saves)
    assert len(saves[-COST_SAMPLE:]) == 5 and latest.step == 6
    assert latest.slowdown_s == pytest.approx(0.25)  # median of 0.3, 0.2, 5.0, 0.2
    assert latest.blocking_s == 0.01 and latest.steps == 3
    assert typical([MeasuredSave(1, 0.5, None, 0, 0.5)]).slowdown_s is None
    with pytest.raises(ValueError):
        typical([])
