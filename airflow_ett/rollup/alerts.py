"""The nightly rollup's alerts: one per Level-2 component that breached its SLO or got
worse than its baseline by more than a threshold (docs/decisions/0029-alerts-and-movers.md).

An alert names the component, its owning team, the day's share against the SLO, the
change against the baseline (the fleet over the `baseline_days` stored days before,
pooled: GPU time over GPU time, as every fleet figure), the tenants and models that moved
it most (`shift_share.contributions` over the day's and the baseline's groups) and the
fleet page of the day. A component both in breach and regressed is one alert with both
reasons: one message per component and day, so that a bad night is a handful of
messages to the teams that own them, never a flood.

"Worse" is up for the five lost components and down for effective training (ETT%).
Pure: rollups in, alerts out; sending is `operators/notify.py`'s.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Final, Literal

import msgspec

from airflow_ett.ett.phases import COMPONENTS, EFFECTIVE
from airflow_ett.rollup.alert_config import AlertsConfig
from airflow_ett.rollup.components import ComponentsConfig
from airflow_ett.rollup.day import DayRollup
from airflow_ett.rollup.figures import GroupFigures
from airflow_ett.rollup.shift_share import Amounts, contributions, ratio_pct

AlertReason = Literal["slo_breach", "regression"]
#: A mover must have moved the share by at least this much (points) to be named.
MIN_MOVER_POINTS: Final = 0.005


class Mover(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant or model and how much it moved the component's fleet share (points, the
    share's own sign: up for a lost component is worse, down for ETT%), of which
    `mix_points` by its weight in the fleet moving (`shift_share`), with its own share
    before and now."""

    name: str
    points: float
    mix_points: float
    before_pct: float | None  # None: it ran nothing in the baseline (it entered)
    now_pct: float | None  # None: it ran nothing that day (it left)

    def line(self, scope: str) -> str:
        why = ""
        if abs(self.mix_points) > abs(self.points - self.mix_points):
            why = ("; it entered" if self.before_pct is None else
                   "; it left" if self.now_pct is None else
                   "; mostly its weight in the fleet's GPU time moving")
        return (f"moved by {scope} {self.name}: {self.points:+.2f} points "
                f"({_share(self.before_pct)} -> {_share(self.now_pct)}{why})")


class Alert(msgspec.Struct, frozen=True, kw_only=True):
    day: str
    component: str
    owner: str
    reasons: list[AlertReason]
    share_pct: float  # the day's fleet share of the component (ETT% for effective training)
    target: str  # the SLO as shown (`<1%`, `>=90%`, `-`)
    baseline_pct: float | None  # None: no baseline day stored
    baseline_days: list[str]
    change_points: float | None  # share_pct - baseline_pct
    gpu_hours_lost: float  # that day, to this component (0 for effective training)
    tenants: list[Mover]
    models: list[Mover]
    link: str
    notify: list[str]  # the notifiers it goes to, by name

    @property
    def key(self) -> str:
        """What the store records as sent (with the notifier's name): a rerun of the day
        sends only what it has not sent yet."""
        return f"{self.day}/{self.component}"

    @property
    def subject(self) -> str:
        what = " and ".join({"slo_breach": "SLO breached",
                             "regression": "regression"}[r] for r in self.reasons)
        return (f"[ETT] {self.component} {what} on {self.day}: {_share(self.share_pct)} "
                f"(SLO {self.target}{_change(self.change_points)}) - {self.owner}")

    def lines(self) -> list[str]:
        """The message as plain lines (the text body; the HTML body escapes the same)."""
        label = "ETT%" if self.component == EFFECTIVE else f"{self.component}'s share"
        out = [f"owner: {self.owner}",
               f"{label} on {self.day}: {_share(self.share_pct)} of the fleet's GPU time "
               f"(SLO {self.target}{': BREACH' if 'slo_breach' in self.reasons else ''})"]
        if self.baseline_pct is not None and self.change_points is not None:
            days = self.baseline_days
            span = days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"
            out.append(f"baseline ({len(days)} day(s), {span}): {_share(self.baseline_pct)}"
                       f", change {self.change_points:+.2f} points"
                       + (" (regression)" if "regression" in self.reasons else ""))
        else:
            out.append("baseline: no stored day before it to compare with")
        if self.gpu_hours_lost:
            out.append(f"GPU-hours lost to it that day: {self.gpu_hours_lost:,.1f}")
        for scope, movers in (("tenant", self.tenants), ("model", self.models)):
            out.extend(m.line(scope) for m in movers)
        out.append(f"fleet page: {self.link}")
        return out

    @property
    def text(self) -> str:
        return "\n".join(self.lines()) + "\n"

    @property
    def html(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.lines()[:-1])
        link = html.escape(self.link, quote=True)
        return (f"<p>{html.escape(self.subject)}</p><ul>{items}</ul>"
                f'<p><a href="{link}">fleet page</a></p>')


