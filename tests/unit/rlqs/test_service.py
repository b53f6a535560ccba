"""The RLQS service without a transport: streams driven by hand, time by a manual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping

import pytest

from sluice._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2
from sluice._proto.envoy.type.v3 import ratelimit_strategy_pb2
from sluice.clock import ManualClock
from sluice.edge.status import GrpcError, Status
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.rlqs.service import RLQS_USAGE_SUFFIX, QuotaService, QuotaSettings
from sluice.usage.recorder import ALLOWED, OVER_LIMIT, UsageRecorder
from tests.support.rlqs_streams import Feed, next_response, rate, run, strategies

POLICY = """
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
"""

Response = rlqs_pb2.RateLimitQuotaResponse
ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL
DENY_ALL = ratelimit_strategy_pb2.RateLimitStrategy.DENY_ALL


def snapshot(text: str = POLICY) -> Snapshot:
    return Snapshot(load_text(text, "policy.yaml"))


class Harness:
    def __init__(self, **settings: object) -> None:
        self.clock = ManualClock(1000.0)
        self.snapshot = snapshot()
        self.recorder = UsageRecorder()
        self.assignments: dict[str, int] = {}
        self.service = QuotaService(
            lambda: self.snapshot,
            self.clock,
            settings=QuotaSettings(**settings),  # type: ignore[arg-type]
            recorder=self.recorder,
            on_assignments=lambda kind, n: self.assignments.__setitem__(
                kind, self.assignments.get(kind, 0) + n
            ),
        )

    def open(self) -> tuple[Feed, AsyncIterator[bytes]]:
        feed = Feed()
        return feed, self.service.stream(feed)


ACME = {"tenant": "acme"}
ACME_KEY = (("tenant", "acme"),)


@pytest.fixture
def harness() -> Iterator[Harness]:
    yield Harness()


@run
async def test_each_report_is_answered_for_each_of_its_buckets(harness: Harness) -> None:
    feed, responses = harness.open()
    feed.report((ACME, 0, 0, 0), ({"other": "x"}, 0, 0, 0), domain="api")
    response = await next_response(responses)
    assert strategies(response) == {
        ACME_KEY: (100, 100, 1),
        (("other", "x"),): ALLOW_ALL,
    }
    actions = response.bucket_action
    assert {a.quota_assignment_action.assignment_time_to_live.seconds for a in actions} == {15}
    assert harness.assignments == {"token_bucket": 1, "allow_all": 1}
    assert (harness.service.streams, harness.service.buckets, harness.service.reports) == (1, 2, 1)
    feed.close()
    with pytest.raises(StopAsyncIteration):
        await next_response(responses)
    assert harness.service.streams == 0


@run
async def test_two_streams_split_the_limit_by_demand(harness: Harness) -> None:
    busy, busy_out = harness.open()
    quiet, quiet_out = harness.open()
    busy.report((ACME, 0, 0, 0), domain="api")
    await next_response(busy_out)
    quiet.report((ACME, 0, 0, 0), domain="api")
    await next_response(quiet_out)
    busy.report((ACME, 5, 400, 500))  # 180 a second asked
    quiet.report((ACME, 5, 50, 0))  # 10 a second asked
    await next_response(busy_out)
    await next_response(quiet_out)
    harness.clock.advance(1)
    await harness.service.rebalance()
    busy_rate = rate(await next_response(busy_out))
    quiet_rate = rate(await next_response(quiet_out))
    assert busy_rate > 5 * quiet_rate
    assert quiet_rate >= 5  # the floor: 5 % of the rate is every stream's
    assert busy_rate + quiet_rate <= 100 * 1.02
    assert busy_rate + quiet_rate >= 100 * 0.95

    # The busy stream leaves: within a rebalance the quiet one holds the whole limit.
    busy.close()
    with pytest.raises(StopAsyncIteration):
        await next_response(busy_out)
    await harness.service.rebalance()
    assert rate(await next_response(quiet_out)) == 100


@run
async def test_a_new_stream_starts_from_its_share_not_the_whole_limit(harness: Harness) -> None:
    first, first_out = harness.open()
    first.report((ACME, 0, 0, 0), domain="api")
    await next_response(first_out)
    first.report((ACME, 5, 500, 0))
    await next_response(first_out)
    await harness.service.rebalance()
    second, second_out = harness.open()
    second.report((ACME, 0, 0, 0), domain="api")
    assert rate(await next_response(second_out)) < 10


@run
async def test_a_bucket_no_longer_reported_is_dropped_after_the_ttl(harness: Harness) -> None:
    feed, responses = harness.open()
    feed.report((ACME, 0, 0, 0), domain="api")
    await next_response(responses)
    harness.clock.advance(16)
    await harness.service.rebalance()
    assert harness.service.buckets == 0
    feed.close()


@run
async def test_assignments_are_refreshed_before_they_expire(harness: Harness) -> None:
    feed, responses = harness.open()
    feed.report((ACME, 0, 0, 0), domain="api")
    await next_response(responses)
    harness.clock.advance(5)
    feed.report((ACME, 5, 0, 0))
    await next_response(responses)
    harness.clock.advance(7.5)  # half the TTL since the last send, and still reported
    await harness.service.rebalance()
    assert rate(await next_response(responses)) == 100
    feed.close()


@run
async def test_a_published_policy_is_pushed_at_the_next_rebalance(harness: Harness) -> None:
    feed, responses = harness.open()
    feed.report((ACME, 0, 0, 0), domain="api")
    await next_response(responses)
    harness.snapshot = snapshot(POLICY.replace("100", "0"))
    await harness.service.rebalance()
    assert set(strategies(await next_response(responses)).values()) == {DENY_ALL}
    feed.close()


@run
async def test_snapshot_changed_wakes_the_rebalance_at_once(harness: Harness) -> None:
    harness.service.start()
    try:
        feed, responses = harness.open()
        feed.report((ACME, 0, 0, 0), domain="api")
        await next_response(responses)
        harness.snapshot = snapshot(POLICY.replace("100", "50"))
        harness.service.snapshot_changed()  # rebalance_interval_s is 1 s; next_response waits 2
        assert rate(Response.FromString(await asyncio.wait_for(anext(responses), 0.5))) == 50
        feed.close()
    finally:
        await harness.service.stop()


@run
async def test_reported_counts_feed_usage_marked_as_rlqs(harness: Harness) -> None:
    feed, responses = harness.open()
    feed.report((ACME, 5, 40, 7), ({"other": "x"}, 5, 9, 0), domain="api")
    await next_response(responses)
    usage = harness.recorder.drain()
    assert list(usage) == ["api.tenant" + RLQS_USAGE_SUFFIX]
    counts = usage["api.tenant" + RLQS_USAGE_SUFFIX].counts
    assert (counts[ALLOWED], counts[OVER_LIMIT]) == (40, 7)
    offenders = usage["api.tenant" + RLQS_USAGE_SUFFIX].offenders
    assert offenders is not None and offenders.top() == [("tenant,acme", 7)]  # as the limiter's
    feed.close()


@pytest.mark.parametrize(
    ("reports", "status", "message"),
    [
        ([((ACME, 0, 0, 0), "")], Status.INVALID_ARGUMENT, "domain: the stream's first report"),
        ([((ACME, 0, 0, 0), "nope")], Status.NOT_FOUND, "domain: 'nope' has no policy"),
        ([(({}, 0, 0, 0), "api")], Status.INVALID_ARGUMENT, r"\.bucket_id\.bucket: empty"),
        ([((ACME, -1, 0, 0), "api")], Status.INVALID_ARGUMENT, "time_elapsed: negative"),
        ([((ACME, 1, 2**50, 0), "api")], Status.INVALID_ARGUMENT, "num_requests_allowed: "),
        (
            [((ACME, 0, 0, 0), "api"), ((ACME, 0, 0, 0), "other")],
            Status.INVALID_ARGUMENT,
            "one stream per domain",
        ),
    ],
)
@run
async def test_bad_reports_end_the_stream_with_a_status_naming_the_field(
    harness: Harness,
    reports: list[tuple[tuple[Mapping[str, str], float, int, int], str]],
    status: Status,
    message: str,
) -> None:
    bystander, bystander_out = harness.open()
    bystander.report((ACME, 0, 0, 0), domain="api")
    await next_response(bystander_out)
    feed, responses = harness.open()
    for usage, domain in reports:
        feed.report(usage, domain=domain)
    with pytest.raises(GrpcError, match=message) as caught:
        while True:
            await next_response(responses)
    assert caught.value.status == status
    # Nothing else disturbed: the other stream is still answered.
    bystander.report((ACME, 1, 1, 0))
    assert rate(await next_response(bystander_out)) == 100
    bystander.close()


@run
async def test_a_stream_past_its_bucket_maximum_is_refused() -> None:
    harness = Harness(max_buckets_per_stream=1000)
    feed, responses = harness.open()
    feed.report(*(({"tenant": str(i)}, 0, 0, 0) for i in range(1000)), domain="api")
    assert len((await next_response(responses)).bucket_action) == 1000
    feed.report(({"tenant": "one-more"}, 0, 0, 0))
    with pytest.raises(GrpcError, match="1001 buckets, more than the maximum of 1000") as caught:
        await next_response(responses)
    assert caught.value.status == Status.RESOURCE_EXHAUSTED


@run
async def test_a_report_of_thousands_of_buckets_yields_the_loop_while_taken() -> None:
    harness = Harness()
    feed, responses = harness.open()
    seen: list[int] = []

    async def watch() -> None:  # another coroutine on the loop: a ShouldRateLimit call, say
        while True:
            seen.append(harness.service.buckets)
            await asyncio.sleep(0)

    watcher = asyncio.ensure_future(watch())
    feed.report(*(({"tenant": str(i)}, 0, 0, 0) for i in range(3000)), domain="api")
    assert len((await next_response(responses)).bucket_action) == 3000
    watcher.cancel()
    assert any(0 < n < 3000 for n in seen), "the loop ran only before or after the report"
    feed.close()


@run
async def test_a_bad_bucket_in_a_later_chunk_refuses_the_whole_report() -> None:
    harness = Harness()
    feed, responses = harness.open()
    usages = [({"tenant": str(i)}, 0, 0, 0) for i in range(2500)]
    usages.append(({"tenant": "late"}, -1, 0, 0))  # read in the third chunk
    feed.report(*usages, domain="api")
    with pytest.raises(GrpcError, match=r"bucket_quota_usages\[2500\]\.time_elapsed: negative"):
        await next_response(responses)
    assert harness.service.buckets == 0  # the chunks read before it were not taken


@run
async def test_drain_ends_streams_unavailable_and_refuses_new_ones(harness: Harness) -> None:
    feed, responses = harness.open()
    feed.report((ACME, 0, 0, 0), domain="api")
    await next_response(responses)
    await harness.service.drain()
    with pytest.raises(GrpcError) as caught:
        await next_response(responses)
    assert caught.value.status == Status.UNAVAILABLE
    _, late = harness.open()
    with pytest.raises(GrpcError) as refused:
        await next_response(late)
    assert refused.value.status == Status.UNAVAILABLE
