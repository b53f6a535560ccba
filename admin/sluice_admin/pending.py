"""A domain's rules while they are being edited: pure functions over rule mappings.

The pending policy is kept as the YAML format's own mappings (``rule_document``), so what
is validated, shown as YAML and diffed is exactly what would be published.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from sluice.algorithms import ALGORITHMS, DEFAULT_ALGORITHM
from sluice.model import DomainPolicy, Rule
from sluice.policies.yaml_format import dump_policy, rule_document
from sluice_admin.pins import offender_entries

__all__ = [
    "LimitFields",
    "RuleForm",
    "RuleRow",
    "diff",
    "document_rules",
    "form_from_rule",
    "offender_values",
    "pending_text",
    "put_rule",
    "remove_rule",
    "rows",
    "rule_id",
]

RulePath = tuple[tuple[str, str | None], ...]
Doc = dict[str, Any]

LIMIT, UNLIMITED, NO_LIMIT = "limit", "unlimited", "none"


@dataclass(frozen=True)
class RuleRow:
    domain: str
    path: RulePath
    rule: Rule

    @property
    def depth(self) -> int:
        return len(self.path) - 1

    @property
    def label(self) -> str:
        """The rule's one name on every page: its usage id, the ``rule`` label of /metrics."""
        return rule_id(self.domain, self.path)


def rows(policy: DomainPolicy) -> list[RuleRow]:
    """Every rule of the tree, depth first, each with its path from the top."""

    def walk(rules: tuple[Rule, ...], parent: RulePath) -> Iterator[RuleRow]:
        for rule in rules:
            path = (*parent, (rule.key, rule.value))
            yield RuleRow(policy.domain, path, rule)
            yield from walk(rule.descriptors, path)

    return list(walk(policy.descriptors, ()))


def rule_id(domain: str, path: RulePath) -> str:
    """The id usage telemetry files a rule under (as ``policies/snapshot.py`` names it)."""
    return domain + "".join(f".{k}" + (f"_{v}" if v else "") for k, v in path)


def offender_values(key: str) -> str:
    """An over-limit key as recorded (the counter's ``key,value,…`` after the domain) shown
    as its values only: the rule's name already says which keys they are."""
    entries = offender_entries(key)
    return ", ".join(value for _, value in entries) if entries is not None else key


def document_rules(policy: DomainPolicy) -> list[Doc]:
    return [rule_document(r) for r in policy.descriptors]


def pending_text(domain: str, descriptors: list[Doc]) -> str:
    """The YAML a pending edit is validated, shown and diffed as (so line numbers match).

    The same dump as ``dump_policy``: a validated pending policy prints identically.
    """
    document = {"domain": domain, "descriptors": descriptors}
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False)


def _matches(doc: Doc, step: tuple[str, str | None]) -> bool:
    return (doc.get("key"), doc.get("value")) == step


def put_rule(docs: list[Doc], parent: RulePath, old: RulePath | None, new: Doc) -> list[Doc]:
    """``docs`` with ``new`` under ``parent``: replacing the rule at ``old`` (an edit, which
    keeps its children unless ``new`` has its own), else appended (an add). Never mutates."""
    if parent:
        head, rest = parent[0], parent[1:]
        out = []
        for doc in docs:
            if _matches(doc, head):
                children = put_rule(list(doc.get("descriptors", [])), rest, _tail(old), new)
                doc = {**doc, "descriptors": children}
            out.append(doc)
        return out
    if old is None:
        return [*docs, new]
    out = []
    for doc in docs:
        if _matches(doc, old[-1]):
            if "descriptors" in doc and "descriptors" not in new:
                new = {**new, "descriptors": doc["descriptors"]}
            doc = new
        out.append(doc)
    return out


def _tail(path: RulePath | None) -> RulePath | None:
    return path[1:] if path is not None else None


