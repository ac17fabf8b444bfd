"""A trainer checkpoint's `extra`: written by the trainer's saves (`train_extra`), read
back by discovery, restore, preflight and the final state (`read_train_extra`)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from airflow_ett.trainer.state import (
    ExtraError,
    TrainExtra,
    read_train_extra,
    set_rng_state,
    train_extra,
)


def test_the_extra_a_save_writes_reads_back_whole_through_json() -> None:
    extra = train_extra(step=6, cursor=192, model="dlrm_tiny", model_identity="ab12",
                        world_size=2, bad_rows=3)
    marker_json = json.loads(json.dumps(dict(extra)))  # as the commit marker holds it
    assert read_train_extra(marker_json, where="step-6") == extra
    torch.manual_seed(1)  # the generators restored from it give what they would have
    saved = train_extra(step=1, cursor=0, model="m", model_identity="i", world_size=1,
                        bad_rows=0)
    want = torch.rand(4)
    set_rng_state(read_train_extra(json.loads(json.dumps(dict(saved))), where="s")["rng"])
    assert torch.equal(torch.rand(4), want)


def test_an_older_trainers_extra_reads_with_what_it_has() -> None:
    """Step and cursor are every trainer's; the rest came later (model_identity after
    `model`, bad_rows with owners' files) and are left out when absent."""
    old: TrainExtra = {"step": 3, "cursor": 96}
    assert read_train_extra({"step": 3, "cursor": 96, "model": None, "unknown": 1},
                            where="step-3") == old


@pytest.mark.parametrize(("extra", "says"), [
    ([1], "extra = [1]: must be a mapping"),
    ({"cursor": 1}, "step = None: must be an integer >= 0"),
    ({"step": 1, "cursor": -1}, "cursor = -1: must be >= 0"),
    ({"step": 1, "cursor": 1, "rng": {"cpu": 5}}, "rng.cpu = 5: must be a string"),
    ({"step": 1, "cursor": 1, "world_size": 0}, "world_size = 0: must be >= 1"),
    ({"step": 1, "cursor": 1, "bad_rows": "2"}, "bad_rows = '2': must be an integer"),
])
def test_a_damaged_extra_names_the_checkpoint_field_and_value(extra: object, says: str
                                                              ) -> None:
    with pytest.raises(ExtraError, match=f"checkpoint step-9: extra: {re.escape(says)}"):
        read_train_extra(extra, where="step-9")
