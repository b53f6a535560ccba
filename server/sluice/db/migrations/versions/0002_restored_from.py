"""Record which version a rollback restored, so the audit trail says so.

Revision ID: 0002
Revises: 0001
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
    # batch mode: SQLite cannot ALTER TABLE ... ADD COLUMN with every constraint intact otherwise.
    with op.batch_alter_table("policy_versions") as batch:
        batch.add_column(sa.Column("restored_from", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policy_versions") as batch:
        batch.drop_column("restored_from")
