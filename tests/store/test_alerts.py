"""The store's record of the alerts sent and of the flags raised on jobs, on SQLite and
PostgreSQL: what is asked is what was recorded, a second record keeps the first, and
other days and jobs are not mixed in."""

from __future__ import annotations

import msgspec

from airflow_ett.ett.flags import JobFlag
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


def test_a_jobs_flag_is_kept_from_its_first_raising(store_url: str) -> None:
    first = JobFlag(job="j", kind="time_to_start", at=100.0, tenant="ads", bound_s=60.0,
                    waited_s=100.0, message="late")
    with EttStore(store_url) as store:
        assert store.flags.of_job("j") == []
        assert store.flags.raise_flag(first) is True
        assert store.flags.raise_flag(msgspec.structs.replace(first, at=200.0)) is False
        assert store.flags.of_job("j") == [first]
        assert store.flags.of_job("other") == []
        with store.engine.begin() as conn:  # a row a later version wrote, unreadable here
            conn.exec_driver_sql("INSERT INTO ett_job_flags (job, kind, at, payload) "
                                 "VALUES ('j', 'future_kind', 300, '{\"kind\": 1}')")
        assert store.flags.of_job("j") == [first]
