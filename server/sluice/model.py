"""Plain domain types shared by policies, the limiter and the backends.

Nothing here imports generated protobuf code: the gRPC layer converts at the boundary.
Envoy's words are kept for Envoy's concepts (domain, descriptor, entry, unit, hits_addend);
Sluice's own for its own (policy, rule, decision).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sluice.records import record

__all__ = [
    "LIMIT_OVERRIDES",
    "Code",
    "Concurrency",
    "DEFAULT_LEASE_TTL_S",
    "Decision",
    "Descriptor",
    "DescriptorStatus",
    "DomainPolicy",
    "Header",
    "LimitOverride",
    "PIN_KINDS",
    "Pin",
    "RateLimit",
    "RateLimitRequest",
    "Reset",
    "Rule",
    "Unit",
]


# What a server or a domain does with a descriptor's own ``limit`` (Envoy's per-request
# override): allow (use it, as envoyproxy/ratelimit does), ignore (decide by the matching
# rule, as if none were sent), deny (INVALID_ARGUMENT).
LIMIT_OVERRIDES = ("allow", "ignore", "deny")


class Unit(enum.IntEnum):
    """Time units, numbered exactly as Envoy's ``RateLimitResponse.RateLimit.Unit``."""

    UNKNOWN = 0
    SECOND = 1
    MINUTE = 2
    HOUR = 3
    DAY = 4
    MONTH = 5
    YEAR = 6
    WEEK = 7

    @property
    def seconds(self) -> int:
        """Length of one window; months and years are fixed-length, as envoyproxy/ratelimit does."""
        return _UNIT_SECONDS[self]

    @classmethod
    def parse(cls, text: str) -> Unit | None:
        """The unit named by ``text`` (case-insensitive), or None when it names no real unit."""
        unit = cls.__members__.get(text.upper()) if isinstance(text, str) else None
        return None if unit is None or unit is cls.UNKNOWN else unit


_UNIT_SECONDS = {
    Unit.UNKNOWN: 0,
    Unit.SECOND: 1,
    Unit.MINUTE: 60,
    Unit.HOUR: 60 * 60,
    Unit.DAY: 24 * 60 * 60,
    Unit.WEEK: 7 * 24 * 60 * 60,
    Unit.MONTH: 30 * 24 * 60 * 60,
    Unit.YEAR: 365 * 24 * 60 * 60,
}


class Code(enum.IntEnum):
    """Numbered as Envoy's ``RateLimitResponse.Code``."""

    UNKNOWN = 0
    OK = 1
    OVER_LIMIT = 2


@dataclass(frozen=True, slots=True)
class RateLimit:
    """One limit: ``requests_per_unit`` per ``unit``, counted by ``algorithm``.

    ``name`` is the rule's name, echoed to clients in ``current_limit.name``. ``burst`` is the
    capacity of token_bucket, leaky_bucket and gcra (None: ``requests_per_unit``).
    ``timezone`` is set when the limit counts in calendar windows (``calendar: true``): the
    IANA zone whose days, weeks, months or years they are; None: epoch-aligned windows.
    """

    requests_per_unit: int
    unit: Unit
    name: str = ""
    algorithm: str = "fixed_window"
    burst: int | None = None
    timezone: str | None = None


# How long a lease lasts unless renewed, when a rule's ``lease_ttl`` does not say.
DEFAULT_LEASE_TTL_S = 30.0


@dataclass(frozen=True, slots=True)
class Concurrency:
    """A concurrency limit (``rate_limit: {concurrency: N}``): at most ``max_leases`` leases
    held at once per descriptor, each lasting ``lease_ttl_s`` unless renewed, so a client
    that dies holding one frees its slot by itself (sluice/leases/)."""

    max_leases: int
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S


