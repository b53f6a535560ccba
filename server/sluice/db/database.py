"""The config database as one object: its engine, its schema upgrades, its error messages.

The stores that keep tables in it (policies, usage telemetry, the admin app's accounts) are
peers built on one :class:`Database`; none reaches into another.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from sluice.db.engine import SQLITE_IMMEDIATE, normalise, open_engine, password_forms
from sluice.errors import ConfigDatabaseError, SluiceError
from sluice.redaction import redact_url

__all__ = ["Database", "schema_head"]

_MIGRATIONS = Path(__file__).with_name("migrations")

# Advisory lock key of schema upgrades: "sluice" in ASCII followed by a small number,
# unlikely to collide with locks other applications take in a shared database. Writers of
# other tables pick their own number (sluice.policies.store takes 2).
_UPGRADE_LOCK = 0x736C_7569_6365_0001


def schema_head() -> str:
    """The newest schema revision this code knows."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


class Database:
    """A SQLite or PostgreSQL config database, named by URL.

    Thread-safe; every process sharing one database needs its own ``Database``.
    """

    def __init__(self, url: str) -> None:
        self._redacted = redact_url(url)
        self._secrets: tuple[str, ...] = ()
        with self.translated("open"):
            parsed = normalise(make_url(url))
            self._secrets = password_forms(parsed)
            self._engine = open_engine(parsed)

    def __repr__(self) -> str:
        return f"Database({self._redacted!r})"

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def redacted_url(self) -> str:
        """The URL with its passwords hidden, for messages and logs."""
        return self._redacted

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._engine.dialect.name

    def upgrade(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` (the newest this code knows); a no-op when there.

        Safe to call from several processes at once: they take turns, and the later ones find
        nothing to do.
        """
        config = _alembic_config()
        with self.translated("schema upgrade"), self.writing(_UPGRADE_LOCK) as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    @contextmanager
    def writing(self, lock: int) -> Iterator[Connection]:
        """A connection inside a write transaction that holds the writers' lock ``lock``.

        Serialises writers: ``BEGIN IMMEDIATE`` on SQLite (one writer at a time, whatever the
        lock), a transaction-scoped advisory lock on PostgreSQL.
        """
        sqlite = self.dialect == "sqlite"
        with self._engine.connect() as conn:
            if sqlite:
                conn.execution_options(**{SQLITE_IMMEDIATE: True})
            with conn.begin():
                if not sqlite:
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

    def close(self) -> None:
        """Close pooled connections; the database may still be used and will reconnect."""
        self._engine.dispose()


def _alembic_config() -> Config:
    config = Config()
    # Config values go through ConfigParser interpolation, which treats "%" specially.
    config.set_main_option("script_location", str(_MIGRATIONS).replace("%", "%%"))
    return config
