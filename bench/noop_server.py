"""The baseline: a grpc.aio RateLimitService whose ShouldRateLimit returns a constant OK.

Same server options as Sluice's gRPC server (server/sluice/grpc/server.py), so whatever
Sluice costs on top of this is Sluice's own. Run: ``python bench/noop_server.py --port N``;
it prints ``READY <port>`` once serving.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
