"""Quota and AsyncQuota against a live ``sluice serve`` over RLQS: the assigned rate admitted
in process with no ShouldRateLimit call, blanket rules, and ``on_unavailable`` while Sluice
is stopped, until it is back.

Rates are measured over wall time (what is under test is a rate); waits poll for a state
with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

from sluice_client import AsyncClient, Client, OnUnavailable, QuotaDecision, SluiceUnavailable
from sluice_client.quota import Quota
from tests.support.processes import SluiceProcess, free_port, sluice_serve

DOMAIN = "quota"
RATE = 20  # per second, burst RATE: a token bucket of RATE a second holding RATE
POLICY = f"""\
domain: {DOMAIN}
descriptors:
  - key: tenant
    rate_limit: {{unit: second, requests_per_unit: {RATE}}}
  - key: blocked
    rate_limit: {{unit: second, requests_per_unit: 0}}
  - key: free
    rate_limit: {{unlimited: true}}
"""
TTL_S = 2


@contextmanager
def _serve(workdir: Path, ports: tuple[int, int] | None = None) -> Iterator[SluiceProcess]:
    workdir.mkdir(exist_ok=True)
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY)
    with sluice_serve(
        workdir, config=policy, extra_args=["--rlqs-assignment-ttl-s", str(TTL_S)], ports=ports
    ) as server:
        yield server


@pytest.fixture(scope="module")
def quota_sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    with _serve(tmp_path_factory.mktemp("sluice-quota")) as server:
        yield server


def metric(server: SluiceProcess, name: str) -> float:
    """The sum of every sample of ``name`` on the server's /metrics (0 when absent)."""
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name or sample.startswith(name + "{"):
            total += float(value)
    return total


