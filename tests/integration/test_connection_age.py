"""--grpc-max-connection-age-s: a connection is closed with GOAWAY once that old, on both
transports (grpc.aio's max_connection_age_ms; Envoy's max_connection_duration), so a
long-lived client such as Envoy reconnects, and spreads over instances started since."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.support.processes import sluice_serve, wait_until


@pytest.mark.slow  # a real server per transport, and a delay of seconds
@pytest.mark.parametrize("transport", ["grpcio", "pyvoy"])
def test_an_aged_connection_is_closed_and_the_client_reconnects(
    tmp_path: Path, transport: str
) -> None:
    args = ["--transport", transport, "--grpc-max-connection-age-s", "1"]
    args += ["--grpc-max-connection-age-grace-s", "1"]
    with sluice_serve(tmp_path, extra_args=args) as server:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            request = rls_pb2.RateLimitRequest(domain="none")
            request.descriptors.add().entries.add(key="k", value="v")
            stub.ShouldRateLimit(request, timeout=5)
            states: list[grpc.ChannelConnectivity] = []
            lock = threading.Lock()

            def seen(state: grpc.ChannelConnectivity) -> None:
                with lock:
                    states.append(state)

            channel.subscribe(seen, try_to_connect=False)
            # The server ends the connection (GOAWAY): the channel leaves READY by itself.
            wait_until(
                lambda: (
                    grpc.ChannelConnectivity.IDLE in states
                    or grpc.ChannelConnectivity.CONNECTING in states
                ),
                15,
                "the aged connection to close",
            )
            # And the next call simply opens a new one.
            answer = stub.ShouldRateLimit(request, timeout=5)
            assert answer.overall_code == rls_pb2.RateLimitResponse.OK
            channel.unsubscribe(seen)
