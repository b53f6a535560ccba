"""The Envoy example the end-to-end tests run: examples/envoy/envoy.yaml and its policy, the
ports written in it, and the upstream it routes to (a handler answering every GET)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.support.envoy import rewrite_ports

__all__ = [
    "ENVOY_CONFIG",
    "EXAMPLES",
    "EXAMPLE_ADMIN",
    "EXAMPLE_LISTENER",
    "EXAMPLE_SLUICE",
    "EXAMPLE_UPSTREAM",
    "POLICY",
    "STATS",
    "UPSTREAM_BODY",
    "Upstream",
    "example_config",
    "upstream_server",
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "envoy"
ENVOY_CONFIG = EXAMPLES / "envoy.yaml"
POLICY = EXAMPLES / "ratelimit.yaml"

# The ports written in examples/envoy/envoy.yaml.
EXAMPLE_LISTENER, EXAMPLE_ADMIN, EXAMPLE_UPSTREAM, EXAMPLE_SLUICE = 10000, 9901, 8000, 8081

# Envoy counts the filter's outcomes in the scope of the route's target cluster.
STATS = "cluster.upstream.ratelimit."
UPSTREAM_BODY = "upstream ok"


class Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the name is fixed by http.server)
        body = UPSTREAM_BODY.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def upstream_server(handler: type[BaseHTTPRequestHandler] = Upstream) -> Iterator[int]:
    """An HTTP upstream for Envoy to route to, served on a thread: its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def example_config(
    path: Path,
    *,
    listener: int,
    admin: int,
    upstream: int,
    sluice: int,
    written: tuple[int, int, int, int] = (
        EXAMPLE_LISTENER,
        EXAMPLE_ADMIN,
        EXAMPLE_UPSTREAM,
        EXAMPLE_SLUICE,
    ),
) -> dict[str, Any]:
    """An example Envoy config with the ports ``written`` in it (listener, admin, upstream,
    Sluice; envoy.yaml's by default) replaced by these."""
    return rewrite_ports(
        yaml.safe_load(path.read_text()),
        dict(zip(written, (listener, admin, upstream, sluice), strict=True)),
    )
