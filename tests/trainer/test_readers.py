"""The typed readers every config entry point uses: nothing a person typed is coerced."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.trainer.readers import Reader, show


class Bad(ValueError):
    pass


R = Reader("where", Bad)


@pytest.mark.parametrize(("read", "value", "message"), [
    (lambda v: R.boolean("compile", v), "no", "where: compile = 'no': must be true or false"),
    (lambda v: R.boolean("record", v), 0, "record = 0: must be true or false"),
    (lambda v: R.integer("num_dense", v), 8.9, "num_dense = 8.9: must be an integer"),
    (lambda v: R.integer("num_dense", v), 8.0, "num_dense = 8.0: must be an integer"),
    (lambda v: R.integer("steps", v), True, "steps = True: must be an integer"),
    (lambda v: R.integer("steps", v, minimum=1), 0, "steps = 0: must be >= 1"),
    (lambda v: R.integer("seed", v, maximum=9), 10, "seed = 10: must be <= 9"),
    (lambda v: R.number("grace_s", v, above=0), math.inf, "grace_s = inf: must be a finite"),
    (lambda v: R.number("log_every_s", v, above=0), math.nan, "log_every_s = nan: must be a "
                                                             "finite number > 0"),
    (lambda v: R.number("lr", v, above=0), 10**400, "must be a finite number > 0"),
    (lambda v: R.number("lr", v, above=0), False, "lr = False: must be a number"),
    (lambda v: R.number("lr", v, above=0), "0.1", "lr = '0.1': must be a number"),
    (lambda v: R.number("lr", v, above=0), 0, "lr = 0: must be > 0"),
    (lambda v: R.sequence("tags", v), "abc", "tags = 'abc': must be a list"),
    (lambda v: R.sequence("tags", v), {"a": 1}, "tags = {'a': 1}: must be a list"),
    (lambda v: R.sequence("tags", v), {"a"}, "tags = {'a'}: must be a list"),
    (lambda v: R.strings("tags", v), ["a", 3], "tags[1] = 3: must be a string"),
    (lambda v: R.mapping("queues", v), ["gpu"], "queues = ['gpu']: must be a mapping"),
    (lambda v: R.mapping("faults", v), "kill", "faults = 'kill': must be a mapping"),
    (lambda v: R.mapping("m", v, known=("a",)), {"b": 1}, "unknown key(s) ['b']"),
    (lambda v: R.text("kind", v, choices=("x", "y")), "z", "kind = 'z': must be one of"),
    (lambda v: R.text("tenant", v), " ", "tenant = ' ': must be a non-empty string"),
    (lambda v: R.path("work_dir", v), "", "work_dir = '': must be a path"),
    (lambda v: R.path("work_dir", v), 5, "work_dir = 5: must be a path"),
])
def test_each_mistake_is_one_line_naming_field_and_value(read: Any, value: object,
                                                         message: str) -> None:
    with pytest.raises(Bad) as info:
        read(value)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_good_values_keep_their_type() -> None:
    assert R.boolean("b", False) is False
    assert R.integer("i", 3, minimum=1) == 3 and type(R.integer("i", 3)) is int
    assert R.number("f", 2) == 2.0 and R.number("f", 0.5, above=0) == 0.5
    assert R.strings("t", ["a", "b"]) == ("a", "b") and R.strings("t", ()) == ()
    assert R.path("p", "x", base=Path("/b")) == Path("/b/x")
    assert R.path("p", "/abs", base=Path("/b")) == Path("/abs")


def test_a_long_value_is_shown_cut_short() -> None:
    assert len(show("x" * 10_000)) == 100 and show("x" * 10_000).endswith("...")
    with pytest.raises(Bad) as info:
        R.integer("steps", "9" * 10_000)
    assert len(str(info.value)) < 200
