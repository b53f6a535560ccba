"""The ASGI application Envoy runs through pyvoy for ``sluice serve --transport pyvoy``.

Envoy (started by sluice/pyvoy_launcher.py) serves the gRPC port with its own HTTP/2 stack
and hands each call to this app, in an interpreter embedded in the Envoy process, on one
event loop (pyvoy's thread). The rest of Sluice runs on that same loop, started from the
ASGI lifespan: the aiohttp HTTP port, the snapshot reloader and the usage flusher, all
over one limiter, exactly as under grpc.aio.

Settings come from the environment (``SLUICE_*``, secrets as ``SLUICE_*_FILE``) the launcher
sets. A socket inherited from the launcher (fd ``SLUICE_EDGE_CONTROL_FD``) carries the
lifecycle, because Envoy owns the process's signals: this app writes ``ready HTTP_PORT``
once started; the launcher writes ``serving`` once Envoy's listener accepts (health turns
SERVING then), and ``drain`` on SIGTERM, and the app drains as grpc.aio does
(health NOT_SERVING, new calls UNAVAILABLE, calls in flight finish within the grace period,
usage flushed), answers ``stopped`` and ends the process at once (``os._exit``, as
grpc.aio's server does); a drain that raises is logged with its traceback, answered
``failed`` and ends the process with code 1 (the launcher then exits 1). If the launcher
goes away (the socket reads end-of-file), the app drains and ends the process the same way.
An app that refuses to start writes ``refused CODE LINES`` instead of ``ready``: the launcher
exits with that code and prints those lines.

Under ``sluice serve --workers N`` (N > 1) each worker's launcher runs one Envoy with this
app; the supervisor's ``PROMETHEUS_MULTIPROC_DIR`` reaches it through the environment, and
its metrics are added up there with the other workers' (sluice/metrics.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys

from grpc_health.v1 import health_pb2

from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2
from sluice.app import Sluice, freeze_startup_heap
from sluice.edge import GrpcApp
from sluice.edge.asgi import STREAM_STREAM, UNARY_UNARY
from sluice.edge.health import SERVICE_NAME as HEALTH_SERVICE
from sluice.edge.health import HealthService
from sluice.edge.reflection import add_reflection
from sluice.errors import SluiceError
from sluice.exit_codes import describe
from sluice.grpc.codec import encode_decision
from sluice.grpc.core import RateLimitCore, decode_request
from sluice.grpc.leases import LEASE_SERVICE_NAME, add_lease_methods
from sluice.grpc.server import HEALTH_SERVICE_NAMES, RLQS_NAME
from sluice.logs import configure as configure_logging
from sluice.policies.store import PolicyStore
from sluice.rlqs.service import QuotaService
from sluice.rlqs.wire import decode_reports
from sluice.settings import Settings, from_arguments

__all__ = [
    "CONTROL_FD_VARIABLE",
    "EdgeFront",
    "add_quota_service",
    "add_rate_limit_service",
    "app",
    "build",
]

log = logging.getLogger("sluice")

CONTROL_FD_VARIABLE = "SLUICE_EDGE_CONTROL_FD"
WORKER_VARIABLE = "SLUICE_EDGE_WORKER"  # set by the launcher of one of --workers N
RLS_NAME = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
RLS_PATH = f"/{RLS_NAME}/ShouldRateLimit"
MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024  # as GrpcServer's grpc.max_receive_message_length


def add_rate_limit_service(app: GrpcApp, core: RateLimitCore) -> None:
    """ShouldRateLimit on the edge, answered by ``core`` as grpc.aio's servicer answers (its
    refusals are the edge's own ``GrpcError``)."""
    app.add_method(RLS_PATH, UNARY_UNARY, core.decide, decode_request, encode_decision)


def add_quota_service(app: GrpcApp, quota: QuotaService) -> None:
    """StreamRateLimitQuotas (RLQS) on the edge: a bidirectional stream per data plane."""
    app.add_method(
        f"/{RLQS_NAME}/StreamRateLimitQuotas",
        STREAM_STREAM,
        quota.stream,
        decode_reports,
        bytes,  # the service encodes its responses itself
    )


class EdgeFront:
    """The gRPC port as Sluice sees it under pyvoy: Envoy listens; health is reported here."""

    def __init__(self, health: HealthService, port: int) -> None:
        self.health = health
        self.port = port

    async def start(self) -> None:
        """Health is set by ``Sluice`` (SERVING once Envoy's listener accepts)."""

    async def set_serving(self, serving: bool) -> None:
        Response = health_pb2.HealthCheckResponse  # noqa: N806
        await self.health.set_all(Response.SERVING if serving else Response.NOT_SERVING)

    async def stop(self, grace_s: float) -> None:
        """Nothing to close here: the launcher ends Envoy, and with it the listener."""


