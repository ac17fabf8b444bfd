"""Typed readers for every value a person types: one set, used by every config entry point.

The trainer's TOML/JSON config, the model configs, the `training_job(...)` factory, the
operators' arguments and the trigger form's params all read their values through these,
so that a mistake fails the same way everywhere: one line naming the field and the value,
before any work starts. Nothing is coerced: `"no"` is not a boolean (Python's `bool("no")`
is True), `8.9` is not an integer (`int(8.9)` is 8), a string is not a list of tags
(`list("abc")` is three), `True` is not an integer (`isinstance(True, int)` holds) and
`nan`/`inf` are not durations or learning rates (every comparison with nan is False, so a
range check alone lets it through).

Torch-free and Airflow-free: DAG files call these at parse time.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

_MAX_SHOWN = 100

_Choice = TypeVar("_Choice", bound=str)


def show(value: object) -> str:
    """`repr(value)` on one line, cut short: a pasted blob must not flood the message."""
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else f"{text[:_MAX_SHOWN - 3]}..."


class Reader:
    """Reads typed values for one entry point; errors are `error(f"{where}: {name} = ...")`.

    `where` says whose field it is (`trainer config`, `training_job`, an operator's
    name); empty: the name stands alone (`DAG param 'steps'`).
    """

    def __init__(self, where: str, error: type[ValueError]) -> None:
        self.where = where
        self.error = error

    def fail(self, name: str, value: object, why: str) -> ValueError:
        prefix = f"{self.where}: " if self.where else ""
        return self.error(f"{prefix}{name} = {show(value)}: {why}")

    def boolean(self, name: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.fail(name, value, "must be true or false (a boolean, not a string "
                                         "or number)")
        return value

    def integer(self, name: str, value: object, *, minimum: int | None = None,
                maximum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise self.fail(name, value, "must be an integer" + _bounds(minimum, maximum))
        out = int(value)
        if (minimum is not None and out < minimum) or (maximum is not None and out > maximum):
            raise self.fail(name, value, "must be" + _bounds(minimum, maximum))
        return out

    def number(self, name: str, value: object, *, minimum: float | None = None,
               above: float | None = None, maximum: float | None = None) -> float:
        """A finite real number (an int is fine: `lr = 1`); `above` is an exclusive bound."""
        bounds = _bounds(minimum, maximum, above)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise self.fail(name, value, "must be a number" + bounds)
        try:
            out = float(value)
        except OverflowError:
            out = math.inf
        if not math.isfinite(out):
            raise self.fail(name, value, "must be a finite number" + bounds)
        if ((minimum is not None and out < minimum) or (above is not None and out <= above)
                or (maximum is not None and out > maximum)):
            raise self.fail(name, value, "must be" + bounds)
        return out

    def text(self, name: str, value: object, *, choices: Collection[str] | None = None,
             empty: bool = False, max_len: int | None = None) -> str:
        if not isinstance(value, str):
            raise self.fail(name, value, "must be a string" if choices is None
                            else f"must be one of {sorted(choices)}")
        if choices is not None and value not in choices:
            raise self.fail(name, value, f"must be one of {sorted(choices)}")
        if not empty and not value.strip():
            raise self.fail(name, value, "must be a non-empty string")
        if max_len is not None and len(value) > max_len:
            raise self.fail(name, value, f"must be at most {max_len} characters")
        return value

    def mapping(self, name: str, value: object, *,
                known: Collection[str] | None = None) -> Mapping[str, object]:
        """A mapping with string keys; `known`: no other keys (a typo is not ignored)."""
        if not isinstance(value, Mapping):
            raise self.fail(name, value, "must be a mapping (a table / dict / JSON object)")
        for key in value:
            if not isinstance(key, str):
                raise self.fail(f"{name} key", key, "must be a string")
        if known is not None:
            unknown = sorted(set(value) - set(known))
            if unknown:
                raise self.fail(name, dict(value), f"unknown key(s) {unknown}; known: "
                                                   f"{sorted(known)}")
        return value

    def sequence(self, name: str, value: object, *, min_len: int = 0) -> tuple[object, ...]:
        """A list or tuple: not a string (`list("abc")` is three items), not a mapping
        (its keys), not a set (no order)."""
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
            raise self.fail(name, value, "must be a list")
        if len(value) < min_len:
            raise self.fail(name, value, f"must have at least {min_len} item(s)")
        return tuple(value)

    def strings(self, name: str, value: object) -> tuple[str, ...]:
        return tuple(self.text(f"{name}[{i}]", item)
                     for i, item in enumerate(self.sequence(name, value)))

    def choice(self, name: str, value: object, choices: Sequence[_Choice]) -> _Choice:
        """One of `choices` (a `Literal`'s values), typed as that `Literal`."""
        self.text(name, value, choices=choices)
        return next(c for c in choices if c == value)

    def path(self, name: str, value: object, *, base: Path | None = None) -> Path:
        """A filesystem path (str or PathLike, non-empty); relative ones are under `base`."""
        if not isinstance(value, str | os.PathLike) or not str(os.fspath(value)).strip():
            raise self.fail(name, value, "must be a path (a non-empty string)")
        p = Path(os.fspath(value)).expanduser()
        return p if p.is_absolute() or base is None else base / p


def _bounds(minimum: float | None, maximum: float | None, above: float | None = None) -> str:
    parts = [f">= {minimum}" if minimum is not None else "",
             f"> {above}" if above is not None else "",
             f"<= {maximum}" if maximum is not None else ""]
    shown = " and ".join(p for p in parts if p)
    return f" {shown}" if shown else ""
