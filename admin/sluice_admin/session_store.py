"""The admin app's sessions as stored in the config database (SQLite or PostgreSQL), so a
reload, a bookmark or a second tab finds the session, and ending one is seen by every tab
and browser of it.

A sign-in starts a row with a one-time *ticket* (good for ``TICKET_TTL_S``): the browser
trades it at ``/_sluice/session`` (served.py) for the session cookie, and only then does the
row get its token. Both are kept as SHA-256 hashes. Rows of ended sessions stay, with why
they ended, until they expire: the sign-in page can then say why, and a single sign-on
identity that started one session cannot start another.

Whether a row still stands is :func:`verdict`, a pure function of the row and the time.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Column, MetaData, String, Table, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from sluice.db import Database
from sluice.db.tables import UTCDateTime
from sluice.db.tables import metadata as server_metadata
from sluice_admin.auth import Role, User
from sluice_admin.session_cookie import CookieSession, new_token, token_hash

__all__ = ["TICKET_TTL_S", "Ended", "SessionRow", "SessionStore", "metadata", "verdict"]

TICKET_TTL_S = 60
# Ended rows are kept this long past their expiry (what the sign-in page says, used
# identities), then deleted by the next sign-in.
_KEEP_ENDED_S = 86400
_SIGNING_KEY = "session_signing_key"

metadata = MetaData(naming_convention=server_metadata.naming_convention)

# Migration 0008 creates these (in the server's history, like admin_users: see accounts.py).
admin_sessions = Table(
    "admin_sessions",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("user_name", String(255), nullable=False, index=True),
    Column("role", String(16), nullable=False),
    Column("token_hash", String(64)),
    Column("ticket_hash", String(64), index=True),
    Column("ticket_expires_at", UTCDateTime()),
    Column("identity", String(64), index=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("last_seen_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    Column("ended_at", UTCDateTime()),
    Column("ended_why", String(32)),
)
admin_secrets = Table(
    "admin_secrets",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(512), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
)


class Ended(enum.StrEnum):
    """Why a session no longer stands."""

    SIGNED_OUT = "signed out"  # its user signed out, here or in another tab or browser
    IDLE = "idle"  # no action for longer than the idle timeout
    EXPIRED = "expired"  # its lifetime is over
    REMOVED = "removed"  # its user's account was removed


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    user: User
    last_seen_s: float
    expires_s: float
    ended: Ended | None
    sso: bool  # started by single sign-on


def verdict(row: SessionRow, now_s: float, idle_timeout_s: float) -> Ended | None:
    """Why ``row`` no longer stands at ``now_s``, or None while it does. An idle timeout of
    0 means none."""
    if row.ended is not None:
        return row.ended
    if now_s >= row.expires_s:
        return Ended.EXPIRED
    if idle_timeout_s > 0 and now_s - row.last_seen_s > idle_timeout_s:
        return Ended.IDLE
    return None


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class SessionStore:
    """Sessions in ``database``; every method takes the time from its caller (the pages'
    clock), so tests step it instead of waiting."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def start(
        self, user: User, *, now_s: float, lifetime_s: float, identity: str | None = None
    ) -> tuple[str, str]:
        """A new session for ``user``: its id, and the ticket the browser trades for the
        cookie. ``identity`` marks a single sign-on identity as used."""
        session_id = secrets.token_hex(16)
        ticket = new_token()
        with self._db.translated("start admin session"), self._db.engine.begin() as conn:
            conn.execute(
                delete(admin_sessions).where(
                    admin_sessions.c.expires_at < _at(now_s - _KEEP_ENDED_S)
                )
            )
            conn.execute(
                insert(admin_sessions).values(
                    id=session_id,
                    user_name=user.name,
                    role=user.role.value,
                    ticket_hash=token_hash(ticket),
                    ticket_expires_at=_at(now_s + TICKET_TTL_S),
                    identity=identity,
                    created_at=_at(now_s),
                    last_seen_at=_at(now_s),
                    expires_at=_at(now_s + lifetime_s),
                )
            )
        return session_id, ticket

    def redeem(self, ticket: str, *, now_s: float) -> tuple[CookieSession, int] | None:
        """Trade a sign-in ticket, once, for the session's cookie contents and the session's
        expiry (Unix seconds); None for an unknown, used or late ticket, or an ended session."""
        hashed = token_hash(ticket)
        token = new_token()
        with self._db.translated("redeem admin sign-in ticket"), self._db.engine.begin() as conn:
            row = conn.execute(
                select(admin_sessions.c.id, admin_sessions.c.expires_at).where(
                    admin_sessions.c.ticket_hash == hashed,
                    admin_sessions.c.ticket_expires_at > _at(now_s),
                    admin_sessions.c.ended_at.is_(None),
                )
            ).first()
            if row is None:
                return None
            # The ticket in the WHERE clause again: of two concurrent redeems, one updates.
            taken = conn.execute(
                update(admin_sessions)
                .where(admin_sessions.c.id == row.id, admin_sessions.c.ticket_hash == hashed)
                .values(ticket_hash=None, ticket_expires_at=None, token_hash=token_hash(token))
            ).rowcount
        if taken != 1:
            return None
        return CookieSession(row.id, token), int(row.expires_at.timestamp())

    def get(self, session_id: str) -> SessionRow | None:
        return self._row(admin_sessions.c.id == session_id)

    def by_cookie(self, cookie: CookieSession) -> SessionRow | None:
        """The session a cookie names, if the cookie's token is that session's."""
        return self._row(
            admin_sessions.c.id == cookie.session_id,
            admin_sessions.c.token_hash == token_hash(cookie.token),
        )

    def _row(self, *where: object) -> SessionRow | None:
        c = admin_sessions.c
        query = select(
            c.id, c.user_name, c.role, c.last_seen_at, c.expires_at, c.ended_why, c.identity
        )
        with self._db.translated("read admin session"), self._db.engine.connect() as conn:
            row = conn.execute(query.where(*where)).first()  # type: ignore[arg-type]
        if row is None:
            return None
        return SessionRow(
            row.id,
            User(row.user_name, Role(row.role)),
            row.last_seen_at.timestamp(),
            row.expires_at.timestamp(),
            Ended(row.ended_why) if row.ended_why is not None else None,
            row.identity is not None,
        )

    def touch(self, session_id: str, *, now_s: float) -> None:
        """Note an action in the session (what the idle timeout counts from)."""
        with self._db.translated("touch admin session"), self._db.engine.begin() as conn:
            conn.execute(
                update(admin_sessions)
                .where(admin_sessions.c.id == session_id, admin_sessions.c.ended_at.is_(None))
                .values(last_seen_at=_at(now_s))
            )

    def end(self, session_id: str, why: Ended, *, now_s: float) -> None:
        self._end(admin_sessions.c.id == session_id, why, now_s)

    def end_user(self, name: str, why: Ended, *, now_s: float) -> int:
        """End every session of user ``name``; how many were still standing."""
        return self._end(admin_sessions.c.user_name == name, why, now_s)

    def _end(self, where: object, why: Ended, now_s: float) -> int:
        with self._db.translated("end admin session"), self._db.engine.begin() as conn:
            return conn.execute(
                update(admin_sessions)
                .where(where, admin_sessions.c.ended_at.is_(None))  # type: ignore[arg-type]
                .values(
                    ended_at=_at(now_s),
                    ended_why=why.value,
                    # The token stays: a reload with the cookie finds the row and says why.
                    ticket_hash=None,
                    ticket_expires_at=None,
                )
            ).rowcount

    def identity_used(self, identity: str) -> bool:
        query = select(admin_sessions.c.id).where(admin_sessions.c.identity == identity)
        with self._db.translated("read admin session"), self._db.engine.connect() as conn:
            return conn.execute(query).first() is not None

    def signing_key(self, *, now_s: float) -> str:
        """The cookie signing key kept in the database, made on first use. Every admin
        replica on the database reads the same one; of two making it at once, one wins."""
        query = select(admin_secrets.c.value).where(admin_secrets.c.name == _SIGNING_KEY)
        with self._db.translated("read admin secret"), self._db.engine.connect() as conn:
            found = conn.execute(query).scalar()
        if found is not None:
            return str(found)
        made = secrets.token_urlsafe(48)
        with self._db.translated("write admin secret"):
            try:
                with self._db.engine.begin() as conn:
                    conn.execute(
                        insert(admin_secrets).values(
                            name=_SIGNING_KEY, value=made, created_at=_at(now_s)
                        )
                    )
                return made
            except IntegrityError:
                pass  # another replica made it first: read theirs
        with self._db.translated("read admin secret"), self._db.engine.connect() as conn:
            return str(conn.execute(query).scalar_one())
