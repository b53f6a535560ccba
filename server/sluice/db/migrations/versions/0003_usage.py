"""Usage telemetry: per-rule counts per second and per minute, and top offenders per minute.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTERS = ("allowed", "over_limit", "shadow_over_limit", "near_limit", "backend_errors")


def upgrade() -> None:
    op.create_table(
        "usage_counts",
        sa.Column("rule", sa.String(512), nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.Column("bucket_s", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in _COUNTERS),
        sa.PrimaryKeyConstraint("rule", "resolution_s", "bucket_s", name="pk_usage_counts"),
    )
    op.create_table(
        "usage_offenders",
        sa.Column("rule", sa.String(512), nullable=False),
        sa.Column("bucket_s", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(1024), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("rule", "bucket_s", "key", name="pk_usage_offenders"),
    )


def downgrade() -> None:
    op.drop_table("usage_offenders")
    op.drop_table("usage_counts")
