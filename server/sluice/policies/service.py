"""Policy lifecycle as one service: read, validate, publish, delete, history, diff, rollback.

The HTTP write API, the CLI and the admin app all go through this class, so a change made
any way is validated the same way, versioned the same way, and refused the same way when it
was based on a version someone else has since replaced.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from sluice.clock import Clock, SystemClock
from sluice.errors import ConfigError, DomainNotFoundError, VersionNotFoundError
from sluice.model import PIN_KINDS, DomainPolicy, Pin, Reset, Rule
from sluice.policies.descriptor_text import (
    format_entries,
    format_time,
    parse_entries,
    parse_expiry,
)
from sluice.policies.snapshot import Snapshot
from sluice.policies.store import PolicyStore, StoredPolicy
from sluice.policies.yaml_format import (
    DEFAULT_MAX_LOG_LIMIT,
    dump_policy,
    load_sources,
    rule_document,
)

__all__ = ["DomainView", "PolicyService", "Version"]


@dataclass(frozen=True)
class DomainView:
    """The live policy of one domain and the version that made it live."""

    domain: str
    version: int
    policy: DomainPolicy
    document: str
    author: str
    comment: str
    created_at: datetime


@dataclass(frozen=True)
class Version:
    """One entry of a domain's audit trail, with its diff from the version before."""

    domain: str
    version: int
    author: str
    comment: str
    created_at: datetime
    deleted: bool
    restored_from: int | None
    diff: str


