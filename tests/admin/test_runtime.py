"""sluice_admin.runtime's pure parts: the setting, grouping answers by store, rows in words."""

from __future__ import annotations

import pytest

from sluice_admin.runtime import Answer, assignment_text, by_store, lease_rows, parse_servers


def test_servers_are_http_urls_and_a_bad_one_is_named() -> None:
    assert parse_servers(" http://a:8080/, https://b:8443 ,") == [
        "http://a:8080",
        "https://b:8443",
    ]
    with pytest.raises(ValueError, match="'b:8080' is not an http:// or https:// URL"):
        parse_servers("http://a:8080,b:8080")


def test_servers_on_one_redis_store_are_shown_once_memory_stores_each() -> None:
    redis = {"store": "redis://r:6379/0 sluice:", "shared": True}
    memory = {"store": "memory", "shared": False}
    answers = [
        Answer("http://a", redis),
        Answer("http://b", memory),
        Answer("http://c", redis),
        Answer("http://d", memory),
        Answer("http://e", error="unreachable: refused"),
    ]
    assert by_store(answers) == [
        (["http://a", "http://c"], answers[0]),
        (["http://b"], answers[1]),
        (["http://d"], answers[3]),
        (["http://e"], answers[4]),
    ]


def test_assignments_in_words() -> None:
    assert assignment_text(None) == "none sent yet"
    assert assignment_text({"strategy": "deny_all", "ttl_s": 15}) == "deny all"
    bucket = {"max_tokens": 3, "tokens_per_fill": 1, "fill_interval_s": 4}
    assert (
        assignment_text({"strategy": "token_bucket", "ttl_s": 15, "token_bucket": bucket})
        == "token bucket: 1 every 4 seconds, at most 3"
    )


def test_a_lease_row_without_a_name_or_a_rule_says_so() -> None:
    body = {
        "rows": [
            {
                "entries": [],
                "stored_as": "sluice:{#3f2a}:lease",
                "rule": "",
                "held": 2,
                "max_leases": None,
                "next_expiry_s": 1.25,
                "last_expiry_s": 9.0,
            }
        ]
    }
    assert lease_rows(body) == [
        {
            "descriptor": "sluice:{#3f2a}:lease",
            "rule": "(no concurrency rule now)",
            "held": 2,
            "of": "",
            "next expires in": "1.2 s",
            "last expires in": "9.0 s",
        }
    ]
