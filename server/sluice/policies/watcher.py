"""Follows ``--config`` (upstream's runtime directory): what the files say is what is published.

Every ``interval_s`` a thread reads every policy file (hidden files and directories skipped,
so a Kubernetes ConfigMap's ``..data`` swap is seen through the visible symlinks) and
compares a hash of their names and contents with the last look. Polling the contents rather
than watching for events catches every way a file changes (written, replaced, a symlink
swapped, a directory mounted again) and needs no inotify; a look at 20 files (17 KB) takes
about 1 ms, on a thread, never on the event loop or the request path.

A change is validated as a whole, then each domain whose text changed in the files is
published as a new version, and a domain that went from the files is deleted. Only what the
files changed is published: a domain edited another way since (the write API, the admin app)
keeps that edit until its file changes. The server's reloader then installs the new
snapshot, as for any other publish. An invalid change is logged (file and line) and counted,
and nothing is published: the last good version keeps serving until the files are fixed.

Several servers watching the same files (replicas on one PostgreSQL config database) publish
one version, not one each: each publish names the versions it was based on, so a replica that
lost the race sees StaleVersionError, looks again, and finds nothing left to change.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import ConfigDatabaseError, ConfigError, StaleVersionError
from sluice.model import DomainPolicy
from sluice.periodic import Periodic
from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore, StoredPolicy
from sluice.policies.yaml_format import dump_policy, load_sources, read_sources

__all__ = ["WATCH_AUTHOR", "ConfigWatcher", "WatchStatus"]

log = logging.getLogger(__name__)

# The author of every version the files publish; with the path as comment, it marks the
# domains the files own (the ones deleted when their file goes away).
WATCH_AUTHOR = "sluice serve --config"
# Publishing retries after losing a race to another replica; the second look normally finds
# the other replica's identical publish, so nothing is left to do.
_ATTEMPTS = 3


@dataclass
class WatchStatus:
    checks: int = 0
    publishes: int = 0  # looks that published at least one new version
    errors: int = 0  # changes refused because the files were invalid (counted once each)
    last_error: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "checks": self.checks,
            "publishes": self.publishes,
            "errors": self.errors,
            "last_error": self.last_error,
        }


class ConfigWatcher:
    def __init__(
        self,
        path: str | Path,
        service: PolicyService,
        *,
        interval_s: float = 1.0,
        merge_domains: bool = False,
        max_log_limit: int,
    ) -> None:
        self.path = Path(path)
        self._service = service
        self._merge_domains = merge_domains
        self._max_log_limit = max_log_limit
        self._seen: str | None = None  # hash of the files as last validated
        # {domain: document} as the files last said it; None: not known yet, so the first
        # look publishes as an import does.
        self._said: dict[str, str] | None = None
        self._retrying = False  # the last look could not publish
        self._periodic = Periodic("config files", interval_s, self.poll_once)
        self.status = WatchStatus()

    @property
    def comment(self) -> str:
        return str(self.path)

    def import_now(self) -> dict[str, int]:
        """Read, validate and publish the files now, as an import: every domain whose live
        document differs, and the deletion of each domain the files published before and
        no longer define. ``{domain: new version}``. Raises ConfigError when they are
        invalid (a server must not start on a broken config) and ConfigDatabaseError when
        the database is unreachable."""
        fingerprint, policies = self._read()
        said = _documents(policies)
        changed = self._publish(self._changes(said))
        self._seen, self._said = fingerprint, said
        return changed

    def follow_database(self) -> None:
        """Take what the files last said from the database (the versions they published),
        so that the first look publishes only what the files changed since, never undoing
        what was published another way meanwhile. For a server whose files were just
        imported (``import_now`` in another process)."""
        current = self._service.store.current()
        self._said = {
            domain: stored.document
            for domain, stored in current.items()
            if stored.author == WATCH_AUTHOR and stored.comment == self.comment
        }

    def check(self) -> dict[str, int] | None:
        """One look: None when the files are as last seen or invalid (logged and counted);
        else what was published (``{}`` when every domain was already live as written)."""
        self.status.checks += 1
        try:
            fingerprint, sources = self._sources()
        except ConfigError as exc:  # the path is gone or a file unreadable: say so once
            self._refused("\n".join(exc.problems), exc)
            return None
        if fingerprint == self._seen:
            return None
        try:
            policies = self._load(sources)
        except ConfigError as exc:
            self._refused(fingerprint, exc)
            return None
        said = _documents(policies)
        try:
            changed = self._publish(self._changes(said))
        except (ConfigDatabaseError, StaleVersionError) as exc:
            # Not seen yet: the next look tries again (the database back, or the writers
            # racing this one done). Said once per outage, not every look.
            if not self._retrying:
                log.warning("config files %s: not published, will retry: %s", self.path, exc)
            self._retrying = True
            return None
        self._retrying = False
        self._seen, self._said = fingerprint, said
        self.status.last_error = ""
        if changed:
            self.status.publishes += 1
            log.info("config files %s published: %s", self.path, _versions(changed))
        return changed

    async def poll_once(self) -> None:
        await asyncio.to_thread(self.check)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    # -- helpers -----------------------------------------------------------------------------

    def _sources(self) -> tuple[str, list[tuple[str, str]]]:
        """A hash of the files' names and texts, and the (name, text) pairs; ConfigError when
        the path is missing or a file is not UTF-8. A directory without policy files is
        an empty set of policies, as upstream reads it."""
        sources, unreadable = read_sources(self.path, allow_empty=True)
        if unreadable:
            raise ConfigError(unreadable)
        digest = hashlib.sha256()
        for name, text in sources:
            digest.update(f"{len(name)}:{name}{len(text)}:{text}".encode())
        return digest.hexdigest(), sources

    def _load(self, sources: list[tuple[str, str]]) -> list[DomainPolicy]:
        return load_sources(
            sources, max_log_limit=self._max_log_limit, merge_domains=self._merge_domains
        )

    def _read(self) -> tuple[str, list[DomainPolicy]]:
        fingerprint, sources = self._sources()
        return fingerprint, self._load(sources)

    def _refused(self, fingerprint: str, exc: ConfigError) -> None:
        if fingerprint != self._seen:
            self._seen = fingerprint  # reported once, not every second until fixed
            self.status.errors += 1
            self.status.last_error = "; ".join(exc.problems)
            log.error(
                "config files %s refused, the last good version keeps serving:\n  %s",
                self.path,
                "\n  ".join(exc.problems),
            )

    def _changes(self, said: dict[str, str]) -> dict[str, str | None]:
        """What to publish: the domains whose text the files changed since they last said
        (None: deleted); all of them, as an import, when that is not known."""
        if self._said is None:
            changes: dict[str, str | None] = dict(said)
            for domain, stored in self._service.store.current().items():
                owned = stored.author == WATCH_AUTHOR and stored.comment == self.comment
                if owned and domain not in said:
                    changes[domain] = None  # its file went away while no one watched
            return changes
        changes = {d: text for d, text in said.items() if self._said.get(d) != text}
        changes.update({d: None for d in self._said if d not in said})
        return changes

    def _publish(self, documents: Mapping[str, str | None]) -> dict[str, int]:
        # What is stored must load back, as PolicyService.publish makes sure.
        self._service.validate([(d, text) for d, text in documents.items() if text])
        store = self._service.store
        for attempt in range(_ATTEMPTS):
            current = store.current()
            changes = {
                domain: text
                for domain, text in documents.items()
                if (current[domain].document if domain in current else None) != text
            }
            if not changes:
                return {}
            expected = {d: _version(store, current, d) for d in changes}
            try:
                return store.publish(
                    changes,
                    author=WATCH_AUTHOR,
                    comment=self.comment,
                    expected_versions=expected,
                )
            except StaleVersionError:
                if attempt == _ATTEMPTS - 1:
                    raise
                # Another writer (a replica watching the same files) went first: look again.
        return {}  # not reached


def _version(store: PolicyStore, current: Mapping[str, StoredPolicy], domain: str) -> int:
    """The latest version of ``domain``, deletions included (0: never seen)."""
    stored = current.get(domain)
    if stored is not None:
        return stored.version
    history = store.history(domain)
    return history[0].version if history else 0


def _documents(policies: list[DomainPolicy]) -> dict[str, str]:
    return {p.domain: dump_policy(p) for p in policies}


def _versions(changed: Mapping[str, int]) -> str:
    return ", ".join(f"{domain} v{version}" for domain, version in sorted(changed.items()))
