"""An immutable, compiled view of every domain's rules, built once and swapped whole.

Matching follows envoyproxy/ratelimit: at each entry of a request descriptor, an exact
key+value rule beats a wildcard value (first in file order), which beats a key-only rule;
the walk never backtracks; a limit applies only when it sits at the request's last entry.

An operator's pins (overrides, blocks, allows) are a dict per domain keyed by the exact
entries, so thousands of them cost one dict lookup per descriptor. A reset gives the counter
a new key (the counter key plus one ``#reset:N`` part): the next request starts from nothing
on every instance and every backend at once, with no state to delete and no race with the
requests counting meanwhile; the abandoned state expires as any idle counter does.

A match also says what envoyproxy/ratelimit names its statsd counters (``metric_name``):
the rule's own path (``rule_id``), unless the rule asks for request values in it
(``detailed_metric``, ``value_to_metric``) or the client sent its own ``limit``. Such a rule's
node holds a plan of its name, built once; only those rules pay for a name per request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sluice.algorithms import ALGORITHMS, Limit
from sluice.algorithms.calendar import calendar_for
from sluice.model import DomainPolicy, LimitOverride, Pin, RateLimit, Rule
from sluice.policies.glob import Glob
from sluice.records import record

__all__ = ["ALLOW", "BLOCK", "OVERRIDE", "Match", "PinMatch", "Snapshot", "compile_limit"]

# PinMatch.kind, compiled from the pin kinds' names (an int compare on the request path).
OVERRIDE, BLOCK, ALLOW = range(3)
_PIN_KIND = {"overrides": OVERRIDE, "blocks": BLOCK, "allows": ALLOW}


@record
class Match:
    """What applies to one request descriptor: the counter it uses and the compiled limits.

    ``limits`` is empty when the rule is ``unlimited``. ``name`` is the rule's limit name, the
    one other rules' ``replaces`` refer to.
    """

    # The rule's place in its domain, e.g. "messaging.message_type_marketing.to_number".
    rule_id: str
    # (domain, key1, value1, key2, value2, ...); a share_threshold wildcard puts its pattern in
    # place of the concrete value, so every value it matches shares one counter.
    counter_key: tuple[str, ...]
    limits: tuple[Limit, ...]
    unlimited: bool = False
    shadow_mode: bool = False
    name: str = ""
    replaces: tuple[str, ...] = ()
    # envoyproxy/ratelimit's quota_mode: refuses only with every quota of the request.
    quota_mode: bool = False
    # Upstream's statsd name for this hit (before sanitizing) when it is not ``rule_id``:
    # request values put in by detailed_metric / value_to_metric, or a client's own limit.
    metric_name: str | None = None


@record
class PinMatch:
    """An operator's pin on one exact descriptor, as the limiter applies it until
    ``expires_at_s`` (infinity: until removed). ``match`` is, for an override, its own limit
    on its own counter (the counter key plus ``#override``: never the rule's); for a block or
    an allow, the rule's, whose id usage is recorded under."""

    kind: int
    match: Match
    expires_at_s: float


def compile_limit(rate_limit: RateLimit) -> Limit:
    """The limit as the request path uses it: the algorithm resolved, ``burst`` defaulted."""
    burst = rate_limit.burst if rate_limit.burst is not None else rate_limit.requests_per_unit
    algorithm = ALGORITHMS[rate_limit.algorithm]
    zone = rate_limit.timezone
    calendar = calendar_for(rate_limit.unit, zone) if zone is not None else None
    return Limit(
        rate_limit.requests_per_unit,
        rate_limit.unit.seconds,
        algorithm,
        burst,
        rate_limit,
        calendar,
    )


# How one level of a metric name is written (_MetricPart's mode): the rule's own text; the
# request's key and value, or the key alone for an empty value (value_to_metric); the key
# and value always, "key_" for an empty value (detailed_metric).
_RULE_TEXT, _KEY_VALUE, _KEY_UNDERSCORE_VALUE = range(3)
_MetricPart = tuple[str, int]  # (the rule's text, or the key; mode)
# What a level of the path to a rule contributes to its metric name: (key, the rule's
# value or None, value_to_metric, share_threshold).
_Level = tuple[str, str | None, bool, bool]


def _metric_plan(rule: Rule, path: tuple[_Level, ...]) -> tuple[_MetricPart, ...] | None:
    """envoyproxy/ratelimit's stat key for a hit on ``rule`` (reached through ``path``, the
    levels from the domain down to it), as parts to fill with the request's values; None
    when every part is the rules' own text, so the name is ``rule_id``.

    Upstream (config_impl.go, GetLimit): a ``detailed_metric`` rule is named with every
    request value (``key_value``, ``key_`` for an empty one), except that a share_threshold
    wildcard level keeps its pattern and then the other levels drop the ``_`` of an empty
    value. Otherwise each level is the rule's own text (``key_value`` or ``key``, a wildcard's
    pattern included), except a level whose rule has ``value_to_metric`` and matched by key
    alone or by a wildcard without share_threshold: the request's ``key_value`` (``key``
    when the value is empty)."""
    parts: list[_MetricPart] = []
    if rule.detailed_metric:
        shared = any(share for _, _, _, share in path)
        for key, value, _, share in path:
            if share and value is not None:
                parts.append((f"{key}_{value}", _RULE_TEXT))
            else:
                parts.append((key, _KEY_VALUE if shared else _KEY_UNDERSCORE_VALUE))
        return tuple(parts)
    dynamic = False
    for key, value, to_metric, share in path:
        exact = value is not None and "*" not in value
        if to_metric and not exact and not share:
            parts.append((key, _KEY_VALUE))
            dynamic = True
        else:
            parts.append((key if value is None else f"{key}_{value}", _RULE_TEXT))
    return tuple(parts) if dynamic else None


def _metric_name(
    domain: str, plan: tuple[_MetricPart, ...], entries: tuple[tuple[str, str], ...]
) -> str:
    name = domain
    for (text, mode), (_, value) in zip(plan, entries, strict=False):
        if mode == _RULE_TEXT:
            name += "." + text
        elif mode == _KEY_VALUE and not value:
            name += "." + text
        else:
            name += "." + text + "_" + value
    return name


class _Node:
    __slots__ = (
        "match",
        "metric_plan",
        "shared_value",
        "exact",
        "wildcards",
        "key_only",
        "has_children",
        "resets",
    )

    def __init__(
        self,
        rule: Rule | None,
        children: Iterable[Rule],
        rule_id: str,
        path: tuple[_Level, ...] = (),
    ) -> None:
        # Built once here: the request path only adds the counter key. None: no limit applies
        # here (the root, a placeholder for deeper rules, or a whitelisting node).
        self.match = _match(rule, rule_id) if rule is not None and rule.applies_limit else None
        self.metric_plan = (
            _metric_plan(rule, path) if rule is not None and self.match is not None else None
        )
        # A share_threshold wildcard counts every value it matches on one counter, its own.
        self.shared_value = rule.value if rule is not None and rule.share_threshold else None
        self.exact: dict[tuple[str, str], _Node] = {}
        self.wildcards: dict[str, list[tuple[Glob, _Node]]] = {}
        self.key_only: dict[str, _Node] = {}
        for child in children:
            child_id = f"{rule_id}.{child.key}" + (f"_{child.value}" if child.value else "")
            level = (child.key, child.value, child.value_to_metric, child.share_threshold)
            node = _Node(child, child.descriptors, child_id, (*path, level))
            if child.value is None:
                self.key_only[child.key] = node
            elif child.is_wildcard:
                self.wildcards.setdefault(child.key, []).append((Glob(child.value), node))
            else:
                self.exact[(child.key, child.value)] = node
        self.has_children = bool(self.exact or self.wildcards or self.key_only)
        # A domain's root only: counter key -> the part a reset appends to it.
        self.resets: dict[tuple[str, ...], str] = {}

    def child(self, key: str, value: str) -> _Node | None:
        """Exact value, else the first wildcard that matches, else key-only."""
        node = self.exact.get((key, value))
        if node is not None:
            return node
        for pattern, candidate in self.wildcards.get(key, ()):
            if pattern.matches(value):
                return candidate
        return self.key_only.get(key)


class Snapshot:
    """Compiled rules of every domain; never mutated after construction."""

    def __init__(self, policies: Iterable[DomainPolicy] = (), *, version: str = "") -> None:
        self.policies: tuple[DomainPolicy, ...] = tuple(sorted(policies, key=lambda p: p.domain))
        self.version = version
        self._domains = {p.domain: _Node(None, p.descriptors, p.domain) for p in self.policies}
        self._limit_overrides = {p.domain: p.limit_overrides for p in self.policies}
        self._pins: dict[str, dict[tuple[tuple[str, str], ...], PinMatch]] = {}
        for policy in self.policies:
            self._compile_resets(policy)
            generations = {reset.entries: reset.generation for reset in policy.resets}
            pins = {
                pin.entries: self._compile_pin(policy.domain, pin, generations)
                for pin in policy.pins
            }
            if pins:
                self._pins[policy.domain] = pins

    def _compile_resets(self, policy: DomainPolicy) -> None:
        # Keyed by the counter, so resetting a descriptor whose rule shares one counter among
        # many values (share_threshold) resets that shared counter; the generations of every
        # reset landing on one counter are added, so each new reset moves it on.
        generations: dict[tuple[str, ...], int] = {}
        for reset in policy.resets:
            match = self.lookup(policy.domain, reset.entries)
            if match is not None:
                key = match.counter_key
                generations[key] = generations.get(key, 0) + reset.generation
        self._domains[policy.domain].resets = {key: f"#reset:{n}" for key, n in generations.items()}

    def _compile_pin(
        self, domain: str, pin: Pin, generations: dict[tuple[tuple[str, str], ...], int]
    ) -> PinMatch:
        rule = self.lookup(domain, pin.entries) or Match(f"{domain}.(pin)", (), ())
        expires = pin.expires_at_s if pin.expires_at_s is not None else math.inf
        kind = _PIN_KIND[pin.kind]
        if kind != OVERRIDE or pin.rate_limit is None:
            return PinMatch(kind, rule, expires)
        # One extra part makes the key's length even, which a rule's never is (the domain,
        # then key/value pairs): an override can never share a counter with a descriptor.
        suffix = "#override"
        generation = generations.get(pin.entries, 0)
        if generation:
            suffix += f"#reset:{generation}"
        counter_key = (domain, *(part for entry in pin.entries for part in entry), suffix)
        limit = compile_limit(pin.rate_limit)
        override = Match(
            rule.rule_id, counter_key, (limit,), name=rule.name, replaces=rule.replaces
        )
        return PinMatch(kind, override, expires)

    def pins(self, domain: str) -> dict[tuple[tuple[str, str], ...], PinMatch]:
        """The domain's pins by exact entries (empty for none: one falsy test per request)."""
        return self._pins.get(domain, _NO_PINS)

    def has_domain(self, domain: str) -> bool:
        return domain in self._domains

    def limit_overrides(self, domain: str) -> str | None:
        """The domain's own choice for client limit overrides (None: the server's)."""
        return self._limit_overrides.get(domain)

    def lookup(self, domain: str, entries: tuple[tuple[str, str], ...]) -> Match | None:
        """The rule with a limit (or ``unlimited``) that applies to these entries, if any."""
        node = self._domains.get(domain)
        if node is None:
            return None
        root = node
        counter_key = [domain]
        last = len(entries) - 1
        for i, (key, value) in enumerate(entries):
            child = node.child(key, value)
            if child is None:
                return None
            node = child
            shared = node.shared_value
            counter_key += (key, value if shared is None else shared)
            if i == last:
                match = node.match
                if match is None:
                    return None  # a node with neither limit nor matching depth whitelists
                counter = tuple(counter_key)
                if root.resets:
                    suffix = root.resets.get(counter)
                    if suffix is not None:
                        counter = (*counter, suffix)
                plan = node.metric_plan
                if plan is None:
                    return _with_counter_key(match, counter, None)
                return _with_counter_key(match, counter, _metric_name(domain, plan, entries))
            if not node.has_children:
                return None  # the request is deeper than the rules: no limit applies
        return None

    def override(
        self, domain: str, entries: tuple[tuple[str, str], ...], limit: LimitOverride
    ) -> Match | None:
        """A client's own ``limit`` for these entries, counted like a key-only rule's: one
        counter per concrete value. None for an unknown domain, as envoyproxy/ratelimit
        ignores overrides there. Its metric is named as upstream names it: the entries'
        ``key_value`` (``key`` for an empty value) after the domain."""
        if domain not in self._domains:
            return None
        # Compiled as a rule's limit is: the default algorithm, burst = the limit.
        compiled = compile_limit(RateLimit(limit.requests_per_unit, limit.unit))
        counter_key = (domain, *(part for entry in entries for part in entry))
        name = domain + "".join(f".{k}_{v}" if v else f".{k}" for k, v in entries)
        return Match(f"{domain}.(override)", counter_key, (compiled,), metric_name=name)

    def dump(self) -> str:
        """Every rule that applies a limit, one per line, like envoyproxy/ratelimit's /rlconfig."""
        lines = [f"version: {self.version or '(none)'}"]
        for policy in self.policies:
            lines.extend(_dump_rules(policy.domain, policy.descriptors))
        return "\n".join(lines) + "\n"


_NO_PINS: dict[tuple[tuple[str, str], ...], PinMatch] = {}


def _match(rule: Rule, rule_id: str) -> Match:
    return Match(
        rule_id,
        (),
        tuple(compile_limit(x) for x in rule.limits),
        unlimited=rule.unlimited,
        shadow_mode=rule.shadow_mode,
        name=rule.limits[0].name if rule.limits else "",
        replaces=rule.replaces,
        quota_mode=rule.quota_mode,
    )


def _with_counter_key(match: Match, counter_key: tuple[str, ...], metric_name: str | None) -> Match:
    return Match(
        match.rule_id,
        counter_key,
        match.limits,
        match.unlimited,
        match.shadow_mode,
        match.name,
        match.replaces,
        match.quota_mode,
        metric_name,
    )


def _dump_rules(parent: str, rules: Iterable[Rule]) -> Iterable[str]:
    for rule in rules:
        key = f"{parent}.{rule.key}" + (f"_{rule.value}" if rule.value is not None else "")
        flags = f"shadow_mode={str(rule.shadow_mode).lower()}"
        if rule.quota_mode:
            flags += " quota_mode=true"
        if rule.unlimited:
            yield f"{key}: unlimited {flags}"
        for limit in rule.limits:
            burst = f" burst={limit.burst}" if limit.burst is not None else ""
            yield (
                f"{key}: unit={limit.unit.name} requests_per_unit={limit.requests_per_unit} "
                f"algorithm={limit.algorithm}{burst} {flags}"
            )
        yield from _dump_rules(key, rule.descriptors)
