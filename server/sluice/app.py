"""The composition root: settings in, a running Sluice out. All wiring happens here."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from aiohttp import web
from redis.asyncio import Redis, RedisCluster

from sluice.access_log import AccessLog
from sluice.backends import Backend
from sluice.backends.memory import MemoryBackend
from sluice.backends.over_limit_cache import OverLimitCache
from sluice.backends.redis.backend import RedisBackend
from sluice.backends.redis.connect import RedisTls, SharedSslContext, connect
from sluice.clock import Clock, SystemClock
from sluice.errors import ConfigDatabaseError
from sluice.grpc.core import RateLimitCore
from sluice.grpc.leases import LeaseCore
from sluice.grpc.server import GrpcServer
from sluice.http.app import make_app
from sluice.http.connections import BoundedRunner
from sluice.http.management import make_management_app
from sluice.http.runtime import Runtime
from sluice.leases import LeaseService, LeaseStore, MemoryLeaseStore
from sluice.leases.redis import RedisLeaseStore
from sluice.limiter import LimiterSettings, RateLimiter
from sluice.metrics import Metrics
from sluice.policies.reloader import SnapshotReloader
from sluice.policies.service import PolicyService
from sluice.policies.snapshot import Snapshot
from sluice.policies.store import PolicyStore
from sluice.policies.watcher import ConfigWatcher
from sluice.readiness import Readiness
from sluice.redaction import redact_url
from sluice.rlqs.exchange import DemandExchange, LocalExchange, RedisExchange
from sluice.rlqs.service import QuotaService, QuotaSettings
from sluice.settings import Settings
from sluice.statsd import StatsdSink, parse_tags
from sluice.tls import ServerTls
from sluice.tls_reload import FollowedTls
from sluice.usage.flusher import UsageFlusher
from sluice.usage.recorder import RuleUsage, UsageRecorder
from sluice.usage.store import UsageStore

if TYPE_CHECKING:  # the module imports OpenTelemetry: only when tracing is on
    from sluice.tracing import Tracing

__all__ = [
    "GrpcFront",
    "Sluice",
    "freeze_startup_heap",
    "make_backend",
    "make_lease_store",
    "make_statsd",
]

log = logging.getLogger("sluice")


def make_backend(
    settings: Settings, *, redis_ssl_context: SharedSslContext | None = None
) -> Backend:
    """The backend the settings name: memory, or Redis (with the local over-limit cache).
    ``redis_ssl_context``: TLS connections to Redis share it (so it can be reloaded)."""
    if settings.backend != "redis":
        return MemoryBackend(max_keys=settings.memory_max_keys)
    log.info("algorithm state in Redis at %s", redact_url(settings.redis_url))
    backend: Backend = RedisBackend(
        _redis_client(settings, redis_ssl_context=redis_ssl_context),
        key_prefix=settings.redis_key_prefix,
        max_concurrent_calls=settings.redis_pool_size,
        lean_client=settings.redis_client == "lean",
    )
    if settings.local_cache:
        backend = OverLimitCache(backend, max_keys=settings.local_cache_max_keys)
    return backend


def make_exchange(
    settings: Settings, *, redis_ssl_context: SharedSslContext | None = None
) -> DemandExchange:
    """How RLQS instances agree on shares: through Redis when state lives there (every
    instance sharing it shares the limits), else this instance alone."""
    if settings.backend != "redis":
        return LocalExchange()
    client = _redis_client(settings, pool_size=4, redis_ssl_context=redis_ssl_context)
    return RedisExchange(client, key_prefix=settings.redis_key_prefix)


def make_lease_store(
    settings: Settings, *, redis_ssl_context: SharedSslContext | None = None
) -> LeaseStore:
    """Where concurrency leases are held: with the algorithm state (its own Redis client)."""
    if settings.backend != "redis":
        return MemoryLeaseStore()
    return RedisLeaseStore(
        _redis_client(settings, redis_ssl_context=redis_ssl_context),
        key_prefix=settings.redis_key_prefix,
        max_concurrent_calls=settings.redis_pool_size,
    )


def _lease_store_name(settings: Settings) -> str:
    """Where leases live, as the runtime view names it: a Redis store is every instance's."""
    if settings.backend != "redis":
        return "memory"
    return f"{redact_url(settings.redis_url)} {settings.redis_key_prefix}"