def wait_for(
    quota: Quota, bucket: dict[str, str], want: Callable[[QuotaDecision], bool], timeout_s: float
) -> QuotaDecision:
    """The first decision ``want`` accepts (or the last one at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        decision = quota.allow(bucket)
        if want(decision) or time.monotonic() > deadline:
            return decision
        time.sleep(0.01)


def test_the_assigned_rate_is_admitted_in_process_with_no_call_per_decision(
    quota_sluice: SluiceProcess, unique: str
) -> None:
    bucket = {"tenant": unique}
    calls_before = metric(quota_sluice, "sluice_request_duration_seconds_count")
    reports_before = metric(quota_sluice, "sluice_rlqs_reports_total")
    with Client(quota_sluice.grpc_target, on_unavailable="deny") as client:
        quota = client.quota(DOMAIN, report_interval_s=1.0)
        first = quota.allow(bucket)
        assert first == QuotaDecision(allowed=False, degraded=True)  # no assignment yet
        assigned = wait_for(quota, bucket, lambda d: not d.degraded, timeout_s=5)
        assert assigned == QuotaDecision(allowed=True)
        # From the first assigned decision on: the full bucket, then RATE a second.
        started = time.monotonic()
        allowed, denied, decisions = 1, 0, 1
        while (elapsed := time.monotonic() - started) < 4.0:
            decision = quota.allow(bucket)
            assert not decision.degraded
            allowed += decision.allowed
            denied += not decision.allowed
            decisions += 1
            time.sleep(0.002)
    expected = RATE + RATE * elapsed
    assert 0.9 * expected <= allowed <= 1.1 * expected, (allowed, expected, decisions)
    assert denied > decisions / 2  # asked about ten times the rate
    # Not one ShouldRateLimit call; a handful of stream messages for hundreds of decisions.
    assert metric(quota_sluice, "sluice_request_duration_seconds_count") == calls_before
    reports = metric(quota_sluice, "sluice_rlqs_reports_total") - reports_before
    assert 1 <= reports <= 10 < decisions / 50


def test_blanket_rules_deny_or_allow_everything(quota_sluice: SluiceProcess, unique: str) -> None:
    with Client(quota_sluice.grpc_target, on_unavailable="allow") as client:
        quota = client.quota(DOMAIN, report_interval_s=1.0)
        blocked, free = {"blocked": unique}, {"free": unique}
        assert wait_for(quota, blocked, lambda d: not d.degraded, 5) == QuotaDecision(False)
        assert wait_for(quota, free, lambda d: not d.degraded, 5) == QuotaDecision(True)
        assert all(quota.allow(free, cost=1000) for _ in range(500))
        assert not any(quota.allow(blocked) for _ in range(10))
        quota.close()
        # Closed: nothing is held any more, on_unavailable decides.
        assert quota.allow(blocked) == QuotaDecision(allowed=True, degraded=True)


def test_one_quota_per_domain_and_client(quota_sluice: SluiceProcess) -> None:
    with Client(quota_sluice.grpc_target) as client:
        quota = client.quota(DOMAIN, report_interval_s=1.0)
        assert client.quota(DOMAIN, report_interval_s=1) is quota
        with pytest.raises(ValueError, match="reports every 1.0s, not 2.0s"):
            client.quota(DOMAIN, report_interval_s=2.0)
        quota.close()
        assert quota.closed
        assert client.quota(DOMAIN, report_interval_s=2.0) is not quota
    # Closing the client closed the quota it still held.
    assert quota.closed


def _assigned(quota: Quota, bucket: dict[str, str]) -> bool:
    """Whether ``bucket`` holds a live assignment (decided by it, not by on_unavailable)."""
    try:
        return not quota.allow(bucket).degraded
    except SluiceUnavailable:
        return False


def _poll(condition: Callable[[], bool], timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


@pytest.mark.parametrize("on_unavailable", ["deny", "raise"])
def test_on_unavailable_while_sluice_is_stopped_then_assignments_resume(
    tmp_path: Path, unique: str, on_unavailable: OnUnavailable
) -> None:
    bucket = {"tenant": unique}
    ports = (free_port(), free_port())
    with Client(f"127.0.0.1:{ports[0]}", on_unavailable=on_unavailable) as client:
        # Opened before Sluice is up, as an application starting first would.
        quota = client.quota(DOMAIN, report_interval_s=0.5)
        with _serve(tmp_path / "first", ports):
            # Before the first assignment, on_unavailable decides.
            expect_raise = on_unavailable == "raise"
            with pytest.raises(SluiceUnavailable) if expect_raise else nullcontext():
                assert quota.allow(bucket) == QuotaDecision(allowed=False, degraded=True)
            # The channel's reconnection backoff is capped at 5 s.
            _poll(lambda: _assigned(quota, bucket), 10, "no assignment within 10 s")
        # Stopped (SIGTERM: Sluice ends the stream with UNAVAILABLE). The last assignment
        # holds for its time to live, then on_unavailable decides again.
        _poll(lambda: not _assigned(quota, bucket), TTL_S + 2, "assignment outlived its TTL")
        if on_unavailable == "deny":
            assert quota.allow(bucket) == QuotaDecision(allowed=False, degraded=True)
        # Back on the same ports: the quota reconnects by itself (backoff at most 5 s).
        with _serve(tmp_path / "second", ports):
            _poll(lambda: _assigned(quota, bucket), 10, "no assignment after Sluice came back")
            assert not quota.closed


def test_async_quota_admits_the_assigned_rate(quota_sluice: SluiceProcess, unique: str) -> None:
    bucket = {"tenant": unique}

    async def run() -> tuple[int, float]:
        async with AsyncClient(quota_sluice.grpc_target, on_unavailable="deny") as client:
            quota = client.quota(DOMAIN, report_interval_s=1.0)
            assert quota.allow(bucket) == QuotaDecision(allowed=False, degraded=True)
            deadline = time.monotonic() + 5
            while quota.allow(bucket).degraded:
                assert time.monotonic() < deadline, "no assignment within 5 s"
                await asyncio.sleep(0.01)
            started = time.monotonic()
            allowed = 1
            while (elapsed := time.monotonic() - started) < 3.0:
                allowed += quota.allow(bucket).allowed
                await asyncio.sleep(0.002)
            return allowed, elapsed

    allowed, elapsed = asyncio.run(run())
    expected = RATE + RATE * elapsed
    assert 0.9 * expected <= allowed <= 1.1 * expected, (allowed, expected)


def test_allow_from_many_threads_admits_the_assigned_rate_once(
    quota_sluice: SluiceProcess, unique: str
) -> None:
    bucket = {"tenant": unique}
    with Client(quota_sluice.grpc_target, on_unavailable="deny") as client:
        quota = client.quota(DOMAIN, report_interval_s=1.0)
        assert wait_for(quota, bucket, lambda d: not d.degraded, 5) == QuotaDecision(True)
        counts = [0] * 4
        started = time.monotonic()

        def hammer(index: int) -> None:
            while time.monotonic() - started < 2.0:
                counts[index] += quota.allow(bucket).allowed

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(len(counts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    # What was left of the burst after the first decision, then RATE a second: shared by the
    # threads, never handed out twice.
    expected = RATE - 1 + RATE * elapsed
    assert 0.9 * expected <= sum(counts) <= 1.1 * expected, (counts, expected)


def test_a_domain_without_a_policy_is_logged_and_decided_by_on_unavailable(
    quota_sluice: SluiceProcess, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="sluice_client.quota"),
        Client(quota_sluice.grpc_target, on_unavailable="allow") as client,
    ):
        quota = client.quota(f"no-such-domain-{unique}", report_interval_s=1.0)
        assert quota.allow({"tenant": unique}) == QuotaDecision(allowed=True, degraded=True)
        deadline = time.monotonic() + 5
        while not caplog.records:
            assert time.monotonic() < deadline, "the stream's failure was not logged"
            time.sleep(0.02)
        assert "NOT_FOUND" in caplog.records[0].getMessage()
        assert quota.allow({"tenant": unique}) == QuotaDecision(allowed=True, degraded=True)


def test_async_quota_outside_the_event_loop_is_refused_clearly(unreachable_target: str) -> None:
    quota = AsyncClient(unreachable_target).quota(DOMAIN)
    with pytest.raises(RuntimeError, match="inside the running event loop"):
        quota.allow({"tenant": "a"})


def test_async_quota_without_sluice_falls_back_and_closes(unreachable_target: str) -> None:
    async def run() -> list[QuotaDecision]:
        client = AsyncClient(unreachable_target, on_unavailable="deny")
        quota = client.quota(DOMAIN, report_interval_s=0.1)
        decisions = []
        for _ in range(5):
            decisions.append(quota.allow({"tenant": "a"}))
            await asyncio.sleep(0.05)  # lets the task try (and fail) to stream meanwhile
        await client.close()
        assert quota.closed
        return decisions

    assert asyncio.run(run()) == [QuotaDecision(allowed=False, degraded=True)] * 5


def test_two_clients_on_one_bucket_share_the_rate_by_demand(
    quota_sluice: SluiceProcess, unique: str
) -> None:
    """Each client's stream reports what it was asked; Sluice splits the rate by that demand,
    so the busy one gets the larger share and together they stay near the rate."""
    bucket = {"tenant": unique}
    with (
        Client(quota_sluice.grpc_target, on_unavailable="deny") as busy_client,
        Client(quota_sluice.grpc_target, on_unavailable="deny") as quiet_client,
    ):
        busy = busy_client.quota(DOMAIN, report_interval_s=0.5)
        quiet = quiet_client.quota(DOMAIN, report_interval_s=0.5)
        for quota in (busy, quiet):
            _poll(lambda q=quota: _assigned(q, bucket), 5, "no assignment within 5 s")
        allowed = {"busy": 0, "quiet": 0}
        started = time.monotonic()

        def run(name: str, quota: Quota, pause_s: float) -> None:
            while time.monotonic() - started < 6.0:
                allowed[name] += quota.allow(bucket).allowed
                time.sleep(pause_s)

        threads = [
            threading.Thread(target=run, args=("busy", busy, 0.002)),  # ~20 times the rate
            threading.Thread(target=run, args=("quiet", quiet, 0.1)),  # half the rate
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    # Each stream may start with a full bucket of its share; beyond that, the rate.
    assert sum(allowed.values()) <= 1.1 * RATE * elapsed + 2 * RATE, allowed
    assert sum(allowed.values()) >= 0.8 * RATE * elapsed, allowed
    assert allowed["busy"] > allowed["quiet"] > 0, allowed
