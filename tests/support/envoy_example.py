"""The Envoy example the end-to-end tests run: examples/envoy/envoy.yaml and its policy, the
ports written in it, and the upstream it routes to (a handler answering every GET)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path

__all__ = [
    "ENVOY_CONFIG",
    "EXAMPLE_ADMIN",
    "EXAMPLE_LISTENER",
    "EXAMPLE_SLUICE",
    "EXAMPLE_UPSTREAM",
    "POLICY",
    "STATS",
    "UPSTREAM_BODY",
    "Upstream",
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