def _redis_client(
    settings: Settings,
    *,
    pool_size: int | None = None,
    redis_ssl_context: SharedSslContext | None = None,
) -> Redis | RedisCluster:
    """``redis_ssl_context``: TLS connections share it, so a rotated client certificate
    reaches them (sluice/tls_reload.py)."""
    return connect(
        settings.redis_url,
        pool_size=settings.redis_pool_size if pool_size is None else pool_size,
        timeout_s=settings.redis_timeout_ms / 1000,
        tls=RedisTls(
            settings.redis_tls_ca_file, settings.redis_tls_cert_file, settings.redis_tls_key_file
        ),
        shared_ssl_context=redis_ssl_context,
    )


def make_statsd(settings: Settings, state: Callable[[], dict[str, float]]) -> StatsdSink | None:
    """envoyproxy/ratelimit's statsd metrics, when ``statsd_address`` names a destination."""
    if not settings.statsd_address:
        return None
    host, _, port = settings.statsd_address.rpartition(":")
    log.info(
        "statsd metrics to %s:%s (%s) every %gs",
        host,
        port,
        settings.statsd_protocol,
        settings.statsd_flush_interval_s,
    )
    return StatsdSink(
        host.strip("[]"),
        int(port),
        flavor=settings.statsd_flavor,
        protocol=settings.statsd_protocol,
        tags=parse_tags(settings.statsd_tags),
        flush_interval_s=settings.statsd_flush_interval_s,
        state=state,
    )


YOUNG_GC_THRESHOLD = 10_000


