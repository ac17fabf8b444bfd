"""What a job's submission says about it beyond its timeline: its GPUs (`world_size`, the
weight of its GPU-hours in the fleet rollup) and whether it is synthetic; and the bounds
on the free-form `attrs` it may carry."""

from __future__ import annotations

import json

import pytest

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import (
    MAX_NESTING,
    MAX_WORLD_SIZE,
    AttemptEnded,
    AttemptStarted,
    EventError,
    JobEnded,
    JobSubmitted,
    parse_line,
)
from airflow_ett.ett.synthetic import JobSpec, simulate
from tests.factories import T0


def _job(submitted: JobSubmitted | None) -> list:
    rest = [AttemptStarted(id="s", job="j", ts=T0 + 1, attempt="1"),
            AttemptEnded(id="e", job="j", ts=T0 + 5, attempt="1", status="success"),
            JobEnded(id="d", job="j", ts=T0 + 5, status="success")]
    return ([submitted] if submitted else []) + rest


@pytest.mark.parametrize(("submitted", "world_size", "synthetic"), [
    (JobSubmitted(id="a", job="j", ts=T0, world_size=8, attrs={"synthetic": True}), 8, True),
    (JobSubmitted(id="a", job="j", ts=T0), 1, False),
    (JobSubmitted(id="a", job="j", ts=T0, attrs={"synthetic": "yes"}), 1, False),  # not True
    (JobSubmitted(id="a", job="j", ts=T0, attrs={"synthetic": 1}), 1, False),
    (None, 1, False),  # no submission at all: the defaults
])
def test_world_size_and_the_synthetic_mark_reach_the_summary(
        submitted: JobSubmitted | None, world_size: int, synthetic: bool) -> None:
    result = attribute_job(_job(submitted))
    assert (result.world_size, result.synthetic) == (world_size, synthetic)
    summary = result.summary()
    assert (summary.world_size, summary.synthetic) == (world_size, synthetic)
    assert summary.to_dict()["world_size"] == world_size


def test_the_simulator_reports_its_world_size() -> None:
    assert attribute_job(simulate(JobSpec(world_size=4))).world_size == 4
    assert JobSpec(batch=1).batch == 1  # the smallest batch is allowed


def _submitted(**fields: object) -> str:
    return json.dumps({"type": "job_submitted", "id": "a", "job": "j", "ts": T0, **fields})


@pytest.mark.parametrize("world_size", [1, 2, MAX_WORLD_SIZE])
def test_a_world_size_in_bounds_is_kept(world_size: int) -> None:
    assert parse_line(_submitted(world_size=world_size)).world_size == world_size  # type: ignore[union-attr]


@pytest.mark.parametrize("world_size", [0, -1, MAX_WORLD_SIZE + 1])
def test_a_world_size_out_of_bounds_is_refused_naming_it(world_size: int) -> None:
    with pytest.raises(EventError) as caught:
        parse_line(_submitted(world_size=world_size))
    assert (caught.value.field, caught.value.value) == ("world_size", world_size)
    assert f"must be a GPU count in [1, {MAX_WORLD_SIZE}]" in str(caught.value)


def _nested(depth: int, kind: str) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_attrs_may_nest_up_to_the_bound_and_no_deeper(kind: str) -> None:
    # attrs itself is one level: its values may nest MAX_NESTING - 1 more
    ok = parse_line(_submitted(attrs={"v": _nested(MAX_NESTING - 1, kind)}))
    assert ok.attrs["v"] == _nested(MAX_NESTING - 1, kind)  # type: ignore[union-attr]
    with pytest.raises(EventError) as caught:
        parse_line(_submitted(attrs={"v": _nested(MAX_NESTING, kind)}))
    assert caught.value.field == "attrs"
    assert f"nested deeper than {MAX_NESTING} levels" in str(caught.value)
