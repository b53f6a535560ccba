"""``sluice serve`` started as envoyproxy/ratelimit is: no flag, no ``SLUICE_*`` variable, only
upstream's environment variables and its runtime directory (``upstream_env.py``).

Decisions follow the YAML under ``RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY``,
laid out as a Kubernetes ConfigMap mount is (each file a symlink through ``..data``);
counters land in the Redis that ``REDIS_URL`` names, in upstream's single, sentinel and
cluster forms, under ``CACHE_KEY_PREFIX``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.backends.redis.connect import parse_url
from tests.integration.redis_support import data_nodes, scan_keys
from tests.support.certs import make_pki
from tests.support.processes import SluiceProcess, run_sluice, sluice_serve, wait_until
from tests.support.redis_servers import RedisProcess

OK, OVER_LIMIT = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT

# Shaped like upstream's examples/ratelimit/config/example.yaml.
CONFIG = """\
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 1
"""


def configmap_mount(runtime: Path) -> None:
    """``runtime/ratelimit/config`` as the kubelet mounts a ConfigMap with key config.yaml:
    the real file under a hidden timestamped directory, ``..data`` a symlink to it, and
    ``config.yaml`` a symlink through ``..data``."""
    config = runtime / "ratelimit" / "config"
    version = config / "..2026_11_25_13_00_00.000000001"
    version.mkdir(parents=True)
    (version / "config.yaml").write_text(CONFIG)
    (config / "..data").symlink_to(version.name)
    (config / "config.yaml").symlink_to("..data/config.yaml")


def upstream_redis_env(url: str) -> dict[str, str]:
    """Sluice's Redis URL of a test deployment as upstream's variables name it."""
    if url.startswith("redis://"):
        return {"REDIS_TYPE": "single", "REDIS_URL": url.removeprefix("redis://").split("/")[0]}
    parsed = parse_url(url)
    hosts = [f"{host}:{port}" for host, port in parsed.hosts]
    if parsed.scheme == "redis+sentinel":
        return {"REDIS_TYPE": "sentinel", "REDIS_URL": ",".join([parsed.path[0], *hosts])}
    return {"REDIS_TYPE": "cluster", "REDIS_URL": ",".join(hosts)}


def decide(server: SluiceProcess, *entries: tuple[str, str]) -> int:
    request = rls_pb2.RateLimitRequest(
        domain="rl",
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[
                    ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
                    for key, value in entries
                ]
            )
        ],
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        return int(stub.ShouldRateLimit(request, timeout=10).overall_code)


@pytest.fixture(params=["single", "sentinel", "cluster"])
def redis_url(request: pytest.FixtureRequest, private_redis: RedisProcess) -> Iterator[str]:
    if request.param == "single":
        yield private_redis.url
    else:
        yield request.getfixturevalue(f"redis_{request.param}")


@pytest.mark.slow
def test_upstream_deployment_runs_unchanged(tmp_path: Path, redis_url: str) -> None:
    configmap_mount(tmp_path / "runtime")
    prefix = f"upstream_{tmp_path.name}_"  # the sentinel and cluster deployments are shared
    env = {
        **upstream_redis_env(redis_url),
        "USE_STATSD": "false",
        "LOG_LEVEL": "debug",
        "LOG_FORMAT": "json",
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_POOL_SIZE": "4",
        "REDIS_TIMEOUT": "2s",
        "RUNTIME_ROOT": str(tmp_path / "runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_APPDIRECTORY": "config",
        "RUNTIME_WATCH_ROOT": "false",
        "RUNTIME_IGNOREDOTFILES": "true",
        "CACHE_KEY_PREFIX": prefix,
        "DEBUG_PORT": "6070",
    }
    with sluice_serve(tmp_path, upstream_only=True, env=env) as server:
        nested = (("source_cluster", "proxy"), ("destination_cluster", "mock"))
        assert [decide(server, *nested) for _ in range(3)] == [OK, OK, OVER_LIMIT]
        assert [decide(server, ("foo", "bar")) for _ in range(2)] == [OK, OVER_LIMIT]
        assert decide(server, ("foo", "other")) == OK  # a key-only rule counts each value
        keys = [key for _, key in scan_keys(data_nodes(redis_url), f"{prefix}*")]
        log = server.log()
    assert len(keys) == 3, keys  # one counter per limited descriptor value, under the prefix
    records = [json.loads(line) for line in log.splitlines()]  # LOG_FORMAT=json: every line
    assert {"@message", "@timestamp", "level"} <= set(records[0])
    warnings = [r["@message"] for r in records if "not honoured" in r["@message"]]
    assert warnings == [
        "upstream settings recognised but not honoured: "
        "DEBUG_PORT (no debug port: /rlconfig and /metrics are on PORT)"
    ]
    assert any(r["level"] == "debug" for r in records)  # LOG_LEVEL=debug


def test_a_configmap_update_under_runtime_root_is_served_within_5_s(tmp_path: Path) -> None:
    # The kubelet's update: a new hidden timestamped directory, then ..data swapped to it.
    configmap_mount(tmp_path / "runtime")
    config = tmp_path / "runtime" / "ratelimit" / "config"
    env = {
        "RUNTIME_ROOT": str(tmp_path / "runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_WATCH_ROOT": "true",  # upstream's default mode: the root's symlink swap
        "USE_STATSD": "false",
    }
    with sluice_serve(tmp_path, upstream_only=True, env=env) as server:
        assert [decide(server, ("added", "x")) for _ in range(2)] == [OK, OK]  # no rule yet
        update = config / "..2026_11_25_13_05_00.000000002"
        update.mkdir()
        added = "  - key: added\n    rate_limit: {unit: day, requests_per_unit: 1}\n"
        (update / "config.yaml").write_text(CONFIG + added)
        (config / "..data_tmp").symlink_to(update.name)
        (config / "..data_tmp").replace(config / "..data")
        wait_until(lambda: decide(server, ("added", "x")) == OVER_LIMIT, 5, "the new rule")
        assert decide(server, ("foo", "bar")) == OK  # the rest of the file as before
        log = server.log()
    assert "not honoured" not in log


def test_sluice_settings_beat_upstream_ones_and_say_where_each_came_from(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "GRPC_PORT": "9081",
        "SLUICE_GRPC_PORT": "7081",
        "PORT": "9080",
        "REDIS_URL": "redis.internal:6379",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_AUTH": "canary-pw",
        "CACHE_KEY_PREFIX": "rl_",
        "SLUICE_REDIS_KEY_PREFIX": "mine:",
    }
    result = run_sluice(["settings", "--http-port", "7080"], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["grpc_port"] == {"value": 7081, "source": "SLUICE_GRPC_PORT"}
    assert shown["http_port"] == {"value": 7080, "source": "--http-port"}
    assert shown["redis_key_prefix"] == {"value": "mine:", "source": "SLUICE_REDIS_KEY_PREFIX"}
    assert shown["backend"] == {"value": "redis", "source": "upstream REDIS_URL"}
    assert shown["redis_url"] == {
        "value": "redis://:***@redis.internal:6379",
        "source": "upstream REDIS_URL, REDIS_SOCKET_TYPE, REDIS_AUTH",
    }
    assert shown["database_url"] == {"value": "sqlite:///sluice.db", "source": "default"}
    assert "canary-pw" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:11211"},
            "sluice: BACKEND_TYPE: memcache is not supported: Sluice keeps counters in Redis "
            "(BACKEND_TYPE=redis with REDIS_URL) or in memory\n",
        ),
        (
            {"REDIS_URL": "/var/run/nutcracker/ratelimit.sock"},
            "sluice: REDIS_SOCKET_TYPE: Redis over a unix socket is not supported; "
            "use REDIS_SOCKET_TYPE=tcp and REDIS_URL=HOST:PORT\n",
        ),
    ],
)
def test_what_cannot_serve_stops_serve_with_a_clear_message(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = run_sluice(["serve"], env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (1, message)


def test_upstreams_grpc_mtls_variables_secure_the_grpc_port(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    configmap_mount(tmp_path / "runtime")
    env = {
        "RUNTIME_ROOT": str(tmp_path / "runtime"),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "RUNTIME_IGNOREDOTFILES": "true",
        "USE_STATSD": "false",
        "GRPC_SERVER_USE_TLS": "true",
        "GRPC_SERVER_TLS_CERT": str(pki.server_cert),
        "GRPC_SERVER_TLS_KEY": str(pki.server_key),
        "GRPC_CLIENT_TLS_CACERT": str(pki.ca),
    }
    https = pki.client_context(with_cert=True)
    with sluice_serve(tmp_path, upstream_only=True, env=env, https=https) as server:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pki.ca.read_bytes(),
            private_key=pki.client_key.read_bytes(),
            certificate_chain=pki.client_cert.read_bytes(),
        )
        request = rls_pb2.RateLimitRequest(domain="rl")
        request.descriptors.add().entries.add(key="foo", value="tls")
        with grpc.secure_channel(server.grpc_target, credentials) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            codes = [stub.ShouldRateLimit(request, timeout=10).overall_code for _ in range(2)]
        with grpc.insecure_channel(server.grpc_target) as channel:
            with pytest.raises(grpc.RpcError) as plaintext:
                rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5)
        log = server.log()
    assert codes == [OK, OVER_LIMIT]
    assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (
        "GRPC_SERVER_USE_TLS (TLS covers the HTTP port too: HTTP health probes need HTTPS)" in log
    )
