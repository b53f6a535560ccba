"""Between YAML policies and the config database: import, export, and the live snapshot."""

from __future__ import annotations

from collections.abc import Iterable

from sluice.model import DomainPolicy
from sluice.policies.snapshot import Snapshot
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import dump_policy, load_sources

__all__ = ["import_policies", "load_policies", "load_snapshot"]


def import_policies(
    store: PolicyStore, policies: Iterable[DomainPolicy], *, author: str, comment: str
) -> dict[str, int]:
    """Publish each domain's canonical document; returns {domain: new version} for the
    domains that changed (an identical re-import creates no version)."""
    documents = {p.domain: dump_policy(p) for p in policies}
    return store.publish(documents, author=author, comment=comment)


def load_policies(store: PolicyStore, domains: Iterable[str] | None = None) -> list[DomainPolicy]:
    """The current policies, validated again on the way out: the database is not trusted to
    hold only what this version of Sluice accepts."""
    wanted = None if domains is None else set(domains)
    current = store.current()
    return load_sources(
        (f"database:{domain}@v{stored.version}", stored.document)
        for domain, stored in current.items()
        if wanted is None or domain in wanted
    )


def load_snapshot(store: PolicyStore) -> Snapshot:
    current = store.current()
    version = ",".join(f"{d}@v{s.version}" for d, s in current.items())
    return Snapshot(load_policies(store), version=version)
