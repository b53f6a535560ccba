"""Keeps a server's snapshot in step with the config database.

Every ``interval_s`` it reads the database's change token (one cheap indexed query); when the
token moved, it reads the live documents, validates and compiles them off the event loop,
and hands the new snapshot over in one assignment. What never happens: an invalid version
going live (it is logged and counted, the last good snapshot keeps serving), or a database
outage changing a decision (the last good snapshot keeps serving; it catches up on return).
A database that hangs rather than refuses counts as unreachable after ``timeout_s``. Each
good snapshot is also written to a local cache file, which a server starting while the
database is down serves from.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.errors import ConfigDatabaseError, ConfigError
from sluice.periodic import Periodic
from sluice.policies.snapshot import Snapshot
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import load_sources

__all__ = ["ReloadStatus", "SnapshotReloader"]

log = logging.getLogger(__name__)


@dataclass
class ReloadStatus:
    version: str = ""
    source: str = "none"  # "database", or "cache" when started from the local cache
    database_up: bool = False
    database_error: str = ""
    down_since: float | None = None
    loads: int = 0
    invalid: int = 0  # versions refused because they failed validation
    database_errors: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "version": self.version,
            "source": self.source,
            "database": "up" if self.database_up else "unreachable",
            "database_error": self.database_error,
            "down_since": self.down_since,
            "loads": self.loads,
            "invalid_versions": self.invalid,
            "database_errors": self.database_errors,
        }


class SnapshotReloader:
    def __init__(
        self,
        store: PolicyStore,
        install: Callable[[Snapshot], None],
        *,
        interval_s: float,
        cache_path: Path | None,
        max_log_limit: int,
        timeout_s: float = 5.0,
    ) -> None:
        self._store = store
        self._timeout_s = timeout_s
        self._reading: asyncio.Future[_LiveDocuments | None] | None = None
        self._install = install
        self._cache_path = cache_path
        self._max_log_limit = max_log_limit
        self._token: int | None = None
        self._periodic = Periodic("config reload", interval_s, self.poll_once)
        self.status = ReloadStatus()

    def load_initial(self) -> None:
        """Load before serving: from the database, else from the local cache (and say so).

        Raises ConfigDatabaseError when the database is down and there is no cache, and
        ConfigError when the stored policies are invalid: a server must not start empty.
        """
        try:
            live = _read_live(self._store)
            self._database_up()
            self._take(live, source="database")
            return
        except ConfigDatabaseError as exc:
            self._database_down(exc)
            problem: Exception = exc
        except ConfigError as exc:
            self.status.invalid += 1
            problem = exc
        cached = _read_cache(self._cache_path) if self._cache_path is not None else None
        if cached is None:
            raise problem
        self._take(cached, source="cache")
        log.warning(
            "serving %s from the local cache %s: %s",
            cached.version or "no domains",
            self._cache_path,
            problem,
        )

    async def poll_once(self) -> bool:
        """One poll; True when a new snapshot was installed.

        A database that does not answer within ``timeout_s`` is reported unreachable like one
        that refuses; the read under way is not abandoned but awaited again by the next
        poll, so a hung database holds one thread, never one per poll.
        """
        if self._reading is None:
            self._reading = asyncio.ensure_future(asyncio.to_thread(self._read))
            self._reading.add_done_callback(_seen)
        try:
            live = await asyncio.wait_for(asyncio.shield(self._reading), self._timeout_s)
        except TimeoutError:
            self._database_down(
                ConfigDatabaseError(f"config database: no answer within {self._timeout_s:g}s")
            )
            return False
        except ConfigDatabaseError as exc:
            self._database_down(exc)
            return False
        finally:
            if self._reading.done():
                self._reading = None
        self._database_up()
        if live is None:
            return False
        try:
            snapshot = await asyncio.to_thread(
                _build_snapshot, live, max_log_limit=self._max_log_limit
            )
        except ConfigError as exc:
            self.status.invalid += 1
            self._token = live.token  # don't retry the same bad version every poll
            log.error(
                "refused config version %s; still serving %s:\n%s",
                live.version,
                self.status.version,
                exc,
            )
            return False
        self._commit(live, snapshot, source="database")
        # Off the event loop, as the read and the compile are: the file holds every document.
        await asyncio.to_thread(self._save, live)
        return True

    def _read(self) -> _LiveDocuments | None:
        """The live documents when the change token moved (or the cache is serving), else None."""
        token = self._store.change_token()
        if token == self._token and self.status.source == "database":
            return None
        return _read_live(self._store)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    def _take(self, live: _LiveDocuments, *, source: str) -> None:
        self._commit(live, _build_snapshot(live, max_log_limit=self._max_log_limit), source=source)
        if source == "database":
            self._save(live)

    def _commit(self, live: _LiveDocuments, snapshot: Snapshot, *, source: str) -> None:
        self._install(snapshot)
        changed = snapshot.version != self.status.version
        self._token = live.token
        self.status.version = snapshot.version
        self.status.source = source
        self.status.loads += 1
        if changed:
            log.info("serving config %s (from the %s)", snapshot.version or "(empty)", source)

    def _save(self, live: _LiveDocuments) -> None:
        """Write the database's live documents to the local cache file, if there is one."""
        if self._cache_path is None:
            return
        try:
            _write_cache(self._cache_path, live)
        except OSError as exc:
            log.warning("could not write the snapshot cache %s: %s", self._cache_path, exc)

    def _database_up(self) -> None:
        if not self.status.database_up and self.status.down_since is not None:
            log.warning("config database reachable again")
        self.status.database_up = True
        self.status.database_error = ""
        self.status.down_since = None

    def _database_down(self, exc: ConfigDatabaseError) -> None:
        self.status.database_errors += 1
        if self.status.database_up or self.status.down_since is None:
            log.error(
                "config database unreachable; keeping config %s: %s", self.status.version, exc
            )
            self.status.down_since = time.time()
        self.status.database_up = False
        self.status.database_error = str(exc)


