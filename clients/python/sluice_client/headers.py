"""HTTP response headers for a decision: RateLimit-Policy and RateLimit
(draft-ietf-httpapi-ratelimit-headers) and Retry-After, as Sluice writes them.

Sluice's own headers (``--response-headers``) are used when present; otherwise the same are
derived from the statuses, so the middleware answers alike with either server setting.
"""

from __future__ import annotations

import math

from sluice_client.types import Decision

__all__ = ["rate_limit_headers", "retry_after"]

_OURS = frozenset({"ratelimit-policy", "ratelimit", "retry-after"})


def rate_limit_headers(decision: Decision) -> tuple[tuple[str, str], ...]:
    """``(name, value)`` pairs for the limit closest to exhaustion (plus Retry-After when
    refused); empty when no limit applied or the decision is degraded."""
    if any(name.lower() in _OURS for name, _ in decision.headers):
        return decision.headers
    limited = [s for s in decision.statuses if s.limit is not None]
    if not limited:
        return ()
    closest = min(limited, key=lambda s: s.remaining)
    limit = closest.limit
    assert limit is not None  # filtered above
    name = _sf_string(limit.name or "default")
    headers = [
        ("RateLimit-Policy", f"{name};q={limit.requests_per_unit};w={limit.window_s}"),
        ("RateLimit", f"{name};r={closest.remaining};t={_whole_seconds(closest.reset_s)}"),
    ]
    wait = retry_after(decision)
    if wait is not None:
        headers.append(("Retry-After", wait))
    return tuple(headers)


def retry_after(decision: Decision) -> str | None:
    """Retry-After's value (whole seconds, rounded up: a client is never early), or None."""
    if decision.allowed:
        return None
    header = next((v for k, v in decision.headers if k.lower() == "retry-after"), None)
    if header is not None:
        return header
    wait = decision.retry_after_s
    return None if wait is None else str(_whole_seconds(wait))


def _whole_seconds(seconds: float) -> int:
    return math.ceil(seconds)


def _sf_string(text: str) -> str:
    """An RFC 8941 sf-string; characters it cannot carry are replaced, never passed through."""
    safe = "".join(c if " " <= c <= "~" else "?" for c in text)
    return '"' + safe.replace("\\", "\\\\").replace('"', '\\"') + '"'
