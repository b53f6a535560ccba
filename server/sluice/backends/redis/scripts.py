"""The Lua script that applies hits in Redis, and its Python calling convention.

The registered script is ``lua/prelude.lua``, one file per algorithm (in
``sluice.algorithms.ALGORITHMS`` order) and ``lua/apply.lua``, concatenated: the algorithm
files only read state and hand back a commit, the driver decides which commits run. Every
formula mirrors the Python step functions, so Redis and the memory backend decide alike.

Calling convention (one call = one atomic decision for a batch of hits):

* KEYS: the state key of every limit of every hit, in order (hit by hit, limit by limit).
  The caller names them; on Redis Cluster they must all share one hash slot.
* ARGV: ``now`` (seconds, ``repr`` of a float) or ``""`` to use Redis's clock; then per hit
  ``cost, k`` and ``k`` times ``algorithm, requests_per_unit, period_s, burst``.
* Reply: five values per limit, in KEYS order: allowed, remaining, reset_s, delay_s, fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluice.algorithms import ALGORITHMS, Outcome
from sluice.backends import Hit

__all__ = ["SCRIPT_SOURCE", "ApplyScript", "decode_result", "encode_args", "key_count"]

_LUA_DIR = Path(__file__).with_name("lua")
_PARTS = ("prelude", *ALGORITHMS, "apply")
_FIELDS = 5  # per limit in the reply

SCRIPT_SOURCE: str = "\n".join(
    f"-- {name}.lua\n" + (_LUA_DIR / f"{name}.lua").read_text(encoding="utf-8") for name in _PARTS
)


def key_count(hits: Sequence[Hit]) -> int:
    """How many KEYS a call for ``hits`` takes: one per limit of each hit."""
    return sum(len(hit.limits) for hit in hits)


def encode_args(hits: Sequence[Hit], now: float | None) -> list[str]:
    """ARGV for ``hits``; ``now=None`` lets the script read Redis's clock."""
    # repr is the shortest string that parses back to the same double, in Lua too.
    args = ["" if now is None else repr(float(now))]
    for hit in hits:
        args += [str(int(hit.cost)), str(len(hit.limits))]
        for limit in hit.limits:
            args += [
                limit.algorithm.name,
                str(int(limit.requests_per_unit)),
                str(int(limit.period_s)),
                str(int(limit.burst)),
            ]
    return args


def decode_result(raw: Sequence[Any], hits: Sequence[Hit]) -> list[tuple[Outcome, ...]]:
    """The script's flat reply as one tuple of outcomes per hit, one outcome per limit."""
    if len(raw) != _FIELDS * key_count(hits):
        raise ValueError(f"expected {_FIELDS * key_count(hits)} values, got {len(raw)}")
    outcomes = []
    i = 0
    for hit in hits:
        per_hit = []
        for _ in hit.limits:
            allowed, remaining, reset_s, delay_s, fits = raw[i : i + _FIELDS]
            per_hit.append(
                Outcome(
                    allowed=int(allowed) == 1,
                    remaining=int(remaining),
                    reset_s=float(reset_s),
                    delay_s=float(delay_s),
                    fits=int(fits) == 1,
                )
            )
            i += _FIELDS
        outcomes.append(tuple(per_hit))
    return outcomes


class ApplyScript:
    """The script registered with a ``redis.asyncio`` client (EVALSHA, NOSCRIPT fallback)."""

    def __init__(self, client: Any) -> None:
        self._script = client.register_script(SCRIPT_SOURCE)

    async def __call__(
        self, keys: Sequence[str], hits: Sequence[Hit], now: float | None = None
    ) -> list[tuple[Outcome, ...]]:
        """Apply ``hits`` atomically."""
        if len(keys) != key_count(hits):
            raise ValueError(f"{len(keys)} keys for {key_count(hits)} limits")
        raw = await self._script(keys=list(keys), args=encode_args(hits, now))
        return decode_result(raw, hits)
