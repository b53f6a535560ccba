"""The edge's call context: the peer as grpc.aio writes it (the access log reads it)."""

from __future__ import annotations

import pytest

from sluice.edge.asgi import Context


@pytest.mark.parametrize(
    ("client", "peer"),
    [
        (("10.0.0.7", 51234), "ipv4:10.0.0.7:51234"),
        (("::1", 40000), "ipv6:[::1]:40000"),
        (None, "unknown"),
    ],
)
def test_peer(client: tuple[str, int] | None, peer: str) -> None:
    assert Context("/svc/Method", [], None, client).peer() == peer
