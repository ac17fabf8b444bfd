"""The alerts the nightly rollup has sent: ett_alerts_sent.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

One row per alert (`<day>/<component>`) and notifier it reached, so that a retry of the
rollup task after a notifier failed, or a rerun of a day, sends only what was not sent
yet (decision 0029). Written out in full, like the others.
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


def downgrade() -> None:
    op.drop_table("ett_alerts_sent")
