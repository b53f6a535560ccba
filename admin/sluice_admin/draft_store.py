"""Each admin user's pending edits, kept in the config database until published or
discarded, so a reload, a new tab or a sign-in elsewhere finds them.

A draft is a domain's rules as the pending YAML (``pending.pending_text``), the live version
they started from, and the live rules as they were then (None for a new domain): what the
Rules page diffs and publishes against. Validating them again is the page's business.
"""

from __future__ import annotations

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

from sluice.db import Database
from sluice.db.tables import UTCDateTime
from sluice.db.tables import metadata as server_metadata

__all__ = ["DraftStore", "StoredDraft", "metadata"]

metadata = MetaData(naming_convention=server_metadata.naming_convention)

# Migration 0008 creates it (in the server's history, like admin_users: see accounts.py).
admin_drafts = Table(
    "admin_drafts",
    metadata,
    Column("user_name", String(255), primary_key=True),
    Column("domain", String(256), primary_key=True),
    Column("base_version", Integer, nullable=False),
    Column("rules", Text, nullable=False),
    Column("loaded", Text),
    Column("updated_at", UTCDateTime(), nullable=False),
)


@dataclass(frozen=True)
class StoredDraft:
    domain: str
    base_version: int  # 0: the domain did not exist
    rules: str  # the pending rules, as pending_text writes them
    loaded: str | None  # the live rules it started from, likewise; None for a new domain


class DraftStore:
    def __init__(self, database: Database) -> None:
        self._db = database

    def all(self, user_name: str) -> list[StoredDraft]:
        c = admin_drafts.c
        query = (
            select(c.domain, c.base_version, c.rules, c.loaded)
            .where(c.user_name == user_name)
            .order_by(c.domain)
        )
        with self._db.translated("read pending edits"), self._db.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [StoredDraft(r.domain, r.base_version, r.rules, r.loaded) for r in rows]

    def get(self, user_name: str, domain: str) -> StoredDraft | None:
        return next((d for d in self.all(user_name) if d.domain == domain), None)

    def put(self, user_name: str, draft: StoredDraft) -> None:
        c = admin_drafts.c
        values = {
            "base_version": draft.base_version,
            "rules": draft.rules,
            "loaded": draft.loaded,
            "updated_at": datetime.now(UTC),
        }
        mine = (c.user_name == user_name, c.domain == draft.domain)
        with self._db.translated("save pending edit"), self._db.engine.begin() as conn:
            if not conn.execute(update(admin_drafts).where(*mine).values(values)).rowcount:
                conn.execute(
                    insert(admin_drafts).values(user_name=user_name, domain=draft.domain, **values)
                )

    def drop(self, user_name: str, domain: str) -> None:
        c = admin_drafts.c
        with self._db.translated("drop pending edit"), self._db.engine.begin() as conn:
            conn.execute(delete(admin_drafts).where(c.user_name == user_name, c.domain == domain))
