"""Descriptors and expiries as operators type them."""

from __future__ import annotations

import pytest

from sluice.policies.descriptor_text import (
    format_entries,
    format_time,
    parse_entries,
    parse_expiry,
    parse_time,
)

NOW = 1_800_000_000.5  # 2027-01-15T08:00:00.5Z


def test_entries_round_trip_in_order_and_values_may_hold_equals() -> None:
    entries = parse_entries(" tenant = acme ,key=abc==")
    assert entries == (("tenant", "acme"), ("key", "abc=="))
    assert parse_entries(format_entries(entries)) == entries


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "descriptor: must be KEY=VALUE[,KEY=VALUE…], not empty"),
        (
            "tenant",
            "descriptor: 'tenant' is not KEY=VALUE (in 'tenant'; entries are separated by ',')",
        ),
        ("tenant=", "descriptor: 'tenant=' is not KEY=VALUE"),
        ("=x", "descriptor: '=x' is not KEY=VALUE"),
        ("a=b,,c=d", "descriptor: '' is not KEY=VALUE"),
    ],
)
def test_bad_entries_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_entries(text)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("10m", 600), ("2h", 7200), ("7d", 7 * 86400), ("1w", 7 * 86400), (" 5 s ", 5)],
)
def test_durations_count_from_now_rounded_up_to_whole_seconds(text: str, seconds: int) -> None:
    assert parse_expiry(text, NOW) == 1_800_000_001 + seconds


def test_absolute_times_need_a_zone_and_the_future() -> None:
    assert parse_expiry("2027-01-15T09:00:01+01:00", NOW) == 1_800_000_001
    with pytest.raises(
        ValueError, match="^expires_in: '2027-01-15T08:00:00Z' is not in the future"
    ):
        parse_expiry("2027-01-15T08:00:00Z", NOW)
    assert parse_expiry("2027-01-15T08:00:01.2Z", NOW) == 1_800_000_002
    with pytest.raises(ValueError, match="^expires_in: '2027-01-16T00:00:00' has no time zone"):
        parse_expiry("2027-01-16T00:00:00", NOW)
    with pytest.raises(ValueError, match="^expires_in: '2027-13-01T00:00:00Z' is not an ISO 8601"):
        parse_expiry("2027-13-01T00:00:00Z", NOW)


@pytest.mark.parametrize("text", ["soon", "10", "1y", "-5s", "0.5h", "", "9" * 400 + "d"])
def test_unparseable_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="^expires_in: .* is neither a duration"):
        parse_expiry(text, NOW)


def test_a_zero_duration_is_not_in_the_future() -> None:
    with pytest.raises(ValueError, match="is not in the future"):
        parse_expiry("0s", 1_800_000_000.0)


def test_times_format_as_utc_and_read_back() -> None:
    assert format_time(1_800_000_000) == "2027-01-15T08:00:00Z"
    assert parse_time(format_time(1_800_000_000), "expires_at") == 1_800_000_000
