"""RLQS messages built and read for Quota and AsyncQuota: reports out, bucket actions in.

Pure, as ``_wire`` is for ShouldRateLimit. An action this client cannot apply (a strategy it
does not know, a token bucket without a fill interval) is left out and logged, so the bucket
falls back to ``on_unavailable`` instead of being enforced wrongly.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sluice_client._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from sluice_client._proto.envoy.type.v3 import ratelimit_strategy_pb2
from sluice_client._quota import Action, Strategy, Usage
from sluice_client._token_bucket import TokenBucketSpec
from sluice_client.types import UNIT_SECONDS

__all__ = ["build_reports", "parse_actions"]

_log = logging.getLogger("sluice_client.quota")

_BlanketRule = ratelimit_strategy_pb2.RateLimitStrategy.BlanketRule
# envoy.type.v3.RateLimitUnit: 1 SECOND … 6 YEAR (no WEEK there).
_UNITS = {1: "second", 2: "minute", 3: "hour", 4: "day", 5: "month", 6: "year"}


def build_reports(domain: str, usages: Sequence[Usage]) -> rlqs_pb2.RateLimitQuotaUsageReports:
    # The domain goes in every message: Sluice accepts it repeated, and the first message of
    # every stream needs it.
    reports = rlqs_pb2.RateLimitQuotaUsageReports(domain=domain)
    for usage in usages:
        item = reports.bucket_quota_usages.add(
            num_requests_allowed=usage.allowed, num_requests_denied=usage.denied
        )
        item.bucket_id.bucket.update(usage.bucket)
        item.time_elapsed.FromNanoseconds(round(usage.elapsed_s * 1e9))
    return reports


def parse_actions(response: rlqs_pb2.RateLimitQuotaResponse) -> list[Action]:
    actions = []
    for action in response.bucket_action:
        bucket = tuple(sorted(action.bucket_id.bucket.items()))
        if not bucket:
            _log.warning("RLQS: ignored a bucket action with an empty bucket_id")
            continue
        kind = action.WhichOneof("bucket_action")
        if kind == "abandon_action":
            actions.append(Action(bucket, None))
            continue
        if kind != "quota_assignment_action":
            _log.warning("RLQS: ignored a bucket action without an action for %s", bucket)
            continue
        assignment = action.quota_assignment_action
        strategy = _strategy(assignment.rate_limit_strategy)
        if strategy is None:
            _log.warning(
                "RLQS: ignored an assignment for %s: unsupported strategy %s",
                bucket,
                assignment.rate_limit_strategy,
            )
            continue
        ttl = assignment.assignment_time_to_live
        ttl_s = ttl.seconds + ttl.nanos / 1e9
        # Unset or zero: no expiry is given, so it is held while its stream lasts.
        actions.append(Action(bucket, strategy, ttl_s if ttl_s > 0 else None))
    return actions


def _strategy(strategy: ratelimit_strategy_pb2.RateLimitStrategy) -> Strategy | None:
    kind = strategy.WhichOneof("strategy")
    if kind == "blanket_rule":
        return "deny_all" if strategy.blanket_rule == _BlanketRule.DENY_ALL else "allow_all"
    if kind == "token_bucket":
        bucket = strategy.token_bucket
        tokens_per_fill = bucket.tokens_per_fill.value if bucket.HasField("tokens_per_fill") else 1
        interval_s = bucket.fill_interval.seconds + bucket.fill_interval.nanos / 1e9
        if interval_s <= 0:
            return None
        return TokenBucketSpec(bucket.max_tokens, tokens_per_fill, interval_s)
    if kind == "requests_per_time_unit":
        # Envoy's filter does not enforce this one; as a token bucket it is N per unit with a
        # burst of N, a fixed window without its boundary burst.
        per_unit = strategy.requests_per_time_unit
        unit = _UNITS.get(per_unit.time_unit)
        if unit is None or per_unit.requests_per_time_unit > 2**32 - 1:
            return None
        n = per_unit.requests_per_time_unit
        return TokenBucketSpec(n, n, float(UNIT_SECONDS[unit]))
    return None
