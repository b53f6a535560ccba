"""The management port (sluice/http/management.py): plaintext probes and metrics while the
service ports demand client certificates, and readiness that follows the state backend.

Real ``sluice serve`` processes on both transports of the gRPC port, a private Redis the
test stops and starts again, certificates made by the test.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.grpc.server import HEALTH_SERVICE_NAMES
from tests.support.certs import Pki, make_pki
from tests.support.processes import SluiceProcess, free_port, sluice_serve, wait_until
from tests.support.redis_servers import RedisProcess

# Each test starts a real server with mTLS and Redis: seconds.
pytestmark = pytest.mark.slow

TRANSPORTS = ["grpcio", "pyvoy"]
RLS = "envoy.service.ratelimit.v3.RateLimitService"
POLICY = "domain: m\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"


def get(port: int, path: str) -> tuple[int, str]:
    """One plaintext GET: the status and the body, whatever the status."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def mtls_with_redis(
    request: pytest.FixtureRequest, tmp_path: Path, private_redis: RedisProcess
) -> Iterator[tuple[SluiceProcess, int, Pki]]:
    pki = make_pki(tmp_path)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    management_port = free_port()
    args = [
        "--transport", request.param,
        "--tls-cert-file", str(pki.server_cert),
        "--tls-key-file", str(pki.server_key),
        "--tls-client-ca-file", str(pki.ca),
        "--management-port", str(management_port),
        "--management-host", "127.0.0.1",
        "--backend", "redis",
        "--redis-url", private_redis.url,
    ]  # fmt: skip
    with sluice_serve(
        tmp_path, config=policy, extra_args=args, https=pki.client_context()
    ) as server:
        yield server, management_port, pki


@pytest.mark.parametrize("mtls_with_redis", TRANSPORTS, indirect=True)
def test_probes_and_metrics_answer_in_plaintext_while_the_service_ports_demand_mtls(
    mtls_with_redis: tuple[SluiceProcess, int, Pki],
) -> None:
    server, port, pki = mtls_with_redis
    assert get(port, "/healthcheck") == (200, "OK")
    assert get(port, "/ready") == (200, "READY")
    status, metrics = get(port, "/metrics")
    assert status == 200
    assert "sluice_config_loads" in metrics
    # The service's HTTP port is TLS only: a plaintext probe there gets no answer.
    with pytest.raises(OSError):
        get(server.http_port, "/healthcheck")
    # gRPC health (over mTLS) answers for the service's full name too.
    credentials = grpc.ssl_channel_credentials(
        pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
    )
    with grpc.secure_channel(server.grpc_target, credentials) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in (RLS, *HEALTH_SERVICE_NAMES):
            answer = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, name


@pytest.mark.parametrize("mtls_with_redis", TRANSPORTS, indirect=True)
def test_ready_follows_the_state_backend(
    mtls_with_redis: tuple[SluiceProcess, int, Pki], private_redis: RedisProcess
) -> None:
    _, port, _ = mtls_with_redis
    assert get(port, "/ready") == (200, "READY")
    private_redis.kill()
    status, body = get(port, "/ready")
    assert status == 503
    assert body.startswith("NOT READY: state backend unavailable"), body
    # Liveness is not readiness: the process serves, so restarting it would not help.
    assert get(port, "/healthcheck") == (200, "OK")
    private_redis.start()
    wait_until(lambda: get(port, "/ready")[0] == 200, 15, "ready again once Redis returns")
    assert get(port, "/ready") == (200, "READY")
