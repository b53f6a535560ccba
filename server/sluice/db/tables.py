"""Schema of the config database, as SQLAlchemy Core tables.

Migrations under ``migrations/versions`` are written out by hand and never import this module,
so that an old migration keeps creating the schema it created on the day it was written.
Keep the two in step: a change here needs a new migration.

The admin app's ``admin_users`` table (migration 0004) is defined in ``sluice_admin.accounts``:
the server never touches it, but its migration belongs to the one schema history every process
that upgrades the database runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

__all__ = [
    "UTCDateTime",
    "metadata",
    "policy_versions",
    "usage_counts",
    "usage_key_bins",
    "usage_keys",
    "usage_offenders",
]

# Explicit constraint names let later migrations drop or alter them on both backends.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    SQLite has no timezone-aware type and hands back naive values; normalising on the way in
    and out makes both backends return the same thing.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given for a UTC column; attach a timezone")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        stored: datetime = value
        if stored.tzinfo is None:
            return stored.replace(tzinfo=UTC)
        return stored.astimezone(UTC)


# One row per published change, never updated or deleted: history, rollback and diff read
# old rows as they are. max(id) doubles as the change token, hence AUTOINCREMENT on SQLite
# (ids are never reused even if rows were ever removed by hand).
policy_versions = Table(
    "policy_versions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("domain", String(255), nullable=False, index=True),
    # 1, 2, 3... per domain; a deletion takes a number too, and a re-created domain continues.
    Column("version", Integer, nullable=False),
    # NULL marks a deletion: the domain has no policy as of this version.
    Column("document", Text, nullable=True),
    Column("author", String(255), nullable=False),
    Column("comment", Text, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    # Set on a rollback: the version whose document this one restores.
    Column("restored_from", Integer, nullable=True),
    # Backstop against two publishers numbering the same version.
    UniqueConstraint("domain", "version"),
    sqlite_autoincrement=True,
)

# Usage telemetry, written by every server once a second as additive upserts, so the figures
# of all instances add up. resolution_s is 1 (kept for an hour) or 60 (kept for two days).
usage_counts = Table(
    "usage_counts",
    metadata,
    Column("rule", String(512), primary_key=True),
    Column("resolution_s", Integer, primary_key=True),
    Column("bucket_s", BigInteger, primary_key=True),
    Column("allowed", BigInteger, nullable=False, default=0),
    Column("over_limit", BigInteger, nullable=False, default=0),
    Column("shadow_over_limit", BigInteger, nullable=False, default=0),
    Column("near_limit", BigInteger, nullable=False, default=0),
    Column("backend_errors", BigInteger, nullable=False, default=0),
    Column("blocked", BigInteger, nullable=False, default=0, server_default="0"),
)

# The heaviest over-limit keys of each rule, per minute.
usage_offenders = Table(
    "usage_offenders",
    metadata,
    Column("rule", String(512), primary_key=True),
    Column("bucket_s", BigInteger, primary_key=True),
    Column("key", String(1024), primary_key=True),
    Column("hits", BigInteger, nullable=False),
)

# Per key, for the what-if's replay and the suggested limits. resolution_s 1: each second's
# heaviest keys of a rule and their hits (kept an hour, added up across servers); 60: each
# key's peak hits in one second of the minute (kept two days, the highest server's).
usage_keys = Table(
    "usage_keys",
    metadata,
    Column("rule", String(512), primary_key=True),
    Column("resolution_s", Integer, primary_key=True),
    Column("bucket_s", BigInteger, primary_key=True),
    Column("key", String(1024), primary_key=True),
    Column("hits", BigInteger, nullable=False),
)

# The other keys of the second, as a histogram of hits per key (sluice/usage/key_summary.py):
# per bin, how many keys and their hits. At resolution 60, each bin's busiest second.
usage_key_bins = Table(
    "usage_key_bins",
    metadata,
    Column("rule", String(512), primary_key=True),
    Column("resolution_s", Integer, primary_key=True),
    Column("bucket_s", BigInteger, primary_key=True),
    Column("bin_floor", BigInteger, primary_key=True),
    Column("key_count", BigInteger, nullable=False),
    Column("hits", BigInteger, nullable=False),
)
