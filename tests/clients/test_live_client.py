"""Client and AsyncClient against a live ``sluice serve``: decisions, deadlines, outages."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import grpc
import pytest

from sluice_client import (
    AsyncClient,
    Client,
    Decision,
    Descriptor,
    InvalidRequest,
    Limit,
    SluiceUnavailable,
    rate_limit_headers,
)
from tests.support.processes import SluiceProcess


def test_allowed_then_over_the_limit(sluice: SluiceProcess, domain: str, unique: str) -> None:
    with Client(sluice.grpc_target) as client:
        decisions = [client.check(domain, [{"user": unique}]) for _ in range(4)]

    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.statuses[0].remaining for d in decisions] == [2, 1, 0, 0]
    first, refused = decisions[0], decisions[3]
    assert first.statuses[0].limit == Limit(3, "hour", "per-user")
    assert first.retry_after_s is None and first.delay_s == 0 and not first.degraded
    status = refused.statuses[0]
    assert not status.allowed and status.reason == ""
    assert 0 < status.reset_s <= 3600
    assert refused.retry_after_s == status.retry_after_s == status.reset_s
    headers = dict(refused.headers)
    assert headers["RateLimit-Policy"] == '"per-user";q=3;w=3600'
    assert headers["RateLimit"].startswith('"per-user";r=0;t=')
    assert int(headers["Retry-After"]) >= refused.retry_after_s


def test_client_side_headers_match_the_servers(
    sluice: SluiceProcess, domain: str, unique: str
) -> None:
    """The middleware's fallback (a server without --response-headers) says the same."""
    with Client(sluice.grpc_target) as client:
        allowed = client.check(domain, [{"user": unique}], hits=2)
        refused = client.check(domain, [{"user": unique}], hits=2)
    for decision in (allowed, refused):
        stripped = dataclasses.replace(decision, headers=())
        assert rate_limit_headers(stripped) == decision.headers


def test_entries_in_order_per_descriptor_hits_and_overrides(
    sluice: SluiceProcess, domain: str, unique: str
) -> None:
    with Client(sluice.grpc_target) as client:
        decision = client.check(
            domain,
            [
                {"user": unique},
                Descriptor({"user": unique}, hits=0),  # looks, does not count
                Descriptor([("user", unique + "-o")], limit=Limit(1, "hour")),
                {"nobody": "configured"},
                {"grpc_method": "/a.B/C", "tenant": unique},
            ],
        )
    user, peek, override, unmatched, nested = decision.statuses
    assert user.remaining == 2 and peek.remaining == 2
    assert override.limit is not None
    assert (override.limit.requests_per_unit, override.limit.unit) == (1, "hour")
    assert override.remaining == 0 and override.allowed
    assert unmatched.limit is None and unmatched.allowed
    assert nested.limit == Limit(2, "hour", "per-tenant-method")


def test_a_limit_that_never_admits_says_why(sluice: SluiceProcess, domain: str) -> None:
    with Client(sluice.grpc_target) as client:
        decision = client.check(domain, [{"blocked": "x"}])
    assert not decision.allowed
    assert "nothing is ever admitted" in decision.statuses[0].reason
    assert decision.retry_after_s is None


def test_invalid_requests_raise_whatever_on_unavailable_says(
    sluice: SluiceProcess, domain: str
) -> None:
    with Client(sluice.grpc_target, on_unavailable="allow") as client:
        with pytest.raises(InvalidRequest, match="descriptors: must not be empty"):
            client.check(domain, [])
        with pytest.raises(InvalidRequest, match="Sluice refused the request"):
            client.check(domain, [{"k" * 300: "v"}])  # over the server's key-length bound


def test_async_client_decides_the_same(sluice: SluiceProcess, domain: str, unique: str) -> None:
    async def run() -> list[Decision]:
        async with AsyncClient(sluice.grpc_target) as client:
            return [await client.check(domain, [{"user": unique}]) for _ in range(4)]

    decisions = asyncio.run(run())
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert decisions[3].statuses[0].limit == Limit(3, "hour", "per-user")
    assert decisions[3].retry_after_s is not None


def test_async_client_can_be_built_before_the_event_loop(
    sluice: SluiceProcess, domain: str, unique: str
) -> None:
    client = AsyncClient(sluice.grpc_target)  # as an ASGI module does at import time

    async def run() -> Decision:
        try:
            return await client.check(domain, [{"user": unique}])
        finally:
            await client.close()

    assert asyncio.run(run()).allowed


# When Sluice gives no answer.


@pytest.mark.parametrize(
    ("choice", "allowed"), [("allow", True), ("deny", False)], ids=["allow", "deny"]
)
def test_unreachable_server_is_decided_by_on_unavailable(
    unreachable_target: str, domain: str, choice: str, allowed: bool
) -> None:
    with Client(unreachable_target, on_unavailable=choice, timeout_s=2) as client:
        started = time.monotonic()
        decision = client.check(domain, [{"user": "u"}, {"path": "/"}])
    assert time.monotonic() - started < 1.5  # refused connections fail fast, before the deadline
    assert decision.degraded and decision.allowed is allowed
    assert len(decision.statuses) == 2
    assert all("Sluice unavailable (UNAVAILABLE)" in s.reason for s in decision.statuses)
    assert decision.retry_after_s is None and rate_limit_headers(decision) == ()


def test_unreachable_server_raises_when_asked_to(unreachable_target: str, domain: str) -> None:
    with Client(unreachable_target, on_unavailable="raise") as client:
        with pytest.raises(SluiceUnavailable) as caught:
            client.check(domain, [{"user": "u"}])
    assert caught.value.code is grpc.StatusCode.UNAVAILABLE


def test_async_unreachable_server_under_each_choice(unreachable_target: str, domain: str) -> None:
    async def run(choice: str) -> Decision:
        async with AsyncClient(unreachable_target, on_unavailable=choice) as client:
            return await client.check(domain, [{"user": "u"}])

    assert asyncio.run(run("allow")).allowed
    denied = asyncio.run(run("deny"))
    assert not denied.allowed and denied.degraded
    with pytest.raises(SluiceUnavailable):
        asyncio.run(run("raise"))


def test_a_server_that_never_answers_hits_the_per_call_deadline(
    black_hole_target: str, domain: str
) -> None:
    with Client(black_hole_target, timeout_s=5, on_unavailable="raise") as client:
        started = time.monotonic()
        with pytest.raises(SluiceUnavailable) as caught:
            client.check(domain, [{"user": "u"}], timeout_s=0.2)
        elapsed = time.monotonic() - started
    assert caught.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.15 <= elapsed < 2

    with Client(black_hole_target, timeout_s=0.2) as client:
        decision = client.check(domain, [{"user": "u"}])
    assert decision.allowed and decision.degraded
    assert "DEADLINE_EXCEEDED" in decision.statuses[0].reason


def test_async_deadline(black_hole_target: str, domain: str) -> None:
    async def run() -> Decision:
        async with AsyncClient(black_hole_target, timeout_s=0.2, on_unavailable="deny") as c:
            return await c.check(domain, [{"user": "u"}])

    started = time.monotonic()
    decision = asyncio.run(run())
    assert time.monotonic() - started < 2
    assert not decision.allowed and decision.degraded
    assert "DEADLINE_EXCEEDED" in decision.statuses[0].reason