class PolicyService:
    def __init__(
        self,
        store: PolicyStore,
        *,
        max_log_limit: int = DEFAULT_MAX_LOG_LIMIT,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self._max_log_limit = max_log_limit
        self._clock: Clock = clock or SystemClock()  # what "expires in 10m" counts from

    # -- reading -----------------------------------------------------------------------------

    def domains(self) -> list[DomainView]:
        return [self._view(stored) for stored in self.store.current().values()]

    def get(self, domain: str) -> DomainView:
        stored = self.store.current().get(domain)
        if stored is None:
            raise DomainNotFoundError(f"no policy for domain '{domain}'")
        return self._view(stored)

    def history(self, domain: str) -> list[Version]:
        """Newest first; each with the unified diff of its document against the one before."""
        stored = self.store.history(domain)
        if not stored:
            raise DomainNotFoundError(f"domain '{domain}' has no history")
        versions = []
        for newer, older in zip(stored, [*stored[1:], None], strict=True):
            before = older.document if older is not None else ""
            versions.append(
                Version(
                    domain,
                    newer.version,
                    newer.author,
                    newer.comment,
                    newer.created_at,
                    newer.deleted,
                    newer.restored_from,
                    _diff(domain, before, older.version if older else 0, newer),
                )
            )
        return versions

    def diff(self, domain: str, from_version: int, to_version: int) -> str:
        old, new = self._version(domain, from_version), self._version(domain, to_version)
        return _diff(domain, old.document, old.version, new)

    # -- validating --------------------------------------------------------------------------

    def validate(self, sources: Iterable[tuple[str, str]]) -> list[DomainPolicy]:
        """Policies in (source name, YAML text) pairs, or ConfigError naming every problem."""
        return load_sources(sources, max_log_limit=self._max_log_limit)

    def validate_rule(self, domain: str, document: Mapping[str, object]) -> Rule:
        """One rule given as its YAML/JSON mapping (as in a ``descriptors`` list), validated in
        the context of its domain, so e.g. ``replaces`` can name the domain's other rules."""
        current = self._current_or_empty(domain)
        siblings = [rule_document(r) for r in current.descriptors]
        text = json.dumps({"domain": domain, "descriptors": [*siblings, document]})
        [policy] = self.validate([("rule", text)])
        return policy.descriptors[-1]

    # -- changing ----------------------------------------------------------------------------

    def publish(
        self,
        policies: Iterable[DomainPolicy],
        *,
        author: str,
        comment: str,
        base_versions: Mapping[str, int] | None = None,
    ) -> dict[str, int]:
        """Make these policies live; {domain: new version} for the domains that changed.

        With ``base_versions`` (0 = "must not exist yet") the publish is refused with
        StaleVersionError when any of those domains has moved on since.
        """
        policies, bases = self._keep_live_pins(list(policies), base_versions)
        documents = {p.domain: dump_policy(p) for p in policies}
        # Round-trip through the loader: what is stored must load back, every time.
        self.validate(documents.items())
        return self.store.publish(
            documents, author=author, comment=comment, expected_versions=bases
        )

    def _keep_live_pins(
        self, policies: list[DomainPolicy], base_versions: Mapping[str, int] | None
    ) -> tuple[list[DomainPolicy], Mapping[str, int] | None]:
        """Policies whose document named no pins take the live ones. Those domains' versions
        as read become conditions of the publish (unless the caller gave its own), so a pin
        written in between is never silently lost: the publish fails as stale instead."""
        keeping = [p for p in policies if not p.pins_given]
        if not keeping:
            return policies, base_versions
        live = self.store.current()
        bases = dict(base_versions or {})
        kept = []
        for policy in policies:
            stored = live.get(policy.domain)
            if policy.pins_given or stored is None:
                kept.append(policy)
                continue
            current = self._view(stored).policy
            kept.append(replace(policy, pins=current.pins, resets=current.resets))
            bases.setdefault(policy.domain, stored.version)
        return kept, bases

    def publish_document(
        self,
        text: str,
        *,
        author: str,
        comment: str,
        base_version: int | None = None,
        domain: str | None = None,
    ) -> dict[str, int]:
        """Publish a YAML document; ``domain`` (if given) must be the only domain in it."""
        policies = self.validate([("document", text)])
        if domain is not None and [p.domain for p in policies] != [domain]:
            found = ", ".join(p.domain for p in policies) or "none"
            raise ConfigError([f"document: must define exactly domain '{domain}' (found: {found})"])
        bases = None
        if base_version is not None:
            bases = {p.domain: base_version for p in policies}
        return self.publish(policies, author=author, comment=comment, base_versions=bases)

    def delete(
        self, domain: str, *, author: str, comment: str, base_version: int | None = None
    ) -> int:
        self.get(domain)  # a clear error for a domain that is not there
        bases = {domain: base_version} if base_version is not None else None
        changed = self.store.publish(
            {domain: None}, author=author, comment=comment, expected_versions=bases
        )
        return changed[domain]

    def rollback(
        self,
        domain: str,
        to_version: int,
        *,
        author: str,
        comment: str = "",
        base_version: int | None = None,
    ) -> int | None:
        """Restore ``to_version``'s rules as a new version; None if they are already live."""
        target = self._version(domain, to_version)
        document = None if target.deleted else target.document
        if document is not None:
            self.validate([(f"{domain}@v{to_version}", document)])
        bases = {domain: base_version} if base_version is not None else None
        changed = self.store.publish(
            {domain: document},
            author=author,
            comment=comment or f"rollback to version {to_version}",
            expected_versions=bases,
            restored_from={domain: to_version},
        )
        return changed.get(domain)

    # -- rules within a domain ---------------------------------------------------------------

    def put_rule(
        self,
        domain: str,
        path: tuple[tuple[str, str | None], ...],
        rule: Rule,
        *,
        author: str,
        comment: str,
        base_version: int | None = None,
    ) -> dict[str, int]:
        """Add or replace the rule at ``path`` (its ancestors' (key, value), then its own)."""
        current = self._current_or_empty(domain)
        updated = replace(current, descriptors=_replace(current.descriptors, path, rule))
        bases = {domain: base_version} if base_version is not None else None
        return self.publish([updated], author=author, comment=comment, base_versions=bases)

    def delete_rule(
        self,
        domain: str,
        path: tuple[tuple[str, str | None], ...],
        *,
        author: str,
        comment: str,
        base_version: int | None = None,
    ) -> dict[str, int]:
        current = self.get(domain).policy
        updated = replace(current, descriptors=_replace(current.descriptors, path, None))
        bases = {domain: base_version} if base_version is not None else None
        return self.publish([updated], author=author, comment=comment, base_versions=bases)

    # -- pins and resets on one exact descriptor -----------------------------------------------

    def pins(self, domain: str, kind: str) -> list[Pin]:
        """The domain's overrides, blocks or allows (expired ones included, until pruned)."""
        _check_kind(kind)
        return [p for p in self.get(domain).policy.pins if p.kind == kind]

    def put_pin(
        self,
        domain: str,
        kind: str,
        descriptor: str,
        *,
        rate_limit: Mapping[str, object] | None = None,
        expires_in: str | None = None,
        author: str,
        comment: str,
        base_version: int | None = None,
    ) -> dict[str, int]:
        """Pin ``descriptor`` (``KEY=VALUE,…``) as an override (with ``rate_limit``), a block
        or an allow, replacing the same kind's pin on it, optionally expiring ``expires_in``
        (a duration or an ISO 8601 time) from now. Pins that have expired are pruned in the
        same version (they stay in its diff)."""
        _check_kind(kind)
        policy = self.get(domain).policy
        entries = _matched_entries(policy, descriptor)
        text = format_entries(entries)
        for pin in policy.pins:
            if pin.entries == entries and pin.kind != kind:
                raise ConfigError([f"descriptor: {text} is in {pin.kind}; remove it there first"])
        if kind == "overrides" and rate_limit is None:
            raise ConfigError(["rate_limit: an override needs one (requests_per_unit, unit, …)"])
        if kind != "overrides" and rate_limit is not None:
            raise ConfigError([f"rate_limit: only overrides have one, not {kind}"])
        now = self._clock.now()
        item: dict[str, object] = {"descriptor": text}
        if rate_limit is not None:
            if not isinstance(rate_limit, Mapping):
                raise ConfigError(["rate_limit: must be a mapping (requests_per_unit, unit, …)"])
            item["rate_limit"] = dict(rate_limit)
        if expires_in is not None:
            try:
                item["expires_at"] = format_time(parse_expiry(expires_in, now))
            except ValueError as exc:
                raise ConfigError([str(exc)]) from None
        document = {"domain": domain, kind: [item]}
        document["descriptors"] = [rule_document(r) for r in policy.descriptors]
        try:
            [loaded] = self.validate([("rate_limit", json.dumps(document))])
        except ConfigError as exc:
            # The document is one line of JSON made here: only the field tells anything.
            problems = [p.replace("rate_limit:1: ", "rate_limit: ") for p in exc.problems]
            raise ConfigError(problems) from None
        kept = tuple(p for p in policy.pins if p.entries != entries and not _expired(p, now))
        updated = replace(policy, pins=(*kept, *loaded.pins), pins_given=True)
        bases = {domain: base_version} if base_version is not None else None
        return self.publish([updated], author=author, comment=comment, base_versions=bases)

    def delete_pin(
        self,
        domain: str,
        kind: str,
        descriptor: str,
        *,
        author: str,
        comment: str,
        base_version: int | None = None,
    ) -> dict[str, int]:
        _check_kind(kind)
        policy = self.get(domain).policy
        entries = _entries(descriptor)
        if not any(p.kind == kind and p.entries == entries for p in policy.pins):
            raise ConfigError([f"descriptor: {format_entries(entries)} is not in {kind}"])
        pins = tuple(p for p in policy.pins if p.entries != entries)
        updated = replace(policy, pins=pins, pins_given=True)
        bases = {domain: base_version} if base_version is not None else None
        return self.publish([updated], author=author, comment=comment, base_versions=bases)

    def reset(
        self,
        domain: str,
        descriptor: str,
        *,
        author: str,
        comment: str,
        base_version: int | None = None,
    ) -> dict[str, int]:
        """Start the counters of every limit of the rule (and the override) that applies to
        ``descriptor`` afresh, on every instance: a new reset generation in the document."""
        policy = self.get(domain).policy
        entries = _matched_entries(policy, descriptor)
        before = next((r.generation for r in policy.resets if r.entries == entries), 0)
        resets = tuple(r for r in policy.resets if r.entries != entries)
        updated = replace(policy, resets=(*resets, Reset(entries, before + 1)), pins_given=True)
        bases = {domain: base_version} if base_version is not None else None
        return self.publish([updated], author=author, comment=comment, base_versions=bases)

    # -- helpers -----------------------------------------------------------------------------

    def _current_or_empty(self, domain: str) -> DomainPolicy:
        try:
            return self.get(domain).policy
        except DomainNotFoundError:
            return DomainPolicy(domain)

    def _view(self, stored: StoredPolicy) -> DomainView:
        [policy] = self.validate([(f"database:{stored.domain}@v{stored.version}", stored.document)])
        return DomainView(
            stored.domain,
            stored.version,
            policy,
            stored.document,
            stored.author,
            stored.comment,
            stored.created_at,
        )

    def _version(self, domain: str, version: int) -> StoredPolicy:
        for stored in self.store.history(domain):
            if stored.version == version:
                return stored
        raise VersionNotFoundError(f"domain '{domain}' has no version {version}")


def _check_kind(kind: str) -> None:
    if kind not in PIN_KINDS:
        raise ConfigError([f"kind: must be one of {', '.join(PIN_KINDS)}, not '{kind}'"])


def _entries(descriptor: str) -> tuple[tuple[str, str], ...]:
    try:
        return parse_entries(descriptor)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None


def _matched_entries(policy: DomainPolicy, descriptor: str) -> tuple[tuple[str, str], ...]:
    """The descriptor's entries, refused unless a rule of the domain limits it."""
    entries = _entries(descriptor)
    if Snapshot([replace(policy, pins=(), resets=())]).lookup(policy.domain, entries) is None:
        raise ConfigError(
            [f"descriptor: no rule of domain '{policy.domain}' limits {format_entries(entries)}"]
        )
    return entries


def _expired(pin: Pin, now: float) -> bool:
    return pin.expires_at_s is not None and pin.expires_at_s <= now


def _diff(domain: str, before: str, before_version: int, after: StoredPolicy) -> str:
    label = f"{domain}@v{before_version}" if before_version else "/dev/null"
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.document.splitlines(keepends=True),
        fromfile=label,
        tofile=f"{domain}@v{after.version}" if not after.deleted else "/dev/null",
    )
    return "".join(lines)


def _replace(
    rules: tuple[Rule, ...], path: tuple[tuple[str, str | None], ...], new: Rule | None
) -> tuple[Rule, ...]:
    """``rules`` with the rule at ``path`` replaced by ``new`` (None: removed; absent: added)."""
    if not path:
        raise ConfigError(["path: must name at least one (key, value)"])
    (key, value), rest = path[0], path[1:]
    index = next((i for i, r in enumerate(rules) if (r.key, r.value) == (key, value)), None)
    if rest:
        if index is None:
            shown = key if value is None else f"{key}={value}"
            raise ConfigError([f"path: no rule '{shown}' to nest under"])
        parent = rules[index]
        children = _replace(parent.descriptors, rest, new)
        return (*rules[:index], replace(parent, descriptors=children), *rules[index + 1 :])
    if new is None:
        if index is None:
            shown = key if value is None else f"{key}={value}"
            raise ConfigError([f"path: no rule '{shown}' to delete"])
        return (*rules[:index], *rules[index + 1 :])
    if index is None:
        return (*rules, new)
    return (*rules[:index], new, *rules[index + 1 :])
