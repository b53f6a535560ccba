"""A Redis Cluster of three masters, each with one replica, for failover tests.

Started from the ``redis-server`` binary on free loopback ports like the fixtures in
``tests/support/redis_servers.py`` (whose 3-master cluster has no replicas and stays as it
is), with a short ``cluster-node-timeout`` so a killed master is failed over in about two
seconds, and every process killed when the fixture ends.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import free_port, wait_until
from tests.support.redis_servers import RedisProcess, redis_binary

__all__ = ["NODE_TIMEOUT_MS", "ClusterNode", "ReplicatedCluster", "replicated_redis_cluster"]

NODE_TIMEOUT_MS = 1000


@dataclass(frozen=True)
class ClusterNode:
    """One line of CLUSTER NODES, as seen by one node."""

    port: int
    node_id: str
    master: bool
    failed: bool  # flagged fail (or pfail, suspected, by the node asked)
    master_id: str  # "-" for a master
    slots: tuple[tuple[int, int], ...]


class ReplicatedCluster:
    def __init__(self, root: Path, masters: int = 3) -> None:
        self.nodes: list[RedisProcess] = []
        for n in range(2 * masters):
            port = free_port()
            args = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-port", str(free_port()),
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                # A replica's first sync starts at once (the default waits 5 s for others).
                "--repl-diskless-sync-delay", "0",
            ]  # fmt: skip
            self.nodes.append(RedisProcess(root / f"node{n}", port, args))
        self.masters = masters

    @property
    def url(self) -> str:
        """Every node as a startup node, as an operator would list them."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def node(self, port: int) -> RedisProcess:
        return next(node for node in self.nodes if node.port == port)

    def alive(self) -> list[RedisProcess]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def start(self) -> ReplicatedCluster:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [redis_binary("redis-cli"), "--cluster", "create", *addresses]
            + ["--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        wait_until(self.healthy, 30, "a healthy cluster with a synced replica per master")
        return self

    def view(self, port: int | None = None) -> list[ClusterNode]:
        """CLUSTER NODES as one live node (the given one, or the first alive) sees it."""
        asked = self.node(port) if port is not None else self.alive()[0]
        with asked.client() as client:
            raw = client.execute_command("CLUSTER", "NODES").decode()  # unparsed: one word
        return [_parse_line(line) for line in raw.splitlines() if line.strip()]

    def state(self, port: int) -> str:
        """cluster_state as the node on ``port`` sees it: "ok" or "fail"."""
        with self.node(port).client() as client:
            return client.cluster("info")["cluster_state"]

    def master_ports(self) -> list[int]:
        return sorted(n.port for n in self.view() if n.master and not n.failed)

    def slot_owner(self, slot: int) -> int:
        """The port of the master serving ``slot``, as a live node sees it."""
        for node in self.view():
            if node.master and any(lo <= slot <= hi for lo, hi in node.slots):
                return node.port
        raise LookupError(f"no master serves slot {slot}")

    def replica_of(self, master_port: int) -> int:
        view = self.view()
        master = next(n for n in view if n.port == master_port)
        return next(n.port for n in view if n.master_id == master.node_id)

    def healthy(self) -> bool:
        """Every node sees the cluster ok with all nodes; every replica is in sync."""
        for node in self.alive():
            with node.client() as client:
                info = client.cluster("info")
                if info.get("cluster_state") != "ok":
                    return False
                if int(info.get("cluster_known_nodes", 0)) != len(self.nodes):
                    return False
                replication = client.info("replication")
                if replication["role"] == "slave" and replication["master_link_status"] != "up":
                    return False
        view = self.view()
        return sum(n.master for n in view) == self.masters and all(
            any(r.master_id == m.node_id for r in view) for m in view if m.master
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


def _parse_line(line: str) -> ClusterNode:
    # <id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv> <epoch> <link> <slot>...
    fields = line.split()
    flags = set(fields[2].split(","))
    slots = []
    for item in fields[8:]:
        if item.startswith("["):  # a slot being migrated
            continue
        lo, _, hi = item.partition("-")
        slots.append((int(lo), int(hi or lo)))
    return ClusterNode(
        port=int(fields[1].split("@")[0].rpartition(":")[2]),
        node_id=fields[0],
        master="master" in flags,
        failed=bool(flags & {"fail", "fail?"}),
        master_id=fields[3],
        slots=tuple(slots),
    )


@pytest.fixture
def replicated_redis_cluster(tmp_path: Path) -> Iterator[ReplicatedCluster]:
    """A 3-master, 3-replica Redis Cluster of the test's own, which it may wound."""
    cluster = ReplicatedCluster(tmp_path / "cluster")
    try:
        yield cluster.start()
    finally:
        cluster.stop()
