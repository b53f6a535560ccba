"""LeaseCore: protobuf in, LeaseService call, protobuf out; refusals as gRPC statuses."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice._proto.sluice.lease.v1 import lease_pb2
from sluice.clock import ManualClock
from sluice.edge.status import GrpcError, Status
from sluice.grpc.leases import LEASE_SERVICE_NAME, LeaseCore
from sluice.leases import LeaseService, MemoryLeaseStore
from sluice.metrics import Metrics
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from tests.support.examples import examples

POLICY = """\
domain: jobs
descriptors:
  - key: tenant
    rate_limit: {concurrency: 1, lease_ttl: 1500ms}
"""
ENTRIES = [lease_pb2.Entry(key="tenant", value="acme")]


def core(clock: ManualClock) -> LeaseCore:
    snapshot = Snapshot(load_text(POLICY, "p.yaml"))
    return LeaseCore(LeaseService(lambda: snapshot, MemoryLeaseStore(), clock))


def test_the_service_name_is_the_protos() -> None:
    assert LEASE_SERVICE_NAME == "sluice.lease.v1.LeaseService"
    assert set(core(ManualClock()).methods()) == {"Acquire", "Renew", "Release"}


def test_milliseconds_on_the_wire_rounded_up() -> None:
    clock = ManualClock(100)
    leases = core(clock)
    decode = leases.methods()["Acquire"][1]
    request = decode(lease_pb2.AcquireRequest(domain="jobs", entries=ENTRIES).SerializeToString())
    granted = asyncio.run(leases.acquire(request))
    assert (granted.granted, granted.ttl_ms, granted.max_leases, granted.in_flight) == (
        True,
        1500,
        1,
        1,
    )
    clock.advance(0.0004)
    refused = asyncio.run(leases.acquire(request))
    # 1.4996 s until the held lease expires: told 1500 ms, never less than the wait.
    assert (refused.granted, refused.lease_id, refused.retry_after_ms) == (False, "", 1500)
    renew = lease_pb2.RenewRequest(domain="jobs", entries=ENTRIES, lease_id=granted.lease_id)
    assert asyncio.run(leases.renew(renew)) == lease_pb2.RenewResponse(renewed=True, ttl_ms=1500)
    release = lease_pb2.ReleaseRequest(domain="jobs", entries=ENTRIES, lease_id=granted.lease_id)
    assert asyncio.run(leases.release(release)).released
    assert not asyncio.run(leases.release(release)).released


@pytest.mark.parametrize(
    ("method", "request_", "status", "message"),
    [
        ("Acquire", b"\xff", Status.INVALID_ARGUMENT, "request: not a AcquireRequest in "),
        (
            "Renew",
            lease_pb2.RenewRequest(domain="jobs", entries=ENTRIES),
            Status.INVALID_ARGUMENT,
            "lease_id: must not be empty",
        ),
        (
            "Release",
            lease_pb2.ReleaseRequest(domain="x", entries=ENTRIES, lease_id="a"),
            Status.NOT_FOUND,
            "domain: no policy for domain 'x'",
        ),
    ],
)
def test_refusals_carry_the_status_and_the_field(
    method: str, request_: Any, status: Status, message: str
) -> None:
    leases = core(ManualClock())
    handler, decode = leases.methods()[method]
    data = request_ if isinstance(request_, bytes) else request_.SerializeToString()
    with pytest.raises(GrpcError) as raised:
        asyncio.run(handler(decode(data)))
    assert raised.value.status is status
    assert raised.value.message.startswith(message)


def test_every_call_is_counted_by_method_and_result() -> None:
    clock = ManualClock(100)
    metrics = Metrics(dict)
    snapshot = Snapshot(load_text(POLICY, "p.yaml"))
    leases = LeaseCore(LeaseService(lambda: snapshot, MemoryLeaseStore(), clock), metrics)
    acquire = lease_pb2.AcquireRequest(domain="jobs", entries=ENTRIES)
    granted = asyncio.run(leases.acquire(acquire))
    asyncio.run(leases.acquire(acquire))  # refused: one lease at a time
    renew = lease_pb2.RenewRequest(domain="jobs", entries=ENTRIES, lease_id=granted.lease_id)
    asyncio.run(leases.renew(renew))
    release = lease_pb2.ReleaseRequest(domain="jobs", entries=ENTRIES, lease_id=granted.lease_id)
    asyncio.run(leases.release(release))
    asyncio.run(leases.release(release))  # released already
    clock.advance(10)
    asyncio.run(leases.renew(renew))  # long gone
    with pytest.raises(GrpcError):
        asyncio.run(leases.acquire(lease_pb2.AcquireRequest(domain="x", entries=ENTRIES)))
    counted = {
        (sample.labels["method"], sample.labels["result"]): sample.value
        for family in metrics.registry.collect()
        if family.name == "sluice_lease_calls"
        for sample in family.samples
    }
    assert counted == {
        ("acquire", "granted"): 1,
        ("acquire", "refused"): 1,
        ("renew", "renewed"): 1,
        ("renew", "expired"): 1,
        ("release", "released"): 1,
        ("release", "unknown"): 1,
        ("acquire", "not_found"): 1,
    }


class _Gated(MemoryLeaseStore):
    """A store whose acquire waits for the test: a call held in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def acquire(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.gate.wait()
        return await super().acquire(*args, **kwargs)


def test_drain_refuses_new_calls_and_waits_for_those_in_flight() -> None:
    async def scenario() -> None:
        store = _Gated()
        snapshot = Snapshot(load_text(POLICY, "p.yaml"))
        leases = LeaseCore(LeaseService(lambda: snapshot, store, ManualClock()))
        request = lease_pb2.AcquireRequest(domain="jobs", entries=ENTRIES)
        in_flight = asyncio.ensure_future(leases.acquire(request))
        await store.entered.wait()
        assert not await leases.drain(0.01)  # the call in flight is still there
        with pytest.raises(GrpcError) as raised:
            await leases.acquire(request)
        assert raised.value.status is Status.UNAVAILABLE
        store.gate.set()
        assert await leases.drain(5)
        assert (await in_flight).granted  # the call in flight finished normally

    asyncio.run(scenario())


_text = st.text(max_size=40) | st.just("") | st.text(min_size=1025, max_size=1100)
_entries = st.lists(st.builds(lease_pb2.Entry, key=_text, value=_text), max_size=18)
_ids = st.text(max_size=70)
_ttl = st.integers(0, 2**32 - 1)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.one_of(
        st.binary(max_size=64).map(lambda data: ("Acquire", data)),
        st.builds(
            lambda d, e, t: ("Acquire", lease_pb2.AcquireRequest(domain=d, entries=e, ttl_ms=t)),
            st.sampled_from(["jobs", "", "other"]) | _text,
            _entries,
            _ttl,
        ),
        st.builds(
            lambda d, e, i, t: (
                "Renew",
                lease_pb2.RenewRequest(domain=d, entries=e, lease_id=i, ttl_ms=t),
            ),
            st.sampled_from(["jobs", ""]),
            _entries,
            _ids,
            _ttl,
        ),
        st.builds(
            lambda d, e, i: ("Release", lease_pb2.ReleaseRequest(domain=d, entries=e, lease_id=i)),
            st.sampled_from(["jobs", ""]),
            _entries,
            _ids,
        ),
    )
)
def test_any_request_gets_an_answer_or_a_named_refusal(call: tuple[str, Any]) -> None:
    method, message = call
    leases = core(ManualClock(1000))
    handler, decode = leases.methods()[method]
    data = message if isinstance(message, bytes) else message.SerializeToString()
    try:
        asyncio.run(handler(decode(data)))
    except GrpcError as refusal:
        assert refusal.status in (Status.INVALID_ARGUMENT, Status.NOT_FOUND)
        assert refusal.message.split(":")[0] in (
            "request",
            "domain",
            "entries",
            "ttl",
            "lease_id",
        ) or refusal.message.startswith("entries[")