class Embedded:
    """Sluice inside Envoy: the edge app, and the lifecycle the launcher drives."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.health = HealthService(HEALTH_SERVICE_NAMES)  # as grpc.aio's
        self.sluice = Sluice(
            settings,
            grpc_front=EdgeFront(self.health, settings.grpc_port),
            # One of --workers N: metrics added up with the other workers'.
            metrics_dir=os.environ["PROMETHEUS_MULTIPROC_DIR"]
            if settings.worker_count > 1
            else None,
        )
        self.app = GrpcApp(
            max_receive_message_bytes=MAX_RECEIVE_MESSAGE_BYTES,
            on_startup=[self.startup],
            on_shutdown=[self.shutdown],
        )
        add_rate_limit_service(self.app, self.sluice.rls)
        add_quota_service(self.app, self.sluice.quota)
        add_lease_methods(self.app, self.sluice.leases)
        self.health.add_to(self.app)
        add_reflection(self.app, (RLS_NAME, RLQS_NAME, LEASE_SERVICE_NAME, HEALTH_SERVICE))
        self._store: PolicyStore | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._control_task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        try:
            await self._startup()
        except SluiceError as exc:
            _report_refusal(exc)
            raise

    async def _startup(self) -> None:
        _trace_this_thread()
        store = PolicyStore(self.settings.database_url)
        self._store = store.__enter__()
        # The launcher brought the schema up to date (and imported --config) already.
        self.sluice.attach(store)
        fd = os.environ.get(CONTROL_FD_VARIABLE)
        if fd is None:
            log.warning("no %s: not started by sluice serve", CONTROL_FD_VARIABLE)
            await self.sluice.start()
            return
        # Not serving yet: Envoy starts its listener after this startup; the launcher says
        # "serving" once the listener accepts, so health never runs ahead of the port.
        await self.sluice.start(serving=False)
        freeze_startup_heap()
        sock = socket.socket(fileno=int(fd))
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        writer.write(b"ready %d\n" % self.sluice.http_port)
        await writer.drain()
        self._control_task = asyncio.get_running_loop().create_task(self._follow(reader, writer))

    async def _follow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = b""
        try:
            line = await reader.readline()
            if line == b"serving\n":
                await self.sluice.set_serving(True)
                line = await reader.readline()
            await self.stop()
            answer, code = b"stopped\n", 0
        except Exception:
            # A bug: its traceback in the log, the launcher told, and the process ended all
            # the same. Left to itself, Envoy would serve on without an app that drains, and
            # the launcher would wait out its own timeout, then kill it.
            log.exception("stopping failed")
            answer, code = b"failed\n", 1
        if line:
            writer.write(answer)
            await writer.drain()
        else:
            log.warning("the launcher is gone: ending Envoy")
        # Drained and flushed: end Envoy at once, as grpc.aio's server ends its process
        # (Sluice.run_until_signal). Envoy's own shutdown would join the interpreter's worker
        # threads, which a hung config database can hold for minutes.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)

    async def stop(self) -> None:
        """Drain and close, once (from the launcher's ``drain`` or Envoy's own shutdown)."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        try:
            await self.sluice.stop(exiting=True)
            if self._store is not None:
                self._store.__exit__(None, None, None)
            logging.getLogger("sluice").info("drained")
        finally:
            _save_coverage()

    async def shutdown(self) -> None:
        await self.stop()


def _report_refusal(exc: SluiceError) -> None:
    """Tell the launcher why this app refused to start, so ``sluice serve`` exits with the
    code and the message it would have under grpc.aio (sluice/exit_codes.py)."""
    fd = os.environ.get(CONTROL_FD_VARIABLE)
    if fd is None:
        return
    code, lines = describe(exc)
    with socket.socket(fileno=os.dup(int(fd))) as sock:
        sock.sendall(b"refused %d %s\n" % (code, json.dumps(lines).encode()))


def _start_coverage() -> None:
    """Under the test suite's coverage (its subprocess patch sets COVERAGE_PROCESS_CONFIG for
    every process the tests start), measure this interpreter too: embedded in Envoy, it does
    not read the .pth file through which coverage starts in any other Python process."""
    if os.environ.get("COVERAGE_PROCESS_CONFIG") is None:
        return
    try:
        import coverage
    except ImportError:
        return
    coverage.process_startup()


def _trace_this_thread() -> None:
    """Coverage on Python 3.11 traces the thread that started it and the threads Python starts
    later; pyvoy's event loop runs on a thread Envoy started, so it is started there again."""
    coverage = sys.modules.get("coverage")
    current = coverage.Coverage.current() if coverage is not None else None
    if current is not None:
        current.stop()
        current.start()


def _save_coverage() -> None:
    """Write what coverage measured here: Envoy ends the process without running Python's
    exit handlers, where coverage would save it."""
    coverage = sys.modules.get("coverage")
    current = coverage.Coverage.current() if coverage is not None else None
    if current is not None:
        current.save()


def build() -> GrpcApp:
    settings = from_arguments(None)
    worker = os.environ.get(WORKER_VARIABLE)
    # As the launcher's own lines (sluice/workers.py under --workers, else sluice/cli.py).
    configure_logging(
        level=settings.log_level,
        log_format=settings.log_format,
        worker=int(worker) if worker else None,
    )
    return Embedded(settings).app


if os.environ.get(CONTROL_FD_VARIABLE) is not None:
    _start_coverage()
app = build() if os.environ.get(CONTROL_FD_VARIABLE) is not None else None
"""Built on import inside Envoy (the launcher sets the control fd); None elsewhere, so
importing this module to read it costs nothing."""
