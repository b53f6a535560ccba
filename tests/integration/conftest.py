"""Fixtures shared by the integration tests."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.processes import free_port, wait_until


def _pings(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_timeout=0.5) as client:
            return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a private, throw-away ``redis-server`` (no persistence), for the whole session.

    Tests share it: each uses its own key prefix or flushes what it owns.
    """
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        pytest.fail("redis-server is needed for the Redis integration tests")
    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=(workdir / "redis.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(lambda: process.poll() is not None or _pings(url), 10, "redis-server")
        if process.poll() is not None:
            pytest.fail(f"redis-server exited: {(workdir / 'redis.log').read_text()}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# Private Redis deployments (standalone that tests may kill, Cluster, Sentinel).
from tests.integration.redis_servers import (  # noqa: E402, F401
    private_redis,
    redis_cluster,
    redis_sentinel,
)
