"""Redis faults under a steady gRPC load, with real processes: a `sluice serve` subprocess,
`redis-server` processes killed with SIGKILL, and concurrent ShouldRateLimit calls with a
client deadline.

* A standalone Redis killed mid-load: in each failure mode every call gets the mode's answer
  within its deadline; when Redis is back on its port, decisions resume within 2 s with no
  restart of Sluice, and no fixed window after that admits more than its limit.
* A master of a 3-master, 3-replica Cluster killed mid-load: its replica takes over and
  decisions continue; the other masters' counters are decided until the cluster itself
  reports it is down; the window of errors is measured.
* The master of a Sentinel deployment (one replica, three Sentinels) killed mid-load: the
  Sentinels promote the replica, Sluice finds it through them with no restart, and decides
  again within 2 s of the promotion; the window of errors is measured.
* What the Cluster test found, each fixed in the Redis backend: calls fanned out while
  redis-py's cluster client (re)learns the topology failed, and a call could take as long as
  redis-py's own sleeps and refreshes; now each answer keeps a budget.

Run with ``-s`` to see the measured numbers (they feed docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.crc import key_slot

from sluice.algorithms import ALGORITHMS, Limit
from sluice.backends import Hit
from sluice.backends.redis.backend import RedisBackend
from sluice.backends.redis.connect import connect
from sluice.backends.redis.keys import KeyNamer
from sluice.errors import BackendUnavailableError
from tests.faults.load import Answer, SteadyLoad, Stream, kinds, window_counts
from tests.faults.redis_cluster import NODE_TIMEOUT_MS, ReplicatedCluster
from tests.faults.redis_sentinel import DOWN_AFTER_MS, ReplicatedSentinel
from tests.support.processes import SluiceProcess, sluice_serve
from tests.support.redis_servers import RedisProcess

DOMAIN = "faults"
LIMIT = 10  # per one-second fixed window, on the "limited" stream (~50 calls per window)
# Redis round-trip timeout of the servers under test: 500 ms rather than the default 100, so
# that a busy machine's scheduling hiccup is not taken for a Redis fault (a killed Redis
# refuses at once; the timeout matters only to hangs, tested in tests/integration). Sluice's
# answer budget is three of them; the client's deadline on every call is above that.
REDIS_TIMEOUT_MS = 500
DEADLINE_S = 2.0
PREFIX = "faults:"
POLICY = f"""
domain: {DOMAIN}
descriptors:
  - key: probe
    rate_limit: {{unit: second, requests_per_unit: 1000000}}
  - key: limited
    rate_limit: {{unit: second, requests_per_unit: {LIMIT}}}
