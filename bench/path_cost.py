"""Sluice's own cost per ShouldRateLimit call, in process: the gRPC-over-ASGI edge driven
directly (no sockets, no Envoy), once with a no-op handler and once with Sluice's decision
path over the memory backend, so the difference is what Sluice adds on the event loop.

It is the quick loop for optimising the decision path (seconds, not minutes, and far less
noise than a load test); ``bench/run.py`` remains the measure that counts.

    python bench/path_cost.py                    # 1 and 3 descriptors, 20,000 calls each
    python bench/path_cost.py --profile out.prof # cProfile of the Sluice path
    python bench/path_cost.py --statsd           # also with upstream's statsd metrics on
    python bench/path_cost.py --pins 10000       # also: the domain with 10,000 overrides
                                                 # and 10,000 blocks, against none
    python bench/path_cost.py --value-to-metric  # also: the rule with value_to_metric, its
                                                 # statsd name built and kept per request

With ``--statsd``, two more columns: the Sluice path with a statsd sink (the request path's
hook only), and the same with the sink's work off the request path charged to the calls too
(every 1,000 calls: the usage drain turned into counters, every line formatted and sent by
UDP to a socket of this process), which a server does on its flush timer instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from loadgen import Workload  # noqa: E402

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2  # noqa: E402
from sluice.backends.memory import MemoryBackend  # noqa: E402
from sluice.clock import SystemClock  # noqa: E402
from sluice.edge import GrpcApp  # noqa: E402
from sluice.edge.asgi import UNARY_UNARY  # noqa: E402
from sluice.grpc.core import RateLimitCore  # noqa: E402
from sluice.limiter import RateLimiter  # noqa: E402
from sluice.metrics import Metrics  # noqa: E402
from sluice.policies.snapshot import Snapshot  # noqa: E402
from sluice.policies.yaml_format import load_text  # noqa: E402
from sluice.pyvoy_app import RLS_PATH, add_rate_limit_service  # noqa: E402
from sluice.statsd import StatsdSink  # noqa: E402
from sluice.usage.recorder import UsageRecorder  # noqa: E402

POLICY = """\
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: fixed_window}
"""
# The same rule naming its statsd counters with each request's value.
NAMED_POLICY = POLICY.replace("  - key: user\n", "  - key: user\n    value_to_metric: true\n")
_OK = rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


def noop_app() -> GrpcApp:
    app = GrpcApp()

    async def handler(request: object, context: object) -> rls_pb2.RateLimitResponse:
        return _OK

    app.add_method(
        RLS_PATH,
        UNARY_UNARY,
        handler,
        rls_pb2.RateLimitRequest.FromString,  # as bench/noop_server.py decodes
        rls_pb2.RateLimitResponse.SerializeToString,
    )
    return app


def pinned_policy(count: int) -> str:
    """POLICY plus ``count`` overrides and ``count`` blocks, on values the workload never
    sends (the common case: most callers are not pinned, and each lookup is a miss)."""
    lines = [POLICY, "overrides:"]
    lines += [
        f"  - {{descriptor: user=override-{i}, rate_limit: {{unit: minute, "
        f"requests_per_unit: {i + 1}}}, expires_at: '2099-01-01T00:00:00Z'}}"
        for i in range(count)
    ]
    lines.append("blocks:")
    lines += [f"  - {{descriptor: user=block-{i}}}" for i in range(count)]
    return "\n".join(lines) + "\n"


def sluice_app(
    policy: str = POLICY,
    statsd: StatsdSink | None = None,
    recorder: UsageRecorder | None = None,
) -> GrpcApp:
    snapshot = Snapshot(load_text(policy, "bench.yaml"))
    recorder = recorder or UsageRecorder()
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), SystemClock(), recorder=recorder)
    app = GrpcApp()
    add_rate_limit_service(app, RateLimitCore(limiter, Metrics(dict), statsd))
    return app


def statsd_sink() -> tuple[StatsdSink, socket.socket]:
    """A sink sending to a UDP socket of this process (never read: the kernel drops what
    overflows, as it would at a statsd server that is behind)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    return StatsdSink("127.0.0.1", listener.getsockname()[1]), listener


