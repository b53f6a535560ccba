"""gRPC over ASGI: a small server-side gRPC protocol layer for ASGI servers with the HTTP
trailers extension (pyvoy runs it inside Envoy). Independent of Sluice's domain code.

``GrpcApp`` routes on ``:path`` (``/package.Service/Method``) to unary, server-streaming,
client-streaming and bidirectional handlers; see asgi.py for the protocol details.
"""

from sluice.edge.asgi import Context, GrpcApp, GrpcError
from sluice.edge.status import Status

__all__ = ["Context", "GrpcApp", "GrpcError", "Status"]
