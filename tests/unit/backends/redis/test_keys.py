"""State key names: one hash tag per counter, never shared, bounded in length."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from sluice.algorithms import ALGORITHMS, Limit
from sluice.backends.redis.keys import (
    MAX_TAG_BYTES,
    TAG_CACHE_ENTRIES,
    KeyNamer,
    _cached_tag,
    counter_of_tag,
    counter_tag,
)

counter_keys = st.lists(st.text(max_size=20), min_size=1, max_size=4).map(tuple)


def test_the_layout() -> None:
    names = KeyNamer("sluice:")
    keys = names.keys(
        ("edge", "remote_address", "10.0.0.1"),
        (Limit(5, 60, ALGORITHMS["fixed_window"]), Limit(9, 1, ALGORITHMS["gcra"])),
    )
    assert keys == [
        "sluice:{edge:remote_address:10.0.0.1}:fixed_window:60",
        "sluice:{edge:remote_address:10.0.0.1}:gcra:1",
    ]


@given(counter_keys, counter_keys)
def test_different_counters_never_share_a_tag(a: tuple[str, ...], b: tuple[str, ...]) -> None:
    if a != b:
        assert counter_tag(a) != counter_tag(b)


@given(counter_keys)
def test_every_key_of_a_counter_is_in_one_slot(counter_key: tuple[str, ...]) -> None:
    keys = KeyNamer("p:").keys(
        counter_key,
        (Limit(1, 1, ALGORITHMS["fixed_window"]), Limit(1, 60, ALGORITHMS["token_bucket"])),
    )
    tag = counter_tag(counter_key)
    assert "{" not in tag and "}" not in tag
    assert len({key_slot(key.encode()) for key in keys}) == 1
    assert len({key_slot(key.encode()) for key in keys} | {key_slot(tag.encode())}) == 1


def test_long_tags_are_hashed() -> None:
    tag = counter_tag(("d", "v" * 1000))
    assert tag.startswith("#") and len(tag) == 41
    assert len(counter_tag(("d", "v" * (MAX_TAG_BYTES - 2)))) == MAX_TAG_BYTES


@given(counter_keys)
def test_a_tag_names_its_counter_back_unless_hashed(counter_key: tuple[str, ...]) -> None:
    tag = counter_tag(counter_key)
    if tag.startswith("#"):
        assert counter_of_tag(tag) is None
    elif counter_key != ("",):  # the empty counter's "%" reads back as no parts at all
        assert counter_of_tag(tag) == counter_key


def test_a_prefix_with_braces_is_refused() -> None:
    with pytest.raises(ValueError, match="may not contain"):
        KeyNamer("a{b}:")


def test_the_tag_cache_is_bounded_in_entries_and_in_size() -> None:
    # A flood of distinct maximum-length counters must not fill the cache with kilobytes
    # each: long counters are hashed every time, short ones cached up to a fixed count.
    before = _cached_tag.cache_info().currsize
    for n in range(100):
        long_key = ("domain", "user", f"{n}-" + "x" * 1024)
        assert counter_tag(long_key).startswith("#")
    assert _cached_tag.cache_info().currsize == before
    assert _cached_tag.cache_info().maxsize == TAG_CACHE_ENTRIES
    short_key = ("domain", "user", "a-fresh-short-value")
    assert counter_tag(short_key) == counter_tag(short_key) == "domain:user:a-fresh-short-value"
    assert _cached_tag.cache_info().currsize <= before + 1
