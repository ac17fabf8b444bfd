"""The nightly rollup's alerts sent through Airflow notifiers: a real `BaseNotifier`
subclass that records what it was asked to send, Airflow's own SMTP notifier against a
local SMTP server (aiosmtpd), and the store's record that makes a retry send only the
rest."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import json
import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from airflow_ett.operators.notify import (
    AlertsNotSent,
    NotifierError,
    check_notifier,
    load_notifiers,
    send_alerts,
)
from airflow_ett.operators.rollup import alert_day, nightly_rollup
from airflow_ett.rollup.alert_config import NotifierSpec
from airflow_ett.rollup.alerts import Alert, day_alerts
from airflow_ett.rollup.components import ComponentsConfig, load_components, parse_components
from airflow_ett.store import EttStore, upgrade
from tests.operators import recording
from tests.rollup.alert_days import BAD_DAY, bad_day, baseline
from tests.rollup.scenarios import D, job_a, job_b

RECORDING = "tests.operators.recording.RecordingNotifier"
SMTP = "airflow.providers.smtp.notifications.smtp.SmtpNotifier"


@pytest.fixture(autouse=True)
def _clean_recorder() -> Iterator[None]:
    recording.SENT.clear()
    recording.BROKEN.clear()
    yield
    recording.SENT.clear()
    recording.BROKEN.clear()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EttStore]:
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    with EttStore(url) as s:
        yield s


def _components(text: str) -> ComponentsConfig:
    return parse_components(tomllib.loads(text), source="c.toml")


ROUTED = f'''
[alerts]
notify = ["platform"]
[notifiers.platform]
class = "{RECORDING}"
channel = "#ml-platform"
[notifiers.trainers]
class = "{RECORDING}"
channel = "#trainers"
subject = "init: {{{{ ett_alert.share_pct | round(1) }}}}%"
[components.initialization]
owner = "trainer-team"
max_share_pct = 1.0
notify = ["trainers"]
[components.effective_training]
owner = "ml-platform"
min_share_pct = 90.0
'''


def _alerts(components: ComponentsConfig) -> list[Alert]:
    return day_alerts(bad_day(components), baseline(components), components,
                      fleet_url="http://af/ett/")


def test_each_alert_reaches_its_notifiers_once_rendered_by_airflow(store: EttStore) -> None:
    components = _components(ROUTED)
    alerts = _alerts(components)
    assert [a.component for a in alerts] == ["initialization", "effective_training"]
    sent = send_alerts(alerts, load_notifiers(components), store)
    assert sent == [("2026-11-28/initialization", "platform"),
                    ("2026-11-28/initialization", "trainers"),
                    ("2026-11-28/effective_training", "platform")]
    by = {(s.alert_key, s.channel): s for s in recording.SENT}
    init = alerts[0]
    platform = by[(init.key, "#ml-platform")]
    assert platform.subject == init.subject and platform.text == init.text  # filled in
    assert by[(init.key, "#trainers")].subject == "init: 2.0%"  # the file's own template
    # a second run (a rerun of the day, a retry) sends nothing it sent before
    assert send_alerts(alerts, load_notifiers(components), store) == []
    assert len(recording.SENT) == 3


def test_a_failing_notifier_stops_no_other_and_its_retry_sends_only_the_rest(
        store: EttStore) -> None:
    components = _components(ROUTED)
    alerts = _alerts(components)
    recording.BROKEN.add("#trainers")
    with pytest.raises(AlertsNotSent) as caught:
        send_alerts(alerts, load_notifiers(components), store)
    assert str(caught.value) == ("1 alert(s) not sent: 2026-11-28/initialization -> "
                                 "trainers (ConnectionError: #trainers is down)")
    assert {s.channel for s in recording.SENT} == {"#ml-platform"}
    assert len(recording.SENT) == 2
    recording.BROKEN.clear()  # the service is back: Airflow retries the task
    assert send_alerts(alerts, load_notifiers(components), store) == [
        ("2026-11-28/initialization", "trainers")]
    assert len(recording.SENT) == 3


@pytest.mark.parametrize(("spec", "message"), [
    (NotifierSpec("n", "no_such_module.Notifier", {}),
     "notifier 'n', field 'class': 'no_such_module.Notifier' cannot be imported "
     "(ModuleNotFoundError: No module named 'no_such_module')"),
    (NotifierSpec("n", "tests.operators.recording.Missing", {}),
     "field 'class': 'tests.operators.recording.Missing' is not an Airflow BaseNotifier"),
    (NotifierSpec("n", "tests.operators.recording.NotANotifier", {"channel": "x"}),
     "is not an Airflow BaseNotifier class"),
    (NotifierSpec("n", RECORDING, {"channel": "x", "colour": "red"}),
     "notifier 'n', field 'colour': not a parameter of " + RECORDING +
     " (known: channel, subject, text)"),
    (NotifierSpec("n", RECORDING, {}),
     "notifier 'n': " + RECORDING + " cannot be built with these fields: TypeError:"),
    (NotifierSpec("n", SMTP, {"from_email": "a@b"}),
     "notifier 'n': " + SMTP + " cannot be built with these fields: TypeError:"),
])
def test_a_notifier_described_wrongly_is_one_line_naming_it(spec: NotifierSpec,
                                                            message: str) -> None:
    with pytest.raises(NotifierError) as caught:
        check_notifier("c.toml", spec)
    assert str(caught.value).startswith("components file c.toml: notifier 'n'")
    assert message in str(caught.value) and "\n" not in str(caught.value)


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(email.message_from_bytes(  # type: ignore[arg-type]
            envelope.content, policy=email.policy.default))
        return "250 OK"


@pytest.fixture
def smtp_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Inbox]:
    """A local SMTP server (aiosmtpd) and Airflow's default SMTP connection pointing at it."""
    with socket.socket() as probe:  # aiosmtpd needs a port number up front
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inbox = _Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_tls": True, "disable_ssl": True}}))
    try:
        yield inbox
    finally:
        controller.stop()


