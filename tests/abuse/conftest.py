"""Fixtures of the abuse tests: a private Redis of their own (the shared fixture registered
here again, so a run of several directories starts one server for the abuse tests and a SCAN
over it sees only what the abuse tests wrote)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_servers import throwaway_redis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a throw-away ``redis-server`` for the abuse tests alone, for the whole session."""
    with throwaway_redis(tmp_path_factory.mktemp("redis-abuse")) as url:
        yield url
