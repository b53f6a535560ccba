"""Wildcard values: the same answers as a regular expression, without its backtracking."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.policies.glob import Glob


def reference(pattern: str, value: str) -> bool:
    regex = ".*".join(re.escape(piece) for piece in pattern.split("*"))
    return re.fullmatch(regex, value, re.DOTALL) is not None


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("10.*", "10.0.0.1", True),
        ("10.*", "10.", True),
        ("10.*", "110.0.0.1", False),
        ("*.example.com", "api.example.com", True),
        ("*.example.com", ".example.com", True),
        ("*.example.com", "example.com", False),
        ("/api/*/items", "/api/v1/items", True),
        ("/api/*/items", "/api//items", True),
        ("/api/*/items", "/api/v1/items/x", False),
        ("a*a", "a", False),  # prefix and suffix may not share a character
        ("a*a", "aa", True),
        ("*ab*ab*", "abab", True),
        ("*ab*ab*", "aba", False),
        ("**", "", True),
        ("*", "anything\nat all", True),
        ("*a*a*a*a*b", "a" * 1024, False),
        ("*a*a*a*a*b", "a" * 1023 + "b", True),
    ],
)
def test_matches(pattern: str, value: str, expected: bool) -> None:
    assert Glob(pattern).matches(value) is expected


@given(
    pattern=st.text("ab*", max_size=10).filter(lambda p: "*" in p),
    value=st.text("ab", max_size=12),
)
def test_agrees_with_a_regular_expression(pattern: str, value: str) -> None:
    assert Glob(pattern).matches(value) is reference(pattern, value)


def test_a_value_without_a_star_is_not_a_pattern() -> None:
    with pytest.raises(ValueError, match="not a wildcard pattern: 'abc'"):
        Glob("abc")
