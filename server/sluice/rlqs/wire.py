"""RLQS messages to plain records and back: the only part of sluice/rlqs that sees protobuf.

A report is checked here, field by field, so a bad one ends its stream with INVALID_ARGUMENT
naming the field: bounds as ShouldRateLimit's (sluice/bounds.py) on the domain and each
bucket's entries, a non-negative elapsed time of at most ``MAX_ELAPSED_S``, and counts of
at most ``MAX_COUNT`` requests per report (no data plane serves 2^40 requests in one).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from sluice._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from sluice._proto.envoy.type.v3 import ratelimit_strategy_pb2
from sluice.bounds import RequestBounds
from sluice.edge.status import GrpcError, Status
from sluice.grpc.core import UndecodableRequest, protobuf_decoder
from sluice.records import record
from sluice.rlqs.assignment import TokenBucket
from sluice.rlqs.buckets import ALLOW_ALL, DENY_ALL

__all__ = [
    "MAX_COUNT",
    "MAX_ELAPSED_S",
    "Action",
    "BucketKey",
    "BucketUsage",
    "Report",
    "decode_reports",
    "encode_actions",
    "read_domain",
    "read_usages",
]

MAX_COUNT = 2**40
MAX_ELAPSED_S = 24 * 60 * 60

# A bucket's identity: its (key, value) pairs in key order (BucketId is an unordered map).
BucketKey = tuple[tuple[str, str], ...]


@record
class BucketUsage:
    bucket: BucketKey
    elapsed_s: float
    allowed: int
    denied: int


@record
class Report:
    domain: str
    usages: tuple[BucketUsage, ...]


@record
class Action:
    """An assignment for one bucket: ``kind`` is buckets.TOKEN_BUCKET (with ``token_bucket``),
    ALLOW_ALL or DENY_ALL, for ``ttl_s`` whole seconds."""

    bucket: BucketKey
    kind: int
    ttl_s: int
    token_bucket: TokenBucket | None = None


# The request deserializer to register StreamRateLimitQuotas with: it never raises.
decode_reports = protobuf_decoder(rlqs_pb2.RateLimitQuotaUsageReports)


def read_domain(
    message: rlqs_pb2.RateLimitQuotaUsageReports | UndecodableRequest, bounds: RequestBounds
) -> str:
    """The report's domain, or INVALID_ARGUMENT for bytes that are not a report."""
    if isinstance(message, UndecodableRequest):
        raise _invalid(message.reason)
    if len(message.domain) > bounds.max_domain_length:
        raise _invalid(
            f"domain: {len(message.domain)} characters, more than the maximum of "
            f"{bounds.max_domain_length}"
        )
    return message.domain


def read_usages(
    message: rlqs_pb2.RateLimitQuotaUsageReports, bounds: RequestBounds, start: int, stop: int
) -> list[BucketUsage]:
    """The usages at ``[start, stop)``, validated, or INVALID_ARGUMENT naming the field:
    a caller takes a large report a slice at a time, and applies none of it until every
    slice has been read."""
    usages = []
    for i, usage in enumerate(message.bucket_quota_usages[start:stop], start):
        field = f"bucket_quota_usages[{i}]"
        bucket = _bucket(usage.bucket_id.bucket, f"{field}.bucket_id.bucket", bounds)
        elapsed = usage.time_elapsed
        if elapsed.seconds < 0 or elapsed.nanos < 0:
            raise _invalid(f"{field}.time_elapsed: negative ({elapsed.ToTimedelta()})")
        elapsed_s = elapsed.seconds + elapsed.nanos / 1e9
        if elapsed_s > MAX_ELAPSED_S:
            raise _invalid(
                f"{field}.time_elapsed: {elapsed_s:g} s, more than the maximum of "
                f"{MAX_ELAPSED_S} s between two reports"
            )
        for name in ("num_requests_allowed", "num_requests_denied"):
            count = getattr(usage, name)
            if count > MAX_COUNT:
                raise _invalid(
                    f"{field}.{name}: {count}, more than the maximum of {MAX_COUNT} per report"
                )
        usages.append(
            BucketUsage(bucket, elapsed_s, usage.num_requests_allowed, usage.num_requests_denied)
        )
    return usages


def _bucket(pairs: Mapping[str, str], field: str, bounds: RequestBounds) -> BucketKey:
    if not pairs:
        raise _invalid(f"{field}: empty; a bucket needs at least one key and value")
    if len(pairs) > bounds.max_entries:
        raise _invalid(
            f"{field}: {len(pairs)} entries, more than the maximum of {bounds.max_entries}"
        )
    for key, value in pairs.items():
        if not key:
            raise _invalid(f"{field}: an empty key")
        if len(key) > bounds.max_key_length:
            raise _invalid(
                f"{field}[{key[:32]!r}…]: key of {len(key)} characters, more than the maximum "
                f"of {bounds.max_key_length}"
            )
        if len(value) > bounds.max_value_length:
            raise _invalid(
                f"{field}[{key!r}]: value of {len(value)} characters, more than the maximum of "
                f"{bounds.max_value_length}"
            )
    return tuple(sorted(pairs.items()))


def _invalid(message: str) -> GrpcError:
    return GrpcError(Status.INVALID_ARGUMENT, message)


_Strategy = ratelimit_strategy_pb2.RateLimitStrategy
_BLANKET = {ALLOW_ALL: _Strategy.ALLOW_ALL, DENY_ALL: _Strategy.DENY_ALL}


def encode_actions(actions: list[Action]) -> bytes:
    """A RateLimitQuotaResponse's bytes. Each action is encoded once and its bytes reused:
    a report's answer repeats the assignments it last sent, bucket after bucket."""
    return b"".join(map(_encode_field, actions))


@functools.lru_cache(maxsize=65536)
def _encode_field(action: Action) -> bytes:
    """One ``bucket_action`` field (number 1, length-delimited) of the response."""
    data = _encode_action(action).SerializeToString(deterministic=True)
    return b"\x0a" + _varint(len(data)) + data


def _encode_action(action: Action) -> rlqs_pb2.RateLimitQuotaResponse.BucketAction:
    out = rlqs_pb2.RateLimitQuotaResponse.BucketAction()
    out.bucket_id.bucket.update(action.bucket)
    assignment = out.quota_assignment_action
    assignment.assignment_time_to_live.seconds = action.ttl_s
    strategy = assignment.rate_limit_strategy
    bucket = action.token_bucket
    if bucket is None:
        strategy.blanket_rule = _BLANKET[action.kind]
    else:
        strategy.token_bucket.max_tokens = bucket.max_tokens
        strategy.token_bucket.tokens_per_fill.value = bucket.tokens_per_fill
        strategy.token_bucket.fill_interval.seconds = bucket.fill_interval_s
    return out


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
