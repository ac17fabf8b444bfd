"""Fleet figures weigh GPU time: stored days, tenants, models, teams and parts reweighed.

Revision ID: 0003
Revises: 0002
Create Date: 2027-01-15

Rollup version 1 weighed ETT% and the Level-2 shares of a group of jobs by seconds, so a
1-GPU job counted as much as a 64-GPU one; version 2 weighs GPU-seconds, and a group
with no GPU time (a day with no job) has no ETT% (decision 0010). Every stored figure the
change touches is a function of GPU-hours the rows already hold (the GPU-hours and the
GPU-hours lost by component of each group, the GPU-hours each what-if saves), so the
upgrade recomputes them from the rows alone, in this transaction: no event is read
again, and a store whose events were pruned keeps its history. GPU-hours are turned back
into the integer GPU-microseconds they were divided from (exact below 2**53, about 2.5
million GPU-hours a day), so a migrated day equals the day the new rollup stores for the
same jobs (tests/store/test_store_migrations.py, on SQLite and PostgreSQL).

`ett_daily_days.ett_pct` becomes nullable: a day with no job stores NULL, not 0.

The downgrade writes version 1 back from the seconds the rows also keep (the old code
cannot read a NULL ETT%). Self-contained on purpose: the JSON as it is stored, not the
rollup's classes, so the migration means the same thing whatever the code does later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMPONENTS: Final = ("scheduling", "initialization", "compilation", "effective_training",
                     "wasted_training", "shutdown")
EFFECTIVE: Final = "effective_training"
US_PER_S: Final = 1_000_000
US_PER_H: Final = 3600 * US_PER_S
_TARGET: Final = re.compile(r"^(<|>=)([0-9.eE+-]+)%$")

Json = dict[str, Any]

_days = sa.table("ett_daily_days", sa.column("day", sa.String()),
                 sa.column("ett_pct", sa.Double()), sa.column("payload", sa.Text()))
_groups = sa.table("ett_daily_groups", sa.column("day", sa.String()),
                   sa.column("scope", sa.String()), sa.column("key", sa.String()),
                   sa.column("ett_pct", sa.Double()), sa.column("payload", sa.Text()))


def _us(value: float, unit: int) -> int:
    return round(value * unit)


class _Basis:
    """How a version weighs: GPU-seconds (2) or seconds (1)."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu

    def whole_and_parts(self, g: Json) -> tuple[int, dict[str, int]]:
        """A group's whole and each component's part of it, in integer microseconds."""
        if self.gpu:
            lost = {c: _us(v, US_PER_H) for c, v in g["gpu_hours_lost_by_component"].items()}
            whole = _us(g["gpu_hours"], US_PER_H)
            return whole, {**lost, EFFECTIVE: whole - sum(lost.values())}
        seconds = g["components_s"]
        return (_us(g["e2e_s"], US_PER_S),
                {c: _us(seconds.get(c, 0.0), US_PER_S) for c in COMPONENTS})

    def share(self, part: int, whole: int) -> float | None:
        if whole > 0:
            return 100.0 * part / whole
        return None if self.gpu else 0.0

    def saved(self, w: Json) -> int:
        return (_us(w["gpu_hours_saved"], US_PER_H) if self.gpu
                else _us(w["e2e_s_saved"], US_PER_S))


def _group(g: Json, basis: _Basis) -> Json:
    whole, parts = basis.whole_and_parts(g)
    shares = {c: basis.share(parts.get(c, 0), whole) for c in COMPONENTS}
    return {**g, "ett_pct": shares[EFFECTIVE], "shares_pct": shares}


def _status(row: Json, share: float | None) -> str:
    bound_max, bound_min = row.get("max_share_pct"), row.get("min_share_pct")
    if bound_max is None and bound_min is None:  # a row from before the bounds were kept
        match = _TARGET.match(str(row.get("target", "")))
        if match is not None:
            bound_max, bound_min = ((float(match[2]), None) if match[1] == "<"
                                    else (None, float(match[2])))
    if share is None:
        return "none"
    if bound_max is not None:
        return "ok" if share < bound_max else "breach"
    if bound_min is not None:
        return "ok" if share >= bound_min else "breach"
    return "none"


