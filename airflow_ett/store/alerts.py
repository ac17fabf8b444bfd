"""What the alerts reached (`ett_alerts_sent`) and the flags raised on jobs
(`ett_job_flags`), migration 0004.

The rollup asks `unsent` before it sends and calls `record` after each notifier took an
alert, one row per alert and notifier. A retry of the task after a notifier failed, or a
rerun of the day, then sends only what had not gone yet: an owning team is paged once per
alert, not once per try.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from airflow_ett.ett.flags import JobFlag
from airflow_ett.store.daily import RowAccess
from airflow_ett.store.schema import alerts_sent, job_flags


class SentAlerts:
    """The `ett_alerts_sent` rows of one store (`EttStore.alerts`)."""

    def __init__(self, store: RowAccess) -> None:
        self._store = store

    def sent(self, alerts: Iterable[str]) -> set[tuple[str, str]]:
        """The (alert, notifier) pairs already sent among these alerts."""
        keys = sorted(set(alerts))
        if not keys:
            return set()

        def read(conn: Connection) -> set[tuple[str, str]]:
            query = sa.select(alerts_sent.c.alert, alerts_sent.c.notifier).where(
                alerts_sent.c.alert.in_(keys))
            return {(row.alert, row.notifier) for row in conn.execute(query)}

        return self._store._read(read)

    def record(self, alert: str, notifier: str, *, subject: str, at: float) -> None:
        """`alert` reached `notifier` (recording it again, by a second rollup at the same
        time too, keeps the first record)."""

        def write(conn: Connection) -> None:
            insert = sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert
            conn.execute(insert(alerts_sent).values(
                alert=alert, notifier=notifier, sent_at=at, subject=subject,
            ).on_conflict_do_nothing(index_elements=[alerts_sent.c.alert,
                                                     alerts_sent.c.notifier]))

        self._store._write(write)


class JobFlags:
    """The `ett_job_flags` rows of one store (`EttStore.flags`)."""

    def __init__(self, store: RowAccess) -> None:
        self._store = store

    def raise_flag(self, flag: JobFlag) -> bool:
        """Store `flag`; False when the job had one of that kind already (kept as it was:
        a flag says when it was first raised)."""

        def write(conn: Connection) -> bool:
            insert = sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert
            done = conn.execute(insert(job_flags).values(
                job=flag.job, kind=flag.kind, at=flag.at, payload=flag.to_json().decode(),
            ).on_conflict_do_nothing(index_elements=[job_flags.c.job, job_flags.c.kind]))
            return bool(done.rowcount)

        return self._store._write(write)

    def of_job(self, job: str) -> list[JobFlag]:
        """The job's flags, oldest first (a row this code cannot read is left out)."""

        def read(conn: Connection) -> list[str]:
            query = sa.select(job_flags.c.payload).where(job_flags.c.job == job).order_by(
                job_flags.c.at, job_flags.c.kind)
            return [row.payload for row in conn.execute(query)]

        out = []
        for payload in self._store._read(read):
            try:
                out.append(JobFlag.from_json(payload))
            except ValueError:  # msgspec's DecodeError/ValidationError: a later version's
                continue
        return out