def remove_rule(docs: list[Doc], path: RulePath) -> list[Doc]:
    """``docs`` without the rule at ``path`` (and its children)."""
    head, rest = path[0], path[1:]
    out = []
    for doc in docs:
        if _matches(doc, head):
            if not rest:
                continue
            children = remove_rule(list(doc.get("descriptors", [])), rest)
            doc = {k: v for k, v in doc.items() if k != "descriptors"}
            if children:
                doc["descriptors"] = children
        out.append(doc)
    return out


@dataclass
class LimitFields:
    requests_per_unit: int = 10
    unit: str = "minute"
    algorithm: str = DEFAULT_ALGORITHM.name
    burst: int | None = None

    def document(self) -> Doc:
        doc: Doc = {"unit": self.unit, "requests_per_unit": self.requests_per_unit}
        if ALGORITHMS.get(self.algorithm) is not DEFAULT_ALGORITHM:
            doc["algorithm"] = self.algorithm
        if self.burst is not None:
            doc["burst"] = self.burst
        return doc


@dataclass
class RuleForm:
    """What the rule form edits; ``document()`` is the rule as the YAML format writes it."""

    key: str = ""
    value: str = ""  # empty: a key-only rule
    mode: str = LIMIT  # LIMIT, UNLIMITED or NO_LIMIT (a placeholder or a whitelist)
    limits: list[LimitFields] = field(default_factory=lambda: [LimitFields()])
    name: str = ""
    replaces: list[str] = field(default_factory=list)
    shadow_mode: bool = False
    # Not on the form, but an edit must not drop them.
    detailed_metric: bool = False
    share_threshold: bool = False
    quota_mode: bool = False
    value_to_metric: bool = False
    metadata: str | None = None  # canonical JSON, as the rule keeps it
    timezone: str | None = None  # calendar windows in this zone (the block's `calendar: true`)

    def document(self) -> Doc:
        doc: Doc = {"key": self.key.strip()}
        if self.value.strip():
            doc["value"] = self.value.strip()
        if self.mode != NO_LIMIT:
            block: Doc = {}
            if self.name.strip():
                block["name"] = self.name.strip()
            if self.replaces:
                block["replaces"] = [{"name": n} for n in self.replaces]
            if self.mode == UNLIMITED:
                block["unlimited"] = True
            elif len(self.limits) == 1:
                block.update(self.limits[0].document())
            else:
                block["limits"] = [limit.document() for limit in self.limits]
            if self.mode == LIMIT and self.timezone is not None:
                block["calendar"] = True
                block["timezone"] = self.timezone
            doc["rate_limit"] = block
        for flag in (
            "shadow_mode",
            "quota_mode",
            "detailed_metric",
            "value_to_metric",
            "share_threshold",
        ):
            if getattr(self, flag):
                doc[flag] = True
        if self.metadata is not None:
            doc["metadata"] = json.loads(self.metadata)
        return doc


def form_from_rule(rule: Rule) -> RuleForm:
    mode = UNLIMITED if rule.unlimited else LIMIT if rule.limits else NO_LIMIT
    limits = [
        LimitFields(x.requests_per_unit, x.unit.name.lower(), x.algorithm, x.burst)
        for x in rule.limits
    ]
    return RuleForm(
        key=rule.key,
        value=rule.value or "",
        mode=mode,
        limits=limits or [LimitFields()],
        name=rule.name,
        replaces=list(rule.replaces),
        shadow_mode=rule.shadow_mode,
        detailed_metric=rule.detailed_metric,
        share_threshold=rule.share_threshold,
        quota_mode=rule.quota_mode,
        value_to_metric=rule.value_to_metric,
        metadata=rule.metadata,
        timezone=rule.limits[0].timezone if rule.limits else None,
    )


def diff(live: DomainPolicy | None, live_version: int, pending: DomainPolicy) -> str:
    """Unified diff of the live document against the pending one ("" when equal)."""
    before = dump_policy(live) if live is not None else ""
    after = dump_policy(pending)
    label = f"{pending.domain}@v{live_version}" if live is not None else "/dev/null"
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=label,
        tofile=f"{pending.domain} (pending)",
    )
    return "".join(lines)
