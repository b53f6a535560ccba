"""What OpenTelemetry tracing (``--otel-tracing``, sluice/tracing.py) costs per
ShouldRateLimit call, and what it costs when off: bench/path_cost.py's in-process
measure (the ASGI edge driven directly, memory backend, CPU time per call), for three
variants, each in a child process of its own and alternated round by round so the machine's
drift hits all alike:

- ``hidden``: off, with OpenTelemetry's SDK not importable (as without the ``otel`` extra);
- ``off``: off, with the extra installed (the default);
- ``on``: on, every call traced (the caller's ``traceparent`` continued, spans batched by the
  SDK's BatchSpanProcessor to an exporter that drops them, so no network is measured).

Every call carries a ``traceparent``, as Envoy's calls do with tracing on.

    python bench/tracing_cost.py                  # 1 and 3 descriptors, 5 rounds
    python bench/tracing_cost.py --rounds 9 --calls 20000
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.abc
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("hidden", "off", "on")
TRACEPARENT = (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


class _HideSdk(importlib.abc.MetaPathFinder):
    """The ``otel`` extra not installed: its packages cannot be imported."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: object = None) -> None:
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ImportError(f"No module named {name!r} (hidden by the benchmark)")
        return None


def child(variant: str, descriptors: int, calls: int, repeat: int) -> dict[str, float]:
    if variant == "hidden":
        sys.meta_path.insert(0, _HideSdk())
    sys.path.insert(0, str(HERE))
    from loadgen import Workload
    from path_cost import drive, framed, noop_app, sluice_app

    from sluice.backends.memory import MemoryBackend
    from sluice.clock import SystemClock
    from sluice.edge import GrpcApp
    from sluice.limiter import RateLimiter
    from sluice.metrics import Metrics
    from sluice.policies.snapshot import Snapshot
    from sluice.policies.yaml_format import load_text
    from sluice.pyvoy_app import add_rate_limit_service
    from sluice.usage.recorder import UsageRecorder

    if variant == "on":
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
        from path_cost import POLICY

        from sluice.tracing import TimedBackend, TracedRateLimitCore

        class Dropping(SpanExporter):
            def export(self, spans: object) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropping()))
        snapshot = Snapshot(load_text(POLICY, "bench.yaml"))
        limiter = RateLimiter(
            lambda: snapshot,
            TimedBackend(MemoryBackend()),
            SystemClock(),
            recorder=UsageRecorder(),
        )
        app = GrpcApp()
        core = TracedRateLimitCore(limiter, Metrics(dict), tracer=provider.get_tracer("bench"))
        add_rate_limit_service(app, core)
    else:
        app = sluice_app()
    bodies = framed(Workload(keyspace=1000, descriptors=descriptors), 1000)
    noop = noop_app()

    async def measure() -> dict[str, float]:
        await drive(app, bodies, 2000, headers=[TRACEPARENT])  # warm
        noop_runs, runs = [], []
        for _ in range(repeat):
            noop_runs.append(await drive(noop, bodies, calls, headers=[TRACEPARENT]))
            runs.append(await drive(app, bodies, calls, headers=[TRACEPARENT]))
        return {"noop": min(noop_runs) * 1e6, "sluice": min(runs) * 1e6}

    try:
        import uvloop

        return uvloop.run(measure())
    except ImportError:
        return asyncio.run(measure())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--descriptors", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        [descriptors] = args.descriptors
        print(json.dumps(child(args.child, descriptors, args.calls, 2)))
        return
    print(
        "| descriptors | no-op µs/call | off, SDK not installed µs/call | off µs/call "
        "| on µs/call | on − off µs |"
    )
    print("|---|---|---|---|---|---|")
    for descriptors in args.descriptors:
        best: dict[str, float] = {}
        noop = float("inf")
        for _ in range(args.rounds):
            for variant in VARIANTS:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", variant, "--calls", str(args.calls),
                     "--descriptors", str(descriptors)],
                    check=True, capture_output=True, text=True,
                ).stdout  # fmt: skip
                result = json.loads(out)
                best[variant] = min(best.get(variant, float("inf")), result["sluice"])
                noop = min(noop, result["noop"])
        print(
            f"| {descriptors} | {noop:.1f} | {best['hidden']:.1f} | {best['off']:.1f} "
            f"| {best['on']:.1f} | {best['on'] - best['off']:.1f} |"
        )


if __name__ == "__main__":
    main()
