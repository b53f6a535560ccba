"""From the config database to what a server serves: validated policies and the snapshot,
and the local cache a server starts from when the database is down."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sluice.policies.snapshot import Snapshot
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import DEFAULT_MAX_LOG_LIMIT, load_sources

__all__ = [
    "LiveDocuments",
    "build_snapshot",
    "read_cache",
    "read_live",
    "write_cache",
]


@dataclass(frozen=True)
class LiveDocuments:
    """The live document of every domain, as of change token ``token``."""

    token: int
    documents: dict[str, tuple[int, str]]  # domain -> (version, YAML document)

    @property
    def version(self) -> str:
        """A readable identity of this set of versions, e.g. ``edge@v3,internal@v1``."""
        return ",".join(f"{d}@v{v}" for d, (v, _) in sorted(self.documents.items()))


def read_live(store: PolicyStore) -> LiveDocuments:
    # The token is read first: a publish racing this read makes the next poll load again,
    # never skip a change.
    token = store.change_token()
    current = store.current()
    return LiveDocuments(token, {d: (s.version, s.document) for d, s in current.items()})


def build_snapshot(live: LiveDocuments, *, max_log_limit: int = DEFAULT_MAX_LOG_LIMIT) -> Snapshot:
    """Validate every document again (the database is not trusted to hold only what this
    version of Sluice accepts) and compile them; ConfigError if any is invalid."""
    policies = load_sources(
        ((f"database:{d}@v{v}", doc) for d, (v, doc) in sorted(live.documents.items())),
        max_log_limit=max_log_limit,
    )
    return Snapshot(policies, version=live.version)


def write_cache(path: Path, live: LiveDocuments) -> None:
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


def read_cache(path: Path) -> LiveDocuments | None:
    """The cached documents, or None when there is no usable cache file."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        documents = {str(d): (int(v), str(doc)) for d, (v, doc) in body["documents"].items()}
        return LiveDocuments(int(body["token"]), documents)
    except (OSError, ValueError, KeyError, TypeError):
        return None
