"""Prometheus metrics for ``/metrics`` on the HTTP port (names documented in docs/operations.md).

Per-rule counters are fed from the usage recorder when it is drained (once a second), and
state gauges are read at scrape time, so the request path pays only for the latency
histogram.

Under ``sluice serve --workers N`` (N > 1) every worker writes its metrics to files in a
directory the supervisor shares (prometheus_client's multiprocess mode), and whichever worker
answers a scrape adds them up. The state values read at scrape time live in one worker's
memory, so there each worker copies its own into shared counters and gauges every second
(and the answering worker just before it answers); each says how workers combine
(``_COUNTERS``, ``_GAUGES``, ``_PROCESS_GAUGES``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from sluice.periodic import Periodic
from sluice.usage.recorder import (
    ALLOWED,
    BACKEND_ERROR,
    BLOCKED,
    NEAR_LIMIT,
    OVER_LIMIT,
    SHADOW_OVER,
    RuleUsage,
)

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

GaugeMode = Literal["livesum", "livemin", "livemax"]

# sluice_rule_hits' results: exclusive, so summing them over `result` is every hit once
# (near-limit hits, a share of the allowed ones, have a counter of their own).
_RESULTS = (
    (ALLOWED, "allowed"),
    (OVER_LIMIT, "over_limit"),
    (SHADOW_OVER, "shadow_over_limit"),
    (BACKEND_ERROR, "backend_error"),
    (BLOCKED, "blocked"),
)

# Totals kept elsewhere (reloader, backend, flusher). Across workers: summed, dead workers'
# last figures included, so a restarted worker does not make a total go down.
_COUNTERS = {
    "config_loads": "Snapshots installed.",
    "config_invalid_versions": "Config versions refused because they failed validation.",
    "config_database_errors": "Failed polls of the config database.",
    "config_file_errors": "Changes to the --config files refused as invalid (last good kept).",
    "memory_backend_evictions": "Counters evicted because memory_max_keys was reached.",
    "usage_flush_failures": "Usage flushes that failed (figures kept for the next one).",
    "redis_round_trips": "Round trips to Redis (each carries a batch of decisions).",
    "redis_script_calls": "Script calls sent to Redis (one per hash slot per round trip).",
    "redis_fast_failures": "Decisions failed at once because the circuit was open.",
    "redis_late_answers": "Decisions answered unavailable: Redis took longer than 3 timeouts.",
    "local_cache_refusals": "Hits refused by the local over-limit cache, without Redis.",
    "rlqs_reports": "RLQS usage report messages received.",
    "tls_reloads": "Changed TLS files taken up (the service ports' or the Redis client's).",
    "tls_reload_failures": "Changed TLS files refused as unusable (the previous ones serve on).",
}
# Gauges, and how live workers' values combine (dead workers' values are dropped).
_GAUGES: dict[str, tuple[str, GaugeMode]] = {
    "config_database_up": ("1 when the last poll of the config database succeeded.", "livemin"),
    "config_from_cache": ("1 when serving the local snapshot cache, not the database.", "livemax"),
    "memory_backend_keys": ("Counters held by the memory backend.", "livesum"),
    "rlqs_streams": ("Open RLQS streams.", "livesum"),
    "rlqs_buckets": ("RLQS buckets held by open streams.", "livesum"),
    "redis_circuit_open": (
        "1 while a Redis circuit breaker (on Cluster: any master's) is open.",
        "livemax",
    ),
}
# process_* gauges are summed over live workers (memory, open fds) except these;
# process_cpu_seconds_total is a counter, summed like _COUNTERS.
_PROCESS_GAUGES: dict[str, GaugeMode] = {
    "process_start_time_seconds": "livemin",  # the oldest live worker's start
    "process_max_fds": "livemin",
}


class Metrics:
    def __init__(
        self, state: Callable[[], dict[str, float]], *, multiprocess_dir: str | None = None
    ) -> None:
        """``multiprocess_dir``: this process is one of several workers whose metrics are
        added up (``PROMETHEUS_MULTIPROC_DIR``, set before prometheus_client was imported)."""
        # No *_created series: a sample per counter that dashboards never use, and that
        # differs between workers (prometheus_client's switch is process-wide).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self.multiprocess = multiprocess_dir is not None
        own = None if self.multiprocess else self.registry
        if multiprocess_dir is None:
            ProcessCollector(registry=self.registry)
            self.registry.register(_StateCollector(state))
            self._shared: _SharedState | None = None
        else:
            if values.ValueClass is values.MutexValue:
                raise RuntimeError(
                    "multiprocess metrics: PROMETHEUS_MULTIPROC_DIR was not set when "
                    "prometheus_client was imported"
                )
            MultiProcessCollector(self.registry, path=multiprocess_dir)  # type: ignore[no-untyped-call]
            self._shared = _SharedState(state)
        self._refresher = Periodic("metrics refresh", 1.0, self._refresh_async)
        self.rule_hits = Counter(
            "sluice_rule_hits",
            "Hits per rule and result (a hit of cost n counts n).",
            ["domain", "rule", "result"],
            registry=own,
        )
        self.rule_total_hits = Counter(
            "sluice_rule_total_hits",
            "Hits per rule, whatever the result (envoyproxy/ratelimit's total_hits).",
            ["domain", "rule"],
            registry=own,
        )
        self.rule_near_limit = Counter(
            "sluice_rule_near_limit",
            "Allowed hits that found at least near_limit_ratio of the limit used.",
            ["domain", "rule"],
            registry=own,
        )
        self.rlqs_assignments = Counter(
            "sluice_rlqs_assignments",
            "RLQS bucket actions sent, by strategy (token_bucket, allow_all, deny_all).",
            ["strategy"],
            registry=own,
        )
        self.lease_calls = Counter(
            "sluice_lease_calls",
            "LeaseService calls by method and result: granted / refused (acquire), renewed /"
            " expired (renew), released / unknown (release), or the gRPC status refusing it.",
            ["method", "result"],
            registry=own,
        )
        self.request_seconds = Histogram(
            "sluice_request_duration_seconds",
            "Time to answer ShouldRateLimit, by transport and outcome.",
            ["transport", "code"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=own,
        )

    def record_usage(self, drained: dict[str, RuleUsage]) -> None:
        for rule, usage in drained.items():
            domain = rule.split(".", 1)[0]
            counts = usage.counts
            total = 0
            for index, result in _RESULTS:
                value = counts[index]
                if value:
                    total += value
                    self.rule_hits.labels(domain, rule, result).inc(value)
            if total:
                self.rule_total_hits.labels(domain, rule).inc(total)
            if counts[NEAR_LIMIT]:
                self.rule_near_limit.labels(domain, rule).inc(counts[NEAR_LIMIT])

    def count_lease_call(self, method: str, result: str) -> None:
        self.lease_calls.labels(method, result).inc()

    def count_rlqs_assignments(self, strategy: str, n: int) -> None:
        self.rlqs_assignments.labels(strategy).inc(n)

    def refresh(self) -> None:
        """Workers: copy this process's state values to the shared files (else nothing)."""
        if self._shared is not None:
            self._shared.refresh()

    async def _refresh_async(self) -> None:
        self.refresh()

    def start(self) -> None:
        """Workers: refresh the shared state values every second (else nothing)."""
        if self._shared is not None:
            self.refresh()
            self._refresher.start()

    async def stop(self) -> None:
        await self._refresher.stop()
        self.refresh()  # the last totals, before the process ends

    def exposition(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges and totals that live elsewhere (reloader, backend, flusher), read when scraped."""

    def __init__(self, state: Callable[[], dict[str, float]]) -> None:
        self._state = state

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        values = self._state()
        for name, help_text in _COUNTERS.items():
            if name in values:
                yield CounterMetricFamily(f"sluice_{name}", help_text, value=values[name])
        for name, (help_text, _) in _GAUGES.items():
            if name in values:
                yield GaugeMetricFamily(f"sluice_{name}", help_text, value=values[name])


class _SharedState:
    """One worker's state values and process figures, copied into multiprocess counters and
    gauges; metrics are made when first seen, so a worker exposes the same names a single
    process does."""

    def __init__(self, state: Callable[[], dict[str, float]]) -> None:
        self._state = state
        self._process = ProcessCollector(registry=None)
        self._counters: dict[str, tuple[Counter, list[float]]] = {}
        self._gauges: dict[str, Gauge] = {}

    def refresh(self) -> None:
        values = self._state()
        for name, help_text in _COUNTERS.items():
            if name in values:
                self._count(f"sluice_{name}", help_text, values[name])
        for name, (help_text, mode) in _GAUGES.items():
            if name in values:
                self._gauge(f"sluice_{name}", help_text, mode, values[name])
        for family in self._process.collect():
            for sample in family.samples:
                if family.type == "counter":
                    self._count(family.name, family.documentation, sample.value)
                else:
                    mode = _PROCESS_GAUGES.get(sample.name, "livesum")
                    self._gauge(sample.name, family.documentation, mode, sample.value)

    def _count(self, name: str, help_text: str, value: float) -> None:
        entry = self._counters.get(name)
        if entry is None:
            entry = self._counters[name] = (Counter(name, help_text, registry=None), [0.0])
        counter, last = entry
        if value > last[0]:
            counter.inc(value - last[0])
            last[0] = value

    def _gauge(self, name: str, help_text: str, mode: GaugeMode, value: float) -> None:
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = self._gauges[name] = Gauge(
                name, help_text, registry=None, multiprocess_mode=mode
            )
        gauge.set(value)
