"""The Lua script that applies hits in Redis, and its Python calling convention.

The registered script is ``lua/prelude.lua``, one file per algorithm (in
``sluice.algorithms.ALGORITHMS`` order) and ``lua/apply.lua``, concatenated: the algorithm
files only read state and hand back a commit, the driver decides which commits run. Every
formula mirrors the Python step functions, so Redis and the memory backend decide alike.

Calling convention (one call = one atomic decision for a batch of hits):

* KEYS: the state key of every limit of every hit, in order (hit by hit, limit by limit).
  The caller names them; on Redis Cluster they must all share one hash slot.
* ARGV: ``now`` (seconds, ``repr`` of a float) or ``""`` to use Redis's clock; then per hit
  ``cost, k`` and ``k`` times ``algorithm, requests_per_unit, period_s, burst``
  (``encode_args``); or, the compact form both callers send, ``"#", m``, the ``m`` distinct
  limits' four values, then per hit ``cost, k`` and ``k`` indexes into them
  (``encode_compact_args``, ``encode_command``).
* A calendar limit's ``period_s`` is replaced by its calendar boundaries around ``at`` (the
  caller's clock; ``now`` by default), comma-separated (``Calendar.argument``).
* Reply: six values per limit, in KEYS order: allowed, remaining, reset_s, delay_s, fits,
  below_limit.

Two ways to call it: ``ApplyScript`` through redis-py (Cluster, and anything the lean path
cannot serve), ``LeanApplyScript`` through ``wire.ScriptConnection`` (standalone and
Sentinel), whose RESP bytes ``encode_command`` builds from chunks computed once per limit
and per cost: the same arguments, byte for byte, as ``encode_args``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from sluice.algorithms import ALGORITHMS, Limit, Outcome
from sluice.backends import Hit
from sluice.backends.redis.wire import ScriptConnection, bulk

__all__ = [
    "SCRIPT_SOURCE",
    "ApplyScript",
    "LeanApplyScript",
    "decode_result",
    "encode_args",
    "encode_compact_args",
    "encode_command",
    "key_count",
]

_LUA_DIR = Path(__file__).with_name("lua")
_PARTS = ("prelude", *ALGORITHMS, "apply")
_FIELDS = 6  # per limit in the reply

SCRIPT_SOURCE: str = "\n".join(
    f"-- {name}.lua\n" + (_LUA_DIR / f"{name}.lua").read_text(encoding="utf-8") for name in _PARTS
)


def key_count(hits: Sequence[Hit]) -> int:
    """How many KEYS a call for ``hits`` takes: one per limit of each hit."""
    return sum(len(hit.limits) for hit in hits)


def _period(limit: Limit, at: float | None) -> str:
    """The limit's period argument: its period, or its calendar boundaries around ``at``."""
    calendar = limit.calendar
    if calendar is None:
        return str(int(limit.period_s))
    if at is None:
        raise ValueError("a calendar limit needs the caller's time (at=) to lay out windows")
    return calendar.argument(at)


