"""envoyproxy/ratelimit's YAML policy format: load with validation, dump canonically.

Every problem is reported as ``source:line: reason`` and all problems of a load are
collected, so one run of ``sluice check`` shows everything to fix. A load with any problem
raises ConfigError and returns nothing: a bad file can never half-apply.

What envoyproxy/ratelimit serves, Sluice loads with the same meaning. Where Sluice would
rather be stricter (a ``rate_limit`` without ``requests_per_unit``, a ``replaces`` naming no
limit, a key of upstream's at a level where it means nothing, ``metadata`` that is not sent),
the load goes on and says so in ``warnings`` (``sluice check --strict`` fails on them).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sluice.algorithms import ALGORITHMS, DEFAULT_ALGORITHM
from sluice.algorithms.calendar import CALENDAR_UNITS, known_zone
from sluice.errors import ConfigError
from sluice.model import (
    DEFAULT_LEASE_TTL_S,
    LIMIT_OVERRIDES,
    PIN_KINDS,
    Concurrency,
    DomainPolicy,
    Pin,
    RateLimit,
    Reset,
    Rule,
    Unit,
)
from sluice.policies.descriptor_text import (
    format_duration,
    format_entries,
    format_time,
    parse_duration,
    parse_entries,
    parse_time,
)
from sluice.policies.glob import MAX_WILDCARDS
from sluice.policies.snapshot import Snapshot
from sluice.rlqs.buckets import ambiguous_chains

__all__ = [
    "DEFAULT_MAX_LOG_LIMIT",
    "MAX_ALIAS_NODES",
    "MAX_DEPTH",
    "dump_policies",
    "dump_policy",
    "load_path",
    "load_sources",
    "load_text",
    "read_sources",
    "pin_document",
    "rule_document",
]

# sliding_window_log keeps one entry per admitted request; this caps its memory per key.
DEFAULT_MAX_LOG_LIMIT = 10_000

_ROOT_KEYS = ("domain", "descriptors", "limit_overrides", *PIN_KINDS, "resets")
_PIN_KEYS = {
    "overrides": ("descriptor", "rate_limit", "expires_at"),
    "blocks": ("descriptor", "expires_at"),
    "allows": ("descriptor", "expires_at"),
}
_RESET_KEYS = ("descriptor", "generation")
_RULE_KEYS = (
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
)
_LIMIT_KEYS = (
    "name",
    "replaces",
    "unit",
    "requests_per_unit",
    "unlimited",
    "algorithm",
    "burst",
    "limits",
    "calendar",
    "timezone",
    "concurrency",
    "lease_ttl",
)
# What a concurrency limit (leases held at once) cannot be combined with: they describe a rate.
_RATE_KEYS = ("unit", "requests_per_unit", "algorithm", "burst", "limits", "calendar", "timezone")
# A lease lasts at least a millisecond and at most a day: a slot a dead client held is lost
# for up to lease_ttl, so a longer one would be an outage, not a limit.
_MAX_LEASE_TTL_S = 86400.0
_DEFAULT_TIMEZONE = "UTC"
_ONE_LIMIT_KEYS = ("unit", "requests_per_unit", "algorithm", "burst")
_REPLACES_KEYS = ("name",)
# envoyproxy/ratelimit checks every key against this one list, whatever its level, and ignores
# a known key where it means nothing (``unit`` in a descriptor). Sluice does the same, with a
# warning; a key in neither list is refused, as upstream refuses it.
_UPSTREAM_KEYS = frozenset(
    (
        "domain",
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "shadow_mode",
        "quota_mode",
        "name",
        "replaces",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    )
)
_MAX_REQUESTS_PER_UNIT = 2**32 - 1  # a uint32 on the wire

# What one document may make the loader do. The composer and the walk below recurse once
# per level, so nesting is bounded well inside Python's recursion limit (a policy nests two
# levels per descriptor level). Aliases are shared, not copied, when composed, but the walk
# visits a node once per path to it: a small "billion laughs" document would take forever,
# and a recursive alias forever and a day. Both are refused while composing (_GuardedLoader).
MAX_DEPTH = 100
MAX_ALIAS_NODES = 100_000

# The scalar constructors the loader needs, called directly: SafeConstructor.construct_object
# remembers every node it constructed, which would keep each loaded document alive forever.
_constructor = yaml.constructor.SafeConstructor()
_CONSTRUCTORS = {
    "tag:yaml.org,2002:bool": yaml.constructor.SafeConstructor.construct_yaml_bool,
    "tag:yaml.org,2002:int": yaml.constructor.SafeConstructor.construct_yaml_int,
}
# Longer decimal integers than Python converts by default are far out of every range here.
_MAX_INT_DIGITS = 64


def load_path(
    path: str | Path,
    *,
    max_log_limit: int = DEFAULT_MAX_LOG_LIMIT,
    merge_domains: bool = False,
    warnings: list[str] | None = None,
) -> list[DomainPolicy]:
    """Load a YAML file, or every ``*.yaml``/``*.yml`` file below a directory (sorted).

    Hidden files and directories below the directory are skipped: a Kubernetes ConfigMap
    mount holds each file twice more under ``..data`` and ``..<timestamp>`` (upstream's
    ``RUNTIME_IGNOREDOTFILES=true``)."""
    sources, unreadable = read_sources(path)
    try:
        policies = load_sources(
            sources, max_log_limit=max_log_limit, merge_domains=merge_domains, warnings=warnings
        )
    except ConfigError as exc:
        raise ConfigError(unreadable + exc.problems) from None
    if unreadable:
        raise ConfigError(unreadable)
    return policies


def read_sources(
    path: str | Path, *, allow_empty: bool = False
) -> tuple[list[tuple[str, str]], list[str]]:
    """The (file name, text) of every policy file ``load_path`` reads, and a problem for each
    file that is not UTF-8; ConfigError when there is no such path, or (unless
    ``allow_empty``) a directory holds no policy file."""
    root = Path(path)
    if root.is_dir():
        files = sorted(
            p
            for p in root.rglob("*")
            if p.suffix in (".yaml", ".yml")
            and not any(part.startswith(".") for part in p.relative_to(root).parts)
            and p.is_file()
        )
        if not files and not allow_empty:
            raise ConfigError([f"{root}: no .yaml or .yml files found"])
    elif root.is_file():
        files = [root]
    else:
        raise ConfigError([f"{root}: no such file or directory"])
    sources, unreadable = [], []
    for f in files:
        data = f.read_bytes()
        try:
            # Universal newlines, as reading in text mode would give.
            text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
            sources.append((str(f), text))
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            unreadable.append(f"{f}:{line}: not UTF-8 text (at byte offset {exc.start})")
    return sources, unreadable


def load_text(
    text: str,
    source: str = "<string>",
    *,
    max_log_limit: int = DEFAULT_MAX_LOG_LIMIT,
    warnings: list[str] | None = None,
) -> list[DomainPolicy]:
    """Load every policy document (one per YAML document) in ``text``."""
    return load_sources([(source, text)], max_log_limit=max_log_limit, warnings=warnings)


def load_sources(
    sources: Iterable[tuple[str, str]],
    *,
    max_log_limit: int = DEFAULT_MAX_LOG_LIMIT,
    merge_domains: bool = False,
    warnings: list[str] | None = None,
) -> list[DomainPolicy]:
    """Load several (source name, text) pairs as one set.

    A domain may appear only once, unless ``merge_domains`` (upstream's
    ``MERGE_DOMAIN_CONFIG``): then each later document's top-level descriptors are added to
    the domain's, and a top-level descriptor both define (same key and value) is refused, as
    upstream refuses it. ``warnings``, when given, collects what Sluice would refuse if it
    were stricter than upstream (``sluice check --strict``)."""
    problems: list[str] = []
    merged: dict[str, _Merged] = {}
    for source, text in sources:
        loader = _Loader(source, problems, max_log_limit, warnings)
        for policy, where in loader.documents(text):
            first = merged.get(policy.domain)
            if first is None:
                merged[policy.domain] = _Merged(policy, where, source)
            elif not merge_domains:
                problems.append(
                    f"{where}: duplicate domain '{policy.domain}' "
                    f"(first defined at {first.where}; set MERGE_DOMAIN_CONFIG=true or "
                    f"--merge-domain-config to merge them)"
                )
            else:
                first.add(policy, where, source, problems)
    policies = [m.policy for m in merged.values()]
    for m in merged.values():
        problems.extend(_ambiguous_buckets(m.policy, m.sources))
    if warnings is not None:
        for m in merged.values():
            warnings.extend(_unknown_replaces(m.policy, m.sources))
    if problems:
        raise ConfigError(problems)
    return policies


class _Merged:
    """One domain as loaded so far, from one document or, merged, several."""

    def __init__(self, policy: DomainPolicy, where: str, source: str) -> None:
        self.policy = policy
        self.where = where
        # Where each top-level descriptor (key, value) came from, to name both of a clash;
        # and each rule's source file, to name it in a warning.
        self.top = {(r.key, r.value): f"{source}:{r.line}" for r in policy.descriptors}
        self.sources = {id(r): source for r in _walk(policy.descriptors)}

    def add(self, policy: DomainPolicy, where: str, source: str, problems: list[str]) -> None:
        added: list[Rule] = []
        for rule in policy.descriptors:
            first = self.top.get((rule.key, rule.value))
            if first is not None:
                final = rule.key if rule.value is None else f"{rule.key}_{rule.value}"
                problems.append(
                    f"{source}:{rule.line}: duplicate descriptor composite key "
                    f"'{policy.domain}.{final}' (also at {first}) in merged domain "
                    f"'{policy.domain}'"
                )
                continue
            self.top[(rule.key, rule.value)] = f"{source}:{rule.line}"
            added.append(rule)
        overrides = self.policy.limit_overrides
        if policy.limit_overrides is not None:
            if overrides is not None and overrides != policy.limit_overrides:
                problems.append(
                    f"{where}: limit_overrides '{policy.limit_overrides}' differs from "
                    f"'{overrides}' at {self.where} in merged domain '{policy.domain}'"
                )
            overrides = policy.limit_overrides
        self.sources.update({id(r): source for r in _walk(added)})
        self.policy = DomainPolicy(policy.domain, (*self.policy.descriptors, *added), overrides)


def _ambiguous_buckets(policy: DomainPolicy, sources: dict[int, str]) -> Iterator[str]:
    for rule, keys, earlier in ambiguous_chains(policy):
        yield (
            f"{sources.get(id(rule), '<merged>')}:{rule.line}: the rule chain "
            f"{' → '.join(keys)} has the same keys as {' → '.join(earlier)} in another order, "
            f"so an RLQS bucket with keys {{{', '.join(sorted(keys))}}} would match either; "
            f"domain '{policy.domain}' may have only one order per set of keys"
        )


def _unknown_replaces(policy: DomainPolicy, sources: dict[int, str]) -> Iterator[str]:
    names = _limit_names(policy.descriptors)
    for rule in _walk(policy.descriptors):
        for replaced in rule.replaces:
            if replaced not in names:
                yield (
                    f"{sources.get(id(rule), '<merged>')}:{rule.line}: replaces '{replaced}', "
                    f"but no rate_limit in domain '{policy.domain}' has that name "
                    f"(nothing is replaced)"
                )


class _Loader:
    """Walks composed YAML nodes, so every problem can name the line it comes from."""

    def __init__(
        self,
        source: str,
        problems: list[str],
        max_log_limit: int,
        warnings: list[str] | None = None,
    ) -> None:
        self.source = source
        self.problems = problems
        self.warnings = warnings
        self.max_log_limit = max_log_limit
        self.breaks: list[int] = []  # where the text's "\n"s are, to number lines

    def error(self, node: Node, reason: str) -> None:
        self.problems.append(f"{self.source}:{self.line(node)}: {reason}")

    def warn(self, node: Node, reason: str) -> None:
        if self.warnings is not None:
            self.warnings.append(f"{self.source}:{self.line(node)}: {reason}")

    def line(self, node: Node) -> int:
        return _line(self.breaks, node.start_mark)

    def documents(self, text: str) -> Iterator[tuple[DomainPolicy, str]]:
        self.breaks = _breaks(text)
        try:
            nodes = list(yaml.compose_all(text, Loader=_GuardedLoader))
        except _Refused as exc:
            self.problems.append(f"{self.source}:{_line(self.breaks, exc.mark)}: {exc.reason}")
            return
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = _line(self.breaks, mark)
            problem = exc.problem or exc.context
            self.problems.append(f"{self.source}:{line}: YAML syntax error: {problem}")
            return
        except yaml.reader.ReaderError as exc:
            # A character YAML does not allow (e.g. NUL): no mark, but a position in the text.
            line = bisect.bisect_left(self.breaks, exc.position) + 1
            reason = str(exc).splitlines()[0]
            self.problems.append(f"{self.source}:{line}: YAML syntax error: {reason}")
            return
        except yaml.YAMLError as exc:
            self.problems.append(f"{self.source}:1: YAML syntax error: {exc}")
            return
        if all(node is None or _is_null(node) for node in nodes):
            # As upstream refuses it. A file caught half-written (truncated, not yet filled)
            # reads this way too: refused, it keeps the last good version serving rather than
            # deleting its domain's limits until the next look.
            self.problems.append(
                f"{self.source}:1: config file cannot have empty domain (the file holds no policy)"
            )
            return
        for node in nodes:
            if node is None or _is_null(node):  # an empty document, e.g. a trailing "---"
                continue
            before = len(self.problems)
            policy = self.policy(node)
            if policy is not None and len(self.problems) == before:
                yield policy, f"{self.source}:{self.line(node)}"

    def mapping(
        self, node: Node, allowed: tuple[str, ...], what: str, *, lenient: bool = True
    ) -> dict[str, Node] | None:
        """``node``'s fields. An unknown key is refused, unless ``lenient`` (upstream's parts
        of a document) and upstream knows it: then it is ignored with a warning, as upstream
        ignores it. Sluice's own parts (pins, resets) are not lenient: no upstream file has
        them."""
        if not isinstance(node, MappingNode):
            self.error(node, f"{what} must be a mapping")
            return None
        fields: dict[str, Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.error(key_node, f"a key in {what} must be a string, not a {_kind(key_node)}")
                continue
            key = key_node.value
            if key not in allowed:
                if lenient and key in _UPSTREAM_KEYS:
                    reason = f"'{key}' has no meaning in {what}: ignored, as upstream ignores it"
                    self.warn(key_node, reason)
                else:
                    self.error(key_node, f"unknown key '{key}' in {what}")
            elif key in fields:
                self.error(key_node, f"duplicate key '{key}' in {what}")
            else:
                fields[key] = value_node
        return fields

    def string(self, node: Node | None, field: str) -> str | None:
        if node is None or _is_null(node):
            return None
        if not isinstance(node, ScalarNode):
            self.error(node, f"'{field}' must be a string")
            return None
        return str(node.value)

    def boolean(self, node: Node | None, field: str) -> bool:
        if node is None or _is_null(node):
            return False
        value = _scalar(node)
        if not isinstance(value, bool):
            self.error(node, f"'{field}' must be true or false")
            return False
        return value

    def policy(self, node: Node) -> DomainPolicy | None:
        fields = self.mapping(node, _ROOT_KEYS, "a policy document")
        if fields is None:
            return None
        domain = self.string(fields.get("domain"), "domain")
        if not domain:
            self.error(fields.get("domain", node), "config file cannot have empty domain")
            return None
        rules = self.rules(fields.get("descriptors"), domain)
        overrides = self.limit_overrides(fields.get("limit_overrides"))
        pins, resets = self.per_descriptor(fields, DomainPolicy(domain, rules))
        given = any(key in fields for key in (*PIN_KINDS, "resets"))
        return DomainPolicy(domain, rules, overrides, pins, resets, given)

    def per_descriptor(
        self, fields: dict[str, Node], rules: DomainPolicy
    ) -> tuple[tuple[Pin, ...], tuple[Reset, ...]]:
        """The pins and resets, each naming one exact descriptor that some rule matches, no
        descriptor pinned twice (it could not be both blocked and allowed)."""
        rule_tree = Snapshot([rules])
        pins: list[Pin] = []
        seen: dict[tuple[tuple[str, str], ...], str] = {}
        for kind in PIN_KINDS:
            for i, item, entries in self.descriptor_list(fields, kind, rule_tree):
                where = f"{kind}[{i}]"
                entry = self.mapping(item, _PIN_KEYS[kind], where, lenient=False)
                assert entry is not None  # descriptor_list checked it is a mapping
                rate_limit = None
                if kind == "overrides":
                    rate_limit = self.override_limit(entry.get("rate_limit"), item, where)
                expires = self.expires_at(entry.get("expires_at"), where)
                if entries in seen:
                    self.error(
                        item,
                        f"{where}.descriptor: {format_entries(entries)} is "
                        f"already in {seen[entries]}",
                    )
                    continue
                seen[entries] = where
                pins.append(Pin(kind, entries, rate_limit, expires, self.line(item)))
        resets: list[Reset] = []
        reset_seen: set[tuple[tuple[str, str], ...]] = set()
        for i, item, entries in self.descriptor_list(fields, "resets", rule_tree):
            entry = self.mapping(item, _RESET_KEYS, f"resets[{i}]", lenient=False)
            assert entry is not None
            generation = _scalar(entry["generation"]) if "generation" in entry else None
            if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
                self.error(
                    entry.get("generation", item),
                    f"resets[{i}].generation: must be a whole number from 1",
                )
                continue
            if entries in reset_seen:
                self.error(
                    item, f"resets[{i}].descriptor: {format_entries(entries)} is reset twice"
                )
                continue
            reset_seen.add(entries)
            resets.append(Reset(entries, generation, self.line(item)))
        return tuple(pins), tuple(resets)

    def descriptor_list(
        self, fields: dict[str, Node], name: str, rule_tree: Snapshot
    ) -> Iterator[tuple[int, Node, tuple[tuple[str, str], ...]]]:
        """(index, node, entries) of each item of the list ``name`` whose ``descriptor`` is
        well formed and matched by a rule; problems with the others are reported."""
        node = fields.get(name)
        if node is None or _is_null(node):
            return
        if not isinstance(node, SequenceNode):
            self.error(node, f"'{name}' must be a list")
            return
        [domain] = [p.domain for p in rule_tree.policies]
        for i, item in enumerate(node.value):
            if not isinstance(item, MappingNode):
                self.error(item, f"{name}[{i}] must be a mapping")
                continue
            descriptor = next((v for k, v in item.value if _scalar(k) == "descriptor"), None)
            text = self.string(descriptor, f"{name}[{i}].descriptor")
            if descriptor is None or text is None:
                self.error(descriptor or item, f"{name}[{i}].descriptor: missing (KEY=VALUE,…)")
                continue
            try:
                entries = parse_entries(text, f"{name}[{i}].descriptor")
            except ValueError as exc:
                self.error(descriptor, str(exc))
                continue
            if rule_tree.lookup(domain, entries) is None:
                self.error(
                    descriptor,
                    f"{name}[{i}].descriptor: no rule of domain '{domain}' limits {text}",
                )
                continue
            yield i, item, entries

    def override_limit(self, node: Node | None, item: Node, where: str) -> RateLimit | None:
        if node is None:
            self.error(item, f"{where}.rate_limit: missing (unit, requests_per_unit, …)")
            return None
        fields = self.mapping(node, _ONE_LIMIT_KEYS, f"{where}.rate_limit", lenient=False)
        return self.one_limit(node, fields, "") if fields is not None else None

    def expires_at(self, node: Node | None, where: str) -> float | None:
        text = self.string(node, f"{where}.expires_at")
        if node is None or text is None:
            return None
        try:
            return parse_time(text, f"{where}.expires_at")
        except ValueError as exc:
            self.error(node, str(exc))
            return None

    def limit_overrides(self, node: Node | None) -> str | None:
        if node is None or _is_null(node):
            return None
        value = self.string(node, "limit_overrides")
        if value is None:
            return None  # not a string: reported
        if value not in LIMIT_OVERRIDES:
            self.error(node, f"'limit_overrides' must be one of {', '.join(LIMIT_OVERRIDES)}")
            return None
        return value

    def rules(self, node: Node | None, parent_key: str) -> tuple[Rule, ...]:
        if node is None or _is_null(node):
            return ()
        if not isinstance(node, SequenceNode):
            self.error(node, "'descriptors' must be a list")
            return ()
        rules: list[Rule] = []
        composite: set[str] = set()
        for item in node.value:
            rule = self.rule(item, parent_key)
            if rule is None:
                continue
            final_key = rule.key if not rule.value else f"{rule.key}_{rule.value}"
            full_key = f"{parent_key}.{final_key}"
            if final_key in composite:
                self.error(item, f"duplicate descriptor composite key '{full_key}'")
                continue
            composite.add(final_key)
            rules.append(rule)
        return tuple(rules)

    def rule(self, node: Node, parent_key: str) -> Rule | None:
        fields = self.mapping(node, _RULE_KEYS, "a descriptor")
        if fields is None:
            return None
        key = self.string(fields.get("key"), "key")
        if not key:
            self.error(fields.get("key", node), "descriptor has empty key")
            return None
        value = self.string(fields.get("value"), "value") or None
        final_key = key if value is None else f"{key}_{value}"
        limits: tuple[RateLimit, ...] = ()
        replaces: tuple[str, ...] = ()
        unlimited, name = False, ""
        concurrency: Concurrency | None = None
        if "rate_limit" in fields:
            block = fields["rate_limit"]
            if isinstance(block, MappingNode) and _has_key(block, "concurrency"):
                concurrency, name, replaces = self.concurrency(block)
            else:
                limits, unlimited, name, replaces = self.rate_limit(block)
        if value is not None and value.count("*") > MAX_WILDCARDS:
            self.error(
                fields["value"],
                f"value has {value.count('*')} wildcards '*', more than the maximum of "
                f"{MAX_WILDCARDS}",
            )
        share_threshold = self.boolean(fields.get("share_threshold"), "share_threshold")
        if share_threshold and (value is None or "*" not in value):
            self.error(
                fields["share_threshold"],
                "share_threshold is only allowed on a descriptor whose value has a wildcard '*'",
            )
        return Rule(
            key=key,
            value=value,
            limits=limits,
            unlimited=unlimited,
            name=name,
            shadow_mode=self.boolean(fields.get("shadow_mode"), "shadow_mode"),
            replaces=replaces,
            detailed_metric=self.boolean(fields.get("detailed_metric"), "detailed_metric"),
            share_threshold=share_threshold,
            descriptors=self.rules(fields.get("descriptors"), f"{parent_key}.{final_key}"),
            quota_mode=self.boolean(fields.get("quota_mode"), "quota_mode"),
            value_to_metric=self.boolean(fields.get("value_to_metric"), "value_to_metric"),
            metadata=self.metadata(fields.get("metadata")),
            concurrency=concurrency,
            line=self.line(node),
        )

    def metadata(self, node: Node | None) -> str | None:
        """The ``metadata`` mapping as canonical JSON; its contents are upstream's to define
        (it sends them as dynamic metadata), so any mapping of plain YAML values is kept."""
        if node is None or _is_null(node):
            return None
        if not isinstance(node, MappingNode):
            self.error(node, "'metadata' must be a mapping")
            return None
        value = self.plain(node)
        if value is None:
            return None
        self.warn(node, "'metadata' is kept but not sent: Sluice sends no dynamic metadata")
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    def plain(self, node: Node) -> Any:
        """A node as plain JSON-able data (None after reporting a node that is not)."""
        if isinstance(node, MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, ScalarNode):
                    self.error(key_node, "a key in metadata must be a string")
                    return None
                value = self.plain(value_node)
                if value is None and not _is_null(value_node):
                    return None
                out[str(key_node.value)] = value
            return out
        if isinstance(node, SequenceNode):
            items = [self.plain(item) for item in node.value]
            return items
        if _is_null(node):
            return None
        value = _scalar(node)
        return value if isinstance(value, bool | int) else str(node.value)

    def rate_limit(self, node: Node) -> tuple[tuple[RateLimit, ...], bool, str, tuple[str, ...]]:
        """(limits, unlimited, name, replaces) of a ``rate_limit`` block."""
        fields = self.mapping(node, _LIMIT_KEYS, "rate_limit")
        if fields is None:
            return (), False, "", ()
        name = self.string(fields.get("name"), "name") or ""
        unlimited = self.boolean(fields.get("unlimited"), "unlimited")
        replaces = self.replaces(fields.get("replaces"), name)
        if unlimited:
            if Unit.parse(self.string(fields.get("unit"), "unit") or "") is not None:
                self.error(fields["unit"], "should not specify rate limit unit when unlimited")
            for extra in ("algorithm", "burst", "limits", "calendar", "timezone"):
                if extra in fields:
                    self.error(fields[extra], f"'{extra}' has no meaning when unlimited")
            if "lease_ttl" in fields:
                self.error(fields["lease_ttl"], "'lease_ttl' has no meaning when unlimited")
            # An unlimited rule counts nothing, so its requests_per_unit is checked, then dropped.
            self.requests_per_unit(fields.get("requests_per_unit"), required=False)
            return (), True, name, replaces
        if "lease_ttl" in fields:
            self.error(
                fields["lease_ttl"],
                "'lease_ttl' applies only with 'concurrency' (how long a lease lasts unrenewed)",
            )
        zone = self.calendar(fields)
        if "limits" not in fields:
            limit = self.one_limit(node, fields, name, upstream=True)
            limits: tuple[RateLimit, ...] = (limit,) if limit is not None else ()
        else:
            for single in _ONE_LIMIT_KEYS:
                if single in fields:
                    self.error(
                        fields[single],
                        f"'{single}' belongs inside each entry of 'limits' when 'limits' is given",
                    )
            limits = self.limit_list(fields["limits"], name)
        if zone is not None:
            limits = tuple(self.on_calendar(limit, zone, fields["calendar"]) for limit in limits)
        return limits, False, name, replaces

    def concurrency(self, node: Node) -> tuple[Concurrency | None, str, tuple[str, ...]]:
        """(concurrency, name, replaces) of a ``rate_limit`` block with ``concurrency``."""
        fields = self.mapping(node, _LIMIT_KEYS, "rate_limit")
        if fields is None:
            return None, "", ()
        name = self.string(fields.get("name"), "name") or ""
        replaces = self.replaces(fields.get("replaces"), name)
        for extra in (*_RATE_KEYS, "unlimited"):
            if extra in fields:
                self.error(
                    fields[extra],
                    f"'{extra}' cannot be combined with 'concurrency' (a concurrency limit "
                    "counts leases held at once, not requests per unit of time)",
                )
        value = _scalar(fields["concurrency"])
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(fields["concurrency"], "'concurrency' must be a whole number")
            return None, name, replaces
        if not 0 <= value <= _MAX_REQUESTS_PER_UNIT:
            self.error(
                fields["concurrency"],
                f"'concurrency' must be between 0 and {_MAX_REQUESTS_PER_UNIT}",
            )
            return None, name, replaces
        ttl = self.lease_ttl(fields.get("lease_ttl"))
        return Concurrency(value, ttl if ttl is not None else DEFAULT_LEASE_TTL_S), name, replaces

    def lease_ttl(self, node: Node | None) -> float | None:
        if node is None or _is_null(node):
            return None
        shown = str(node.value) if isinstance(node, ScalarNode) else f"a {_kind(node)}"
        try:
            ttl = parse_duration(node.value if isinstance(node, ScalarNode) else None, "")
        except ValueError:
            self.error(node, f"'lease_ttl' must be a duration such as 30s or 500ms, not {shown}")
            return None
        if not 0.001 <= ttl <= _MAX_LEASE_TTL_S:
            self.error(node, f"'lease_ttl' must be from 1ms to 1d, not {shown}")
            return None
        return ttl

    def calendar(self, fields: dict[str, Node]) -> str | None:
        """The zone of a block's calendar windows, or None for epoch-aligned windows."""
        calendar = self.boolean(fields.get("calendar"), "calendar")
        zone = self.string(fields.get("timezone"), "timezone")
        if zone is not None and not calendar:
            self.error(fields["timezone"], "'timezone' applies only with 'calendar: true'")
            return None
        if not calendar:
            return None
        if zone is None:
            return _DEFAULT_TIMEZONE
        if not known_zone(zone):
            self.error(
                fields["timezone"],
                f"unknown timezone '{zone}' (an IANA time zone name such as Europe/Paris)",
            )
            return None
        return zone

    def on_calendar(self, limit: RateLimit, zone: str, at: Node) -> RateLimit:
        """``limit`` counted in calendar windows of ``zone``, if it can be (else reported)."""
        if not ALGORITHMS[limit.algorithm].calendar_windows:
            windowed = [n for n, a in ALGORITHMS.items() if a.calendar_windows]
            self.error(
                at,
                f"'calendar' needs an algorithm that counts in windows ({' or '.join(windowed)}); "
                f"{limit.algorithm} has no window to align to the calendar",
            )
            return limit  # reported; left off the calendar so the rest can still be checked
        if limit.unit not in CALENDAR_UNITS:
            self.error(
                at,
                f"'calendar' applies to day, week, month and year limits, not "
                f"{limit.unit.name.lower()} (whose windows are not calendar periods)",
            )
            return limit
        return dataclasses.replace(limit, timezone=zone)

    def limit_list(self, node: Node, name: str) -> tuple[RateLimit, ...]:
        if not isinstance(node, SequenceNode) or not node.value:
            self.error(node, "'limits' must be a non-empty list of limits")
            return ()
        limits: list[RateLimit] = []
        seen: dict[tuple[str, Unit], int] = {}
        for item in node.value:
            fields = self.mapping(item, _ONE_LIMIT_KEYS, "a limits entry")
            limit = self.one_limit(item, fields, name) if fields is not None else None
            if limit is None:
                continue
            identity = (limit.algorithm, limit.unit)
            if identity in seen:
                self.error(
                    item,
                    f"two limits with algorithm {limit.algorithm} per {limit.unit.name.lower()} "
                    f"(the other is on line {seen[identity]}): they would share one counter",
                )
                continue
            seen[identity] = self.line(item)
            limits.append(limit)
        return tuple(limits)

    def one_limit(
        self, node: Node, fields: dict[str, Node], name: str, *, upstream: bool = False
    ) -> RateLimit | None:
        """One limit; ``upstream``: a ``rate_limit`` block as upstream writes it, where a
        missing ``requests_per_unit`` is 0 (nothing admitted), not an error."""
        unit_text = self.string(fields.get("unit"), "unit")
        unit = Unit.parse(unit_text) if unit_text else None
        if unit is None:
            self.error(fields.get("unit", node), f"invalid rate limit unit '{unit_text or ''}'")
        rpu = fields.get("requests_per_unit")
        if upstream and (rpu is None or _is_null(rpu)):
            self.warn(
                node,
                "rate_limit has no 'requests_per_unit': read as 0, as upstream reads it, so "
                "nothing is admitted",
            )
        requests = self.requests_per_unit(rpu, required=not upstream, at=node)
        algorithm = self.string(fields.get("algorithm"), "algorithm") or DEFAULT_ALGORITHM.name
        if algorithm not in ALGORITHMS:
            self.error(
                fields["algorithm"],
                f"unknown algorithm '{algorithm}' (one of: {', '.join(ALGORITHMS)})",
            )
            return None
        burst = self.burst(fields.get("burst"), algorithm)
        if ALGORITHMS[algorithm].stores_each_request and requests > self.max_log_limit:
            self.error(
                fields["requests_per_unit"],
                f"{algorithm} keeps one entry per request, so its requests_per_unit is "
                f"capped at {self.max_log_limit}; use sliding_window_counter for larger limits",
            )
            return None
        if unit is None:
            return None
        return RateLimit(requests, unit, name, algorithm, burst)

    def burst(self, node: Node | None, algorithm: str) -> int | None:
        if node is None or _is_null(node):
            return None
        if not ALGORITHMS[algorithm].takes_burst:
            takers = [name for name, a in ALGORITHMS.items() if a.takes_burst]
            self.error(
                node,
                f"'burst' applies only to {', '.join(takers[:-1])} and {takers[-1]}, "
                f"not {algorithm}",
            )
            return None
        value = _scalar(node)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**32 - 1:
            self.error(node, "'burst' must be a whole number from 1 to 4294967295")
            return None
        return value

    def requests_per_unit(
        self, node: Node | None, *, required: bool, at: Node | None = None
    ) -> int:
        if node is None or _is_null(node):
            if required and at is not None:
                self.error(at, "rate_limit needs 'requests_per_unit' (or 'unlimited: true')")
            return 0
        value = _scalar(node)
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(node, "'requests_per_unit' must be a whole number")
            return 0
        if not 0 <= value <= _MAX_REQUESTS_PER_UNIT:
            self.error(node, f"'requests_per_unit' must be between 0 and {_MAX_REQUESTS_PER_UNIT}")
            return 0
        return value

    def replaces(self, node: Node | None, own_name: str) -> tuple[str, ...]:
        if node is None or _is_null(node):
            return ()
        if not isinstance(node, SequenceNode):
            self.error(node, "'replaces' must be a list of {name: ...} entries")
            return ()
        names: list[str] = []
        for item in node.value:
            fields = self.mapping(item, _REPLACES_KEYS, "a replaces entry")
            if fields is None:
                continue
            name = self.string(fields.get("name"), "name")
            if not name:
                self.error(item, "should not have an empty replaces entry")
            elif name == own_name:
                self.error(item, "replaces should not contain name of same descriptor")
            else:
                names.append(name)
        return tuple(names)