def _share(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:.2f}%"


def _change(points: float | None) -> str:
    return "" if points is None else f", {points:+.2f} points vs baseline"


def _amounts(groups: Mapping[str, GroupFigures], component: str) -> dict[str, Amounts]:
    out = {}
    for name, g in groups.items():
        lost = g.gpu_hours_lost_by_component.get(component, 0.0)
        part = g.gpu_hours - g.gpu_hours_lost if component == EFFECTIVE else lost
        out[name] = Amounts(part=part, whole=g.gpu_hours)
    return out


def _pooled(days: Sequence[DayRollup], scope: str, component: str) -> dict[str, Amounts]:
    """The baseline days' groups added up (GPU-hours add; ratios are taken after)."""
    total: dict[str, Amounts] = {}
    for day in days:
        groups = day.tenants if scope == "tenant" else day.models
        for name, a in _amounts(groups, component).items():
            was = total.get(name, Amounts(0.0, 0.0))
            total[name] = Amounts(was.part + a.part, was.whole + a.whole)
    return total


def _movers(today: DayRollup, baseline: Sequence[DayRollup], scope: str, component: str,
            top: int) -> list[Mover]:
    sign = -1.0 if component == EFFECTIVE else 1.0
    now = _amounts(today.tenants if scope == "tenant" else today.models, component)
    moved = contributions(_pooled(baseline, scope, component), now)
    ranked = sorted(moved, key=lambda c: (-sign * c.points, c.group))
    return [Mover(name=c.group, points=c.points, mix_points=c.mix, before_pct=c.before_pct,
                  now_pct=c.after_pct)
            for c in ranked[:top] if sign * c.points >= MIN_MOVER_POINTS]


def fleet_link(base: str, day: str) -> str:
    """The fleet page showing `day` (`base` is the page's URL, `.../ett/`)."""
    return f"{base.rstrip('/')}/?from={day}&to={day}"


def day_alerts(today: DayRollup, baseline: Sequence[DayRollup], components: ComponentsConfig,
               *, fleet_url: str) -> list[Alert]:
    """The alerts of `today`, judged against `baseline` (the stored days before it, any
    order; those without GPU time are left out), in report order of the components.
    `fleet_url` is the fleet page's URL (the file's `fleet_url` when it gives one)."""
    config: AlertsConfig = components.alerts
    base_days = sorted((d for d in baseline if d.fleet.gpu_hours > 0), key=lambda d: d.day)
    link = fleet_link(config.fleet_url or fleet_url, today.day)
    out = []
    for row in today.slo:
        if row.share_pct is None:
            continue  # no GPU time that day: nothing to judge
        c = row.component
        sign = -1.0 if c == EFFECTIVE else 1.0
        before = ratio_pct(_pooled(base_days, "tenant", c)) if base_days else None
        change = None if before is None else row.share_pct - before
        reasons: list[AlertReason] = []
        if row.status == "breach":
            reasons.append("slo_breach")
        if change is not None and sign * change >= config.regression_points:
            reasons.append("regression")
        if not reasons:
            continue
        policy = components.policies[c]
        movers = {scope: (_movers(today, base_days, scope, c, config.top_movers)
                          if before is not None else [])
                  for scope in ("tenant", "model")}
        out.append(Alert(
            day=today.day, component=c, owner=row.owner, reasons=reasons,
            share_pct=row.share_pct, target=row.target, baseline_pct=before,
            baseline_days=[d.day for d in base_days], change_points=change,
            gpu_hours_lost=row.gpu_hours_lost, tenants=movers["tenant"],
            models=movers["model"], link=link,
            notify=list(dict.fromkeys((*config.notify, *policy.notify)))))
    return sorted(out, key=lambda a: COMPONENTS.index(a.component))
