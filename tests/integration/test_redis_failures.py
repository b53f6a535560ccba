"""A Redis that hangs or dies: every answer within the timeout in each failure mode, fail-fast
once the circuit opens, and correct decisions again soon after Redis comes back on its port,
without restarting anything. Also: the over-limit cache keeps a flood off Redis."""

from __future__ import annotations

import asyncio
import time
import uuid

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
        # So do many concurrent requests: none waits for more than the timeout.
        burst = await asyncio.gather(*(answer(limiter, run + "b") for _ in range(50)))
        assert max(elapsed for _, elapsed in burst) < 2 * TIMEOUT_S + 0.05

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
