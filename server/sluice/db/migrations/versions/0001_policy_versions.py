"""Create policy_versions: one immutable row per published policy change.

Revision ID: 0001
Revises:
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
    # Spelled out rather than imported from sluice.policies.tables: this migration must keep
    # creating exactly this table after tables.py moves on.
    op.create_table(
        "policy_versions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("document", sa.Text(), nullable=True),
        sa.Column("author", sa.String(255), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_policy_versions"),
        sa.UniqueConstraint("domain", "version", name="uq_policy_versions_domain_version"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_policy_versions_domain", "policy_versions", ["domain"])


def downgrade() -> None:
    op.drop_index("ix_policy_versions_domain", table_name="policy_versions")
    op.drop_table("policy_versions")