def _what_if(day: Json, fleet: Json, basis: _Basis) -> list[Json]:
    whole, parts = basis.whole_and_parts(fleet)
    if basis.gpu and whole <= 0:
        return []
    effective = parts[EFFECTIVE]
    before = basis.share(effective, whole) or 0.0
    rows = []
    for w in day["what_if"]:
        after = 100.0 * effective / (whole - basis.saved(w)) if whole - basis.saved(w) > 0 \
            else 0.0
        rows.append({**w, "ett_pct_before": before, "ett_pct_after": after,
                     "gain_pts": after - before})
    return sorted(rows, key=lambda w: (-w["gain_pts"], w["kind"],
                                       COMPONENTS.index(w["component"])))


def _day(day: Json, basis: _Basis) -> Json:
    fleet = _group(day["fleet"], basis)
    has_time = (fleet["ett_pct"] is not None) if basis.gpu else day["fleet"]["e2e_s"] > 0
    slo = []
    for row in day["slo"]:
        share = fleet["shares_pct"][row["component"]]
        slo.append({**row, "share_pct": share,
                    "status": _status(row, share) if has_time else "none"})
    by_component = {row["component"]: row for row in slo}
    teams = []
    for t in day["teams"]:
        shares = [by_component[c]["share_pct"] for c in t["components"]]
        teams.append({**t, "share_pct": None if None in shares else sum(shares),
                      "breaches": [c for c in t["components"]
                                   if by_component[c]["status"] == "breach"]})
    return {**day, "fleet": fleet,
            "tenants": {k: _group(g, basis) for k, g in day["tenants"].items()},
            "models": {k: _group(g, basis) for k, g in day["models"].items()},
            "slo": slo, "teams": teams, "what_if": _what_if(day, fleet, basis),
            "version": 2 if basis.gpu else 1}


def _part_ett(part: Json, basis: _Basis) -> float | None:
    """A part's ETT% from its exact sums (`rollup.figures.Totals`)."""
    totals = part["totals"]
    if basis.gpu:
        whole = totals["gpu_us"]
        return basis.share(whole - sum(totals["lost_gpu_us"].values()), whole)
    return basis.share(totals["components_us"].get(EFFECTIVE, 0), totals["e2e_us"])


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _rewrite(conn: sa.Connection, basis: _Basis, wanted: Callable[[Json], bool]) -> None:
    """Every stored day whose payload `wanted` picks, and its groups, reweighed."""
    for day_key, payload in conn.execute(sa.select(_days.c.day, _days.c.payload)).all():
        stored = json.loads(payload)
        if not wanted(stored):
            continue
        day = _day(stored, basis)
        ett = day["fleet"]["ett_pct"]
        conn.execute(sa.update(_days).where(_days.c.day == day_key)
                     .values(ett_pct=ett, payload=_dumps(day)))
        teams = {t["team"]: t for t in day["teams"]}
        groups = conn.execute(sa.select(_groups.c.scope, _groups.c.key, _groups.c.payload)
                              .where(_groups.c.day == day_key)).all()
        for scope, key, group_payload in groups:
            group = json.loads(group_payload)
            if scope in ("tenant", "model"):
                group = _group(group, basis)
                values: Json = {"ett_pct": group["ett_pct"], "payload": _dumps(group)}
            elif scope == "team" and key in teams:
                values = {"payload": _dumps(teams[key])}
            elif scope == "part":
                values = {"ett_pct": _part_ett(group, basis)}
            else:
                continue
            conn.execute(sa.update(_groups).where(_groups.c.day == day_key,
                                                  _groups.c.scope == scope,
                                                  _groups.c.key == key).values(**values))


def upgrade() -> None:
    with op.batch_alter_table("ett_daily_days") as batch:
        batch.alter_column("ett_pct", existing_type=sa.Double(), nullable=True)
    _rewrite(op.get_bind(), _Basis(gpu=True), lambda day: day.get("version", 1) < 2)


def downgrade() -> None:
    _rewrite(op.get_bind(), _Basis(gpu=False), lambda day: day.get("version", 1) >= 2)
    conn = op.get_bind()
    conn.execute(sa.update(_days).where(_days.c.ett_pct.is_(None)).values(ett_pct=0.0))
    with op.batch_alter_table("ett_daily_days") as batch:
        batch.alter_column("ett_pct", existing_type=sa.Double(), nullable=False)
