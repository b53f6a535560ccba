"""Fixtures shared by every test package, registered as a plugin in ``tests/conftest.py``.

Private servers on free loopback ports: a Redis for the session, a Redis a test may kill, a
Redis Cluster and a Sentinel deployment for the session, and a fresh PostgreSQL database per
test. The process helpers behind them are in ``tests/support/redis_servers.py`` and
``tests/support/processes.py``; a package that needs a server of its own (``tests/abuse``)
registers the fixture again in its conftest from the same helpers.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from tests.support import redis_servers
from tests.support.redis_servers import RedisProcess

__all__ = [
    "POSTGRES_ADMIN_URL",
    "postgres_url",
    "private_redis",
    "redis_cluster",
    "redis_sentinel",
    "redis_server",
]

# The machine-wide PostgreSQL used by integration tests (trust auth); override for CI.
POSTGRES_ADMIN_URL = os.environ.get(
    "SLUICE_TEST_POSTGRES_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a brand-new, empty PostgreSQL database, dropped again after the test.

    Fails (never skips) when PostgreSQL is unreachable: a silent skip would hide that half
    of the backend matrix stopped running.
    """
    name = f"sluice_test_{uuid.uuid4().hex}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL for tests not reachable at {POSTGRES_ADMIN_URL}: {exc}")
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(False)
        finally:
            # FORCE: a store the test forgot to close must not keep the database alive.
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a private, throw-away ``redis-server`` (no persistence), for the whole session.

    Tests share it: each uses its own key prefix or flushes what it owns.
    """
    with redis_servers.throwaway_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A standalone Redis of the test's own, which it may kill and restart on the same port."""
    server = RedisProcess(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis+cluster://`` URL of a 3-master Redis Cluster without replicas."""
    with redis_servers.redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as url:
        yield url


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis+sentinel://`` URL (service ``mymaster``, DB 0) of a master and one Sentinel."""
    with redis_servers.redis_sentinel(tmp_path_factory.mktemp("redis-sentinel")) as url:
        yield url
