"""The store's tables, as the code sees them (the migrations are what creates them).

Choices worth knowing:

- `ett_events.id` is the producer's event id and the primary key: dedupe is the database's
  job (INSERT ... ON CONFLICT DO NOTHING), so replays and concurrent writers cannot double
  count, whatever the caller does.
- `ett_events.seq` is the ingest order. PostgreSQL fills it from an identity sequence;
  SQLite has no sequence for a column that is not the primary key, so the store numbers
  rows itself inside its write transaction (SQLite writers are serialized by
  `BEGIN IMMEDIATE`, so `max(seq) + i` cannot collide). Gaps are normal on both. On
  PostgreSQL, seq is assigned at insert, not commit, so "seq > N" is not a safe cursor
  for incremental readers while writers are active.
- Payloads are the event's canonical JSON as text, not a JSON column: the bytes the model
  reads back are exactly the ones written, identical on both databases, and nothing has to
  parse them on the write path.
- Times are float Unix seconds, as in the event format, so no time-zone conversion sits
  between the events and the rows derived from them.
- `ett_jobs.version` is the number of distinct events stored for the job. Every insert
  that adds events bumps it in SQL (`version + n`), so it is an exact change counter that
  the summary cache keys on.
- No foreign keys: events may legitimately arrive in any order, and FK checks would add
  row locks to the hot insert path for no gain.
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa

NAMING_CONVENTION: Final = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

VERSION_TABLE: Final = "ett_alembic_version"
"""Alembic's bookkeeping table, named so the store can share a database with others."""

RUNNING: Final = "running"
"""`ett_jobs.status` until a job_ended event arrives."""

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

