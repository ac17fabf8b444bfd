"""Slow steps by day: ett_daily_days and ett_daily_groups get gpu_hours_lost_to_slow_steps.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05

The GPU-hours of effective training lost to steps slower than each job's ideal step time
(Level 3, inside effective training: not part of `gpu_hours_lost`), a headline figure of
the day, each tenant and each model, so a column beside `gpu_hours_lost` like the other
headline figures (decision 0035). Nullable, and left NULL on the rows already stored: the
figure is made from each job's progress spans, which no stored row holds (a day's job rows
keep its time by component, not its steps), so it cannot be computed from the rows as
0003 reweighed them. Their payloads decode with the figure None ("-" in the reports and
pages) until `airflow-ett rollup` computes the day again from its events. New rows put
it in the payloads too (the day's and the groups' figures, each part's sums, each job
row's `slow_steps_s`): nothing is rewritten here.

The downgrade drops the columns; the payloads' added fields are left, and the code before
0005 ignores them (msgspec skips fields it does not know). Written out in full, like the
others.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("ett_daily_days", "ett_daily_groups")
_COLUMN = "gpu_hours_lost_to_slow_steps"


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column(_COLUMN, sa.Double(), nullable=True))


def downgrade() -> None:
    for table in reversed(_TABLES):
        with op.batch_alter_table(table) as batch:
            batch.drop_column(_COLUMN)
