"""SQLAlchemy engines for the config database, tuned so several processes can share one.

Only SQLite and PostgreSQL are accepted: they are the two the tests run against. A SQLite
file is switched to WAL and given a busy timeout, and its transactions are begun by Sluice
rather than by pysqlite, so that a writer can take the write lock up front
(:data:`SQLITE_IMMEDIATE`); a PostgreSQL engine gets a connect timeout and a pre-ping.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL

from sluice.errors import ConfigDatabaseError

__all__ = ["SQLITE_IMMEDIATE", "normalise", "open_engine", "password_forms"]

# Long enough to ride out another process's publish or migration, short enough to surface a
# wedged writer as an error rather than a hang.
_SQLITE_BUSY_TIMEOUT_MS = 30_000
_PG_CONNECT_TIMEOUT_S = 10

# An execution option read by the SQLite "begin" hook: writers must take the write lock when
# the transaction starts. A deferred transaction that reads and then writes fails at once
# with SQLITE_BUSY under WAL if another process wrote in between, and the busy timeout does
# not help there.
SQLITE_IMMEDIATE = "sluice_sqlite_immediate"


def normalise(url: URL) -> URL:
    """Pick the psycopg 3 driver for bare PostgreSQL URLs; refuse backends never tested."""
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigDatabaseError(
            f"unsupported config database {url.render_as_string(hide_password=True)}: "
            "use a sqlite:/// or postgresql:// URL"
        )
    return url


def password_forms(url: URL) -> tuple[str, ...]:
    """The password of ``url`` as a driver message may quote it: raw and percent-encoded."""
    if not url.password:
        return ()
    password = str(url.password)
    return (password, quote(password, safe=""))


def open_engine(url: URL) -> Engine:
    """An engine for a :func:`normalise`-d URL; a SQLite file's directory is created."""
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
    immediate = conn.get_execution_options().get(SQLITE_IMMEDIATE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
