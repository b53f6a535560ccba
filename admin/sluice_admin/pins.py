"""Overrides, blocks, allows and resets as the pages show and take them: pure functions.

The pins themselves are the server's (:class:`sluice.model.Pin`, written through
``PolicyService.put_pin`` as ``sluice override/block/allow`` do); this module only turns them
into rows with a countdown to their expiry, and an offending key of the Live usage page back
into the descriptor a reset takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.algorithms import ALGORITHMS, DEFAULT_ALGORITHM
from sluice.model import Pin, RateLimit, Unit
from sluice.policies.descriptor_text import format_entries, format_time

__all__ = [
    "KINDS",
    "UNITS",
    "PinRow",
    "countdown",
    "limit_text",
    "offender_descriptor",
    "offender_entries",
    "override_limit",
    "rows",
]

# The kinds in PIN_KINDS, as the page's tabs name them.
KINDS = {"overrides": "Overrides", "blocks": "Blocks", "allows": "Allow-list"}
UNITS = [u.name.lower() for u in Unit if u is not Unit.UNKNOWN]


@dataclass(frozen=True)
class PinRow:
    descriptor: str  # KEY=VALUE,… as the form and the CLI take it
    limit: str  # overrides only; "" for blocks and allows
    expires: str  # the UTC time, or "never"
    remaining: str  # the countdown

    @property
    def line(self) -> str:
        """The row as one line of plain text (descriptors are user-written)."""
        parts = [self.descriptor, *([self.limit] if self.limit else [])]
        if self.expires == "never":
            parts.append("no expiry")
        elif self.remaining == "expired":
            parts.append(f"expired at {self.expires} (pruned at the next pin change)")
        else:
            parts.append(f"expires in {self.remaining} ({self.expires})")
        return " · ".join(parts)


def rows(pins: list[Pin], kind: str, now_s: float) -> list[PinRow]:
    """The domain's pins of ``kind``, soonest expiry first, the ones that never expire last."""
    chosen = sorted(
        (p for p in pins if p.kind == kind),
        key=lambda p: (p.expires_at_s is None, p.expires_at_s or 0.0, p.entries),
    )
    return [
        PinRow(
            format_entries(p.entries),
            limit_text(p.rate_limit) if p.rate_limit is not None else "",
            format_time(p.expires_at_s) if p.expires_at_s is not None else "never",
            countdown(p.expires_at_s, now_s),
        )
        for p in chosen
    ]


def countdown(expires_at_s: float | None, now_s: float) -> str:
    """How long until a pin expires: "4 m 05 s", "2 h 10 m", "3 d 4 h"; "expired" once its
    time has come (the server stops applying it then, on its own clock)."""
    if expires_at_s is None:
        return "no expiry"
    left = math.ceil(expires_at_s - now_s)  # whole seconds, never shown early
    if left <= 0:
        return "expired"
    days, rest = divmod(left, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes:02d} m"
    if minutes:
        return f"{minutes} m {seconds:02d} s"
    return f"{seconds} s"


def limit_text(limit: RateLimit) -> str:
    text = f"{limit.requests_per_unit} / {limit.unit.name.lower()} ({limit.algorithm}"
    return text + (f", burst {limit.burst})" if limit.burst is not None else ")")


def override_limit(
    requests_per_unit: int, unit: str, algorithm: str, burst: int | None
) -> dict[str, object]:
    """The ``rate_limit`` mapping of an override, as ``sluice override set`` builds it."""
    limit: dict[str, object] = {"requests_per_unit": requests_per_unit, "unit": unit}
    if ALGORITHMS.get(algorithm) is not DEFAULT_ALGORITHM:
        limit["algorithm"] = algorithm
    if burst is not None:
        limit["burst"] = burst
    return limit


def offender_entries(key: str) -> tuple[tuple[str, str], ...] | None:
    """An over-limit key as recorded (the counter's ``key,value,…`` after the domain, with a
    ``#reset:N`` or ``#override`` part when the counter has one) as its entries; None when it
    cannot be read back (a value holding a comma)."""
    parts = key.split(",")
    while parts and parts[-1].startswith("#"):
        parts.pop()
    if not parts or len(parts) % 2:
        return None
    return tuple(zip(parts[::2], parts[1::2], strict=True))


def offender_descriptor(key: str) -> str | None:
    """The descriptor (``KEY=VALUE,…``) that resets an offending key's counters."""
    entries = offender_entries(key)
    return format_entries(entries) if entries is not None else None
