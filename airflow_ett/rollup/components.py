"""The components file: which team owns each Level-2 component, and its service level.

An SLO is a bound on the component's share of the fleet's E2E wall time for a day:
`max_share_pct` for the five kinds of lost time ("initialization under 1%"), or
`min_share_pct` for effective training (the fleet ETT% target). The file is TOML, read
once per rollup, and checked whole on load: an error names the file, the component, the
field and the value, so a typo never turns into a silently missing owner or SLO. An owner
is printable text (`str.isprintable`: no NUL, no control or bidi character), so that both
store backends keep the same team names and every report shows them as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

from airflow_ett._untrusted import UntrustedFileError, load_toml
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.rollup.alert_config import (
    AlertConfigError,
    AlertsConfig,
    notify_list,
    parse_alerts,
)

UNOWNED: Final = "unowned"
SloStatus = Literal["ok", "breach", "none"]
_FIELDS: Final = frozenset({"owner", "max_share_pct", "min_share_pct", "notify"})
_TOP_LEVEL: Final = ("components", "alerts", "notifiers")
#: Six components of a few lines each: a components file is under a KB; a rollup reads at
#: most this much of whatever stands at the configured path.
MAX_FILE_BYTES: Final = 1 << 20


class ComponentsError(ValueError):
    """A components file that cannot be used; the message names where and what."""


@dataclass(frozen=True, slots=True)
class ComponentPolicy:
    component: str
    owner: str
    max_share_pct: float | None = None
    min_share_pct: float | None = None
    notify: tuple[str, ...] = ()  # notifiers for this component's alerts, besides [alerts]

    @property
    def target(self) -> str:
        """The SLO as a reader sees it: `<1%`, `>=90%`, or `-` when there is none."""
        if self.max_share_pct is not None:
            return f"<{self.max_share_pct:g}%"
        if self.min_share_pct is not None:
            return f">={self.min_share_pct:g}%"
        return "-"

    def status(self, share_pct: float) -> SloStatus:
        """`breach` when the day's share misses the SLO, `ok` when it meets it."""
        if self.max_share_pct is not None:
            return "ok" if share_pct < self.max_share_pct else "breach"
        if self.min_share_pct is not None:
            return "ok" if share_pct >= self.min_share_pct else "breach"
        return "none"


@dataclass(frozen=True, slots=True)
class ComponentsConfig:
    """One policy per component, in report order; `source` is the file it came from;
    `alerts` its alerting tables (`alert_config.py`)."""

    policies: dict[str, ComponentPolicy]
    source: str
    alerts: AlertsConfig = field(default_factory=AlertsConfig)

    def owner(self, component: str) -> str:
        return self.policies[component].owner

    def teams(self) -> dict[str, tuple[str, ...]]:
        """Each owning team and the components it owns, in report order."""
        out: dict[str, list[str]] = {}
        for component in COMPONENTS:
            out.setdefault(self.owner(component), []).append(component)
        return {team: tuple(owned) for team, owned in out.items()}


def default_components_file() -> Path:
    return Path(str(resources.files("airflow_ett.rollup") / "components.toml"))


def load_components(path: str | Path | None = None) -> ComponentsConfig:
    """The components file at `path` (the bundled default when None or empty)."""
    file = Path(path).expanduser() if path else default_components_file()
    try:
        raw = load_toml(file, what="components file", max_bytes=MAX_FILE_BYTES)
    except UntrustedFileError as exc:  # a FIFO, a device, too large, not UTF-8 or too deep
        raise ComponentsError(str(exc)) from None
    return parse_components(raw, source=str(file))


def parse_components(raw: dict[str, Any], *, source: str) -> ComponentsConfig:
    extra = sorted(set(raw) - set(_TOP_LEVEL))
    if extra:
        raise ComponentsError(f"components file {source}: unknown top-level key {extra[0]!r} "
                              "(only [components.<name>], [alerts] and [notifiers.<name>] "
                              "tables)")
    table = raw.get("components", {})
    if not isinstance(table, dict):
        raise ComponentsError(f"components file {source}: 'components' must be a table, got "
                              f"{table!r}")
    for name in table:
        if name not in COMPONENTS:
            raise ComponentsError(f"components file {source}: component {name!r}: unknown "
                                  f"component (known: {', '.join(COMPONENTS)})")
    policies = {c: _policy(c, table.get(c, {}), source) for c in COMPONENTS}
    try:
        alerts = parse_alerts(raw, source=source, component_notify={
            c: p.notify for c, p in policies.items() if p.notify})
    except AlertConfigError as exc:
        raise ComponentsError(str(exc)) from None
    return ComponentsConfig(policies=policies, source=source, alerts=alerts)


def _policy(component: str, entry: object, source: str) -> ComponentPolicy:
    where = f"components file {source}: component {component!r}"
    if not isinstance(entry, dict):
        raise ComponentsError(f"{where}: must be a table, got {entry!r}")
    for key in entry:
        if key not in _FIELDS:
            raise ComponentsError(f"{where}, field {key!r}: unknown field (known: "
                                  f"{', '.join(sorted(_FIELDS))})")
    owner = entry.get("owner", UNOWNED)
    if not isinstance(owner, str) or not owner.strip():
        raise ComponentsError(f"{where}, field 'owner': {owner!r} is not a team name")
    if not owner.isprintable():
        # NUL: SQLite would store it and PostgreSQL refuse it mid-rollup; the others would
        # drive the terminal of whoever reads the report. Refused here, for both backends.
        raise ComponentsError(f"{where}, field 'owner': {owner!r} is not a team name (it "
                              "holds a control or format character)")
    bounds = {key: _share(where, key, entry[key])
              for key in ("max_share_pct", "min_share_pct") if key in entry}
    if len(bounds) == 2:
        raise ComponentsError(f"{where}: give max_share_pct or min_share_pct, not both")
    try:
        notify = notify_list(where, entry["notify"]) if "notify" in entry else ()
    except AlertConfigError as exc:
        raise ComponentsError(str(exc)) from None
    return ComponentPolicy(component=component, owner=owner.strip(), notify=notify, **bounds)


#: An SLO's share in percent: `max_share_pct` in (0, 100] (a share is never below 0%, so
#: "under 0%" would be a breach on every day, even a perfect one), `min_share_pct` in
#: [0, 100].
_SHARE_RANGES: Final = {"max_share_pct": ("(0, 100]", 0.0, True),
                        "min_share_pct": ("[0, 100]", 0.0, False)}


def _share(where: str, key: str, value: object) -> float:
    shown, lo, open_lo = _SHARE_RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not lo <= value <= 100 or (open_lo and value == lo):
        raise ComponentsError(f"{where}, field {key!r}: {value!r} is not a share in {shown} "
                              "(percent)")
    return float(value)
