"""Initial ETT store schema: events, jobs, summaries.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written out in full rather than imported from `schema.py`: a migration must keep
creating what it created when it was written, whatever the models say later.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ett_events",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("seq", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("attempt", sa.String(), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("ingested_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ett_events"),
    )
    op.create_index("ix_ett_events_seq", "ett_events", ["seq"], unique=True)
    op.create_index("ix_ett_events_job_ts", "ett_events", ["job", "ts"])

    op.create_table(
        "ett_jobs",
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=True),
        sa.Column("model", sa.String(), nullable=True),
        sa.Column("dag_id", sa.String(), nullable=True),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("submitted_ts", sa.Double(), nullable=True),
        sa.Column("ended_ts", sa.Double(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("last_event_ts", sa.Double(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job", name="pk_ett_jobs"),
    )
    op.create_index("ix_ett_jobs_submitted_ts", "ett_jobs", ["submitted_ts"])
    op.create_index("ix_ett_jobs_tenant_submitted_ts", "ett_jobs", ["tenant", "submitted_ts"])
    op.create_index("ix_ett_jobs_model_submitted_ts", "ett_jobs", ["model", "submitted_ts"])
    op.create_index("ix_ett_jobs_dag_id_submitted_ts", "ett_jobs", ["dag_id", "submitted_ts"])
    op.create_index("ix_ett_jobs_ended_ts", "ett_jobs", ["ended_ts"])

    op.create_table(
        "ett_summaries",
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("computed_at", sa.Double(), nullable=False),
        sa.Column("provisional", sa.Boolean(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job", name="pk_ett_summaries"),
    )


def downgrade() -> None:
    op.drop_table("ett_summaries")
    op.drop_index("ix_ett_jobs_ended_ts", table_name="ett_jobs")
    op.drop_index("ix_ett_jobs_dag_id_submitted_ts", table_name="ett_jobs")
    op.drop_index("ix_ett_jobs_model_submitted_ts", table_name="ett_jobs")
    op.drop_index("ix_ett_jobs_tenant_submitted_ts", table_name="ett_jobs")
    op.drop_index("ix_ett_jobs_submitted_ts", table_name="ett_jobs")
    op.drop_table("ett_jobs")
    op.drop_index("ix_ett_events_job_ts", table_name="ett_events")
    op.drop_index("ix_ett_events_seq", table_name="ett_events")
    op.drop_table("ett_events")
