"""The alerting part of the components file: `[alerts]`, `[notifiers.<name>]` and each
component's `notify` list (docs/decisions/0029-alerts-and-movers.md).

```toml
[alerts]
regression_points = 1.0   # a component this many share points worse than its baseline
baseline_days = 7         # the baseline: the fleet over the days before, pooled
top_movers = 3            # tenants and models named per alert
notify = ["platform"]     # notifiers every alert goes to
tts_notify = ["platform"] # a job past its tenant's max_tts_s (default: notify)
fleet_url = "https://airflow.example.com/ett/"   # default: [api] base_url + /ett/

[notifiers.platform]      # any Airflow BaseNotifier, built with the other keys
class = "airflow.providers.smtp.notifications.smtp.SmtpNotifier"
to = "ml-platform@example.com"

[components.initialization]
owner = "trainer-team"
max_share_pct = 1.0
notify = ["trainer-team-slack"]   # besides [alerts] notify
```

Checked here, whole and without Airflow: the keys and ranges, the names, that every name
a `notify` list gives is a notifier of the file, and that `class` is a dotted import path.
Whether the class imports, is a `BaseNotifier` and takes the keys given is checked by
the nightly rollup before it sends (`operators/notify.py`), with the same kind of line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Final

#: A notifier's name: it appears in logs and in the store's record of what was sent.
NOTIFIER_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,50}")
_CLASS_PATH: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
_ALERT_FIELDS: Final = ("regression_points", "baseline_days", "top_movers", "notify",
                        "tts_notify", "fleet_url")


class AlertConfigError(ValueError):
    """A bad `[alerts]`, `[notifiers.*]` or `notify` entry; the message names where."""


@dataclass(frozen=True, slots=True)
class NotifierSpec:
    """One notifier as the file gives it: the class's import path and its keyword
    arguments (TOML values, templated by Airflow when the notifier is called)."""

    name: str
    class_path: str
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    regression_points: float = 1.0
    baseline_days: int = 7
    top_movers: int = 3
    notify: tuple[str, ...] = ()
    #: where a job's time-to-start flag goes (a tenant's `max_tts_s`); None: `notify`
    tts_notify: tuple[str, ...] | None = None
    fleet_url: str = ""  # empty: the fleet page under Airflow's [api] base_url
    notifiers: dict[str, NotifierSpec] = field(default_factory=dict)

    @property
    def start_notify(self) -> tuple[str, ...]:
        """The notifiers a job's time-to-start flag goes to."""
        return self.notify if self.tts_notify is None else self.tts_notify


_RANGES: Final = {"regression_points": (0.0, 100.0, False), "baseline_days": (1, 90, True),
                  "top_movers": (1, 20, True)}


def _number(where: str, key: str, value: object) -> float:
    lo, hi, whole = _RANGES[key]
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or (whole and not isinstance(value, int)) or not math.isfinite(value) \
            or not lo < value <= hi:
        raise AlertConfigError(f"{where}, field {key!r}: {value!r} is not {kind} in "
                               f"({lo:g}, {hi:g}]")
    return value


def notify_list(where: str, value: object, *, key: str = "notify") -> tuple[str, ...]:
    """A `notify` value: a list of notifier names (checked against the file's later)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AlertConfigError(f"{where}, field {key!r}: {value!r} is not a list of "
                               "notifier names")
    for name in value:
        if not NOTIFIER_NAME.fullmatch(name):
            raise AlertConfigError(f"{where}, field {key!r}: {name!r} is not a notifier "
                                   "name (1 to 50 letters, digits, '_' or '-')")
    return tuple(dict.fromkeys(value))


def _url(where: str, value: object) -> str:
    if not isinstance(value, str) or (value and not re.fullmatch(r"https?://\S+", value)):
        raise AlertConfigError(f"{where}, field 'fleet_url': {value!r} is not an http(s) "
                               "URL")
    return value


def _notifier(source: str, name: str, entry: object) -> NotifierSpec:
    where = f"components file {source}: notifier {name!r}"
    if not NOTIFIER_NAME.fullmatch(name):
        raise AlertConfigError(f"{where}: not a notifier name (1 to 50 letters, digits, "
                               "'_' or '-')")
    if not isinstance(entry, dict):
        raise AlertConfigError(f"{where}: must be a table [notifiers.{name}], got {entry!r}")
    path = entry.get("class")
    if not isinstance(path, str) or not _CLASS_PATH.fullmatch(path):
        raise AlertConfigError(f"{where}, field 'class': {path!r} is not an import path "
                               "(module.Class of an Airflow BaseNotifier)")
    return NotifierSpec(name=name, class_path=path,
                        kwargs={k: v for k, v in entry.items() if k != "class"})


def parse_alerts(raw: dict[str, Any], *, source: str,
                 component_notify: dict[str, tuple[str, ...]]) -> AlertsConfig:
    """`[alerts]` and `[notifiers.*]` of a components file's parsed TOML; every name in
    `[alerts] notify` and in `component_notify` must be one of the notifiers."""
    where = f"components file {source}: [alerts]"
    table = raw.get("alerts", {})
    if not isinstance(table, dict):
        raise AlertConfigError(f"{where}: must be a table, got {table!r}")
    for key in table:
        if key not in _ALERT_FIELDS:
            raise AlertConfigError(f"{where}, field {key!r}: unknown field (known: "
                                   f"{', '.join(_ALERT_FIELDS)})")
    tables = raw.get("notifiers", {})
    if not isinstance(tables, dict):
        raise AlertConfigError(f"components file {source}: 'notifiers' must be tables "
                               f"[notifiers.<name>], got {tables!r}")
    notifiers = {name: _notifier(source, name, entry) for name, entry in tables.items()}
    values: dict[str, Any] = {key: _number(where, key, table[key])
                              for key in _RANGES if key in table}
    for key in ("notify", "tts_notify"):
        if key in table:
            values[key] = notify_list(where, table[key], key=key)
    if "fleet_url" in table:
        values["fleet_url"] = _url(where, table["fleet_url"])
    users = [(where, key, values.get(key) or ()) for key in ("notify", "tts_notify")]
    users.extend((f"components file {source}: component {c!r}", "notify", names)
                 for c, names in component_notify.items())
    _check_routes(users, notifiers)
    return AlertsConfig(notifiers=notifiers, **values)


def _check_routes(users: list[tuple[str, str, tuple[str, ...]]],
                  notifiers: dict[str, NotifierSpec]) -> None:
    """Every name a `notify` list gives is a notifier of the file."""
    for user, key, names in users:
        for name in names:
            if name not in notifiers:
                known = ", ".join(sorted(notifiers)) or "none defined"
                raise AlertConfigError(f"{user}, field {key!r}: {name!r} is not a notifier "
                                       f"of the file ([notifiers.<name>]: {known})")
