"""Versioned storage of policy documents in the config database.

The store deals only in documents: one opaque text per domain, validated elsewhere. Every
change appends an immutable row to ``policy_versions``, so history, rollback and diff need
nothing more than reading old rows. SQLite is the default; PostgreSQL is used when the URL
says so (see :mod:`sluice.db`).

Writers are serialised (``BEGIN IMMEDIATE`` on SQLite, a transaction-scoped advisory lock on
PostgreSQL). Publishing is rare, and serialising it keeps ids in commit order, which is what
makes ``max(id)`` a change token a poller cannot miss; the unique (domain, version)
constraint stays as a backstop.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, func, insert, select
from sqlalchemy.exc import IntegrityError

from sluice.db import Database
from sluice.db.tables import policy_versions
from sluice.errors import StaleVersionError

__all__ = ["PolicyStore", "StoredPolicy"]

# The publishers' advisory lock on PostgreSQL: "sluice" in ASCII followed by a small number
# (schema upgrades take 1, see sluice.db.database).
_PUBLISH_LOCK = 0x736C_7569_6365_0002

_MAX_DOMAIN_LENGTH = 255


@dataclass(frozen=True)
class StoredPolicy:
    """One version of one domain's policy document.

    A deletion is a version too: ``deleted`` is True and ``document`` is ``""``. ``current()``
    never returns deletions; ``history()`` does.
    """

    domain: str
    version: int
    document: str
    author: str
    comment: str
    created_at: datetime
    deleted: bool = False
    restored_from: int | None = None  # a rollback: the version whose document it restores


class PolicyStore:
    """The latest policy document of every domain, and all before it, in the config database.

    Given a URL it opens (and closes) a :class:`~sluice.db.Database` of its own; given a
    ``Database`` it shares it with the other stores built on it, and leaves closing it to
    whoever opened it. Thread-safe; every process sharing one database needs its own store.
    """

    def __init__(self, database: Database | str) -> None:
        self._owned = not isinstance(database, Database)
        self._db = Database(database) if isinstance(database, str) else database

    def __repr__(self) -> str:
        return f"PolicyStore({self._db.redacted_url!r})"

    def __enter__(self) -> PolicyStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def database(self) -> Database:
        """The database this store keeps its table in, for the stores of other tables."""
        return self._db

    def upgrade(self, revision: str = "head") -> None:
        """Bring the database's schema up to date (:meth:`sluice.db.Database.upgrade`)."""
        self._db.upgrade(revision)

    def current(self) -> dict[str, StoredPolicy]:
        """The latest version of every domain that has a policy, sorted by domain."""
        with self._db.translated("read current policies"), self._db.engine.connect() as conn:
            latest = _latest(conn, None)
        return {domain: _policy(row) for domain, row in latest.items() if row.document is not None}

    def publish(
        self,
        documents: Mapping[str, str | None],
        *,
        author: str,
        comment: str,
        expected_versions: Mapping[str, int] | None = None,
        restored_from: Mapping[str, int] | None = None,
    ) -> dict[str, int]:
        """Store new documents atomically and return ``{domain: new version}`` for each change.

        ``None`` deletes a domain. Domains whose document equals their current one get no new
        version, so republishing everything is cheap. ``expected_versions`` makes the publish
        conditional: if any named domain's latest version (0 for none) differs, nothing is
        written and :class:`StaleVersionError` is raised. ``restored_from`` records, for a
        rollback, which version each domain's document was taken from.
        """
        expected = dict(expected_versions or {})
        _check_domains([*documents, *expected])
        seen: dict[str, int] = {}
        with self._db.translated("publish"):
            try:
                return self._publish(
                    documents, author, comment, expected, seen, dict(restored_from or {})
                )
            except IntegrityError as exc:
                stale = self._stale_domain(seen)
                if stale is None:
                    raise  # not a version clash: reported as a database error
                raise stale from exc

    def change_token(self) -> int:
        """A number that grows with every publish that changed something; 0 when empty."""
        query = select(func.coalesce(func.max(policy_versions.c.id), 0))
        with self._db.translated("read change token"), self._db.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def history(self, domain: str) -> list[StoredPolicy]:
        """Every version of ``domain``, newest first, deletions included; [] if never seen."""
        query = (
            select(policy_versions)
            .where(policy_versions.c.domain == domain)
            .order_by(policy_versions.c.version.desc())
        )
        with self._db.translated("read history"), self._db.engine.connect() as conn:
            return [_policy(row) for row in conn.execute(query)]

    def close(self) -> None:
        """Close the pooled connections of a database the store opened itself; it may still be
        used and will reconnect."""
        if self._owned:
            self._db.close()

    def _publish(
        self,
        documents: Mapping[str, str | None],
        author: str,
        comment: str,
        expected: Mapping[str, int],
        seen: dict[str, int],
        restored_from: Mapping[str, int],
    ) -> dict[str, int]:
        # One timestamp for the whole publish: it is one change, made at one moment.
        now = datetime.now(UTC)
        with self._db.writing(_PUBLISH_LOCK) as conn:
            domains = {*documents, *expected}
            latest = _latest(conn, domains)
            seen.update({d: latest[d].version if d in latest else 0 for d in domains})
            for domain, want in sorted(expected.items()):
                if seen[domain] != want:
                    raise StaleVersionError(domain, want, seen[domain])
            rows: list[dict[str, Any]] = []
            # Sorted so concurrent writers touch index entries in the same order.
            for domain in sorted(documents):
                row = latest.get(domain)
                if documents[domain] == (row.document if row is not None else None):
                    continue
                rows.append(
                    {
                        "domain": domain,
                        "version": seen[domain] + 1,
                        "document": documents[domain],
                        "author": author,
                        "comment": comment,
                        "created_at": now,
                        "restored_from": restored_from.get(domain),
                    }
                )
            if rows:
                conn.execute(insert(policy_versions), rows)
        return {row["domain"]: row["version"] for row in rows}

    def _stale_domain(self, seen: Mapping[str, int]) -> StaleVersionError | None:
        """After a unique-constraint clash, name a domain some other writer moved on."""
        with self._db.engine.connect() as conn:
            latest = _latest(conn, seen.keys())
        for domain in sorted(latest):
            if latest[domain].version != seen[domain]:
                return StaleVersionError(domain, seen[domain], latest[domain].version)
        return None


