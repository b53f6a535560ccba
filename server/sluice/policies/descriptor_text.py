"""Descriptors and times as operators type them: ``KEY=VALUE[,KEY=VALUE…]``, ``30s``/``7d``
or an ISO 8601 time.

The same text is used on the command line, in the write API and in the YAML document, so
what ``sluice blocks`` prints can be pasted back into ``sluice unblock``. Every error is a
ValueError whose message starts with the field it is about.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

__all__ = [
    "format_duration",
    "format_entries",
    "format_time",
    "parse_duration",
    "parse_entries",
    "parse_expiry",
    "parse_time",
]

# At most 12 digits: more than any sensible duration, and far inside what a float holds.
_DURATION = re.compile(r"\s*(\d{1,12})\s*([smhdw])\s*")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# A length of time, milliseconds included (a lease's TTL may be under a second).
_SPAN = re.compile(r"\s*(\d{1,12})\s*(ms|[smhdw])\s*")


def parse_entries(text: str, field: str = "descriptor") -> tuple[tuple[str, str], ...]:
    """``tenant=acme,plan=pro`` as ordered entries; a value may hold ``=`` but not ``,``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{field}: must be KEY=VALUE[,KEY=VALUE…], not empty")
    entries = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(
                f"{field}: '{part.strip()}' is not KEY=VALUE (in '{text}'; entries are "
                f"separated by ',')"
            )
        entries.append((key, value))
    return tuple(entries)


def format_entries(entries: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{key}={value}" for key, value in entries)


def parse_time(text: str, field: str) -> float:
    """An ISO 8601 time with a zone (``2026-12-04T18:00:00Z``) as whole Unix seconds, rounded
    up (so an expiry is never early, and what is written back reads back the same)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except (ValueError, AttributeError):
        raise ValueError(
            f"{field}: '{text}' is not an ISO 8601 time such as 2026-12-04T18:00:00Z"
        ) from None
    if when.tzinfo is None:
        raise ValueError(f"{field}: '{text}' has no time zone (add Z for UTC)")
    return float(math.ceil(when.timestamp()))


def format_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_expiry(text: str, now_s: float, field: str = "expires_in") -> float:
    """When something given ``text`` from now expires, in whole Unix seconds (rounded up, so
    it is never early): a duration (``30s``, ``10m``, ``2h``, ``7d``, ``1w``) or an absolute
    time; refused when that is not in the future."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        expires = now_s + int(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        if not isinstance(text, str) or not re.match(r"\s*\d{4}-", text):
            raise ValueError(
                f"{field}: '{text}' is neither a duration (30s, 10m, 2h, 7d, 1w) nor an "
                f"ISO 8601 time"
            )
        expires = parse_time(text, field)
    if expires <= now_s:
        raise ValueError(f"{field}: '{text}' is not in the future (now is {format_time(now_s)})")
    return float(math.ceil(expires))


def parse_duration(text: object, field: str) -> float:
    """A length of time (``500ms``, ``30s``, ``10m``, ``2h``, ``7d``, ``1w``) in seconds."""
    match = _SPAN.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"{field}: '{text}' is not a duration such as 500ms, 30s, 10m, 2h, 7d or 1w"
        )
    count, unit = int(match.group(1)), match.group(2)
    return count / 1000 if unit == "ms" else float(count * _UNIT_S[unit])


def format_duration(seconds: float) -> str:
    """What ``parse_duration`` reads back as ``seconds`` (whole milliseconds)."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"