def encode_args(hits: Sequence[Hit], now: float | None, *, at: float | None = None) -> list[str]:
    """ARGV for ``hits``; ``now=None`` lets the script read Redis's clock."""
    at = now if at is None else at
    # repr is the shortest string that parses back to the same double, in Lua too.
    args = ["" if now is None else repr(float(now))]
    for hit in hits:
        args += [str(int(hit.cost)), str(len(hit.limits))]
        for limit in hit.limits:
            args += [
                limit.algorithm.name,
                str(int(limit.requests_per_unit)),
                _period(limit, at),
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
            allowed, remaining, reset_s, delay_s, fits, below = raw[i : i + _FIELDS]
            per_hit.append(
                Outcome(
                    allowed=int(allowed) == 1,
                    remaining=int(remaining),
                    reset_s=float(reset_s),
                    delay_s=float(delay_s),
                    fits=int(fits) == 1,
                    below_limit=int(below),
                )
            )
            i += _FIELDS
        outcomes.append(tuple(per_hit))
    return outcomes


@lru_cache(maxsize=4096)
def _limit_chunk(algorithm: str, requests_per_unit: int, period: str, burst: int) -> bytes:
    return b"".join(
        bulk(part.encode()) for part in (algorithm, str(requests_per_unit), period, str(burst))
    )


def _limit_args(limit: Limit, at: float | None) -> bytes:
    """A limit's four arguments in RESP (cached: limits come from a compiled snapshot, and
    calendar boundaries change once a window)."""
    return _limit_chunk(
        limit.algorithm.name, int(limit.requests_per_unit), _period(limit, at), int(limit.burst)
    )


@lru_cache(maxsize=1024)
def _hit_header(cost: int, limits: int) -> bytes:
    return bulk(str(cost).encode()) + bulk(str(limits).encode())


@lru_cache(maxsize=1024)
def _index(n: int) -> bytes:
    return bulk(str(n).encode())


def encode_command(
    keys: Sequence[str], hits: Sequence[Hit], now: float | None, *, at: float | None = None
) -> tuple[bytes, int]:
    """numkeys, KEYS and ARGV (the compact form) of the call for ``hits`` as RESP bulk
    strings, and how many there are: what ``wire.ScriptConnection.call`` sends after
    ``EVALSHA sha``."""
    at = now if at is None else at
    table: dict[bytes, bytes] = {}  # a limit's RESP arguments -> its index, in RESP
    hit_parts = []
    for hit in hits:
        limits = hit.limits
        hit_parts.append(_hit_header(int(hit.cost), len(limits)))
        for limit in limits:
            chunk = _limit_args(limit, at)
            index = table.get(chunk)
            if index is None:
                index = table[chunk] = _index(len(table) + 1)
            hit_parts.append(index)
    parts = [bulk(str(len(keys)).encode())]
    parts += [bulk(key.encode()) for key in keys]
    parts.append(b"$0\r\n\r\n" if now is None else bulk(repr(float(now)).encode()))
    parts += [b"$1\r\n#\r\n", _index(len(table)), *table]
    parts += hit_parts
    nargs = len(keys) + 4 + 4 * len(table) + 2 * len(hits) + len(keys)
    return b"".join(parts), nargs


def encode_compact_args(
    hits: Sequence[Hit], now: float | None, *, at: float | None = None
) -> list[str]:
    """ARGV for ``hits`` in the compact form (each distinct limit once): what
    ``encode_command`` sends, as strings for redis-py."""
    at = now if at is None else at
    table: dict[tuple[str, str, str, str], int] = {}
    per_hit: list[str] = []
    for hit in hits:
        per_hit += [str(int(hit.cost)), str(len(hit.limits))]
        for limit in hit.limits:
            spec = (
                limit.algorithm.name,
                str(int(limit.requests_per_unit)),
                _period(limit, at),
                str(int(limit.burst)),
            )
            per_hit.append(str(table.setdefault(spec, len(table) + 1)))
    args = ["" if now is None else repr(float(now)), "#", str(len(table))]
    for spec in table:
        args += spec
    return args + per_hit


class LeanApplyScript:
    """The script over a ``wire.ScriptConnection``: what ``ApplyScript`` does, without
    redis-py on the way."""

    def __init__(self, connection: ScriptConnection) -> None:
        self.connection = connection

    async def __call__(
        self,
        keys: Sequence[str],
        hits: Sequence[Hit],
        now: float | None = None,
        *,
        at: float | None = None,
    ) -> list[tuple[Outcome, ...]]:
        """Apply ``hits`` atomically (``at``: the caller's time, for calendar windows)."""
        if len(keys) != key_count(hits):
            raise ValueError(f"{len(keys)} keys for {key_count(hits)} limits")
        payload, nargs = encode_command(keys, hits, now, at=at)
        raw = await self.connection.call(payload, nargs)
        return decode_result(raw, hits)


class ApplyScript:
    """The script registered with a ``redis.asyncio`` client (EVALSHA, NOSCRIPT fallback)."""

    def __init__(self, client: Any) -> None:
        self._script = client.register_script(SCRIPT_SOURCE)

    async def __call__(
        self,
        keys: Sequence[str],
        hits: Sequence[Hit],
        now: float | None = None,
        *,
        at: float | None = None,
    ) -> list[tuple[Outcome, ...]]:
        """Apply ``hits`` atomically (``at``: the caller's time, for calendar windows)."""
        if len(keys) != key_count(hits):
            raise ValueError(f"{len(keys)} keys for {key_count(hits)} limits")
        raw = await self._script(keys=list(keys), args=encode_compact_args(hits, now, at=at))
        return decode_result(raw, hits)
