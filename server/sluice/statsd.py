"""envoyproxy/ratelimit's statsd metrics, with its names and types, so its dashboards and
alerts keep working on Sluice (docs/migrating.md, "Metrics").

What is sent, every ``flush_interval_s`` (upstream's ``STATS_FLUSH_INTERVAL``):

* ``ratelimit.service.rate_limit.<key path>.{total_hits,over_limit,near_limit,within_limit,
  shadow_mode,over_limit_with_local_cache}``, counters per key path: by default a rule's
  place in its domain (``domain.key_value.key``), which is Sluice's rule id; with request
  values in it for a rule with ``detailed_metric`` or ``value_to_metric`` and for a client's
  own ``limit`` (the snapshot's ``Match.metric_name``). Unlimited rules count nothing.
* ``ratelimit_server.ShouldRateLimit.total_requests`` (counter) and ``.response_time``
  (timer, milliseconds), one timer sample per call.
* ``ratelimit.service.config_load_success`` / ``config_load_error``,
  ``ratelimit.service.call.should_rate_limit.redis_error`` / ``service_error``,
  ``ratelimit.service.global_shadow_mode``, ``ratelimit.redis_pool.cx_total`` /
  ``cx_local_close`` (the decisions' Redis connections opened / closed): counters, the
  increase of totals kept elsewhere (``state``); ``ratelimit.redis_pool.cx_active`` (those
  open now): a gauge, sent at every flush.
* ``ratelimit.service.rate_limit.<domain>.domain_not_found``: descriptors of a domain no
  policy has, per domain (``domains_not_found``, drained at each flush).

The request path pays for one call of ``observe_request`` (a counter and a list append);
the per-rule counters come from the usage recorder's drain, which the request path already
feeds, and the hits named otherwise from its ``drain_named`` (recorded only for such rules).
Everything else (names, sums, datagrams) happens at flush, on the event loop, in UDP
datagrams of at most ``MAX_DATAGRAM_BYTES``.

Tags (``EXTRA_TAGS``) are written as upstream's sinks write them: DogStatsD appends
``|#k:v,...``; plain statsd (lyft/gostats) folds them into the name as ``.__k=v``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Callable, Mapping, Sequence

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

__all__ = [
    "MAX_DATAGRAM_BYTES",
    "FLAVORS",
    "PROTOCOLS",
    "StatsdSink",
    "parse_tags",
    "sanitize",
]

log = logging.getLogger(__name__)

FLAVORS = ("statsd", "dogstatsd")
PROTOCOLS = ("udp", "tcp")
TCP_TIMEOUT_S = 1.0
# What fits in one Ethernet frame with IP and UDP headers to spare (statsd clients' usual size).
MAX_DATAGRAM_BYTES = 1432
# Timer samples kept per flush; past it, the kept ones are sent with a sample rate.
MAX_TIMER_SAMPLES = 20_000

_RATE_LIMIT = "ratelimit.service.rate_limit."
_SERVER = "ratelimit_server.ShouldRateLimit."
# Totals in ``state`` and the upstream counter each one's increase is sent as.
_STATE_COUNTERS = {
    "config_loads": "ratelimit.service.config_load_success",
    "config_invalid_versions": "ratelimit.service.config_load_error",
    "redis_errors": "ratelimit.service.call.should_rate_limit.redis_error",
    "service_errors": "ratelimit.service.call.should_rate_limit.service_error",
    "global_shadow_answers": "ratelimit.service.global_shadow_mode",
    "redis_connections_opened": "ratelimit.redis_pool.cx_total",
    "redis_connections_closed": "ratelimit.redis_pool.cx_local_close",
}
# Values in ``state`` sent as they are, as upstream's gauges, at every flush.
_STATE_GAUGES = {
    "redis_connections": "ratelimit.redis_pool.cx_active",
}
_IPV4 = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
_TAG_VALUE_UNSAFE = re.compile(r"[.:|]")


def sanitize(name: str) -> str:
    """Upstream's ``SanitizeStatName``: ``:`` and ``|`` become ``_`` (they would end the
    name in a statsd line), and so do the dots of an IPv4 address in a value."""
    name = name.replace(":", "_").replace("|", "_")
    return _IPV4.sub(lambda m: m.group(0).replace(".", "_"), name)


def parse_tags(text: str) -> dict[str, str]:
    """Upstream's ``EXTRA_TAGS``: ``k1:v1,k2:v2``; ValueError naming the bad item."""
    tags: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, colon, value = item.partition(":")
        if not colon or not key.strip():
            raise ValueError(f"'{item}' is not KEY:VALUE")
        tags[key.strip()] = value.strip()
    return tags


