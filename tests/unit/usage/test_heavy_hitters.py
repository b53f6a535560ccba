from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.usage.heavy_hitters import SpaceSaving


def test_keeps_the_heaviest_keys_within_capacity() -> None:
    sketch = SpaceSaving(5)
    stream = ["a"] * 50 + ["b"] * 30 + [f"noise{i}" for i in range(40)] + ["c"] * 20
    random.Random(7).shuffle(stream)
    for key in stream:
        sketch.add(key)
    assert len(sketch) == 5
    # Keys above len(stream) / capacity = 28 are guaranteed to be kept.
    assert {"a", "b"} <= {k for k, _ in sketch.top()}
    assert sketch.top(1)[0][1] >= 50


@given(st.lists(st.sampled_from("abcdefghij"), max_size=300), st.integers(1, 5))
def test_never_under_reports_and_guarantees_frequent_keys(stream: list[str], capacity: int) -> None:
    sketch = SpaceSaving(capacity)
    for key in stream:
        sketch.add(key)
    reported = dict(sketch.top())
    for key in set(stream):
        true = stream.count(key)
        if true > len(stream) / capacity:
            assert key in reported
        if key in reported:
            assert reported[key] >= true


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        SpaceSaving(0)
