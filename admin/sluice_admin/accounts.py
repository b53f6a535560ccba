"""The admin app's users as stored in the config database (besides those the
``--admin-users`` setting gives): name, role and a slow, salted hash of the password.

The table belongs to the admin app, the only code that reads or writes it, so it is defined
here rather than in :mod:`sluice.db.tables`. Its migration (0004) stays in the server's
history: every process that upgrades the shared database must create the same schema.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Column, MetaData, String, Table, insert, select, update

from sluice.db import Database
from sluice.db.tables import UTCDateTime
from sluice.db.tables import metadata as server_metadata
from sluice_admin.auth import Account, Role

__all__ = ["AccountStore", "admin_users", "metadata"]

# The server's naming convention, so the constraint names match what migration 0004 created.
metadata = MetaData(naming_convention=server_metadata.naming_convention)

# role is "viewer" or "editor"; password_hash is auth.hash_password's scrypt encoding.
admin_users = Table(
    "admin_users",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("role", String(16), nullable=False),
    Column("password_hash", String(512), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
)


class AccountStore:
    """Admin app users in ``database``, a peer of the policy and usage stores on it."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def all(self) -> dict[str, Account]:
        query = select(admin_users.c.name, admin_users.c.role, admin_users.c.password_hash)
        with self._db.translated("read admin users"), self._db.engine.connect() as conn:
            rows = conn.execute(query).all()
        return {r.name: Account(r.name, Role(r.role), r.password_hash) for r in rows}

    def save(self, account: Account) -> bool:
        """Create or replace a user; True if it was new."""
        values = {"role": account.role.value, "password_hash": account.password_hash}
        with self._db.translated("write admin user"), self._db.engine.begin() as conn:
            updated = conn.execute(
                update(admin_users).where(admin_users.c.name == account.name).values(values)
            ).rowcount
            if updated:
                return False
            conn.execute(
                insert(admin_users).values(
                    name=account.name, created_at=datetime.now(UTC), **values
                )
            )
        return True
