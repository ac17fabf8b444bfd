"""Alerts: the ones the nightly rollup sent (ett_alerts_sent), flags on jobs (ett_job_flags).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

`ett_alerts_sent`: one row per alert (`<day>/<component>`, `tts/<job>`) and notifier it
reached, so that a retry after a notifier failed, or a rerun of a day, sends only what was
not sent yet (decision 0029). `ett_job_flags`: one row per job and kind of flag (a job
past its tenant's time-to-start bound while it still waited), its JSON beside it.
Written out in full, like the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ett_alerts_sent",
        sa.Column("alert", sa.String(), nullable=False),
        sa.Column("notifier", sa.String(), nullable=False),
        sa.Column("sent_at", sa.Double(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("alert", "notifier", name="pk_ett_alerts_sent"),
    )
    op.create_table(
        "ett_job_flags",
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job", "kind", name="pk_ett_job_flags"),
    )


def downgrade() -> None:
    op.drop_table("ett_job_flags")
    op.drop_table("ett_alerts_sent")
