"""The servers' runtime state for the Leases and RLQS pages: the leases held and the RLQS
buckets live in the servers (or their Redis), not in the config database, so each server of
``--admin-servers`` is asked over HTTP (``GET /api/v1/leases``, ``/api/v1/rlqs/buckets``,
docs/api.md) with the API token, all at once, each answer kept apart with its server.

Then, pure: the answers as table rows. Leases in Redis are every server's, so servers on the
same store (the answer names it) are shown once; memory leases and RLQS streams are each
server's own.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LEASES",
    "RLQS_BUCKETS",
    "Answer",
    "ask",
    "assignment_text",
    "bucket_rows",
    "by_store",
    "lease_rows",
    "parse_servers",
    "plural",
]

LEASES = "/api/v1/leases"
RLQS_BUCKETS = "/api/v1/rlqs/buckets"
TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Answer:
    """One server's answer: its JSON ``body``, or ``error`` saying why there is none."""

    server: str
    body: dict[str, Any] | None = None
    error: str = ""


def parse_servers(text: str) -> list[str]:
    """``--admin-servers``: base URLs, comma-separated; ValueError naming a bad one."""
    servers = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        parts = urllib.parse.urlsplit(entry)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"'{entry}' is not an http:// or https:// URL")
        servers.append(entry.rstrip("/"))
    return servers


def ask(
    servers: Sequence[str], path: str, *, token: str, domain: str, limit: int = 100
) -> list[Answer]:
    """Every server's answer to ``path`` for ``domain``, in the order of ``servers``."""
    if not servers:
        return []
    query = urllib.parse.urlencode({"domain": domain, "limit": limit})
    with ThreadPoolExecutor(max_workers=min(8, len(servers))) as pool:
        return list(pool.map(lambda server: _get(server, f"{path}?{query}", token), servers))


def _get(server: str, path: str, token: str) -> Answer:
    request = urllib.request.Request(server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return Answer(server, json.load(response))
    except urllib.error.HTTPError as exc:
        try:
            reason = json.load(exc).get("error", "")
        except (ValueError, AttributeError, OSError):
            reason = ""
        return Answer(server, error=f"HTTP {exc.code}" + (f": {reason}" if reason else ""))
    except urllib.error.URLError as exc:
        return Answer(server, error=f"unreachable: {exc.reason}")
    except OSError as exc:  # a timeout or a reset while reading
        return Answer(server, error=f"unreachable: {exc}")
    except ValueError as exc:
        return Answer(server, error=f"not a Sluice answer (no JSON): {exc}")


def by_store(answers: Sequence[Answer]) -> list[tuple[list[str], Answer]]:
    """Lease answers, one per store: the servers sharing a Redis store answer alike, so the
    first answer stands for them all (with every server's name); a memory store is its
    server's own; a failed answer is its own too."""
    groups: dict[str, tuple[list[str], Answer]] = {}
    for answer in answers:
        body = answer.body
        shared = body is not None and body.get("shared")
        key = f"store {body['store']}" if shared and body is not None else answer.server
        if key in groups:
            groups[key][0].append(answer.server)
        else:
            groups[key] = ([answer.server], answer)
    return list(groups.values())


def plural(count: int, word: str) -> str:
    """``1 lease``, ``2 leases``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _descriptor(entries: list[list[str]]) -> str:
    return ", ".join(f"{key}={value}" for key, value in entries)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


def lease_rows(body: dict[str, Any]) -> list[dict[str, object]]:
    """A leases answer as rows: the descriptor, its rule, held of how many, expiries."""
    rows: list[dict[str, object]] = []
    for row in body["rows"]:
        limit = row["max_leases"]
        rows.append(
            {
                "descriptor": _descriptor(row["entries"]) or row["stored_as"],
                "rule": row["rule"] or "(no concurrency rule now)",
                "held": row["held"],
                "of": "" if limit is None else str(limit),
                "next expires in": _seconds(row["next_expiry_s"]),
                "last expires in": _seconds(row["last_expiry_s"]),
            }
        )
    return rows


def assignment_text(assignment: dict[str, Any] | None) -> str:
    """What the data plane was last sent for a bucket, in words."""
    if assignment is None:
        return "none sent yet"
    strategy = assignment["strategy"]
    bucket = assignment.get("token_bucket")
    if bucket is None:
        return strategy.replace("_", " ")
    every = bucket["fill_interval_s"]
    period = "second" if every == 1 else f"{every} seconds"
    return (
        f"token bucket: {bucket['tokens_per_fill']} every {period}, at most {bucket['max_tokens']}"
    )


def bucket_rows(body: dict[str, Any]) -> list[dict[str, object]]:
    """An RLQS answer as rows: the bucket, its rule, its assignment and what it is based on."""
    rows: list[dict[str, object]] = []
    for row in body["rows"]:
        rate = row["rate_per_s"]
        share = row["share"]
        rows.append(
            {
                "stream": row["stream"],
                "bucket": ", ".join(f"{k}={v}" for k, v in sorted(row["bucket"].items())),
                "rule": row["rule"] or "(no rule: allowed)",
                "assignment": assignment_text(row["assignment"]),
                "expires in": _seconds(row["expires_in_s"]),
                "limit": f"{rate:g} / s, burst {row['burst']}" if rate else "",
                "share": "" if share is None else f"{share:.0%}",
                "demand": f"{row['demand_per_s']:g} / s",
                "last report": f"{row['reported_s_ago']:.1f} s ago",
            }
        )
    return rows