def _latest(conn: Connection, domains: Collection[str] | None) -> dict[str, Row[Any]]:
    """Latest row of each domain (of ``domains`` only, unless None), deletions included."""
    table = policy_versions
    newest = select(table.c.domain, func.max(table.c.version).label("version")).group_by(
        table.c.domain
    )
    if domains is not None:
        if not domains:
            return {}
        newest = newest.where(table.c.domain.in_(sorted(domains)))
    sub = newest.subquery()
    query = (
        select(table)
        .join(sub, (table.c.domain == sub.c.domain) & (table.c.version == sub.c.version))
        .order_by(table.c.domain)
    )
    return {row.domain: row for row in conn.execute(query)}


def _policy(row: Row[Any]) -> StoredPolicy:
    return StoredPolicy(
        domain=row.domain,
        version=row.version,
        document=row.document if row.document is not None else "",
        author=row.author,
        comment=row.comment,
        created_at=row.created_at,
        deleted=row.document is None,
        restored_from=row.restored_from,
    )


def _check_domains(domains: Collection[str]) -> None:
    # Caught here rather than as a driver error: PostgreSQL would reject an over-long domain
    # with a message about column types, SQLite would silently store it.
    for domain in domains:
        if not isinstance(domain, str) or not domain or len(domain) > _MAX_DOMAIN_LENGTH:
            raise ValueError(f"domain must be a non-empty string of at most 255 chars: {domain!r}")