def _seen(read: asyncio.Future[Any]) -> None:
    """Mark a read's outcome as seen: one the server stopped waiting for (it stopped) must
    not be logged as an exception never retrieved."""
    if not read.cancelled():
        read.exception()


# -- from the config database to a snapshot, and the local cache of what was served ------


@dataclass(frozen=True)
class _LiveDocuments:
    """The live document of every domain, as of change token ``token``."""

    token: int
    documents: dict[str, tuple[int, str]]  # domain -> (version, YAML document)

    @property
    def version(self) -> str:
        """A readable identity of this set of versions, e.g. ``edge@v3,internal@v1``."""
        return ",".join(f"{d}@v{v}" for d, (v, _) in sorted(self.documents.items()))


def _read_live(store: PolicyStore) -> _LiveDocuments:
    # The token is read first: a publish racing this read makes the next poll load again,
    # never skip a change.
    token = store.change_token()
    current = store.current()
    return _LiveDocuments(token, {d: (s.version, s.document) for d, s in current.items()})


def _build_snapshot(live: _LiveDocuments, *, max_log_limit: int) -> Snapshot:
    """Validate every document again (the database is not trusted to hold only what this
    version of Sluice accepts) and compile them; ConfigError if any is invalid."""
    policies = load_sources(
        ((f"database:{d}@v{v}", doc) for d, (v, doc) in sorted(live.documents.items())),
        max_log_limit=max_log_limit,
    )
    return Snapshot(policies, version=live.version)


def _write_cache(path: Path, live: _LiveDocuments) -> None:
    """Replace the cache file atomically: a crash mid-write leaves the previous one intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"token": live.token, "documents": {d: list(v) for d, v in live.documents.items()}}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_cache(path: Path) -> _LiveDocuments | None:
    """The cached documents, or None when there is no usable cache file."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        documents = {str(d): (int(v), str(doc)) for d, (v, doc) in body["documents"].items()}
        return _LiveDocuments(int(body["token"]), documents)
    except (OSError, ValueError, KeyError, TypeError):
        return None