def freeze_startup_heap() -> None:
    """Take what start-up built out of the cyclic collector's sight. A full collection
    walks every tracked object (modules, protobuf descriptors, SQLAlchemy, the snapshot): it
    took 54–66 ms of the event loop's CPU, every 10–60 s under load, and every call waiting
    meanwhile (docs/benchmarks.md, "Tail latency on pyvoy"). Start-up's own garbage is
    collected first, so the freeze keeps only what lives; after it, a full collection walks
    only what serving has allocated since (none took over 0.5 ms in a 60 s run).

    The young generation's threshold is then raised from 700 allocations to
    ``YOUNG_GC_THRESHOLD``: the Redis path allocates a task, a future and their frames per
    batch, and collecting the young every 700 allocations cost about 5 % of its client-side
    CPU per call with one descriptor and 13–15 % with three (``bench/redis_path.py``,
    docs/benchmarks.md "The young generation's threshold"); with fewer collections more of those
    objects are already freed by reference counting when one runs. A young collection then
    walks at most 10,000 objects: about half a millisecond if every one of them still lives.

    Called by what runs a server process, once it serves (``run_until_signal``, and the app
    inside Envoy); not by ``Sluice.start``, which tests call many times in one process."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, older, oldest)


class GrpcFront(Protocol):
    """What serves the gRPC port: grpc.aio's server (``GrpcServer``, the default), or the
    ASGI edge Envoy runs (``sluice.pyvoy_app``). Either answers ShouldRateLimit through
    ``Sluice.rls``, which drains on stop."""

    port: int

    async def start(self) -> None: ...

    async def set_serving(self, serving: bool) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


class Sluice:
    """One server: the gRPC port and the HTTP port over one limiter and one snapshot."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        backend: Backend | None = None,
        metrics_dir: str | None = None,
        grpc_front: GrpcFront | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``metrics_dir``: one of ``--workers`` processes, whose metrics are added up there.
        ``tracing``: with ``otel_tracing``, spans made with it (else the OTEL_* variables')."""
        self.settings = settings
        self.tls = ServerTls.from_settings(settings)
        self.clock = clock or SystemClock()
        self.snapshot = Snapshot()
        # --- certificates followed while serving (sluice/tls_reload.py) ---
        redis_ssl_context = SharedSslContext()
        self.followed_tls = FollowedTls(self.tls, redis_ssl_context, settings)
        # ---
        self.backend = (
            backend
            if backend is not None
            else make_backend(settings, redis_ssl_context=redis_ssl_context)
        )
        # Hits named otherwise than their rule are kept apart only for statsd, which names them.
        self.recorder = UsageRecorder(
            near_limit_ratio=settings.near_limit_ratio, named=bool(settings.statsd_address)
        )
        self.metrics = Metrics(self._metric_state, multiprocess_dir=metrics_dir)
        self.lease_store = make_lease_store(settings, redis_ssl_context=redis_ssl_context)
        # --- OpenTelemetry (sluice/tracing.py): imported only when on ---
        self.tracing: Tracing | None = None
        limiter_backend = self.backend
        if settings.otel_tracing:
            from sluice.tracing import TimedBackend, start_tracing

            self.tracing = tracing if tracing is not None else start_tracing()
            limiter_backend = TimedBackend(self.backend)
        # ---
        self.limiter = RateLimiter(
            lambda: self.snapshot,
            limiter_backend,
            self.clock,
            LimiterSettings(
                bounds=settings.request_bounds,
                global_shadow_mode=settings.global_shadow_mode,
                response_headers=settings.response_headers,
                failure_mode=settings.redis_failure_mode,
                limit_overrides=settings.limit_overrides,
            ),
            recorder=self.recorder,
            leases=self.lease_store,
        )
        # The LeaseService (acquire / renew / release), whichever transport serves it.
        self.leases = LeaseCore(
            LeaseService(
                lambda: self.snapshot,
                self.lease_store,
                self.clock,
                bounds=settings.request_bounds,
            ),
            self.metrics,
        )
        self.statsd = make_statsd(settings, self._metric_state)
        # ShouldRateLimit, whichever transport serves it; drained on stop.
        access_log = AccessLog.create(settings.access_log_sample_rate)
        self.rls = RateLimitCore(self.limiter, self.metrics, self.statsd, access_log)
        if self.tracing is not None:
            from sluice.tracing import TracedRateLimitCore

            self.rls = TracedRateLimitCore(
                self.limiter, self.metrics, self.statsd, access_log, tracer=self.tracing.tracer
            )
        # StreamRateLimitQuotas, whichever transport serves it; its streams end on stop.
        self.quota = QuotaService(
            lambda: self.snapshot,
            self.clock,
            settings=QuotaSettings(
                ttl_s=settings.rlqs_assignment_ttl_s,
                max_buckets_per_stream=settings.rlqs_max_buckets_per_stream,
                bounds=settings.request_bounds,
            ),
            exchange=make_exchange(settings, redis_ssl_context=redis_ssl_context),
            recorder=self.recorder,
            on_assignments=self.metrics.count_rlqs_assignments,
        )
        self._grpc_front = grpc_front
        self._serving = False
        self._grpc: GrpcFront | None = None
        self._http: web.AppRunner | None = None
        self._management: web.AppRunner | None = None
        self.readiness = Readiness(
            serving=lambda: self._serving,
            config=lambda: self.reloader.status if self.reloader is not None else None,
            backend=self.backend,
            clock=self.clock,
        )
        self.reloader: SnapshotReloader | None = None
        self.flusher: UsageFlusher | None = None
        self.watcher: ConfigWatcher | None = None
        self.service: PolicyService | None = None
        self.grpc_port = 0
        self.http_port = 0

    def install(self, snapshot: Snapshot) -> None:
        # One assignment: a request in flight keeps the snapshot it started with.
        self.snapshot = snapshot
        self.quota.snapshot_changed()

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
        self.flusher = UsageFlusher(
            self.recorder,
            UsageStore(store.database),
            self.clock,
            interval_s=s.usage_flush_interval_s,
            on_drain=self._on_drain,
        )
        if s.config and s.config_watch_interval_s > 0:
            # Each server watches: replicas publish the same change once between them.
            self.watcher = ConfigWatcher(
                s.config,
                self.service,
                interval_s=s.config_watch_interval_s,
                merge_domains=s.merge_domain_config,
                max_log_limit=s.max_sliding_log_limit,
            )
            try:
                self.watcher.follow_database()
            except ConfigDatabaseError as exc:  # the first look then publishes as an import
                log.warning("config files %s: the database's versions unread: %s", s.config, exc)
        self.reloader.load_initial()

    def _on_drain(self, drained: dict[str, RuleUsage]) -> None:
        self.metrics.record_usage(drained)
        if self.statsd is not None:
            self.statsd.add_usage(drained, self.recorder.drain_named())

    def status(self) -> dict[str, object]:
        config = self.reloader.status.as_dict() if self.reloader is not None else {}
        usage = {}
        if self.flusher is not None:
            usage = {
                "store": "up" if self.flusher.store_up else "unreachable",
                "flush_failures": self.flusher.failures,
                "dropped": self.flusher.dropped,
            }
        files = self.watcher.status.as_dict() if self.watcher is not None else {}
        return {"config": config, "config_files": files, "usage": usage}

    def _metric_state(self) -> dict[str, float]:
        state: dict[str, float] = {}
        if self.reloader is not None:
            st = self.reloader.status
            state.update(
                config_loads=st.loads,
                config_invalid_versions=st.invalid,
                config_database_errors=st.database_errors,
                config_database_up=float(st.database_up),
                config_from_cache=float(st.source == "cache"),
            )
        if self.watcher is not None:
            state["config_file_errors"] = self.watcher.status.errors
        state.update(self.backend.metric_values())
        if self.flusher is not None:
            state["usage_flush_failures"] = self.flusher.failures
        state["redis_errors"] = self.limiter.backend_errors
        state["global_shadow_answers"] = self.limiter.global_shadow_answers
        state["service_errors"] = self.rls.internal_errors
        state["tls_reloads"] = self.followed_tls.reloads
        state["tls_reload_failures"] = self.followed_tls.failures
        state["rlqs_reports"] = self.quota.reports
        state["rlqs_streams"] = self.quota.streams
        state["rlqs_buckets"] = self.quota.buckets
        return state

    async def start(self, *, serving: bool = True) -> None:
        """Open both ports and start the background work. ``serving=False``: health (gRPC and
        /healthcheck) says not serving until ``set_serving(True)`` (under pyvoy, once Envoy's
        listener accepts: the app starts before it)."""
        s = self.settings
        # Several worker processes (--workers) listen on the same ports; the kernel spreads
        # connections between them.
        shared_ports = s.worker_count > 1
        self._grpc = self._grpc_front or GrpcServer(
            self.limiter,
            s.host,
            s.grpc_port,
            metrics=self.metrics,
            credentials=self.followed_tls.grpc_credentials(),
            reuse_port=shared_ports,
            core=self.rls,
            quota=self.quota,
            leases=self.leases,
            max_connection_age_s=s.grpc_max_connection_age_s,
            max_connection_age_grace_s=s.grpc_max_connection_age_grace_s,
        )
        self.grpc_port = self._grpc.port
        await self._grpc.start()
        app = make_app(
            self.limiter,
            healthy=lambda: self._serving,
            snapshot=lambda: self.snapshot,
            status=self.status,
            max_body_bytes=s.http_max_body_bytes,
            body_timeout_s=s.http_idle_timeout_s,
            service=self.service,
            api_token=s.api_token,
            metrics=self.metrics,
            runtime=Runtime(self.lease_store, _lease_store_name(s), self.quota, self.clock),
        )
        # Requests still in flight at shutdown get the same grace as gRPC calls, not aiohttp's
        # own 60 s: a stuck client must not hold the process past its drain.
        self._http = BoundedRunner(
            app,
            idle_timeout_s=s.http_idle_timeout_s,
            max_idle_connections=s.http_max_idle_connections,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=s.shutdown_grace_s,
        )
        await self._http.setup()
        site = web.TCPSite(
            self._http,
            s.host,
            s.http_port,
            ssl_context=self.followed_tls.http_context(),
            reuse_port=True if shared_ports else None,
        )
        await site.start()
        server = cast(asyncio.Server | None, site._server)  # noqa: SLF001 (aiohttp keeps it)
        sockets = server.sockets if server is not None else ()
        self.http_port = sockets[0].getsockname()[1] if sockets else s.http_port
        if s.management_port:
            await self._start_management(reuse_port=shared_ports)
        if self.reloader is not None:
            self.reloader.start()
        if self.watcher is not None:
            self.watcher.start()
        if self.flusher is not None:
            self.flusher.start()
        self.metrics.start()
        if self.statsd is not None:
            self.statsd.start()
        self.quota.start()
        self.followed_tls.start()
        self._serving = serving
        if not serving:
            await self._grpc.set_serving(False)
        if self._grpc_front is not None:  # Envoy listens: its launcher logs the port
            log.info("serving; HTTP on %s:%d", s.host, self.http_port)
            return
        log.info(
            "gRPC on %s:%d, HTTP on %s:%d, %s",
            s.host,
            self.grpc_port,
            s.host,
            self.http_port,
            "plaintext" if self.tls is None else "mTLS" if self.tls.mutual else "TLS",
        )

    async def _start_management(self, *, reuse_port: bool) -> None:
        """The management port: plaintext whatever the service ports use (its module says
        why), and nothing on it that reads or changes policies or counters."""
        s = self.settings
        app = make_management_app(not_ready_reason=self.readiness.reason, metrics=self.metrics)
        self._management = BoundedRunner(
            app,
            idle_timeout_s=s.http_idle_timeout_s,
            max_idle_connections=s.http_max_idle_connections,
            access_log=None,
            handle_signals=False,
        )
        await self._management.setup()
        site = web.TCPSite(
            self._management,
            s.management_host,
            s.management_port,
            reuse_port=True if reuse_port else None,
        )
        await site.start()
        log.info("management port (plaintext) on %s:%d", s.management_host, s.management_port)

    async def set_serving(self, serving: bool) -> None:
        self._serving = serving
        if self._grpc is not None:
            await self._grpc.set_serving(serving)

    async def stop(self, *, exiting: bool = False) -> None:
        """Drain, then close. First health turns NOT_SERVING (and ``/ready`` 503) while calls
        are still answered, for ``drain_delay_s``: load balancers and Kubernetes endpoints
        take the instance out before it refuses anything. Then new calls are refused with
        UNAVAILABLE (a client may retry them on another instance) while calls in flight
        finish, for up to ``shutdown_grace_s``.

        ``exiting``: the process ends right after, so the gRPC server is left to the exit,
        which closes its connections (UNAVAILABLE for any call still on them). grpc's own
        shutdown cancels the calls that reach it while it runs, and clients do not retry
        CANCELLED.
        """
        await self.set_serving(False)
        if self.settings.drain_delay_s > 0:
            log.info("not ready; still answering for %.1fs", self.settings.drain_delay_s)
            await asyncio.sleep(self.settings.drain_delay_s)
        if self.watcher is not None:
            await self.watcher.stop()
        if self.reloader is not None:
            await self.reloader.stop()
        await self.quota.stop()  # streams end at once: data planes keep their assignments
        if self._grpc is not None:
            grace_s = self.settings.shutdown_grace_s
            drained = await asyncio.gather(self.rls.drain(grace_s), self.leases.drain(grace_s))
            if not all(drained):
                log.warning("shutdown grace period over: calls still in flight are cut off")
            if not exiting:
                await self._grpc.stop(0)
        if self._http is not None:
            await self._http.cleanup()
        if self._management is not None:
            await self._management.cleanup()
        await self.followed_tls.stop()
        if self.flusher is not None:
            await self.flusher.stop()
        if self.statsd is not None:
            await self.statsd.stop()  # after the flusher's last drain: nothing is left out
        await self.metrics.stop()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.flush)
        await self.backend.close()
        await self.lease_store.close()

    async def run_until_signal(self, started: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT, drain, and end the process with exit code 0 (1 if
        the drain raised, its traceback logged).

        It ends here, at once (``os._exit``), once everything Sluice holds is stopped and
        flushed: unwinding would shut grpc down (cancelling calls that arrive meanwhile) and
        join worker threads, which a hung config database can hold for many minutes.

        ``started`` is called once both ports serve.
        """
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        freeze_startup_heap()
        if started is not None:
            started()
        await stop.wait()
        log.info(
            "signal received: draining for up to %.1fs, after %.1fs reporting not ready",
            self.settings.shutdown_grace_s,
            self.settings.drain_delay_s,
        )
        code = 0
        try:
            await self.stop(exiting=True)
        except Exception:
            # A bug: its traceback in the log and exit code 1, as promptly as a clean stop.
            log.exception("stopping failed")
            code = 1
        else:
            log.info("stopped")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
