"""The alerting tables of the components file: `[alerts]`, `[notifiers.<name>]` and a
component's `notify`, checked whole on load: each mistake is one line naming the file,
the table, the field and the value."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from airflow_ett.rollup.alert_config import AlertsConfig, NotifierSpec
from airflow_ett.rollup.components import ComponentsError, load_components, parse_components

SMTP = "airflow.providers.smtp.notifications.smtp.SmtpNotifier"
GOOD = f'''
[alerts]
regression_points = 0.5
baseline_days = 14
top_movers = 2
notify = ["platform"]
fleet_url = "https://airflow.example.com/ett/"

[notifiers.platform]
class = "{SMTP}"
to = "ml-platform@example.com"

[notifiers.trainer-team]
class = "tests.operators.recording.RecordingNotifier"
channel = "#trainer"

[components.initialization]
owner = "trainer-team"
max_share_pct = 1.0
notify = ["trainer-team", "trainer-team"]
'''


def _parse(text: str) -> object:
    return parse_components(tomllib.loads(text), source="c.toml")


def test_a_full_alerting_file_is_read_with_its_notifiers_and_routes(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(GOOD)
    config = load_components(f)
    assert config.alerts == AlertsConfig(
        regression_points=0.5, baseline_days=14, top_movers=2, notify=("platform",),
        fleet_url="https://airflow.example.com/ett/",
        notifiers={"platform": NotifierSpec("platform", SMTP,
                                            {"to": "ml-platform@example.com"}),
                   "trainer-team": NotifierSpec("trainer-team",
                                                "tests.operators.recording.RecordingNotifier",
                                                {"channel": "#trainer"})})
    assert config.policies["initialization"].notify == ("trainer-team",)  # once
    assert config.policies["shutdown"].notify == ()
    assert config.alerts.start_notify == ("platform",)  # no tts_notify: where all go
    own = _parse(GOOD.replace('notify = ["platform"]\n', 'notify = ["platform"]\n'
                              'tts_notify = ["trainer-team"]\n', 1))
    assert own.alerts.start_notify == ("trainer-team",)  # type: ignore[attr-defined]


def test_the_bundled_file_alerts_nobody_by_default() -> None:
    alerts = load_components().alerts
    assert alerts == AlertsConfig() and alerts.notifiers == {} and alerts.notify == ()


@pytest.mark.parametrize(("text", "message"), [
    ("[alerts]\nregression_points = 0\n",
     "[alerts], field 'regression_points': 0 is not a number in (0, 100]"),
    ("[alerts]\nregression_points = true\n", "field 'regression_points': True is not"),
    ("[alerts]\nregression_points = nan\n", "field 'regression_points': nan is not"),
    ("[alerts]\nbaseline_days = 1.5\n",
     "field 'baseline_days': 1.5 is not a whole number in (1, 90]"),
    ("[alerts]\nbaseline_days = 91\n", "field 'baseline_days': 91 is not a whole number"),
    ("[alerts]\ntop_movers = 0\n", "field 'top_movers': 0 is not a whole number"),
    ("[alerts]\nfleet_url = \"ftp://x/\"\n", "field 'fleet_url': 'ftp://x/' is not an http(s)"),
    ("[alerts]\nnotify = \"platform\"\n",
     "field 'notify': 'platform' is not a list of notifier names"),
    ("[alerts]\nnotify = [\"no such\"]\n", "field 'notify': 'no such' is not a notifier name"),
    ("[alerts]\nnotify = [\"ghost\"]\n",
     "[alerts], field 'notify': 'ghost' is not a notifier of the file ([notifiers.<name>]: "
     "none defined)"),
    ("[alerts]\nsend_to = 1\n", "[alerts], field 'send_to': unknown field"),
    ("[alerts]\ntts_notify = [\"ghost\"]\n",
     "[alerts], field 'tts_notify': 'ghost' is not a notifier of the file"),
    ("[alerts]\ntts_notify = \"x\"\n", "field 'tts_notify': 'x' is not a list of notifier"),
    ("alerts = 3\n", "[alerts]: must be a table, got 3"),
    ("notifiers = 3\n", "'notifiers' must be tables [notifiers.<name>], got 3"),
    ("[notifiers.x]\nto = \"a\"\n",
     "notifier 'x', field 'class': None is not an import path"),
    ("[notifiers.x]\nclass = \"SmtpNotifier\"\n",
     "notifier 'x', field 'class': 'SmtpNotifier' is not an import path"),
    ("[notifiers.\"a b\"]\nclass = \"m.C\"\n", "notifier 'a b': not a notifier name"),
    ("[components.shutdown]\nnotify = [\"ghost\"]\n[notifiers.x]\nclass = \"m.C\"\n",
     "component 'shutdown', field 'notify': 'ghost' is not a notifier of the file "
     "([notifiers.<name>]: x)"),
    ("[components.shutdown]\nnotify = [1]\n",
     "component 'shutdown', field 'notify': [1] is not a list of notifier names"),
    ("[alert]\nnotify = []\n", "unknown top-level key 'alert'"),
])
def test_each_mistake_is_one_line_naming_the_field_and_value(text: str, message: str) -> None:
    with pytest.raises(ComponentsError) as caught:
        _parse(text)
    assert message in str(caught.value)
    assert str(caught.value).startswith("components file c.toml")
    assert "\n" not in str(caught.value)
