"""Sending the nightly rollup's alerts through Airflow notifiers (decision 0029).

A notifier of the components file (`[notifiers.<name>]`) is any Airflow `BaseNotifier`:
the SMTP or Slack provider's, or a deployment's own. `load_notifiers` checks each one
before anything is sent (the class imports, is a `BaseNotifier`, takes the keys the file
gives), with one line naming the file, the notifier and the field. A fresh instance is
built per alert (Airflow renders a notifier's templated fields in place, once), and
called as Airflow calls one, with a context: `ett_alert` (the `rollup.alerts.Alert`),
`ett_subject`, `ett_text` (plain text) and `ett_html`. Prefixed: Airflow merges a
notifier's own templated fields into the context under their names, so a `subject` key
would be overwritten by the unrendered field. The message fields a notifier's class
takes and the file leaves out are filled with the alert's: `subject` and `title` with
the subject, `html_content` with the HTML, `text` and `message` with the text, so that
`class` and `to` are all an SMTP notifier needs.

`send_alerts` records each (alert, notifier) that went in the store, and skips those
already recorded: a retry after a notifier failed sends only the rest. A notifier that
fails does not stop the others; the failures are raised together at the end, so the
task fails and Airflow retries it.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from airflow.sdk import BaseNotifier

    from airflow_ett.rollup.alert_config import NotifierSpec
    from airflow_ett.rollup.components import ComponentsConfig
    from airflow_ett.store import EttStore

log = logging.getLogger(__name__)

#: A notifier's message parameters the file may leave out, and what fills them.
MESSAGE_FIELDS: Final = {"subject": "{{ ett_subject }}", "title": "{{ ett_subject }}",
                         "html_content": "{{ ett_html }}", "text": "{{ ett_text }}",
                         "message": "{{ ett_text }}"}


class Message(Protocol):
    """What is sent: a rollup's `rollup.alerts.Alert`, a job's `plugin.tts_watch.StartAlert`."""

    @property
    def key(self) -> str: ...  # what the store records as sent, with the notifier's name

    @property
    def notify(self) -> list[str]: ...  # the notifiers it goes to, by name

    @property
    def subject(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def html(self) -> str: ...


class NotifierError(ValueError):
    """A notifier of the components file that cannot be built; one line naming it."""


class AlertsNotSent(RuntimeError):
    """Some alerts did not reach some notifiers (each one named); the rest went."""


@dataclass(frozen=True, slots=True)
class Notifier:
    """A checked notifier: `build()` makes a fresh instance for one alert."""

    name: str
    cls: type[BaseNotifier]
    kwargs: dict[str, Any]

    def build(self) -> BaseNotifier:
        return self.cls(**self.kwargs)


def _where(source: str, spec: NotifierSpec) -> str:
    return f"components file {source}: notifier {spec.name!r}"


def _class(source: str, spec: NotifierSpec) -> type[BaseNotifier]:
    from airflow.sdk import BaseNotifier

    module_name, _, attr = spec.class_path.rpartition(".")
    where = f"{_where(source, spec)}, field 'class'"
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module's own error on import
        raise NotifierError(f"{where}: {spec.class_path!r} cannot be imported "
                            f"({type(exc).__name__}: {exc})") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseNotifier)):
        raise NotifierError(f"{where}: {spec.class_path!r} is not an Airflow BaseNotifier "
                            "class")
    return cls


def check_notifier(source: str, spec: NotifierSpec) -> Notifier:
    """`spec` as a `Notifier`, its class imported and its keys checked against the class's
    parameters; the message fields it leaves out filled with the alert's."""
    cls = _class(source, spec)
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in spec.kwargs:
        if key not in params and not takes_any:
            known = ", ".join(n for n, p in params.items() if p.kind in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))
            raise NotifierError(f"{_where(source, spec)}, field {key!r}: not a parameter of "
                                f"{spec.class_path} (known: {known})")
    kwargs = {**{k: v for k, v in MESSAGE_FIELDS.items() if k in params}, **spec.kwargs}
    try:  # a trial build: what the signature cannot tell (a **kwargs passed on, a type)
        cls(**kwargs)
    except Exception as exc:
        raise NotifierError(f"{_where(source, spec)}: {spec.class_path} cannot be built "
                            f"with these fields: {type(exc).__name__}: {exc}") from None
    return Notifier(name=spec.name, cls=cls, kwargs=kwargs)


def load_notifiers(components: ComponentsConfig) -> dict[str, Notifier]:
    """Every notifier of the components file, checked (raises `NotifierError`)."""
    return {name: check_notifier(components.source, spec)
            for name, spec in components.alerts.notifiers.items()}


def alert_context(alert: Message) -> dict[str, Any]:
    """What a notifier is called with (and renders its templated fields against)."""
    return {"ett_alert": alert, "ett_subject": alert.subject, "ett_text": alert.text,
            "ett_html": alert.html}


def send_alerts(alerts: Sequence[Message], notifiers: dict[str, Notifier], store: EttStore, *,
                clock: Callable[[], float] = time.time) -> list[tuple[str, str]]:
    """Send each alert to its notifiers, skipping what the store says went already;
    returns the (alert, notifier) pairs sent now. Raises `AlertsNotSent` naming those that
    failed, after trying every one."""
    done = store.alerts.sent(a.key for a in alerts)
    sent, failed = [], []
    for alert in alerts:
        for name in alert.notify:
            if (alert.key, name) in done:
                continue
            try:
                notifier = notifiers[name].build()
                notifier(alert_context(alert))
            except Exception as exc:  # a notifier's own failure: the others still go
                log.warning("ETT alert %s: notifier %r failed: %s: %s", alert.key, name,
                            type(exc).__name__, exc)
                failed.append(f"{alert.key} -> {name} ({type(exc).__name__}: {exc})")
                continue
            store.alerts.record(alert.key, name, subject=alert.subject, at=clock())
            sent.append((alert.key, name))
            log.info("ETT alert %s sent to %r: %s", alert.key, name, alert.subject)
    if failed:
        raise AlertsNotSent(f"{len(failed)} alert(s) not sent: " + "; ".join(failed))
    return sent
