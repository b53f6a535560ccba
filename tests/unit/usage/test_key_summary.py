"""A second's per-key hits summarised: the heaviest keys by name, the rest in bins, totals
exact."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.usage.key_summary import KeySummary, bin_of, bin_upper, summarize


def test_bins_are_exact_up_to_eight_then_two_per_doubling() -> None:
    assert [bin_of(n) for n in (1, 7, 8, 11, 12, 15, 16, 23, 24, 31, 32, 47, 48)] == [
        1, 7, 8, 8, 12, 12, 16, 16, 24, 24, 32, 32, 48,
    ]  # fmt: skip
    assert [bin_upper(f) for f in (1, 7, 8, 12, 16, 24, 32, 48)] == [1, 7, 11, 15, 23, 31, 47, 63]


@given(st.integers(min_value=1, max_value=2**40))
def test_every_count_lies_in_its_bin(hits: int) -> None:
    floor = bin_of(hits)
    assert floor <= hits <= bin_upper(floor)
    assert bin_of(bin_upper(floor)) == floor and bin_of(bin_upper(floor) + 1) != floor


def test_the_heaviest_keys_by_name_the_rest_counted_in_bins() -> None:
    counts = {("d", "user", f"u{i}"): hits for i, hits in enumerate([50, 9, 30, 1, 1, 10, 2])}
    summary = summarize(counts, top=2)
    assert summary.top == {"user,u0": 50, "user,u2": 30}
    assert summary.bins == {8: [2, 19], 2: [1, 2], 1: [2, 2]}


def test_few_keys_are_all_kept_and_later_drains_add_up() -> None:
    summary = summarize({("d", "user", "a"): 3}, top=5)
    assert summary == KeySummary({"user,a": 3}, {})
    summary.add(summarize({("d", "user", "a"): 2, ("d", "user", "b"): 1}, top=1))
    assert summary == KeySummary({"user,a": 5}, {1: [1, 1]})


@given(
    st.dictionaries(st.text(max_size=3), st.integers(min_value=1, max_value=10**6), max_size=60),
    st.integers(min_value=1, max_value=20),
)
def test_the_summary_accounts_for_every_hit_and_key(counts: dict[str, int], top: int) -> None:
    summary = summarize({("d", "k", key): n for key, n in counts.items()}, top=top)
    assert len(summary.top) == min(top, len(counts))
    assert sum(summary.top.values()) + sum(h for _, h in summary.bins.values()) == sum(
        counts.values()
    )
    assert len(summary.top) + sum(k for k, _ in summary.bins.values()) == len(counts)
    # Nothing binned outweighs what was kept by name.
    smallest_kept = min(summary.top.values(), default=0)
    assert all(floor <= smallest_kept for floor in summary.bins)