def _has_key(node: MappingNode, key: str) -> bool:
    return any(isinstance(k, ScalarNode) and k.value == key for k, _ in node.value)


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _scalar(node: Node) -> Any:
    """The bool or int a scalar node holds; anything else comes back as itself or its text,
    which the caller then refuses as the wrong type (never an exception: a malformed value
    such as ``0x_``, ``!!bool maybe`` or ``2001-13-45`` is a problem to report, not a crash)."""
    if not isinstance(node, ScalarNode):
        return node
    construct = _CONSTRUCTORS.get(node.tag)
    if construct is None:
        return node.value
    text = node.value.replace("_", "")
    if node.tag.endswith(":int") and len(text) > _MAX_INT_DIGITS and text.lstrip("+-").isdigit():
        return -(2**64) if text.startswith("-") else 2**64  # too long to convert: out of range
    try:
        return construct(_constructor, node)
    except (ValueError, KeyError, yaml.YAMLError):
        return node.value


def _kind(node: Node) -> str:
    return "mapping" if isinstance(node, MappingNode) else "list"


def _breaks(text: str) -> list[int]:
    return [m.start() for m in re.finditer("\n", text)]


# yaml.Mark, or the C loader's mark of the same shape.
_Mark = yaml.error.Mark | yaml._yaml.Mark


