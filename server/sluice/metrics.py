"""Prometheus metrics for ``/metrics`` on the HTTP port (names documented in docs/operations.md).

Per-rule counters are fed from the usage recorder when it is drained (once a second), and
state gauges are read at scrape time, so the request path pays only for the latency
histogram.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from sluice.usage.recorder import COUNTER_NAMES, RuleUsage

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self, state: Callable[[], dict[str, float]]) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.rule_hits = Counter(
            "sluice_rule_hits",
            "Hits per rule and result (a hit of cost n counts n).",
            ["domain", "rule", "result"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "sluice_request_duration_seconds",
            "Time to answer ShouldRateLimit, by transport and outcome.",
            ["transport", "code"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=self.registry,
        )
        self.registry.register(_StateCollector(state))

    def record_usage(self, drained: dict[str, RuleUsage]) -> None:
        for rule, usage in drained.items():
            domain = rule.split(".", 1)[0]
            for name, value in zip(COUNTER_NAMES, usage.counts, strict=True):
                if value:
                    self.rule_hits.labels(domain, rule, name).inc(value)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges and totals that live elsewhere (reloader, backend, flusher), read when scraped."""

    _COUNTERS = {
        "config_loads": "Snapshots installed.",
        "config_invalid_versions": "Config versions refused because they failed validation.",
        "config_database_errors": "Failed polls of the config database.",
        "memory_backend_evictions": "Counters evicted because memory_max_keys was reached.",
        "usage_flush_failures": "Usage flushes that failed (figures kept for the next one).",
        "redis_round_trips": "Round trips to Redis (each carries a batch of decisions).",
        "redis_script_calls": "Script calls sent to Redis (one per hash slot per round trip).",
        "redis_fast_failures": "Decisions failed at once because the circuit was open.",
        "redis_late_answers": "Decisions answered unavailable: Redis took longer than 3 timeouts.",
        "local_cache_refusals": "Hits refused by the local over-limit cache, without Redis.",
    }
    _GAUGES = {
        "config_database_up": "1 when the last poll of the config database succeeded.",
        "config_from_cache": "1 when serving the local snapshot cache, not the database.",
        "memory_backend_keys": "Counters held by the memory backend.",
        "redis_circuit_open": "1 while a Redis circuit breaker (on Cluster: any master's) is open.",
    }

    def __init__(self, state: Callable[[], dict[str, float]]) -> None:
        self._state = state

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        values = self._state()
        for name, help_text in self._COUNTERS.items():
            if name in values:
                yield CounterMetricFamily(f"sluice_{name}", help_text, value=values[name])
        for name, help_text in self._GAUGES.items():
            if name in values:
                yield GaugeMetricFamily(f"sluice_{name}", help_text, value=values[name])
