"""A Redis master with one replica, watched by three Sentinels (quorum 2), for failover tests.

Started from the ``redis-server`` binary on free loopback ports like the fixtures in
``tests/support/redis_servers.py`` (whose Sentinel watches a master without a replica, so
it can never fail over), with a short ``down-after-milliseconds`` so a killed master is
replaced in a few seconds, and every process killed when the fixture ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.processes import wait_until
from tests.support.redis_servers import RedisProcess

__all__ = ["DOWN_AFTER_MS", "SERVICE", "ReplicatedSentinel", "replicated_redis_sentinel"]

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000
SENTINELS = 3
QUORUM = 2


class ReplicatedSentinel:
    def __init__(self, root: Path) -> None:
        # A replica's first sync starts at once (the default waits 5 s for others).
        self.master = RedisProcess(root / "master", args=["--repl-diskless-sync-delay", "0"])
        self.replica = RedisProcess(root / "replica")
        self.replica.args = ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.sentinels = [RedisProcess(root / f"sentinel{n}") for n in range(SENTINELS)]

    @property
    def url(self) -> str:
        """Every Sentinel, as an operator would list them."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> ReplicatedSentinel:
        self.master.start()
        self.replica.start()
        for sentinel in self.sentinels:
            config = sentinel.workdir / "sentinel.conf"  # Sentinel rewrites it: its own
            config.write_text(
                f"port {sentinel.port}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} {QUORUM}\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
            )
            sentinel.args = ["--sentinel"]
            sentinel.start(config)
        # A failover needs the replica in sync and the Sentinels aware of each other (they
        # find each other through the master's hello channel, every 2 s).
        wait_until(self._ready, 30, "the replica in sync and the Sentinels to know each other")
        return self

    def master_port(self) -> int:
        """The master's port, as the first Sentinel names it."""
        with self.sentinels[0].client() as client:
            return int(client.sentinel_get_master_addr_by_name(SERVICE)[1])

    def role(self, process: RedisProcess) -> str:
        with process.client() as client:
            return client.execute_command("ROLE")[0].decode()

    def kill(self) -> None:
        for process in (*self.sentinels, self.replica, self.master):
            process.kill()

    def _ready(self) -> bool:
        try:
            with self.replica.client() as client:
                if client.info("replication").get("master_link_status") != "up":
                    return False
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    replicas = client.sentinel_slaves(SERVICE)
                    others = client.sentinel_sentinels(SERVICE)
                    if len(others) != SENTINELS - 1 or not any(
                        r["port"] == self.replica.port and r["master-link-status"] == "ok"
                        for r in replicas
                    ):
                        return False
        except redis.exceptions.RedisError:
            return False
        return True


@pytest.fixture
def replicated_redis_sentinel(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ReplicatedSentinel]:
    deployment = ReplicatedSentinel(tmp_path_factory.mktemp("redis-sentinel-failover"))
    try:
        yield deployment.start()
    finally:
        deployment.kill()
