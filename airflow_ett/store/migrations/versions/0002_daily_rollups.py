"""The nightly rollup's tables: ett_daily_days, ett_daily_groups, ett_daily_jobs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Written out in full, like 0001 (a migration keeps creating what it created).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ett_daily_days",
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("tz", sa.String(), nullable=False),
        sa.Column("lo", sa.Double(), nullable=False),
        sa.Column("hi", sa.Double(), nullable=False),
        sa.Column("computed_at", sa.Double(), nullable=False),
        sa.Column("provisional", sa.Boolean(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("ett_pct", sa.Double(), nullable=False),
        sa.Column("gpu_hours", sa.Double(), nullable=False),
        sa.Column("gpu_hours_lost", sa.Double(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("day", name="pk_ett_daily_days"),
    )
    op.create_table(
        "ett_daily_groups",
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("ett_pct", sa.Double(), nullable=True),
        sa.Column("gpu_hours", sa.Double(), nullable=True),
        sa.Column("gpu_hours_lost", sa.Double(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("day", "scope", "key", name="pk_ett_daily_groups"),
    )
    op.create_table(
        "ett_daily_jobs",
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
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
        sa.PrimaryKeyConstraint("day", "job", name="pk_ett_daily_jobs"),
    )
    op.create_index("ix_ett_daily_jobs_job", "ett_daily_jobs", ["job"])
    op.create_index("ix_ett_daily_jobs_day_gpu_hours_lost", "ett_daily_jobs",
                    ["day", "gpu_hours_lost"])
    op.create_index("ix_ett_daily_jobs_day_dag_id", "ett_daily_jobs", ["day", "dag_id"])


def downgrade() -> None:
    op.drop_index("ix_ett_daily_jobs_day_dag_id", table_name="ett_daily_jobs")
    op.drop_index("ix_ett_daily_jobs_day_gpu_hours_lost", table_name="ett_daily_jobs")
    op.drop_index("ix_ett_daily_jobs_job", table_name="ett_daily_jobs")
    op.drop_table("ett_daily_jobs")
    op.drop_table("ett_daily_groups")
    op.drop_table("ett_daily_days")
