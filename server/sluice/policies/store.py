"""Versioned storage of policy documents in the config database.

The store deals only in documents: one opaque text per domain, validated elsewhere. Every
change appends an immutable row to ``policy_versions``, so history, rollback and diff need
nothing more than reading old rows. SQLite is the default; PostgreSQL is used when the URL
says so.

Writers are serialised (``BEGIN IMMEDIATE`` on SQLite, a transaction-scoped advisory lock on
PostgreSQL). Publishing is rare, and serialising it keeps ids in commit order, which is what
makes ``max(id)`` a change token a poller cannot miss; the unique (domain, version)
constraint stays as a backstop.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, Row, create_engine, event, func, insert, select, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from sluice.errors import ConfigDatabaseError, SluiceError, StaleVersionError
from sluice.policies.tables import policy_versions
from sluice.redaction import redact_url

__all__ = ["PolicyStore", "StoredPolicy", "schema_head"]

_MIGRATIONS = Path(__file__).with_name("migrations")

# Long enough to ride out another process's publish or migration, short enough to surface a
# wedged writer as an error rather than a hang.
_SQLITE_BUSY_TIMEOUT_MS = 30_000
_PG_CONNECT_TIMEOUT_S = 10

# Advisory lock keys: "sluice" in ASCII followed by a small number, unlikely to collide with
# locks other applications take in a shared database.
_UPGRADE_LOCK = 0x736C_7569_6365_0001
_PUBLISH_LOCK = 0x736C_7569_6365_0002

# Read by the SQLite "begin" hook: writers must take the write lock when the transaction
# starts. A deferred transaction that reads and then writes fails at once with SQLITE_BUSY
# under WAL if another process wrote in between, and the busy timeout does not help there.
_SQLITE_IMMEDIATE = "sluice_sqlite_immediate"

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


def schema_head() -> str:
    """The newest schema revision this code knows."""
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS).replace("%", "%%"))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


class PolicyStore:
    """The config database: the latest policy document of every domain, and all before it.

    Thread-safe; every process sharing one database needs its own store.
    """

    def __init__(self, url: str) -> None:
        self._redacted = redact_url(url)
        self._secrets: tuple[str, ...] = ()
        with self.translated("open"):
            parsed = _normalise(make_url(url))
            if parsed.password:
                password = str(parsed.password)
                self._secrets = (password, quote(password, safe=""))
            self._engine = _create_engine(parsed)
        self._sqlite = self._engine.dialect.name == "sqlite"

    def __repr__(self) -> str:
        return f"PolicyStore({self._redacted!r})"

    def __enter__(self) -> PolicyStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def upgrade(self, revision: str = "head") -> None:
        """Bring the schema to the newest revision this code knows; a no-op when it is there.

        Safe to call from several processes at once: they take turns, and the later ones find
        nothing to do.
        """
        config = Config()
        # Config values go through ConfigParser interpolation, which treats "%" specially.
        config.set_main_option("script_location", str(_MIGRATIONS).replace("%", "%%"))
        with self.translated("schema upgrade"), self._writing(_UPGRADE_LOCK) as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    def current(self) -> dict[str, StoredPolicy]:
        """The latest version of every domain that has a policy, sorted by domain."""
        with self.translated("read current policies"), self._engine.connect() as conn:
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
        with self.translated("publish"):
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
        with self.translated("read change token"), self._engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def history(self, domain: str) -> list[StoredPolicy]:
        """Every version of ``domain``, newest first, deletions included; [] if never seen."""
        query = (
            select(policy_versions)
            .where(policy_versions.c.domain == domain)
            .order_by(policy_versions.c.version.desc())
        )
        with self.translated("read history"), self._engine.connect() as conn:
            return [_policy(row) for row in conn.execute(query)]

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, for other tables in the same database (usage telemetry)."""
        return self._engine

    def close(self) -> None:
        """Close pooled connections; the store may still be used and will reconnect."""
        self._engine.dispose()

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
        with self._writing(_PUBLISH_LOCK) as conn:
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
        with self._engine.connect() as conn:
            latest = _latest(conn, seen.keys())
        for domain in sorted(latest):
            if latest[domain].version != seen[domain]:
                return StaleVersionError(domain, seen[domain], latest[domain].version)
        return None

    @contextmanager
    def _writing(self, lock: int) -> Iterator[Connection]:
        """A connection inside a write transaction that holds the writers' lock."""
        with self._engine.connect() as conn:
            if self._sqlite:
                conn.execution_options(**{_SQLITE_IMMEDIATE: True})
            with conn.begin():
                if not self._sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock})
                yield conn

    @contextmanager
    def translated(self, action: str) -> Iterator[None]:
        """Turn driver and migration failures into ConfigDatabaseError without the password."""
        try:
            yield
        except SluiceError:
            raise
        except (SQLAlchemyError, CommandError, OSError, ImportError) as exc:
            cause = exc.orig if isinstance(exc, DBAPIError) else exc
            detail = (str(cause).strip().splitlines() or [""])[0]
            for secret in self._secrets:
                detail = detail.replace(secret, "***")
            message = f"config database {self._redacted}: {action} failed: "
            raise ConfigDatabaseError(f"{message}{type(cause).__name__}: {detail}") from exc


def _normalise(url: URL) -> URL:
    """Pick the psycopg 3 driver for bare PostgreSQL URLs; refuse backends never tested."""
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigDatabaseError(
            f"unsupported config database {url.render_as_string(hide_password=True)}: "
            "use a sqlite:/// or postgresql:// URL"
        )
    return url


def _create_engine(url: URL) -> Engine:
    if url.get_backend_name() == "postgresql":
        connect_args = (
            {} if "connect_timeout" in url.query else {"connect_timeout": _PG_CONNECT_TIMEOUT_S}
        )
        # pre_ping: a restarted PostgreSQL must not cost the next request its query.
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_connect(dbapi_connection: Any, _record: object) -> None:
    # Take transaction control away from pysqlite, which defers BEGIN to the first write and
    # runs DDL outside any transaction; _sqlite_begin issues BEGIN itself.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # Wait for the other process instead of failing with "database is locked".
        cursor.execute(f"PRAGMA busy_timeout = {_SQLITE_BUSY_TIMEOUT_MS}")
        _use_wal(cursor)
    finally:
        cursor.close()


def _use_wal(cursor: Any) -> None:
    """Put the database in WAL mode, which lets readers in one process carry on while another
    publishes. The mode is kept in the file, so only a new database is ever switched.

    Switching reads under a shared lock, then needs an exclusive one. When several connections
    switch a new database at once, SQLite refuses all but one at once (waiting could deadlock)
    without calling the busy handler, so busy_timeout does not apply: retry within it.
    """
    if cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
        return
    deadline = time.monotonic() + _SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)  # the connection that won holds its lock for a moment only


def _sqlite_begin(conn: Connection) -> None:
    immediate = conn.get_execution_options().get(_SQLITE_IMMEDIATE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


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
