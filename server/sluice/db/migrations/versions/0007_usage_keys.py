"""Usage telemetry per key: each second's heaviest keys of a rule by name, the rest as a
histogram of hits per key; per minute, the peak second of each. What the what-if replays.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_keys",
        sa.Column("rule", sa.String(512), nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.Column("bucket_s", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(1024), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("rule", "resolution_s", "bucket_s", "key", name="pk_usage_keys"),
    )
    op.create_table(
        "usage_key_bins",
        sa.Column("rule", sa.String(512), nullable=False),
        sa.Column("resolution_s", sa.Integer(), nullable=False),
        sa.Column("bucket_s", sa.BigInteger(), nullable=False),
        sa.Column("bin_floor", sa.BigInteger(), nullable=False),
        sa.Column("key_count", sa.BigInteger(), nullable=False),
        sa.Column("hits", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "rule", "resolution_s", "bucket_s", "bin_floor", name="pk_usage_key_bins"
        ),
    )


def downgrade() -> None:
    op.drop_table("usage_key_bins")
    op.drop_table("usage_keys")