class StatsdSink:
    """Counts in memory, sends statsd lines on a timer. ``send`` takes one datagram (tests
    and benchmarks pass their own; by default a UDP socket to ``host``:``port``, or with
    ``protocol="tcp"`` one connection carrying newline-terminated lines, as upstream's
    statsd client sends by default; reopened at the next flush when it fails, the lines of
    the failed flush lost, as UDP would lose them).

    TCP is sent from a thread: a statsd server that stops reading must not hold up the event
    loop (each send gives up after ``TCP_TIMEOUT_S``)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        flavor: str = "statsd",
        protocol: str = "udp",
        tags: Mapping[str, str] | None = None,
        flush_interval_s: float = 10.0,
        state: Callable[[], Mapping[str, float]] | None = None,
        send: Callable[[bytes], object] | None = None,
        domains_not_found: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"statsd flavor must be one of {FLAVORS}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"statsd protocol must be one of {PROTOCOLS}")
        self._tcp = protocol == "tcp"
        self._address = (host, port)
        self._state = state
        self._domains_not_found = domains_not_found
        self._send = send
        self._socket: socket.socket | None = None
        self._suffix, self._tag_name = _tag_forms(flavor, dict(tags or {}))
        self._counters: dict[str, int] = {}
        self._state_seen: dict[str, float] = {}
        self._names: dict[str, str] = {}  # rule id -> its sanitized metric prefix
        self._requests = 0
        self._times_ms: list[float] = []
        self._periodic = Periodic("statsd flush", flush_interval_s, self._flush_async)
        self.send_failures = 0

    # -- the request path -------------------------------------------------------------

    def observe_request(self, seconds: float) -> None:
        """One ShouldRateLimit call and how long it took."""
        self._requests += 1
        times = self._times_ms
        if len(times) < MAX_TIMER_SAMPLES:
            times.append(seconds * 1000.0)

    # -- off the request path ---------------------------------------------------------

    def add_usage(
        self,
        drained: Mapping[str, RuleUsage],
        named: Mapping[tuple[str, str], RuleUsage] | None = None,
    ) -> None:
        """Counts from the usage recorder's drain (``UsageFlusher``'s ``on_drain``): per rule,
        less the hits of ``named`` (its ``drain_named``, the same hits by rule id and the
        name upstream gives them), which count under that name instead ("": nowhere)."""
        moved: dict[str, list[int]] = {}
        for (rule_id, name), usage in (named or {}).items():
            values = _values(usage)
            taken = moved.setdefault(rule_id, [0] * len(values))
            for i, value in enumerate(values):
                taken[i] += value
            if name:
                self._add(_RATE_LIMIT + sanitize(name), values)
        for rule_id, usage in drained.items():
            prefix = self._names.get(rule_id)
            if prefix is None:
                prefix = self._names[rule_id] = _RATE_LIMIT + sanitize(rule_id)
            values = _values(usage)
            named_here = moved.get(rule_id)
            if named_here is not None:
                values = [value - n for value, n in zip(values, named_here, strict=True)]
            self._add(prefix, values)

    def _add(self, prefix: str, values: Sequence[int]) -> None:
        counters = self._counters
        for suffix, value in zip(_SUFFIXES, values, strict=True):
            if value > 0:
                key = prefix + suffix
                counters[key] = counters.get(key, 0) + value

    def lines(self) -> list[str]:
        """Everything counted since the last call, as statsd lines; counting starts afresh."""
        counters, self._counters = self._counters, {}
        if self._state is not None:
            values = self._state()
            for source, target in _STATE_COUNTERS.items():
                if source in values:
                    value = values[source]
                    increase = value - self._state_seen.get(source, 0.0)
                    self._state_seen[source] = value
                    if increase > 0:
                        counters[target] = counters.get(target, 0) + int(increase)
            gauges = {
                to: values[source] for source, to in _STATE_GAUGES.items() if source in values
            }
        else:
            gauges = {}
        if self._domains_not_found is not None:
            for domain, n in self._domains_not_found().items():
                key = _RATE_LIMIT + sanitize(domain) + ".domain_not_found"
                counters[key] = counters.get(key, 0) + n
        requests, self._requests = self._requests, 0
        times, self._times_ms = self._times_ms, []
        if requests:
            counters[_SERVER + "total_requests"] = requests
        name, suffix = self._tag_name, self._suffix
        out = [f"{name(key)}:{value}|c{suffix}" for key, value in counters.items()]
        out.extend(f"{name(key)}:{int(value)}|g{suffix}" for key, value in gauges.items())
        if times:
            timer = name(_SERVER + "response_time")
            rate = "" if requests <= len(times) else f"|@{len(times) / requests:.6g}"
            out.extend(f"{timer}:{ms:.3f}|ms{rate}{suffix}" for ms in times)
        return out

    def flush(self) -> None:
        """Send what was counted, in datagrams of at most ``MAX_DATAGRAM_BYTES``."""
        self._send_all(pack(self.lines()))

    def _send_all(self, datagrams: list[bytes]) -> None:
        for datagram in datagrams:
            try:
                self._emit(datagram)
            except OSError as exc:
                # statsd is best effort, as upstream's sink: count, log once, carry on.
                self.send_failures += 1
                if self.send_failures == 1:
                    log.warning("statsd: cannot send to %s:%d: %s", *self._address, exc)
                if self._tcp:
                    self._close()  # reopened at the next flush
                    return

    def _emit(self, datagram: bytes) -> None:
        if self._send is not None:
            self._send(datagram)
            return
        if self._socket is None:
            # Resolved at the first flush (a name, IPv4 or IPv6), and at each reconnection.
            kind = socket.SOCK_STREAM if self._tcp else socket.SOCK_DGRAM
            family, kind, proto, _, address = socket.getaddrinfo(*self._address, type=kind)[0]
            sock = socket.socket(family, kind, proto)
            if self._tcp:
                sock.settimeout(TCP_TIMEOUT_S)
            else:
                sock.setblocking(False)
            try:
                sock.connect(address)
            except OSError:
                sock.close()
                raise
            self._socket = sock
        if self._tcp:
            self._socket.sendall(datagram + b"\n")
        else:
            self._socket.send(datagram)

    def _close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def _flush_async(self) -> None:
        if self._tcp and self._send is None:
            await asyncio.to_thread(self._send_all, pack(self.lines()))
        else:
            self.flush()

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        """Stop the timer and send what is left (call after the usage recorder's last drain)."""
        await self._periodic.stop()
        await self._flush_async()
        self._close()


_SUFFIXES = (
    ".total_hits",
    ".over_limit",
    ".near_limit",
    ".within_limit",
    ".shadow_mode",
    ".over_limit_with_local_cache",
)


def _values(usage: RuleUsage) -> list[int]:
    """A rule's usage as upstream's counters, in ``_SUFFIXES``' order."""
    c = usage.counts
    # An operator's block (Sluice only) is a refusal: over_limit to upstream's names.
    allowed, over, shadow = c[ALLOWED], c[OVER_LIMIT] + c[BLOCKED], c[SHADOW_OVER]
    # Upstream counts a hit in total_hits before asking Redis, so a failed one too; a shadow
    # rule's refusal is over_limit as well as shadow_mode. Of a refused hit that crossed the
    # limit, only the part past it is over_limit (and shadow_mode); its part in the near
    # range is near_limit, and the rest of it is in total_hits alone, as upstream counts.
    below, shadow_below = usage.below_limit, usage.shadow_below_limit
    return [
        allowed + over + shadow + c[BACKEND_ERROR],
        over + shadow - below - shadow_below,
        c[NEAR_LIMIT],
        allowed,
        shadow - shadow_below,
        usage.local_refusals,
    ]


def pack(lines: Sequence[str]) -> list[bytes]:
    """Lines joined by newlines into datagrams of at most ``MAX_DATAGRAM_BYTES`` (a longer
    line goes alone)."""
    datagrams: list[bytes] = []
    current = bytearray()
    for line in lines:
        data = line.encode()
        if current and len(current) + 1 + len(data) > MAX_DATAGRAM_BYTES:
            datagrams.append(bytes(current))
            current = bytearray()
        if current:
            current += b"\n"
        current += data
    if current:
        datagrams.append(bytes(current))
    return datagrams


def _tag_forms(flavor: str, tags: dict[str, str]) -> tuple[str, Callable[[str], str]]:
    """The line suffix and the name function that carry ``tags`` in ``flavor``."""
    if not tags:
        return "", _same
    if flavor == "dogstatsd":
        return "|#" + ",".join(f"{k}:{v}" for k, v in sorted(tags.items())), _same
    # lyft/gostats: name.__key=value, keys sorted, unsafe characters of values replaced.
    folded = "".join(f".__{k}={_TAG_VALUE_UNSAFE.sub('_', v)}" for k, v in sorted(tags.items()))
    return "", lambda name: name + folded


def _same(name: str) -> str:
    return name