async def drive(
    app: GrpcApp,
    bodies: list[bytes],
    calls: int,
    every_1000: Callable[[], None] | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> float:
    """CPU seconds per call, ``calls`` calls one after another (CPU time, not wall time:
    on a shared machine the process is descheduled at random; the best of the repeats counts).
    ``headers``: request metadata sent with every call (bench/tracing_cost.py's traceparent)."""
    scope = {
        "type": "http",
        "path": RLS_PATH,
        "headers": [(b"content-type", b"application/grpc"), (b"te", b"trailers")] + (headers or []),
    }
    sent = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    n = len(bodies)
    started = time.process_time()
    for i in range(calls):
        body = {"type": "http.request", "body": bodies[i % n], "more_body": False}

        async def receive(body: dict[str, object] = body) -> dict[str, object]:
            return body

        await app(scope, receive, send)
        if len(sent) > 64:
            sent.clear()
        if every_1000 is not None and i % 1000 == 999:
            every_1000()
    return (time.process_time() - started) / calls


def framed(workload: Workload, count: int) -> list[bytes]:
    return [len(m).to_bytes(5, "big") + m for m in workload.requests(count)]


async def main_async(args: argparse.Namespace) -> None:
    pins = args.pins
    header = "| descriptors | no-op µs/call | Sluice µs/call | Sluice − no-op µs | × no-op |"
    rule = "|---|---|---|---|---|"
    if args.statsd:
        header += " Sluice + statsd hook µs/call | + statsd flush µs/call |"
        rule += "---|---|"
    if pins:
        header += f" Sluice, {pins:,} overrides + {pins:,} blocks µs/call | × Sluice |"
        rule += "---|---|"
    if args.value_to_metric:
        header += " Sluice, value_to_metric µs/call | × Sluice |"
        rule += "---|---|"
    print(header)
    print(rule)
    for descriptors in args.descriptors:
        bodies = framed(Workload(keyspace=args.keyspace, descriptors=descriptors), 1000)
        noop, sluice = noop_app(), sluice_app()
        pinned = sluice_app(pinned_policy(pins)) if pins else None
        named = None
        if args.value_to_metric:  # statsd on: the names are kept (one per value of the keyspace)
            named = sluice_app(NAMED_POLICY, recorder=UsageRecorder(named=True))
        await drive(sluice, bodies, 2000)  # warm
        for other in (pinned, named):
            if other is not None:
                await drive(other, bodies, 2000)
        noop_runs, sluice_runs, hook_runs, flush_runs, pinned_runs = [], [], [], [], []
        named_runs = []
        if args.statsd:
            sink, listener = statsd_sink()
            recorder = UsageRecorder()
            with_statsd = sluice_app(statsd=sink, recorder=recorder)

            def flush(sink: StatsdSink = sink, recorder: UsageRecorder = recorder) -> None:
                sink.add_usage(recorder.drain())
                sink.flush()

            await drive(with_statsd, bodies, 2000, flush)  # warm
        for _ in range(args.repeat):  # interleaved: the machine's drift hits all alike
            noop_runs.append(await drive(noop, bodies, args.calls))
            sluice_runs.append(await drive(sluice, bodies, args.calls))
            if args.statsd:
                hook_runs.append(await drive(with_statsd, bodies, args.calls))
                sink.lines()  # what the hook gathered, dropped untimed
                flush_runs.append(await drive(with_statsd, bodies, args.calls, flush))
            if pinned is not None:
                pinned_runs.append(await drive(pinned, bodies, args.calls))
            if named is not None:
                named_runs.append(await drive(named, bodies, args.calls))
        a, b = min(noop_runs) * 1e6, min(sluice_runs) * 1e6
        row = f"| {descriptors} | {a:.1f} | {b:.1f} | {b - a:.1f} | {b / a:.2f} |"
        if args.statsd:
            listener.close()
            row += f" {min(hook_runs) * 1e6:.1f} | {min(flush_runs) * 1e6:.1f} |"
        if pinned_runs:
            c = min(pinned_runs) * 1e6
            row += f" {c:.1f} | {c / b:.3f} |"
        if named_runs:
            c = min(named_runs) * 1e6
            row += f" {c:.1f} | {c / b:.3f} |"
        print(row)
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            await drive(sluice, bodies, args.calls)
            profiler.disable()
            profiler.dump_stats(f"{args.profile}.{descriptors}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keyspace", type=int, default=1000)
    parser.add_argument("--descriptors", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--profile", help="write a cProfile of the Sluice path here")
    parser.add_argument("--statsd", action="store_true", help="also measure with statsd on")
    parser.add_argument(
        "--pins",
        type=int,
        default=0,
        metavar="N",
        help="also measure the domain with N overrides and N blocks (none are hit)",
    )
    parser.add_argument(
        "--value-to-metric",
        action="store_true",
        help="also measure the rule with value_to_metric (statsd names per request)",
    )
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main_async(args))
    except ImportError:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
