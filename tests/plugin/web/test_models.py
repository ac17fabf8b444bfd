"""The API's models carry every field of the structs they mirror, so a field the rollup or
the summary gains is either added to the API (and its schema) or fails here."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from airflow_ett.ett.summary import AttemptRow
from airflow_ett.plugin.web import models
from airflow_ett.report import timeline
from airflow_ett.rollup import day, figures, whatif

MIRRORS: list[tuple[type[BaseModel], type, set[str]]] = [
    (models.Group, figures.GroupFigures, set()),
    (models.Team, day.TeamFigures, set()),
    (models.Slo, day.SloRow, set()),
    (models.WhatIf, whatif.WhatIf, {"label"}),
    (models.RunLoss, day.RunLoss, {"href"}),
    (models.Attempt, AttemptRow, set()),
    (models.Bar, timeline.Bar, set()),
    (models.FailureMark, timeline.FailureMark, set()),
]


@pytest.mark.parametrize(("model", "struct", "extra"), MIRRORS,
                         ids=[m.__name__ for m, _, _ in MIRRORS])
def test_models_mirror_the_structs(model: type[BaseModel], struct: type,
                                   extra: set[str]) -> None:
    assert set(model.model_fields) == set(struct.__struct_fields__) | extra


def test_the_day_model_carries_every_part_of_a_day_rollup() -> None:
    carried = set(models.Day.model_fields)
    left_out = {"version"}  # the JSON form's version: the API is versioned by its path
    assert set(day.DayRollup.__struct_fields__) - left_out <= carried