@dataclass(frozen=True, slots=True)
class Rule:
    """One node of a domain's descriptor tree, as written in the YAML format.

    ``value`` is None for a key-only rule; a value containing ``*`` is a wildcard. ``limits``
    is empty for a placeholder (children only), a whitelisting node or an unlimited rule; a
    hit is admitted only if every limit admits it.

    ``quota_mode`` (envoyproxy/ratelimit's): a refused hit on this rule reports OK, unless
    every quota-mode descriptor of the request is refused; then they report OVER_LIMIT and so
    does the request.

    Two flags change only metric names, never a decision. Both follow envoyproxy/ratelimit's
    statsd key path (``<domain>.<key>[_<value>]...``, one level per rule from the domain to
    the matched one), whose exact rules the statsd code owns:

    - ``detailed_metric`` (on the matched rule): the request's own value is put into the
      metric name where the rule matched by key alone, so each concrete value gets its own
      metric (``key1_unspecified_value`` rather than ``key1``).
    - ``value_to_metric`` (on any rule along the path): that one level is named with the
      request's value (``key_value``) when the rule matched by key alone or by a wildcard;
      the other levels keep the rules' names. A cheaper ``detailed_metric``.

    ``metadata`` is the rule's ``metadata`` mapping as canonical JSON (sorted keys), kept so a
    file round-trips; Sluice sends no dynamic metadata, so it has no effect yet.

    ``concurrency`` makes the rule a concurrency limit (leases held at once) instead of a
    rate: ``limits`` is then empty.
    """

    key: str
    value: str | None = None
    limits: tuple[RateLimit, ...] = ()
    unlimited: bool = False
    name: str = ""
    shadow_mode: bool = False
    replaces: tuple[str, ...] = ()
    detailed_metric: bool = False
    share_threshold: bool = False
    descriptors: tuple[Rule, ...] = ()
    quota_mode: bool = False
    value_to_metric: bool = False
    metadata: str | None = None
    concurrency: Concurrency | None = None
    # Where the rule starts in its source file (0 when not from a file); not part of its identity.
    line: int = field(default=0, compare=False)

    @property
    def applies_limit(self) -> bool:
        return bool(self.limits) or self.unlimited or self.concurrency is not None

    @property
    def is_wildcard(self) -> bool:
        return self.value is not None and "*" in self.value


# What an operator can pin on one exact descriptor, named as the YAML lists them: its own
# limit (and counter), refused at once, or never limited.
PIN_KINDS = ("overrides", "blocks", "allows")


@dataclass(frozen=True, slots=True)
class Pin:
    """An operator's setting for one exact descriptor: an override (``rate_limit``), a block
    or an allow (``kind`` is one of PIN_KINDS), in force until ``expires_at_s`` (Unix
    seconds; None: until removed)."""

    kind: str
    entries: tuple[tuple[str, str], ...]
    rate_limit: RateLimit | None = None
    expires_at_s: float | None = None
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Reset:
    """A reset of one descriptor's counters: each new ``generation`` starts them afresh."""

    entries: tuple[tuple[str, str], ...]
    generation: int
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class DomainPolicy:
    """All rules of one domain: the unit the config database stores and versions.

    ``pins`` and ``resets`` are the operator's per-descriptor settings; they live in the same
    versioned document as the rules, so they share its history, diff, rollback and reload.
    """

    domain: str
    descriptors: tuple[Rule, ...] = ()
    # What to do with a descriptor's own ``limit`` (allow, ignore, deny); None: the server's
    # --limit-overrides.
    limit_overrides: str | None = None
    pins: tuple[Pin, ...] = ()
    resets: tuple[Reset, ...] = ()
    # False: read from a document that names none of overrides, blocks, allows and resets,
    # which then keeps the live ones when published (rules kept as code, imported by CI,
    # must not wipe what operators pinned meanwhile). Not part of the policy's identity.
    pins_given: bool = field(default=True, compare=False)


@record
class LimitOverride:
    """A descriptor's own limit, sent by the client instead of the configured one."""

    requests_per_unit: int
    unit: Unit


@record
class Descriptor:
    """One descriptor of a request: ordered (key, value) entries."""

    entries: tuple[tuple[str, str], ...]
    limit: LimitOverride | None = None
    hits_addend: int | None = None  # None: not sent; 0: check without consuming


@record
class RateLimitRequest:
    domain: str
    descriptors: tuple[Descriptor, ...]
    hits_addend: int = 0  # 0 means 1, as in Envoy's API


@record
class DescriptorStatus:
    code: Code
    current_limit: RateLimit | None = None
    limit_remaining: int = 0
    duration_until_reset_s: float = 0
    delay_s: float = 0.0  # leaky_bucket: how long the admitted request should wait its turn
    reason: str = ""  # why a request can never be admitted, when that is the case


@record
class Header:
    key: str
    value: str


@record
class Decision:
    overall_code: Code
    statuses: tuple[DescriptorStatus, ...]
    response_headers: tuple[Header, ...] = field(default=())
