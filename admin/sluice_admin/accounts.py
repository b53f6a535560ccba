"""The admin app's users as stored in the config database (besides those the
``--admin-users`` setting gives): name, role and a slow, salted hash of the password; and
the audit trail of changes to them.

The tables belong to the admin app, the only code that reads or writes them, so they are
defined here rather than in :mod:`sluice.db.tables`. Their migrations (0004, 0006) stay in
the server's history: every process that upgrades the shared database must create the same
schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection

from sluice.db import Database
from sluice.db.tables import UTCDateTime
from sluice.db.tables import metadata as server_metadata
from sluice_admin.auth import Account, Role
from sluice_admin.users import Action, UserChange, check, describe

__all__ = ["AccountStore", "UserChangeEntry", "admin_user_changes", "admin_users", "metadata"]

# The server's naming convention, so the constraint names match what migration 0004 created.
metadata = MetaData(naming_convention=server_metadata.naming_convention)

# role is "viewer", "editor" or "admin"; password_hash is auth.hash_password's scrypt encoding.
admin_users = Table(
    "admin_users",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("role", String(16), nullable=False),
    Column("password_hash", String(512), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
)

# One row per change to a user, never updated: who (actor) did what (action, detail) to whom
# (name). ``sluice admin-user add`` writes here too, as the system user who ran it.
admin_user_changes = Table(
    "admin_user_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("actor", String(255), nullable=False),
    Column("action", String(16), nullable=False),
    Column("name", String(255), nullable=False),
    Column("detail", Text, nullable=False),
    sqlite_autoincrement=True,
)


@dataclass(frozen=True)
class UserChangeEntry:
    """One entry of the users' audit trail."""

    created_at: datetime
    actor: str
    action: str
    name: str
    detail: str


class AccountStore:
    """Admin app users in ``database``, a peer of the policy and usage stores on it."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def all(self) -> dict[str, Account]:
        query = select(admin_users.c.name, admin_users.c.role, admin_users.c.password_hash)
        with self._db.translated("read admin users"), self._db.engine.connect() as conn:
            rows = conn.execute(query).all()
        return {r.name: Account(r.name, Role(r.role), r.password_hash) for r in rows}

    def save(self, account: Account, *, actor: str) -> bool:
        """Create or replace a user (``sluice admin-user add``: no role checks, whoever can
        write the database may); True if it was new. Audited as done by ``actor``."""
        values = {"role": account.role.value, "password_hash": account.password_hash}
        with self._db.translated("write admin user"), self._db.engine.begin() as conn:
            before = _role(conn, account.name)
            if before is not None:
                conn.execute(
                    update(admin_users).where(admin_users.c.name == account.name).values(values)
                )
                if before is not account.role:
                    role = UserChange(Action.ROLE, account.name, account.role)
                    _log(conn, actor, Action.ROLE, account.name, describe(role, before))
                password = UserChange(Action.PASSWORD, account.name)
                _log(conn, actor, Action.PASSWORD, account.name, describe(password, before))
                return False
            conn.execute(
                insert(admin_users).values(
                    name=account.name, created_at=datetime.now(UTC), **values
                )
            )
            add = UserChange(Action.ADD, account.name, account.role)
            _log(conn, actor, Action.ADD, account.name, describe(add, None))
        return True

    def change(self, change: UserChange, *, actor: str, setting: Mapping[str, Role]) -> None:
        """Make ``change`` as ``actor`` (checked by :func:`users.check` against the users as
        they are within the transaction, so two admins demoting each other cannot both
        succeed) and record it in the audit trail; UserChangeError when refused."""
        with self._db.translated("change admin user"), self._db.engine.begin() as conn:
            # FOR UPDATE: PostgreSQL serialises concurrent changes here; SQLite has one
            # writer at a time anyway.
            rows = conn.execute(
                select(admin_users.c.name, admin_users.c.role).with_for_update()
            ).all()
            stored = {r.name: Role(r.role) for r in rows}
            check(change, actor=actor, stored=stored, setting=setting)
            where = admin_users.c.name == change.name
            if change.action is Action.ADD:
                assert change.role is not None and change.password_hash is not None
                conn.execute(
                    insert(admin_users).values(
                        name=change.name,
                        role=change.role.value,
                        password_hash=change.password_hash,
                        created_at=datetime.now(UTC),
                    )
                )
            elif change.action is Action.REMOVE:
                conn.execute(delete(admin_users).where(where))
            elif change.action is Action.ROLE:
                assert change.role is not None
                conn.execute(update(admin_users).where(where).values(role=change.role.value))
            else:
                assert change.password_hash is not None
                conn.execute(
                    update(admin_users).where(where).values(password_hash=change.password_hash)
                )
            detail = describe(change, stored.get(change.name))
            _log(conn, actor, change.action, change.name, detail)

    def changes(self, *, limit: int = 200) -> list[UserChangeEntry]:
        """The audit trail, newest first."""
        c = admin_user_changes.c
        query = (
            select(c.created_at, c.actor, c.action, c.name, c.detail)
            .order_by(c.id.desc())
            .limit(limit)
        )
        with self._db.translated("read admin user changes"), self._db.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [UserChangeEntry(r.created_at, r.actor, r.action, r.name, r.detail) for r in rows]


def _role(conn: Connection, name: str) -> Role | None:
    found = conn.execute(
        select(admin_users.c.role).where(admin_users.c.name == name)
    ).scalar_one_or_none()
    return Role(found) if found is not None else None


def _log(conn: Connection, actor: str, action: Action, name: str, detail: str) -> None:
    conn.execute(
        insert(admin_user_changes).values(
            created_at=datetime.now(UTC), actor=actor, action=action.value, name=name, detail=detail
        )
    )
