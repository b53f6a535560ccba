"""Redis key names for algorithm state.

One key per limit of a counter: ``PREFIX{TAG}:ALGORITHM:PERIOD``. Every key of one counter
shares the ``{TAG}`` hash tag, so Redis Cluster puts them in one slot and a single script
call can decide a hit with several limits.

The tag is the counter key's parts percent-encoded (only ``A-Z a-z 0-9 _ . - ~`` stay as
they are) and joined by ``:``; since ``:``, ``{``, ``}`` and ``#`` are always encoded, two
different counters never share a tag, and a part can never end the hash tag early. A tag
longer than ``MAX_TAG_BYTES`` becomes ``#`` + its SHA-1, which bounds key length whatever
the request carries.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from urllib.parse import quote, unquote

from sluice.algorithms import Limit

__all__ = ["MAX_TAG_BYTES", "TAG_CACHE_ENTRIES", "KeyNamer", "counter_of_tag", "counter_tag"]

MAX_TAG_BYTES = 128


# Tags of short counters are cached: the same counters come back request after request.
# Bounded in entries *and* in size: only counters whose parts total at most MAX_TAG_BYTES are
# cached, so a flood of distinct, maximum-length descriptors (up to 16 entries of 1 KiB)
# cannot turn the cache into gigabytes; those are hashed every time.
TAG_CACHE_ENTRIES = 16384


def counter_tag(counter_key: tuple[str, ...]) -> str:
    """The hash tag of a counter."""
    if sum(map(len, counter_key)) > MAX_TAG_BYTES:
        return _tag(counter_key)
    return _cached_tag(counter_key)


def _tag(counter_key: tuple[str, ...]) -> str:
    tag = ":".join(quote(part, safe="", errors="surrogatepass") for part in counter_key)
    if not tag:
        # Redis ignores an empty "{}" and hashes the whole key, which would split the counter
        # across slots; quote() never makes a lone "%", so this names only the empty key.
        return "%"
    if len(tag) > MAX_TAG_BYTES:
        return "#" + hashlib.sha1(tag.encode("ascii")).hexdigest()
    return tag


_cached_tag = lru_cache(maxsize=TAG_CACHE_ENTRIES)(_tag)


def counter_of_tag(tag: str) -> tuple[str, ...] | None:
    """The counter a tag names (``counter_tag``'s inverse), for reading keys back; None for
    a hashed tag, which names its counter without saying what it is."""
    if tag.startswith("#"):
        return None
    if tag == "%":
        return ()
    return tuple(unquote(part, errors="surrogatepass") for part in tag.split(":"))


class KeyNamer:
    def __init__(self, prefix: str) -> None:
        # A brace in the prefix would make Redis take the hash tag from the prefix, putting
        # every counter in one slot (or splitting one counter's keys across slots).
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"the Redis key prefix may not contain '{{' or '}}': {prefix!r}")
        self.prefix = prefix

    def base(self, counter_key: tuple[str, ...]) -> str:
        """The part every state key of the counter starts with (it carries the hash tag)."""
        return f"{self.prefix}{{{counter_tag(counter_key)}}}:"

    def keys(self, counter_key: tuple[str, ...], limits: tuple[Limit, ...]) -> list[str]:
        """The state key of each limit; the memory backend names state by the same parts."""
        base = self.base(counter_key)
        return [f"{base}{limit.algorithm.name}:{limit.period_s}" for limit in limits]
