"""The store's record of the alerts sent, on SQLite and PostgreSQL: what is asked is what
was recorded, a second record keeps the first time, and other days are not mixed in."""

from __future__ import annotations

from airflow_ett.store import EttStore


def test_sent_alerts_are_recorded_once_per_alert_and_notifier(store_url: str) -> None:
    with EttStore(store_url) as store:
        assert store.alerts.sent([]) == set()
        assert store.alerts.sent(["2026-11-28/initialization"]) == set()
        store.alerts.record("2026-11-28/initialization", "mail", subject="s", at=10.0)
        store.alerts.record("2026-11-28/initialization", "mail", subject="s2", at=20.0)
        store.alerts.record("2026-11-28/initialization", "slack", subject="s", at=11.0)
        store.alerts.record("2026-11-27/initialization", "mail", subject="s", at=5.0)
        assert store.alerts.sent(["2026-11-28/initialization", "2026-11-28/shutdown"]) == {
            ("2026-11-28/initialization", "mail"), ("2026-11-28/initialization", "slack")}
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT sent_at, subject FROM ett_alerts_sent WHERE notifier = 'mail' "
                "AND alert = '2026-11-28/initialization'").all()
        assert [tuple(r) for r in rows] == [(10.0, "s")]  # the first time is kept