"""
STEADY_S = 1.0  # load before the fault
OUTAGE_S = 1.5  # how long the standalone Redis stays dead
AFTER_S = 3.2  # load after recovery: at least two whole windows
RECOVERY_BOUND_S = 2.0
# Cluster: the replica is promoted about 2-2.5 s after the kill (node timeout 1 s for the
# failure report, a majority of masters to agree, 0.5-1 s election delay). Sluice follows
# within a breaker cool-down (0.5 s: the dead master's next probe fails, redis-py refreshes
# its slot table, which names the replica), and the masters that answered CLUSTERDOWN meanwhile
# within their own cool-down; plus a stalled call's wait. Bound: 2 s after the promotion.
FOLLOW_BOUND_S = 2.0
# Every refresh of redis-py's slot table also re-reads Redis's command table (COMMAND, ~100 KB
# parsed in Python), holding Sluice's event loop for 0.1-0.3 s, longer on a busy machine; calls
# queued meanwhile may run out of their answer budget (1.5 s). A longer deadline, then.
CLUSTER_DEADLINE_S = 3.0


# The load of the standalone and Sentinel tests: counters spread over values, and one counter
# over its limit in every window.
STEADY_STREAMS = (
    Stream("probe", "probe", tuple(f"p{n}" for n in range(8)), rate_per_s=60, workers=3),
    Stream("limited", "limited", ("hot",), rate_per_s=60, workers=3, gated=True),
)


def _serve(tmp_path: Path, url: str, mode: str):
    config = tmp_path / "policy.yaml"
    config.write_text(POLICY)
    args = ["--backend", "redis", "--redis-url", url, "--redis-failure-mode", mode]
    args += ["--redis-key-prefix", PREFIX, "--redis-timeout-ms", str(REDIS_TIMEOUT_MS)]
    return sluice_serve(tmp_path, config=config, extra_args=args)


def _failure_answer(mode: str, a: Answer) -> bool:
    """The answer the failure mode gives when Redis cannot be asked."""
    if mode == "allow":
        return a.kind == "OK" and not a.has_limit
    if mode == "deny":
        return a.kind == "OVER_LIMIT" and not a.decided
    return a.kind == "UNAVAILABLE" and "Redis" in a.details


def _check_answered_in_time(
    answers: list[Answer], allowed: set[str], deadline_s: float = DEADLINE_S
) -> None:
    strays = [a for a in answers if a.kind not in allowed]
    assert not strays, f"{len(strays)} calls got no answer of the right kind, e.g. {strays[:3]}"
    late = [a for a in answers if a.latency_s >= deadline_s]
    assert not late, f"{len(late)} answers came after the deadline, e.g. {late[:3]}"


def _check_windows(answers: list[Answer], first: float, last: float) -> dict[int, tuple]:
    """Every whole window in [first, last) admitted exactly LIMIT of the limited stream."""
    counts = window_counts([a for a in answers if a.stream == "limited"], first, last)
    assert len(counts) >= 2, f"too few whole windows to judge: {counts}"
    for w, (surely, at_most) in counts.items():
        assert surely <= LIMIT <= at_most, f"window {w}: {surely}..{at_most} admitted"
    return counts


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


# --- a standalone Redis killed and restarted -------------------------------------------------


@dataclass
class Outage:
    answers: list[Answer]
    killing: float  # wall clock: just before SIGKILL
    killed: float  # Redis is dead (SIGKILL delivered, the process reaped)
    restarting: float  # the restart begins
    up: float  # the restarted Redis answers PING
    recovered: float  # the first decision from Redis since the restart arrived
    stopped: float  # the load ended


async def _kill_and_restart(server: SluiceProcess, redis: RedisProcess) -> Outage:
    async with SteadyLoad(
        server.grpc_target, STEADY_STREAMS, domain=DOMAIN, deadline_s=DEADLINE_S
    ) as load:
        await asyncio.sleep(STEADY_S)
        killing = time.time()
        await asyncio.to_thread(redis.kill)
        killed = time.time()
        await asyncio.sleep(OUTAGE_S)
        restarting = time.time()
        await asyncio.to_thread(redis.start)
        up = time.time()

        def first_decision() -> float | None:
            decided = [a.ended for a in load.since(restarting, "probe") if a.decided]
            return min(decided, default=None)

        while (recovered := first_decision()) is None:
            assert time.time() - restarting < RECOVERY_BOUND_S + 1, "no recovery"
            await asyncio.sleep(0.02)
        await asyncio.sleep(max(0.0, recovered + AFTER_S - time.time()))
        stopped = time.time()
    return Outage(load.answers, killing, killed, restarting, up, recovered, stopped)


@pytest.mark.parametrize("mode", ["allow", "deny", "error"])
def test_redis_killed_during_steady_load(
    private_redis: RedisProcess, tmp_path: Path, mode: str
) -> None:
    with _serve(tmp_path, private_redis.url, mode) as server:
        run = asyncio.run(_kill_and_restart(server, private_redis))
        assert server.process.poll() is None, "Sluice must ride out the outage running"
    answers = run.answers

    # Whatever happens, every call is answered within its deadline with the mode's kinds.
    _check_answered_in_time(
        answers, {"OK", "OVER_LIMIT"} | ({"UNAVAILABLE"} if mode == "error" else set())
    )
    before = [a for a in answers if a.ended < run.killing]
    assert before and all(a.decided for a in before), "not deciding from Redis before the kill"

    # While Redis is dead: the failure mode's answer. The only exception is the local
    # over-limit cache refusing the limited counter until its window ends, as Redis would.
    outage = [a for a in answers if a.started >= run.killed and a.ended <= run.restarting]
    cached_until = math.floor(run.killed) + 1
    wrong = [
        a
        for a in outage
        if not _failure_answer(mode, a)
        and not (a.stream == "limited" and a.decided and a.kind == "OVER_LIMIT")
    ]
    assert not wrong, f"answers during the outage not the {mode} mode's: {wrong[:3]}"
    cached = [a for a in outage if not _failure_answer(mode, a)]
    assert all(a.started < cached_until for a in cached), "refused from a stale cache entry"
    assert len(outage) > 50, f"too little load during the outage: {len(outage)} calls"

    # Back: decisions from Redis again within 2 s of the restart, and only those from then.
    recovery_s = run.recovered - run.restarting
    assert recovery_s <= RECOVERY_BOUND_S, f"recovered {recovery_s:.2f}s after the restart"
    after = [a for a in answers if a.started >= run.recovered]
    assert after and all(a.decided for a in after), [a for a in after if not a.decided][:3]
    windows = _check_windows(answers, run.recovered, run.stopped)

    print(
        f"\nRedis killed, failure mode {mode}: {len(answers)} calls in "
        f"{answers[-1].ended - answers[0].started:.1f}s; "
        f"outage {run.restarting - run.killed:.1f}s: {len(outage)} answers {kinds(outage)} "
        f"(of which {len(cached)} refused by the local over-limit cache), "
        f"max latency {_ms(max(a.latency_s for a in outage))} "
        f"(whole run {_ms(max(a.latency_s for a in answers))}, deadline {_ms(DEADLINE_S)}); "
        f"Redis back (PING) {run.up - run.restarting:.2f}s after the restart began, "
        f"decisions resumed {recovery_s:.2f}s after it; "
        f"admitted per window after ({LIMIT} allowed): "
        + ", ".join(f"{s}" if s == m else f"{s}..{m}" for s, m in windows.values())
    )


# --- a Cluster master killed ------------------------------------------------------------------


def _slot(key: str, value: str) -> int:
    return key_slot(KeyNamer(PREFIX).base((DOMAIN, key, value)).encode())


def _values_by_master(cluster: ReplicatedCluster, per_master: int) -> dict[int, list[str]]:
    """Descriptor values of the probe stream whose counters live on each master."""
    ranges = {n.port: n.slots for n in cluster.view() if n.master}
    owners: dict[int, list[str]] = {port: [] for port in ranges}
    n = 0
    while any(len(values) < per_master for values in owners.values()):
        value, n = f"u{n}", n + 1
        slot = _slot("probe", value)
        port = next(p for p, slots in ranges.items() if any(lo <= slot <= hi for lo, hi in slots))
        if len(owners[port]) < per_master:
            owners[port].append(value)
    return owners


@dataclass
class Failover:
    answers: list[Answer]
    killing: float  # just before SIGKILL
    killed: float
    down: float  # a surviving master first said cluster_state:fail
    promoted: float  # the replica serves the dead master's slots, as the cluster says
    up: float  # that master said cluster_state:ok again
    stopped: float


async def _kill_master(
    server: SluiceProcess,
    cluster: ReplicatedCluster,
    victim: int,
    replica: int,
    witness: int,
    values: list[str],
) -> Failover:
    streams = [
        Stream("probe", "probe", tuple(values), rate_per_s=90, workers=3),
        Stream("limited", "limited", ("hot",), rate_per_s=60, workers=3, gated=True),
    ]
    seen: dict[str, float] = {}

    def observe() -> bool:
        """Note when the witness (a surviving master) says the cluster is down and up again,
        and when the replica has taken over; True once all three were seen."""
        now = time.time()
        ok = cluster.state(witness) == "ok"
        if not ok:
            seen.setdefault("down", now)
        elif "down" in seen:
            seen.setdefault("up", now)
        view = {n.port: n for n in cluster.view(replica)}
        if view[replica].master and view[replica].slots and view[victim].failed:
            seen.setdefault("promoted", now)
        return len(seen) == 3

    async with SteadyLoad(
        server.grpc_target, streams, domain=DOMAIN, deadline_s=CLUSTER_DEADLINE_S
    ) as load:
        await asyncio.sleep(STEADY_S)
        killing = time.time()
        await asyncio.to_thread(cluster.node(victim).kill)
        killed = time.time()
        while not await asyncio.to_thread(observe):
            assert time.time() - killed < 10 * NODE_TIMEOUT_MS / 1000, f"no failover: {seen}"
            await asyncio.sleep(0.02)
        await asyncio.sleep(max(0.0, seen["promoted"] + FOLLOW_BOUND_S + 3.2 - time.time()))
        stopped = time.time()
    return Failover(
        load.answers, killing, killed, seen["down"], seen["promoted"], seen["up"], stopped
    )


def test_cluster_master_killed_during_steady_load(
    replicated_redis_cluster: ReplicatedCluster, tmp_path: Path
) -> None:
    cluster = replicated_redis_cluster
    # The victim is the master of the limited counter; the probe covers every master.
    victim = cluster.slot_owner(_slot("limited", "hot"))
    replica = cluster.replica_of(victim)
    values_by_master = _values_by_master(cluster, per_master=4)
    witness = next(port for port in values_by_master if port != victim)
    on_victim = set(values_by_master[victim])
    values = [v for vs in values_by_master.values() for v in vs]
    with _serve(tmp_path, cluster.url, "error") as server:
        run = asyncio.run(_kill_master(server, cluster, victim, replica, witness, values))
        assert server.process.poll() is None
    answers = run.answers

    # The replica took over: the surviving masters and it serve every slot.
    assert cluster.master_ports() == sorted(
        {p for p in values_by_master if p != victim} | {replica}
    )
    assert cluster.state(witness) == "ok"

    # Every call answered within its deadline: a decision, or UNAVAILABLE naming Redis.
    _check_answered_in_time(answers, {"OK", "OVER_LIMIT", "UNAVAILABLE"}, CLUSTER_DEADLINE_S)
    errors = [a for a in answers if not a.decided]
    assert all("Redis" in a.details for a in errors), errors[:3]
    assert not [a for a in answers if a.ended < run.killing and not a.decided]
    assert errors, "the kill went unnoticed: is the load reaching the victim?"

    # The other masters' counters are decided until the cluster itself says it is down
    # (cluster_state:fail, with full coverage required, from the failure report to the
    # promotion): a dead master fails its own slots, not everyone's. (A call stalled behind a
    # slot-table refresh until its answer budget ran out is slow, not refused: reported.)
    others = [a for a in errors if a.stream == "probe" and a.value not in on_victim]
    stalled = [a for a in errors if "no answer within" in a.details]
    early = [a for a in others if a.ended < run.down - 0.5 and a not in stalled]
    assert not early, f"other masters' calls failed before the cluster was down: {early[:3]}"

    # Decisions continue: nothing but decisions from FOLLOW_BOUND_S after the promotion.
    resumed_by = run.promoted + FOLLOW_BOUND_S
    late = [a for a in errors if a.started >= resumed_by]
    assert not late, f"errors {FOLLOW_BOUND_S}s after the promotion: {late[:3]}"
    after = [a for a in answers if a.started >= resumed_by]
    assert len(after) > 100 and all(a.decided for a in after)
    last_error = max(a.ended for a in errors)
    # A call whose caller was answered "unavailable" at the budget may still reach Redis
    # afterwards and count (never admitting more): judge the windows from one budget later.
    windows = _check_windows(answers, last_error + 3 * REDIS_TIMEOUT_MS / 1000, run.stopped)

    def span(some: list[Answer]) -> str:
        if not some:
            return "none"
        first, last = min(a.started for a in some), max(a.ended for a in some)
        return (
            f"{len(some)} from {first - run.killed:.2f}s to {last - run.killed:.2f}s "
            f"({last - first:.2f}s)"
        )

    on_dead = [a for a in errors if a.stream == "limited" or a.value in on_victim]
    print(
        f"\nCluster master killed (node timeout {NODE_TIMEOUT_MS} ms, failure mode error), "
        f"times after the kill: cluster down (cluster_state:fail) {run.down - run.killed:.2f}s, "
        f"replica promoted {run.promoted - run.killed:.2f}s, "
        f"cluster ok {run.up - run.killed:.2f}s; "
        f"errors {len(errors)} of {len(answers)} calls {kinds(errors)}, "
        f"last {last_error - run.promoted:+.2f}s from the promotion; "
        f"on the killed master's slots {span(on_dead)}; on the others {span(others)}; "
        f"{len(stalled)} of the errors ran out of the answer budget; "
        f"max latency {_ms(max(a.latency_s for a in answers))} "
        f"(deadline {_ms(CLUSTER_DEADLINE_S)}); "
        f"admitted per window after ({LIMIT} allowed): "
        + ", ".join(f"{s}" if s == m else f"{s}..{m}" for s, m in windows.values())
    )


# --- a Sentinel master killed -----------------------------------------------------------------


@dataclass
class SentinelFailover:
    answers: list[Answer]
    killing: float  # just before SIGKILL
    killed: float
    promoted: float  # a Sentinel names the replica as the master
    stopped: float


async def _kill_sentinel_master(
    server: SluiceProcess, deployment: ReplicatedSentinel
) -> SentinelFailover:
    async with SteadyLoad(
        server.grpc_target, STEADY_STREAMS, domain=DOMAIN, deadline_s=DEADLINE_S
    ) as load:
        await asyncio.sleep(STEADY_S)
        killing = time.time()
        await asyncio.to_thread(deployment.master.kill)
        killed = time.time()
        while await asyncio.to_thread(deployment.master_port) != deployment.replica.port:
            assert time.time() - killed < 20 * DOWN_AFTER_MS / 1000, "no failover"
            await asyncio.sleep(0.02)
        promoted = time.time()
        await asyncio.sleep(FOLLOW_BOUND_S + AFTER_S)
        stopped = time.time()
    return SentinelFailover(load.answers, killing, killed, promoted, stopped)


def test_sentinel_master_killed_during_steady_load(
    replicated_redis_sentinel: ReplicatedSentinel, tmp_path: Path
) -> None:
    deployment = replicated_redis_sentinel
    with _serve(tmp_path, deployment.url, "error") as server:
        run = asyncio.run(_kill_sentinel_master(server, deployment))
        assert server.process.poll() is None, "Sluice must follow the failover running"
    answers = run.answers
    assert deployment.role(deployment.replica) == "master"

    # Every call answered within its deadline: a decision, or UNAVAILABLE naming Redis.
    _check_answered_in_time(answers, {"OK", "OVER_LIMIT", "UNAVAILABLE"})
    before = [a for a in answers if a.ended < run.killing]
    assert before and all(a.decided for a in before), "not deciding from Redis before the kill"
    errors = [a for a in answers if not a.decided]
    assert errors, "the kill went unnoticed: is the load reaching Redis?"
    assert all(a.kind == "UNAVAILABLE" and "Redis" in a.details for a in errors), errors[:3]
    assert min(a.ended for a in errors) >= run.killing

    # Decisions from the new master, found through the Sentinels, within FOLLOW_BOUND_S.
    resumed_by = run.promoted + FOLLOW_BOUND_S
    late = [a for a in errors if a.started >= resumed_by]
    assert not late, f"errors {FOLLOW_BOUND_S}s after the promotion: {late[:3]}"
    after = [a for a in answers if a.started >= resumed_by]
    assert len(after) > 100 and all(a.decided for a in after)
    first_decision = min(a.ended for a in answers if a.started >= run.promoted and a.decided)
    # The new master holds what the old one had replicated; counts go on from there, and no
    # whole window after the last error admits more than the limit.
    last_error = max(a.ended for a in errors)
    windows = _check_windows(answers, last_error + 3 * REDIS_TIMEOUT_MS / 1000, run.stopped)

    print(
        f"\nSentinel master killed (down-after {DOWN_AFTER_MS} ms, 3 Sentinels, quorum 2, "
        f"failure mode error): replica promoted {run.promoted - run.killed:.2f}s after the "
        f"kill; errors {len(errors)} of {len(answers)} calls {kinds(errors)}, from "
        f"{min(a.started for a in errors) - run.killed:+.2f}s to "
        f"{last_error - run.killed:+.2f}s after the kill; first decision from the new master "
        f"{first_decision - run.promoted:+.2f}s after the promotion; "
        f"max latency {_ms(max(a.latency_s for a in answers))} (deadline {_ms(DEADLINE_S)}); "
        f"admitted per window after ({LIMIT} allowed): "
        + ", ".join(f"{s}" if s == m else f"{s}..{m}" for s, m in windows.values())
    )


# --- what the failover test found -------------------------------------------------------------


def test_a_cold_cluster_client_takes_concurrent_calls(redis_cluster: str) -> None:
    """redis-py's cluster client learns the topology on first use and again after it dropped
    every connection (it does on CLUSTERDOWN); calls fanned out meanwhile used to fail
    (ConnectionError, even AttributeError: INTERNAL for the client). Now none does."""
    client = connect(redis_cluster, timeout_s=2)
    backend = RedisBackend(client, key_prefix=f"{PREFIX}cold:")
    hits = [
        Hit((DOMAIN, "probe", f"v{n}"), (Limit(1_000_000, 1, ALGORITHMS["fixed_window"]),), 1)
        for n in range(48)
    ]

    async def wave() -> list:
        # One event-loop tick: one batch, one call per hash slot, all at once.
        return await asyncio.gather(
            *(backend.apply([hit], time.time()) for hit in hits), return_exceptions=True
        )

    async def scenario() -> tuple[list, list]:
        cold = await wave()
        await client.aclose()  # what redis-py itself does on CLUSTERDOWN
        dropped = await wave()
        await backend.close()
        return cold, dropped

    cold, dropped = asyncio.run(scenario())
    assert [r for r in cold + dropped if isinstance(r, BaseException)] == []
    assert backend.failures == 0


def test_a_hung_redis_is_answered_within_the_budget(private_redis: RedisProcess) -> None:
    """However long the client library takes inside a call, the caller has its answer (here:
    unavailable) when the answer budget runs out; the call itself is left to finish."""
    backend = RedisBackend(connect(private_redis.url, timeout_s=2), answer_timeout_s=0.2)
    hit = Hit((DOMAIN, "probe", "hung"), (Limit(10, 1, ALGORITHMS["fixed_window"]),), 1)

    async def scenario() -> list[float]:
        await backend.apply([hit], time.time())  # connected
        private_redis.freeze()
        elapsed = []
        for _ in range(3):
            start = time.perf_counter()
            with pytest.raises(BackendUnavailableError, match="no answer within 200 ms"):
                await backend.apply([hit], time.time())
            elapsed.append(time.perf_counter() - start)
        private_redis.thaw()
        await backend.close()
        return elapsed

    elapsed = asyncio.run(scenario())
    assert all(0.19 <= e < 0.5 for e in elapsed), elapsed
    assert backend.late_answers == 3
