"""A Redis that hangs or dies: every answer within the timeout in each failure mode, fail-fast
once the circuit opens, and correct decisions again soon after Redis comes back on its port,
without restarting anything. Concurrent calls against a Redis that hangs while the circuit is
still closed: each answered in time, few calls sent to it, then the circuit opens. Also: the
over-limit cache keeps a flood off Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest

from sluice.algorithms import ALGORITHMS, Limit
from sluice.backends import Hit
from sluice.backends.over_limit_cache import OverLimitCache
from sluice.backends.redis.backend import RedisBackend
from sluice.backends.redis.breaker import CircuitBreaker
from sluice.backends.redis.connect import connect
from sluice.clock import ManualClock, SystemClock
from sluice.errors import BackendUnavailableError
from sluice.limiter import LimiterSettings, RateLimiter
from sluice.model import Descriptor, RateLimitRequest
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from tests.integration.redis_support import data_nodes, evalsha_calls, reset_stats
from tests.support.holding_proxy import HoldingProxy
from tests.support.redis_servers import RedisProcess

TIMEOUT_S = 0.1
POLICY = """
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
"""


def request(user: str) -> RateLimitRequest:
    return RateLimitRequest("d", (Descriptor((("user", user),)),))


async def answer(limiter: RateLimiter, user: str) -> tuple[str, float]:
    """What the limiter said (OK / OVER_LIMIT / UNAVAILABLE / NO_LIMIT) and how long it took."""
    start = time.perf_counter()
    try:
        decision = await limiter.should_rate_limit(request(user))
    except BackendUnavailableError:
        return "UNAVAILABLE", time.perf_counter() - start
    elapsed = time.perf_counter() - start
    [status] = decision.statuses
    if status.current_limit is None:
        return "NO_LIMIT", elapsed
    return decision.overall_code.name, elapsed


@pytest.mark.parametrize(
    ("mode", "failed"), [("error", "UNAVAILABLE"), ("allow", "NO_LIMIT"), ("deny", "OVER_LIMIT")]
)
def test_outage_answers_are_quick_and_recovery_is_automatic(
    private_redis: RedisProcess, mode: str, failed: str
) -> None:
    # The breaker's cool-down runs on a clock the test steps: the circuit stays open for as
    # long as the test says, however slowly a busy machine gets through the hung phase, and
    # the cool-down passes without sleeping through it.
    cooldown = ManualClock()
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=0.5, clock=cooldown.now)
    backend = RedisBackend(connect(private_redis.url, timeout_s=TIMEOUT_S), breaker=breaker)
    snapshot = Snapshot(load_text(POLICY, "policy.yaml"))
    limiter = RateLimiter(
        lambda: snapshot, backend, SystemClock(), LimiterSettings(failure_mode=mode)
    )
    run = uuid.uuid4().hex

    async def scenario() -> None:
        assert (await answer(limiter, run + "a"))[0] == "OK"

        # Hung: connections accepted, nothing answered. The first few answers cost about
        # one timeout (the breaker counts them), then the open circuit answers at once.
        private_redis.freeze()
        hung = [await answer(limiter, run + "a") for _ in range(10)]
        assert {verdict for verdict, _ in hung} == {failed}
        assert max(elapsed for _, elapsed in hung) < 2 * TIMEOUT_S + 0.05
        assert max(elapsed for _, elapsed in hung[3:]) < 0.005

        # Dead: the port refuses. Still the failure mode's answer, at once, the first one
        # being the probe the cool-down's end lets through (refused, it reopens the circuit).
        private_redis.kill()
        cooldown.advance(breaker.cooldown_s)
        dead = [await answer(limiter, run + "a") for _ in range(5)]
        assert {verdict for verdict, _ in dead} == {failed}
        assert max(elapsed for _, elapsed in dead) < TIMEOUT_S

        # Back on the same port (start() returns once it answers PING), empty: once the
        # cool-down is over, the next request is the probe, and its exact decision closes
        # the circuit, without restarting anything.
        private_redis.start()
        assert breaker.rejects()
        cooldown.advance(breaker.cooldown_s)
        assert (await answer(limiter, run + "c"))[0] == "OK"
        assert breaker.state == "closed"
        assert (await answer(limiter, run + "c"))[0] == "OK"
        assert (await answer(limiter, run + "c"))[0] == "OVER_LIMIT"
        await backend.close()

    asyncio.run(scenario())


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait, on the event loop, for what another thread (the proxy's) makes true."""
    try:
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError(f"no {what} within 10 s") from None