def _line(breaks: list[int], mark: _Mark | None) -> int:
    """The line of ``mark`` as editors and ``grep -n`` count them: YAML also breaks lines at
    NEL, LS, PS and a lone CR, so its own line numbers can point past the line meant."""
    return bisect.bisect_left(breaks, mark.index) + 1 if mark is not None else 1


class _Refused(Exception):
    def __init__(self, mark: _Mark | None, reason: str) -> None:
        super().__init__(reason)
        self.mark = mark
        self.reason = reason


class _GuardedLoader(yaml.SafeLoader):
    """SafeLoader's composer, refusing (``_Refused``) a document that nests deeper than
    MAX_DEPTH or whose aliases would make the walk visit more than MAX_ALIAS_NODES extra
    nodes (or loop), as it composes: the text is parsed once.

    Each anchored node's expanded size is noted as it closes; each alias adds its anchor's.
    The check comes before the composer recurses, so a deep document never reaches
    Python's recursion limit.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._open: list[int] = []  # expanded size so far of each collection being composed
        self._sizes: dict[str, int] = {}  # anchor -> how many nodes it expands to
        self._added = 0  # nodes the aliases of this document add

    def compose_document(self) -> Node | None:
        self._sizes.clear()  # anchors are per document
        self._added = 0
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            size = self._alias_size(event)
            node = super().compose_node(parent, index)
        elif isinstance(event, CollectionStartEvent):
            if len(self._open) >= MAX_DEPTH:
                raise _Refused(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
            self._open.append(1)
            node = super().compose_node(parent, index)
            size = self._open.pop()
        else:
            size = 1
            node = super().compose_node(parent, index)
        if event.anchor is not None and not isinstance(event, AliasEvent):
            self._sizes[event.anchor] = size
        if self._open:
            self._open[-1] += size
        return node

    def _alias_size(self, event: AliasEvent) -> int:
        if event.anchor is None or event.anchor not in self.anchors:
            return 1  # undefined: the composer reports it
        size = self._sizes.get(event.anchor)
        if size is None:  # defined, not yet closed: the alias is inside its own anchor
            reason = f"alias '*{event.anchor}' refers to a node that contains it"
            raise _Refused(event.start_mark, reason)
        self._added += size
        if self._added > MAX_ALIAS_NODES:
            reason = (
                f"aliases expand this document by more than {MAX_ALIAS_NODES} nodes "
                f"(at alias '*{event.anchor}', of {size} nodes)"
            )
            raise _Refused(event.start_mark, reason)
        return size


def _walk(rules: Iterable[Rule]) -> Iterator[Rule]:
    for rule in rules:
        yield rule
        yield from _walk(rule.descriptors)


def _limit_names(rules: Iterable[Rule]) -> set[str]:
    return {rule.name for rule in _walk(rules) if rule.name and rule.applies_limit}


def dump_policy(policy: DomainPolicy) -> str:
    """Canonical YAML for one domain: loading it gives back an equal policy."""
    document: dict[str, Any] = {"domain": policy.domain}
    if policy.limit_overrides is not None:
        document["limit_overrides"] = policy.limit_overrides
    document["descriptors"] = [rule_document(r) for r in policy.descriptors]
    for kind in PIN_KINDS:
        pins = [pin_document(p) for p in policy.pins if p.kind == kind]
        if pins:
            document[kind] = pins
    if policy.resets:
        document["resets"] = [
            {"descriptor": format_entries(r.entries), "generation": r.generation}
            for r in policy.resets
        ]
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False)


def dump_policies(policies: Iterable[DomainPolicy]) -> str:
    """Several domains as one multi-document YAML stream."""
    return "---\n".join(dump_policy(p) for p in policies)


def rule_document(rule: Rule) -> dict[str, Any]:
    """A rule as the plain mapping the YAML format (and the JSON API) writes it."""
    doc: dict[str, Any] = {"key": rule.key}
    if rule.value is not None:
        doc["value"] = rule.value
    if rule.applies_limit:
        block: dict[str, Any] = {}
        if rule.name:
            block["name"] = rule.name
        if rule.replaces:
            block["replaces"] = [{"name": name} for name in rule.replaces]
        if rule.unlimited:
            block["unlimited"] = True
        elif rule.concurrency is not None:
            block["concurrency"] = rule.concurrency.max_leases
            if rule.concurrency.lease_ttl_s != DEFAULT_LEASE_TTL_S:
                block["lease_ttl"] = format_duration(rule.concurrency.lease_ttl_s)
        elif len(rule.limits) == 1:
            block.update(_limit_document(rule.limits[0]))
        else:
            block["limits"] = [_limit_document(limit) for limit in rule.limits]
        zone = rule.limits[0].timezone if rule.limits else None
        if zone is not None:  # a block's limits share it: it is written on the block
            block["calendar"] = True
            if zone != _DEFAULT_TIMEZONE:
                block["timezone"] = zone
        doc["rate_limit"] = block
    for flag in (
        "shadow_mode",
        "quota_mode",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
    ):
        if getattr(rule, flag):
            doc[flag] = True
    if rule.metadata is not None:
        doc["metadata"] = json.loads(rule.metadata)
    if rule.descriptors:
        doc["descriptors"] = [rule_document(child) for child in rule.descriptors]
    return doc


def pin_document(pin: Pin) -> dict[str, Any]:
    """A pin as the plain mapping the YAML format (and the JSON API) writes it."""
    doc: dict[str, Any] = {"descriptor": format_entries(pin.entries)}
    if pin.rate_limit is not None:
        doc["rate_limit"] = _limit_document(pin.rate_limit)
    if pin.expires_at_s is not None:
        doc["expires_at"] = format_time(pin.expires_at_s)
    return doc


def _limit_document(limit: RateLimit) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "unit": limit.unit.name.lower(),
        "requests_per_unit": limit.requests_per_unit,
    }
    if ALGORITHMS[limit.algorithm] is not DEFAULT_ALGORITHM:
        doc["algorithm"] = limit.algorithm
    if limit.burst is not None:
        doc["burst"] = limit.burst
    return doc
