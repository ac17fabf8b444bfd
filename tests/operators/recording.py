"""A real Airflow notifier for the alert tests: a `BaseNotifier` subclass that records what
it was asked to send (its fields as Airflow rendered them) instead of sending it. A channel
in `BROKEN` fails the way a notifier whose service is down does (it raises)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseNotifier


@dataclass(frozen=True)
class Sent:
    channel: str
    subject: str
    text: str
    alert_key: str


SENT: list[Sent] = []
BROKEN: set[str] = set()


class RecordingNotifier(BaseNotifier):
    template_fields = ("channel", "subject", "text")

    def __init__(self, channel: str, subject: str = "", text: str = "") -> None:
        super().__init__()
        self.channel = channel
        self.subject = subject
        self.text = text

    def notify(self, context: Any) -> None:
        if self.channel in BROKEN:
            raise ConnectionError(f"{self.channel} is down")
        SENT.append(Sent(channel=self.channel, subject=self.subject, text=self.text,
                         alert_key=context["ett_alert"].key))


class NotANotifier:
    def __init__(self, channel: str) -> None:
        self.channel = channel
