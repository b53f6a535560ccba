"""Private Redis deployments for tests: a throw-away server, a standalone server that can be
stopped, frozen and restarted on its port, a 3-master Cluster, and a master watched by one
Sentinel.

All run from the ``redis-server`` binary on free loopback ports, in temporary directories,
without persistence, and are stopped when the context (the fixture in
``tests/support/fixtures.py`` using it) ends.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from tests.support.processes import free_port, redis_server_args, stop_process, wait_until

__all__ = [
    "RedisProcess",
    "redis_binary",
    "redis_cluster",
    "redis_sentinel",
    "throwaway_redis",
]


def redis_binary(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not Path(path).exists():
        pytest.fail(f"{name} is needed for the Redis integration tests")
    return path


def _pings(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5) as client:
            return bool(client.ping())
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False


class RedisProcess:
    """One ``redis-server`` on a fixed port, which tests may stop, freeze and start again."""

    def __init__(self, workdir: Path, port: int | None = None, args: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.args = list(args)
        self.process: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)

    def start(self, config_file: Path | None = None) -> RedisProcess:
        argv = [redis_binary("redis-server")]
        if config_file is not None:
            argv.append(str(config_file))
        argv += [
            *redis_server_args(self.workdir, self.port if config_file is None else None),
            *self.args,
        ]
        log = (self.workdir / "redis.log").open("a")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(lambda: self.process.poll() is not None or _pings(self.port), 10, "redis")
        if self.process.poll() is not None:
            pytest.fail(f"redis-server exited: {(self.workdir / 'redis.log').read_text()}")
        return self

    def kill(self) -> None:
        """Gone at once, as after a crash: connections are reset, the port refuses."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # in case it was frozen
            self.process.kill()
            self.process.wait(10)

    def freeze(self) -> None:
        """Still accepting TCP, never answering: what a hung or partitioned Redis looks like."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def throwaway_redis(workdir: Path) -> Iterator[str]:
    """URL of a throw-away ``redis-server`` (no persistence) in ``workdir``, stopped (SIGTERM)
    at the end."""
    binary = redis_binary("redis-server")
    port = free_port()
    process = subprocess.Popen(
        [binary, *redis_server_args(workdir, port)],
        stdout=(workdir / "redis.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(lambda: process.poll() is not None or _pings(port), 10, "redis-server")
        if process.poll() is not None:
            pytest.fail(f"redis-server exited: {(workdir / 'redis.log').read_text()}")
        yield url
    finally:
        stop_process(process, 10)


@contextlib.contextmanager
def redis_cluster(root: Path) -> Iterator[str]:
    """``redis+cluster://`` URL of a 3-master Redis Cluster without replicas, under ``root``."""
    nodes = []
    try:
        for n in range(3):
            nodes.append(_cluster_node(root / f"node{n}"))
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        subprocess.run(
            [redis_binary("redis-cli"), "--cluster", "create", *addresses, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )

        def ready() -> bool:
            for node in nodes:
                with node.client() as client:
                    if client.cluster("info").get("cluster_state") != "ok":
                        return False
            return True

        wait_until(ready, 20, "cluster_state:ok")
        yield "redis+cluster://" + ",".join(addresses)
    finally:
        for node in nodes:
            node.kill()


def _cluster_node(workdir: Path, attempts: int = 5) -> RedisProcess:
    """One Cluster node on two free ports (clients', the cluster bus's). A port found free can
    be taken before redis-server binds it (other processes on the machine pick free ports
    too): then it is tried again on two others."""
    for attempt in range(attempts):
        port = free_port()
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-port", str(free_port()),
            "--cluster-node-timeout", "2000",
        ]  # fmt: skip
        try:
            return RedisProcess(workdir / str(attempt), port, args).start()
        except pytest.fail.Exception as exc:
            if "Address already in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def redis_sentinel(root: Path) -> Iterator[str]:
    """``redis+sentinel://`` URL (service ``mymaster``, DB 0) of a master and one Sentinel,
    under ``root``."""
    master = RedisProcess(root / "master").start()
    sentinel = RedisProcess(root / "sentinel")
    try:
        config = sentinel.workdir / "sentinel.conf"  # Sentinel rewrites it: writable, its own
        config.write_text(
            f"port {sentinel.port}\n"
            f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
            "sentinel down-after-milliseconds mymaster 5000\n"
        )
        sentinel.args = ["--sentinel"]
        sentinel.start(config)

        def knows_master() -> bool:
            with sentinel.client() as client:
                return client.sentinel_get_master_addr_by_name("mymaster") is not None

        wait_until(knows_master, 10, "sentinel to know its master")
        yield f"redis+sentinel://127.0.0.1:{sentinel.port}/mymaster/0"
    finally:
        sentinel.kill()
        master.kill()