@pytest.mark.parametrize(
    ("mode", "failed"), [("error", "UNAVAILABLE"), ("allow", "NO_LIMIT"), ("deny", "OVER_LIMIT")]
)
def test_concurrent_calls_against_a_hung_redis_before_the_circuit_opens(
    redis_server: str, mode: str, failed: str
) -> None:
    # Hung behind a proxy that keeps every byte Sluice sends: what reached Redis is counted.
    host, port = redis_server.removeprefix("redis://").split("/")[0].split(":")
    proxy = HoldingProxy(host, int(port))
    breaker = CircuitBreaker(failure_threshold=3, clock=ManualClock().now)  # no cool-down ends
    backend = RedisBackend(
        connect(f"redis://127.0.0.1:{proxy.port}", timeout_s=TIMEOUT_S),
        key_prefix=f"burst-{uuid.uuid4().hex}:",
        breaker=breaker,
    )
    snapshot = Snapshot(load_text(POLICY, "policy.yaml"))
    limiter = RateLimiter(
        lambda: snapshot, backend, SystemClock(), LimiterSettings(failure_mode=mode)
    )

    def script_calls() -> int:
        return proxy.held().count(b"EVALSHA")

    async def scenario() -> None:
        assert (await answer(limiter, "warm"))[0] == "OK"  # connected, the script loaded
        assert breaker.state == "closed"
        proxy.hold()
        # Four waves of 25 concurrent callers. Each of the first three comes while the call
        # before it hangs (the first while the circuit is closed and Redis answered last),
        # so it queues and leaves as one call when that one times out; the fourth queues
        # behind the third call, whose failure opens the circuit.
        calls: list[asyncio.Future[tuple[str, float]]] = []
        for wave in range(4):
            calls += [asyncio.ensure_future(answer(limiter, f"{wave}-{n}")) for n in range(25)]
            if wave < 3:
                await until(lambda: script_calls() > wave, f"call {wave + 1} to reach Redis")  # noqa: B023
        answers = await asyncio.gather(*calls)
        # Each caller has the failure mode's answer within the backend's budget of three
        # timeouts (pool wait, connect, read), however many wait with it.
        assert {verdict for verdict, _ in answers} == {failed}
        assert max(elapsed for _, elapsed in answers) < 3 * TIMEOUT_S + 0.05
        # A hung Redis was sent one call at a time, one per batch of callers, and none once
        # the circuit opened (after the threshold's worth of failed calls): 3 for 100 callers.
        assert script_calls() == breaker.failure_threshold
        assert breaker.state == "open"
        verdict, elapsed = await answer(limiter, "after")
        assert verdict == failed and elapsed < 0.005
        assert script_calls() == breaker.failure_threshold
        await backend.close()

    try:
        asyncio.run(scenario())
    finally:
        proxy.close()


def test_the_over_limit_cache_keeps_a_flood_off_redis(redis_server: str) -> None:
    nodes = data_nodes(redis_server)
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    # Two instances, as two Sluice processes would be, sharing one counter.
    instances = [
        OverLimitCache(RedisBackend(connect(redis_server, timeout_s=2), key_prefix=prefix))
        for _ in range(2)
    ]
    hit = Hit(("d", "user", "flood"), (Limit(50, 3600, ALGORITHMS["fixed_window"]),), 1)
    requests = 2000

    async def flood() -> int:
        await instances[0].apply(
            [Hit(("warm",), (Limit(1, 1, ALGORITHMS["fixed_window"]),), 0)], time.time()
        )
        reset_stats(nodes)
        admitted = 0
        for n in range(requests):
            [outcomes] = await instances[n % 2].apply([hit], time.time())
            admitted += outcomes[0].allowed
        for instance in instances:
            await instance.close()
        return admitted

    assert asyncio.run(flood()) == 50
    calls = evalsha_calls(nodes)
    print(f"\nover-limit flood: {requests} requests, {calls} script calls")
    assert calls <= requests * 0.1
