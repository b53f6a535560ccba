"""Usage telemetry: hits refused by an operator's block, counted apart from over-limit ones.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The default fills the rows already there; batch mode lets SQLite alter the table.
    with op.batch_alter_table("usage_counts") as batch:
        batch.add_column(sa.Column("blocked", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usage_counts") as batch:
        batch.drop_column("blocked")
