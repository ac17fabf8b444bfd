"""The rollup's figures for other tools: JSON (the stored `DayRollup` form, whole) and CSV
(one figure per row, long format: `day, scope, key, metric, value`), so that a spreadsheet
or a dashboard gets every number the text report shows without parsing text.

Scopes: `fleet`, `tenant`, `model` (the group figures, components and GPU-hours nested as
`components_s.<component>` ...), `team`, `slo`, `what_if` (key: its label) and `top_run`
(key: the job id). `--tenant` narrows both forms to that tenant's figures.

A text cell of the CSV that starts with `=`, `+`, `-`, `@`, a tab or a carriage return
gets a leading `'` (OWASP's advice against CSV injection): a spreadsheet would otherwise
run a tenant named `=HYPERLINK(...)` or `-2+3` as a formula. Numbers are written as
numbers, negative ones included; only text is changed. Text that starts with `'` itself
gets one more, so a reader that knows the rule drops one leading `'` and has the value
back (`csv_text`).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec

from airflow_ett.rollup import DayRollup, GroupFigures

CSV_COLUMNS = ("day", "scope", "key", "metric", "value")
#: What a spreadsheet reads as the start of a formula (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


_QUOTED = (*FORMULA_STARTS, "'")


def csv_cell(value: Any) -> Any:
    """A value as the CSV writes it: None empty, text starting like a formula (or with
    `'`) behind a `'`, anything else (numbers, booleans) as it is."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_QUOTED):
        return "'" + value
    return value


def csv_text(cell: str) -> str:
    """A text cell read back as the value it was (`csv_cell`'s inverse on text)."""
    return cell.removeprefix("'")


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(value, list):
        yield prefix, ";".join(str(v) for v in value)
    else:
        yield prefix, value


def _group_rows(day: str, scope: str, key: str, g: GroupFigures) -> Iterator[tuple[Any, ...]]:
    for metric, value in _flat("", msgspec.to_builtins(g)):
        yield day, scope, key, metric, value


def csv_rows(days: Sequence[DayRollup], *, tenant: str | None = None
             ) -> Iterator[tuple[Any, ...]]:
    for r in days:
        yield from (_fleet_rows(r) if tenant is None else _tenant_rows(r, tenant))


def _tenant_rows(r: DayRollup, tenant: str) -> Iterator[tuple[Any, ...]]:
    g = r.tenants.get(tenant)
    if g is not None:
        yield from _group_rows(r.day, "tenant", tenant, g)
    for run in r.top_runs:
        if run.tenant == tenant:
            yield from _struct_rows(r.day, "top_run", run.job, run, skip=("job",))


def _fleet_rows(r: DayRollup) -> Iterator[tuple[Any, ...]]:
    yield from _group_rows(r.day, "fleet", "", r.fleet)
    for scope, groups in (("tenant", r.tenants), ("model", r.models)):
        for key, g in groups.items():
            yield from _group_rows(r.day, scope, key, g)
    for team in r.teams:
        yield from _struct_rows(r.day, "team", team.team, team, skip=("team",))
    for slo in r.slo:
        yield from _struct_rows(r.day, "slo", slo.component, slo, skip=("component",))
    for w in r.what_if:
        yield from _struct_rows(r.day, "what_if", w.label, w)
    for run in r.top_runs:
        yield from _struct_rows(r.day, "top_run", run.job, run, skip=("job",))


def _struct_rows(day: str, scope: str, key: str, value: msgspec.Struct,
                 skip: tuple[str, ...] = ()) -> Iterator[tuple[Any, ...]]:
    for metric, v in _flat("", msgspec.to_builtins(value)):
        if metric not in skip:
            yield day, scope, key, metric, v


def to_csv(days: Sequence[DayRollup], *, tenant: str | None = None) -> str:
    return write_csv([CSV_COLUMNS, *csv_rows(days, tenant=tenant)])


def write_csv(rows: Iterable[Sequence[Any]]) -> str:
    """The rows as CSV text, each cell through `csv_cell`, each row ending in `\\n`.

    The writer ends rows in `\\r\\n`, each turned into `\\n` as it is written: the csv
    module quotes a field that holds a character of its line terminator and no other, so
    with `\\n` alone a name holding a carriage return went out unquoted and broke the
    file for every reader."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    for row in rows:
        writer.writerow([csv_cell(v) for v in row])
        out.seek(out.tell() - 2)
        out.write("\n")
        out.truncate()
    return out.getvalue()


def to_json(days: Sequence[DayRollup], *, tenant: str | None = None) -> str:
    """The days as stored (a list, oldest first); with `tenant`, each day's figures for it."""
    if tenant is None:
        payload: list[Any] = [msgspec.to_builtins(r) for r in days]
    else:
        payload = [{"day": r.day, "tz": r.tz, "tenant": tenant,
                    "figures": msgspec.to_builtins(r.tenants.get(tenant)),
                    "top_runs": [msgspec.to_builtins(x) for x in r.top_runs
                                 if x.tenant == tenant]} for r in days]
    return json.dumps(payload, indent=2) + "\n"
