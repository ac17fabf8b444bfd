"""What moved a fleet ratio between two periods, group by group (shift-share).

A fleet figure such as ETT% or a Level-2 share is a ratio of sums over groups (tenants,
models): `s = sum(part_g) / sum(whole_g)`, GPU-seconds over GPU-seconds. Its change from
period 1 to period 2 splits exactly into one contribution per group:

    contribution_g = w2_g * (s2_g - s1_g)  +  (w2_g - w1_g) * (s1_g - s1)
                     ^ the group itself got    ^ the group's weight moved, and it was
                       better or worse           above or below the fleet before

where `w_g = whole_g / sum(whole)` is the group's weight and `s_g` its own ratio. Summed
over the groups, the first terms and the second give `s2 - s1` exactly (the algebra is in
docs/decisions/0029-alerts-and-movers.md). A group that only appears in period 2 (it
entered) takes `s1_g = s2_g`: it contributes by how far it sits from the old fleet figure;
a group that left contributes minus its old weight times its old distance. A group of
the same size and the same ratio in both periods contributes 0, whatever its ratio: a
model that was always slow did not move anything.

The two periods may have different lengths (a day against a week): only the weights and
ratios enter, never absolute sums. Pure: no Airflow, no SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Amounts:
    """A group's sums in one period: `part` of `whole` (e.g. lost GPU-hours of GPU-hours)."""

    part: float
    whole: float


@dataclass(frozen=True, slots=True)
class Contribution:
    """One group's share of a ratio's change, in the ratio's unit (percentage points when
    the ratio is a percentage). `rate` + `mix` == `points`."""

    group: str
    points: float
    rate: float  # the group's own ratio moved
    mix: float  # the group's weight moved
    before_pct: float | None  # the group's ratio in period 1 (None: it was absent)
    after_pct: float | None  # in period 2 (None: it left)


def ratio_pct(amounts: Mapping[str, Amounts]) -> float | None:
    """`100 * sum(part) / sum(whole)`; None when there is no whole."""
    whole = sum(a.whole for a in amounts.values())
    return 100.0 * sum(a.part for a in amounts.values()) / whole if whole > 0 else None


def contributions(before: Mapping[str, Amounts], after: Mapping[str, Amounts]
                  ) -> list[Contribution]:
    """Every group's contribution to the change of the ratio (in percentage points), the
    largest in size first (ties by name). Empty when either period has no whole: a change
    from or to nothing has no split."""
    fleet_before = ratio_pct(before)
    whole_before = sum(a.whole for a in before.values())
    whole_after = sum(a.whole for a in after.values())
    if fleet_before is None or whole_after <= 0:
        return []
    out = []
    for group in sorted(set(before) | set(after)):
        b, a = before.get(group), after.get(group)
        s1 = 100.0 * b.part / b.whole if b is not None and b.whole > 0 else None
        s2 = 100.0 * a.part / a.whole if a is not None and a.whole > 0 else None
        w1 = b.whole / whole_before if b is not None else 0.0
        w2 = a.whole / whole_after if a is not None else 0.0
        base = s1 if s1 is not None else (s2 if s2 is not None else fleet_before)
        rate = w2 * ((s2 if s2 is not None else base) - base)
        mix = (w2 - w1) * (base - fleet_before)
        out.append(Contribution(group=group, points=rate + mix, rate=rate, mix=mix,
                                before_pct=s1, after_pct=s2))
    out.sort(key=lambda c: (-abs(c.points), c.group))
    return out
