"""Runtime state for operators on the HTTP port, read-only, behind the API token (it names
the clients holding leases and the data planes' buckets): see docs/api.md.

- ``GET /api/v1/leases``: the concurrency leases held (sluice/leases/listing.py);
- ``GET /api/v1/rlqs/buckets``: the RLQS buckets of this instance's open streams with their
  current assignments (sluice/rlqs/listing.py).

Both take ``?domain=`` (one domain's only) and ``?limit=`` (rows, 1 to 1000, default 100),
and say how many were left out. Thin: the query in, a domain listing out as JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sluice.clock import Clock
from sluice.errors import InvalidRequestError
from sluice.http.api import bearer_guard
from sluice.leases.listing import HeldRow, list_leases
from sluice.leases.store import LeaseStore
from sluice.policies.snapshot import Snapshot
from sluice.rlqs.buckets import TOKEN_BUCKET
from sluice.rlqs.listing import BucketRow, list_buckets
from sluice.rlqs.service import STRATEGY_NAMES, QuotaService

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Runtime", "add_runtime_routes"]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


@dataclass(frozen=True)
class Runtime:
    """What the routes read. ``store_name``: where the leases live, as operators name it
    (``memory``: this process's own; a Redis URL, password hidden, and key prefix: shared by
    every instance on it)."""

    lease_store: LeaseStore
    store_name: str
    quota: QuotaService
    clock: Clock


def add_runtime_routes(
    app: web.Application, runtime: Runtime, snapshot: Callable[[], Snapshot], token: str
) -> None:
    guard = bearer_guard(token)

    async def leases(request: web.Request) -> web.Response:
        domain, limit = _query(request)
        listing = await list_leases(
            runtime.lease_store, snapshot(), now=runtime.clock.now(), domain=domain, limit=limit
        )
        body = {
            "store": runtime.store_name,
            "shared": runtime.store_name != "memory",
            "tables": listing.tables,
            "leases": listing.leases,
            "omitted": listing.omitted,
            "rows": [_lease_row(row) for row in listing.rows],
        }
        return _json(body)

    async def buckets(request: web.Request) -> web.Response:
        domain, limit = _query(request)
        listing = list_buckets(
            runtime.quota.open_streams(), now_s=runtime.clock.now(), domain=domain, limit=limit
        )
        body = {
            # A stream lives in one process: with --workers, the one that answered.
            "pid": os.getpid(),
            "streams": listing.streams,
            "buckets": listing.buckets,
            "omitted": listing.omitted,
            "rows": [_bucket_row(row) for row in listing.rows],
        }
        return _json(body)

    app.router.add_get("/api/v1/leases", guard(leases))
    app.router.add_get("/api/v1/rlqs/buckets", guard(buckets))


def _query(request: web.Request) -> tuple[str, int]:
    text = request.query.get("limit", str(DEFAULT_LIMIT))
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidRequestError(f"limit: '{text}' is not a whole number from 1 to {MAX_LIMIT}")
    return request.query.get("domain", ""), int(text)


def _lease_row(row: HeldRow) -> dict[str, Any]:
    return {
        "domain": row.domain,
        "entries": [list(entry) for entry in row.entries],
        "rule": row.rule_id,
        "held": row.held,
        "max_leases": row.max_leases,
        "next_expiry_s": round(row.next_expiry_s, 3),
        "last_expiry_s": round(row.last_expiry_s, 3),
        "stored_as": row.stored_as,
    }


def _bucket_row(row: BucketRow) -> dict[str, Any]:
    sent = row.assignment
    assignment: dict[str, Any] | None = None
    if sent is not None:
        assignment = {"strategy": STRATEGY_NAMES[sent.kind], "ttl_s": sent.ttl_s}
        if sent.kind == TOKEN_BUCKET and sent.token_bucket is not None:
            tb = sent.token_bucket
            assignment["token_bucket"] = {
                "max_tokens": tb.max_tokens,
                "tokens_per_fill": tb.tokens_per_fill,
                "fill_interval_s": tb.fill_interval_s,
            }
    expires = row.expires_in_s
    return {
        "stream": row.stream,
        "domain": row.domain,
        "bucket": dict(row.bucket),
        "rule": row.rule_id,
        "rate_per_s": row.rate_per_s,
        "burst": row.burst,
        "share": row.share,
        "assignment": assignment,
        "demand_per_s": round(row.demand_per_s, 3),
        "reported_s_ago": round(row.reported_s_ago, 3),
        "expires_in_s": round(expires, 3) if expires is not None else None,
    }


def _json(body: dict[str, Any]) -> web.Response:
    return web.Response(text=json.dumps(body), content_type="application/json")
