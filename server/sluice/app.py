"""The composition root: settings in, a running Sluice out. All wiring happens here."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from sluice.backends import Backend
from sluice.backends.memory import MemoryBackend
from sluice.clock import Clock, SystemClock
from sluice.grpc.server import GrpcServer
from sluice.http.app import make_app
from sluice.limiter import LimiterSettings, RateLimiter
from sluice.policies.reloader import SnapshotReloader
from sluice.policies.service import PolicyService
from sluice.policies.snapshot import Snapshot
from sluice.policies.store import PolicyStore
from sluice.settings import Settings

__all__ = ["Sluice"]

log = logging.getLogger("sluice")


class Sluice:
    """One server: the gRPC port and the HTTP port over one limiter and one snapshot."""

    def __init__(
        self, settings: Settings, *, clock: Clock | None = None, backend: Backend | None = None
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.snapshot = Snapshot()
        self.backend = (
            backend if backend is not None else MemoryBackend(max_keys=settings.memory_max_keys)
        )
        self.limiter = RateLimiter(
            lambda: self.snapshot,
            self.backend,
            self.clock,
            LimiterSettings(
                bounds=settings.request_bounds,
                global_shadow_mode=settings.global_shadow_mode,
                response_headers=settings.response_headers,
            ),
        )
        self._serving = False
        self._grpc: GrpcServer | None = None
        self._http: web.AppRunner | None = None
        self.reloader: SnapshotReloader | None = None
        self.service: PolicyService | None = None
        self.grpc_port = 0
        self.http_port = 0

    def install(self, snapshot: Snapshot) -> None:
        # One assignment: a request in flight keeps the snapshot it started with.
        self.snapshot = snapshot

    def attach(self, store: PolicyStore) -> None:
        """Serve the policies in ``store`` and follow its changes (after ``start``)."""
        s = self.settings
        self.service = PolicyService(store, max_log_limit=s.max_sliding_log_limit)
        self.reloader = SnapshotReloader(
            store,
            self.install,
            interval_s=s.config_poll_interval_s,
            cache_path=s.snapshot_cache_path,
            max_log_limit=s.max_sliding_log_limit,
        )
        self.reloader.load_initial()

    def status(self) -> dict[str, object]:
        config = self.reloader.status.as_dict() if self.reloader is not None else {}
        return {"config": config}

    async def start(self) -> None:
        s = self.settings
        self._grpc = GrpcServer(self.limiter, s.host, s.grpc_port)
        self.grpc_port = self._grpc.port
        await self._grpc.start()
        app = make_app(
            self.limiter,
            healthy=lambda: self._serving,
            snapshot=lambda: self.snapshot,
            status=self.status,
            max_body_bytes=s.http_max_body_bytes,
            service=self.service,
            api_token=s.api_token,
        )
        self._http = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._http.setup()
        site = web.TCPSite(self._http, s.host, s.http_port)
        await site.start()
        sockets = site._server.sockets if site._server is not None else ()  # noqa: SLF001
        self.http_port = sockets[0].getsockname()[1] if sockets else s.http_port
        if self.reloader is not None:
            self.reloader.start()
        self._serving = True
        log.info("gRPC on %s:%d, HTTP on %s:%d", s.host, self.grpc_port, s.host, self.http_port)

    async def stop(self) -> None:
        """Drain: health turns NOT_SERVING, new calls are refused, in-flight calls finish."""
        self._serving = False
        if self.reloader is not None:
            await self.reloader.stop()
        if self._grpc is not None:
            await self._grpc.stop(self.settings.shutdown_grace_s)
        if self._http is not None:
            await self._http.cleanup()
        await self.backend.close()

    async def run_until_signal(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        log.info("signal received: draining for up to %.1fs", self.settings.shutdown_grace_s)
        await self.stop()
        log.info("stopped")
