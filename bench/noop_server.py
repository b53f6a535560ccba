"""The baseline: a RateLimitService whose ShouldRateLimit returns a constant OK, on the same
transport as Sluice's gRPC port, so whatever Sluice costs on top of it is Sluice's own.

``--transport grpcio`` (the default): a grpc.aio server with the options of Sluice's
(server/sluice/grpc/server.py). ``--transport pyvoy``: Envoy with the config
``sluice serve --transport pyvoy`` runs (sluice/pyvoy_launcher.py), serving the no-op on
Sluice's gRPC-over-ASGI edge (sluice/edge), as Sluice's ShouldRateLimit is served there.

Run: ``python bench/noop_server.py --port N [--transport pyvoy]``; it prints ``READY <port>``
once serving, and with pyvoy ``ENVOY_PID <pid>``: the process whose CPU is the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

# Built once: the handler's own cost should be as close to zero as Python allows.
_OK = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


class NoopServicer(rls_pb2_grpc.RateLimitServiceServicer):
    async def ShouldRateLimit(  # noqa: N802 (the name is fixed by the proto)
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext
    ) -> rls_pb2.RateLimitResponse:
        return _OK


async def serve(host: str, port: int) -> None:
    # Keep in step with GrpcServer.__init__: the options change the transport's cost.
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", 4 * 1024 * 1024),
        ]
    )
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(NoopServicer(), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    await server.start()
    print(f"READY {bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def _edge_app():  # noqa: ANN202 (a sluice.edge.GrpcApp; imported inside Envoy only)
    from sluice.edge import GrpcApp
    from sluice.edge.asgi import UNARY_UNARY

    async def should_rate_limit(request, context):  # noqa: ANN001, ANN202
        return _OK

    app = GrpcApp()
    app.add_method(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        UNARY_UNARY,
        should_rate_limit,
        rls_pb2.RateLimitRequest.FromString,  # decoded, as grpc.aio's no-op decodes it
        rls_pb2.RateLimitResponse.SerializeToString,
    )
    return app


# What Envoy imports (as noop_server:edge_app): built only there.
edge_app = _edge_app() if os.environ.get("SLUICE_NOOP_EDGE") else None


def serve_pyvoy(host: str, port: int, app: str) -> None:
    from sluice.pyvoy_launcher import _die_with_parent, _listener_port, envoy_command, envoy_config
    from sluice.settings import Settings

    with tempfile.TemporaryDirectory(prefix="sluice-noop-") as tmp:
        admin = Path(tmp) / "admin.sock"
        config = envoy_config(Settings(host=host, grpc_port=port), admin, app)
        path = Path(tmp) / "envoy.json"
        path.write_text(json.dumps(config))
        from pyvoy._server import get_envoy_environ

        env = {**os.environ, **get_envoy_environ(), "SLUICE_NOOP_EDGE": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env["PYTHONPATH"]])
        process = subprocess.Popen(
            envoy_command(path),
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        # Only now (a child inherits blocked signals): SIGTERM and SIGINT wait for sigwait.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            for _ in range(600):
                if process.poll() is not None:
                    raise SystemExit(f"Envoy exited with {process.returncode}")
                try:
                    bound = _listener_port(admin)
                    break
                except (OSError, ValueError, KeyError, RuntimeError):
                    time.sleep(0.05)
            else:
                raise SystemExit("Envoy did not start listening")
            print(f"READY {bound}", flush=True)
            print(f"ENVOY_PID {process.pid}", flush=True)
            signal.sigwait({signal.SIGTERM, signal.SIGINT})
        finally:
            process.terminate()
            process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--transport", choices=("grpcio", "pyvoy"), default="grpcio")
    parser.add_argument(
        "--app",
        default="noop_server:edge_app",
        help="pyvoy: the ASGI app Envoy runs (another no-op, to compare with the edge's)",
    )
    args = parser.parse_args()
    if args.transport == "pyvoy":
        serve_pyvoy(args.host, args.port, args.app)
    else:
        asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    sys.exit(main())