events = sa.Table(
    "ett_events",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("seq", sa.BigInteger(), sa.Identity(), nullable=False),
    sa.Column("job", sa.String(), nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("ts", sa.Double(), nullable=False),
    sa.Column("attempt", sa.String(), nullable=True),
    sa.Column("payload", sa.Text(), nullable=False),
    sa.Column("ingested_at", sa.Double(), nullable=False),
    sa.Index("ix_ett_events_seq", "seq", unique=True),
    sa.Index("ix_ett_events_job_ts", "job", "ts"),
)

jobs = sa.Table(
    "ett_jobs",
    metadata,
    sa.Column("job", sa.String(), primary_key=True),
    sa.Column("tenant", sa.String(), nullable=True),
    sa.Column("model", sa.String(), nullable=True),
    sa.Column("dag_id", sa.String(), nullable=True),
    sa.Column("run_id", sa.String(), nullable=True),
    sa.Column("submitted_ts", sa.Double(), nullable=True),
    sa.Column("ended_ts", sa.Double(), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("last_event_ts", sa.Double(), nullable=False),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.Index("ix_ett_jobs_submitted_ts", "submitted_ts"),
    sa.Index("ix_ett_jobs_tenant_submitted_ts", "tenant", "submitted_ts"),
    sa.Index("ix_ett_jobs_model_submitted_ts", "model", "submitted_ts"),
    sa.Index("ix_ett_jobs_dag_id_submitted_ts", "dag_id", "submitted_ts"),
    sa.Index("ix_ett_jobs_ended_ts", "ended_ts"),
)

summaries = sa.Table(
    "ett_summaries",
    metadata,
    sa.Column("job", sa.String(), primary_key=True),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.Column("computed_at", sa.Double(), nullable=False),
    sa.Column("provisional", sa.Boolean(), nullable=False),
    sa.Column("payload", sa.Text(), nullable=False),
)

# The nightly rollup's rows (migration 0002). One day is replaced whole when it is rolled
# up again; the day is its ISO date in the rollup's time zone (`tz` says which). Headline
# figures are columns so that the pages can query trends and worst runs; the rest is the
# JSON form of the rollup (`payload`), the one a report renders.
daily_days = sa.Table(
    "ett_daily_days",
    metadata,
    sa.Column("day", sa.String(10), primary_key=True),
    sa.Column("tz", sa.String(), nullable=False),
    sa.Column("lo", sa.Double(), nullable=False),
    sa.Column("hi", sa.Double(), nullable=False),
    sa.Column("computed_at", sa.Double(), nullable=False),
    sa.Column("provisional", sa.Boolean(), nullable=False),
    sa.Column("jobs", sa.Integer(), nullable=False),
    # GPU-weighted; NULL for a day with no job (migration 0003)
    sa.Column("ett_pct", sa.Double(), nullable=True),
    sa.Column("gpu_hours", sa.Double(), nullable=False),
    sa.Column("gpu_hours_lost", sa.Double(), nullable=False),
    sa.Column("payload", sa.Text(), nullable=False),
    # inside effective training, not part of gpu_hours_lost; NULL for a day stored before
    # it (migration 0005, decision 0035)
    sa.Column("gpu_hours_lost_to_slow_steps", sa.Double(), nullable=True),
)

daily_groups = sa.Table(
    "ett_daily_groups",
    metadata,
    sa.Column("day", sa.String(10), primary_key=True),
    sa.Column("scope", sa.String(16), primary_key=True),  # tenant|model|team|part
    sa.Column("key", sa.String(), primary_key=True),
    sa.Column("jobs", sa.Integer(), nullable=False),
    sa.Column("ett_pct", sa.Double(), nullable=True),  # None for a team (it owns components)
    sa.Column("gpu_hours", sa.Double(), nullable=True),
    sa.Column("gpu_hours_lost", sa.Double(), nullable=False),
    sa.Column("payload", sa.Text(), nullable=False),
    # as the day's; NULL for a team, and for a row stored before it (migration 0005)
    sa.Column("gpu_hours_lost_to_slow_steps", sa.Double(), nullable=True),
)

daily_jobs = sa.Table(
    "ett_daily_jobs",
    metadata,
    sa.Column("day", sa.String(10), primary_key=True),
    sa.Column("job", sa.String(), primary_key=True),
    sa.Column("tenant", sa.String(), nullable=False),
    sa.Column("model", sa.String(), nullable=False),
    sa.Column("dag_id", sa.String(), nullable=True),
    sa.Column("run_id", sa.String(), nullable=True),
    sa.Column("gpus", sa.Integer(), nullable=False),
    sa.Column("provisional", sa.Boolean(), nullable=False),
    sa.Column("synthetic", sa.Boolean(), nullable=False),
    sa.Column("e2e_s", sa.Double(), nullable=False),
    sa.Column("effective_s", sa.Double(), nullable=False),
    sa.Column("gpu_hours", sa.Double(), nullable=False),
    sa.Column("gpu_hours_lost", sa.Double(), nullable=False),
    sa.Column("payload", sa.Text(), nullable=False),
    sa.Index("ix_ett_daily_jobs_job", "job"),
    sa.Index("ix_ett_daily_jobs_day_gpu_hours_lost", "day", "gpu_hours_lost"),
    # The pages' fleet for a user who may read only some DAGs: their rows of a day.
    sa.Index("ix_ett_daily_jobs_day_dag_id", "day", "dag_id"),
)

# What the nightly rollup's alerts reached (migration 0004): one row per alert
# (`<day>/<component>`) and notifier, so that a retry or a rerun sends only the rest.
alerts_sent = sa.Table(
    "ett_alerts_sent",
    metadata,
    sa.Column("alert", sa.String(), primary_key=True),
    sa.Column("notifier", sa.String(), primary_key=True),
    sa.Column("sent_at", sa.Double(), nullable=False),
    sa.Column("subject", sa.Text(), nullable=False),
)

# Flags on jobs (migration 0004): one per job and kind (`ett.flags.JobFlag`, as JSON).
job_flags = sa.Table(
    "ett_job_flags",
    metadata,
    sa.Column("job", sa.String(), primary_key=True),
    sa.Column("kind", sa.String(32), primary_key=True),
    sa.Column("at", sa.Double(), nullable=False),
    sa.Column("payload", sa.Text(), nullable=False),
)

TABLES: Final = (events, jobs, summaries, daily_days, daily_groups, daily_jobs, alerts_sent,
                 job_flags)
