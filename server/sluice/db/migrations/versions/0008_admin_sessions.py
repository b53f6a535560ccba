"""The admin app's sessions, its users' pending edits, and its generated secrets.

- ``admin_sessions``: one row per sign-in. The browser holds only the session's id and a
  random token (in a signed cookie); the row holds the token's SHA-256, so reading the table
  gives no usable cookie. An ended session keeps its row (with why it ended) until it
  expires, so the sign-in page can say why and a used single sign-on identity cannot start a
  second session.
- ``admin_drafts``: each user's pending (unpublished) rules per domain, as YAML.
- ``admin_secrets``: secrets the app generates when none is configured (the session cookie's
  signing key), shared by every admin replica on the database.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "admin_sessions",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=True),
        sa.Column("ticket_hash", sa.String(64), nullable=True),
        sa.Column("ticket_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("identity", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_why", sa.String(32), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_admin_sessions"),
    )
    op.create_index("ix_admin_sessions_user_name", "admin_sessions", ["user_name"])
    op.create_index("ix_admin_sessions_ticket_hash", "admin_sessions", ["ticket_hash"])
    op.create_index("ix_admin_sessions_identity", "admin_sessions", ["identity"])
    op.create_table(
        "admin_drafts",
        sa.Column("user_name", sa.String(255), nullable=False),
        sa.Column("domain", sa.String(256), nullable=False),
        sa.Column("base_version", sa.Integer(), nullable=False),
        sa.Column("rules", sa.Text(), nullable=False),
        sa.Column("loaded", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("user_name", "domain", name="pk_admin_drafts"),
    )
    op.create_table(
        "admin_secrets",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.String(512), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_admin_secrets"),
    )


def downgrade() -> None:
    op.drop_table("admin_secrets")
    op.drop_table("admin_drafts")
    op.drop_index("ix_admin_sessions_identity", "admin_sessions")
    op.drop_index("ix_admin_sessions_ticket_hash", "admin_sessions")
    op.drop_index("ix_admin_sessions_user_name", "admin_sessions")
    op.drop_table("admin_sessions")
