"""list_buckets: the open streams' buckets with what each was last sent, busiest first."""

from __future__ import annotations

from sluice.clock import ManualClock
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.rlqs.assignment import TokenBucket
from sluice.rlqs.buckets import TOKEN_BUCKET
from sluice.rlqs.listing import BucketRow, list_buckets
from sluice.rlqs.service import QuotaService
from sluice.rlqs.wire import Action
from tests.support.rlqs_streams import Collector, Feed, run

POLICY = """
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
---
domain: web
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 10}
"""
ACME, ZED, BOB = (("tenant", "acme"),), (("tenant", "zed"),), (("tenant", "bob"),)
FULL = TokenBucket(100, 100, 1)  # the whole 100 a second: the only stream on each bucket


@run
async def test_buckets_with_their_assignment_busiest_first_and_bounded() -> None:
    clock = ManualClock(1000.0)
    snapshot = Snapshot(load_text(POLICY))
    service = QuotaService(lambda: snapshot, clock)
    api, web = Feed(), Feed()
    api_responses, web_responses = Collector(service.stream(api)), Collector(service.stream(web))
    api.report(({"tenant": "acme"}, 0, 0, 0), ({"tenant": "zed"}, 0, 0, 0), domain="api")
    api.report(({"tenant": "bob"}, 0, 0, 0))
    web.report(({"path": "/"}, 0, 0, 0), domain="web")
    await api_responses.wait(2)
    await web_responses.wait(1)
    clock.advance(1)
    api.report(({"tenant": "acme"}, 1, 28, 2), ({"tenant": "zed"}, 1, 5, 0))
    await api_responses.wait(3)
    clock.advance(2)

    listing = list_buckets(service.open_streams(), now_s=clock.now(), domain="api", limit=2)
    assert listing.rows == (
        # 30 a second asked (28 allowed, 2 denied); its assignment sent at 1001, for 15 s.
        BucketRow(1, "api", ACME, "api.tenant", 100.0, 100, 1.0,
                  Action(ACME, TOKEN_BUCKET, 15, FULL), 30.0, 2.0, 13.0),
        BucketRow(1, "api", ZED, "api.tenant", 100.0, 100, 1.0,
                  Action(ZED, TOKEN_BUCKET, 15, FULL), 5.0, 2.0, 13.0),
    )  # fmt: skip
    assert (listing.streams, listing.buckets, listing.omitted) == (1, 3, 1)  # bob: the quietest
    everything = list_buckets(service.open_streams(), now_s=clock.now())
    assert (everything.streams, everything.buckets, everything.omitted) == (2, 4, 0)
    [bob] = [row for row in everything.rows if row.bucket == BOB]
    assert (bob.assignment, bob.expires_in_s, bob.reported_s_ago) == (
        Action(BOB, TOKEN_BUCKET, 15, FULL),
        12.0,  # sent at 1000, not since
        3.0,
    )
    for feed, responses in ((api, api_responses), (web, web_responses)):
        feed.close()
        await responses.close()