def test_airflows_smtp_notifier_mails_the_alert_to_a_real_smtp_server(
        store: EttStore, smtp_server: _Inbox) -> None:
    components = _components(f'''
[alerts]
notify = ["mail"]
[notifiers.mail]
class = "{SMTP}"
to = "trainer-team@example.com"
from_email = "ett@example.com"
[components.initialization]
owner = "trainer-team"
max_share_pct = 1.0
''')
    alert = _alerts(components)[0]
    assert alert.component == "initialization"
    assert send_alerts([alert], load_notifiers(components), store) == [(alert.key, "mail")]
    (mail,) = smtp_server.messages
    assert mail["Subject"] == alert.subject
    assert mail["To"] == "trainer-team@example.com"
    body = mail.get_body(("html",))
    assert body is not None
    html = body.get_content()
    assert html == alert.html  # the HTML body as the alert wrote it, not re-escaped
    assert "owner: trainer-team" in html and "moved by tenant ads" in html


def test_the_nightly_rollup_alerts_the_day_it_ran_for_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's own day only (not the days it recomputes), judged from the store."""
    url = f"sqlite:///{tmp_path / 'ett.db'}"
    upgrade(url)
    components = tmp_path / "components.toml"
    components.write_text(f'''
[alerts]
notify = ["rec"]
[notifiers.rec]
class = "{RECORDING}"
channel = "#all"
[components.scheduling]
owner = "scheduler-team"
max_share_pct = 0.1
[components.effective_training]
owner = "ml-platform"
min_share_pct = 99.9
''')
    for key, value in {"STORE_URL": url, "REPORT_DIR": str(tmp_path / "reports"),
                       "ROLLUP_TIMEZONE": "UTC", "ROLLUP_RECOMPUTE_DAYS": "2",
                       "COMPONENTS_FILE": str(components)}.items():
        monkeypatch.setenv(f"AIRFLOW__ETT__{key}", value)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/af")
    with EttStore(url) as store:
        store.insert_events([*job_a(), *job_b()])
    now = dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp()
    nightly_rollup(D, now=now)
    with EttStore(url) as store:
        stored, before = store.daily.day(D.isoformat()), store.daily.day(
            (D - dt.timedelta(days=1)).isoformat())
        assert stored is not None and before is not None  # A's first hour is on D-1
    breached = [r.component for r in stored.slo if r.status == "breach"]
    assert breached == ["scheduling", "effective_training"]  # both tight SLOs missed
    expected = day_alerts(stored, [before], load_components(components),
                          fleet_url="https://airflow.example.com/af/ett/")
    assert {"scheduling", "effective_training"} <= {a.component for a in expected}
    assert [s.alert_key for s in recording.SENT] == [a.key for a in expected]
    assert [s.subject for s in recording.SENT] == [a.subject for a in expected]
    assert all(s.text.endswith(f"fleet page: https://airflow.example.com/af/ett/?from={D}"
                               f"&to={D}\n") for s in recording.SENT)
    nightly_rollup(D, now=now + 60)  # a rerun of the day: nothing twice
    assert len(recording.SENT) == len(expected)


def test_a_wrong_notifier_fails_the_task_after_the_day_is_stored(
        store: EttStore, monkeypatch: pytest.MonkeyPatch) -> None:
    components = _components(f'[notifiers.x]\nclass = "{RECORDING}"\ncolour = 1\n')
    with pytest.raises(NotifierError, match="field 'colour'"):
        alert_day(BAD_DAY, components, store)
