"""RLQS messages (_quota_wire.py): reports built, bucket actions read, without a server."""

from __future__ import annotations

import logging

import pytest

from sluice_client._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from sluice_client._proto.envoy.type.v3 import ratelimit_strategy_pb2
from sluice_client._quota import Action, Usage
from sluice_client._quota_wire import build_reports, parse_actions
from sluice_client._token_bucket import TokenBucketSpec

Strategy = ratelimit_strategy_pb2.RateLimitStrategy
Response = rlqs_pb2.RateLimitQuotaResponse


def test_a_report_carries_the_domain_and_each_buckets_usage() -> None:
    reports = build_reports(
        "edge",
        [
            Usage((("path", "/a"), ("tenant", "acme")), 7, 3, 5.0000015),
            Usage((("tenant", "beta"),), 0, 0, 0.0),
        ],
    )
    assert reports.domain == "edge"
    first, second = reports.bucket_quota_usages
    assert dict(first.bucket_id.bucket) == {"path": "/a", "tenant": "acme"}
    assert (first.num_requests_allowed, first.num_requests_denied) == (7, 3)
    assert (first.time_elapsed.seconds, first.time_elapsed.nanos) == (5, 1500)
    assert dict(second.bucket_id.bucket) == {"tenant": "beta"}
    assert second.time_elapsed.ToNanoseconds() == 0


def _assignment(response: Response, bucket: dict[str, str], ttl_s: int) -> Strategy:
    action = response.bucket_action.add()
    action.bucket_id.bucket.update(bucket)
    action.quota_assignment_action.assignment_time_to_live.seconds = ttl_s
    strategy: Strategy = action.quota_assignment_action.rate_limit_strategy
    return strategy


def test_token_bucket_blanket_rules_and_abandon_are_read() -> None:
    response = Response()
    bucket = _assignment(response, {"tenant": "acme", "path": "/a"}, 15).token_bucket
    bucket.max_tokens = 20
    bucket.tokens_per_fill.value = 10
    bucket.fill_interval.seconds = 2
    _assignment(response, {"tenant": "b"}, 15).blanket_rule = Strategy.DENY_ALL
    _assignment(response, {"tenant": "c"}, 0).blanket_rule = Strategy.ALLOW_ALL
    response.bucket_action.add().bucket_id.bucket["tenant"] = "d"
    response.bucket_action[-1].abandon_action.SetInParent()

    assert parse_actions(response) == [
        Action((("path", "/a"), ("tenant", "acme")), TokenBucketSpec(20, 10, 2.0), 15.0),
        Action((("tenant", "b"),), "deny_all", 15.0),
        Action(
            (("tenant", "c"),), "allow_all", None
        ),  # no time to live: held while the stream lasts
        Action((("tenant", "d"),), None),
    ]


def test_tokens_per_fill_defaults_to_one() -> None:
    response = Response()
    bucket = _assignment(response, {"tenant": "a"}, 15).token_bucket
    bucket.max_tokens = 5
    bucket.fill_interval.nanos = 500_000_000
    assert parse_actions(response)[0].strategy == TokenBucketSpec(5, 1, 0.5)


def test_requests_per_time_unit_is_a_token_bucket_of_n_per_unit() -> None:
    response = Response()
    per_unit = _assignment(response, {"tenant": "a"}, 15).requests_per_time_unit
    per_unit.requests_per_time_unit = 100
    per_unit.time_unit = 2  # MINUTE
    assert parse_actions(response)[0].strategy == TokenBucketSpec(100, 100, 60.0)


def test_what_cannot_be_enforced_is_left_out_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    response = Response()
    _assignment(response, {"tenant": "a"}, 15).token_bucket.max_tokens = 5  # no fill_interval
    _assignment(response, {"tenant": "b"}, 15)  # no strategy
    response.bucket_action.add().bucket_id.bucket["tenant"] = "c"  # no action
    response.bucket_action.add().abandon_action.SetInParent()  # no bucket
    with caplog.at_level(logging.WARNING, logger="sluice_client.quota"):
        assert parse_actions(response) == []
    assert len(caplog.records) == 4
    assert "unsupported strategy" in caplog.records[0].getMessage()
    assert "empty bucket_id" in caplog.records[3].getMessage()
