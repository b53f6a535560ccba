"""The config database, which is also the usage store, really stopped, and really hung, under
load.

A private PostgreSQL cluster (``tests/faults/database.py``) serves ``sluice serve`` processes
while the test sends steady gRPC traffic over six rules, one per algorithm, and checks every
decision, before, during and after the fault, against what the policy says.

- Stopped for 60 s of real time with ``pg_ctl stop -m immediate`` (connections drop
  mid-transaction, as in a crash), then started again. Measured: how soon the servers see the
  database again, how soon a policy published after recovery is live on both, and whether
  the usage counted through the outage reached the store exactly once.
- Hung (every PostgreSQL process SIGSTOPped: connections open, nothing answers, as with a
  frozen host or a partition that drops packets). Measured: how soon the servers report it,
  and that a server told to stop meanwhile still exits at once.

Reproduce the numbers: ``.venv/bin/python -m pytest -s tests/faults/test_database_faults.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.policies.store import PolicyStore
from sluice.usage.store import MINUTE, SECOND, UsageStore
from tests.faults.database import PrivatePostgres, private_postgres
from tests.support.processes import SluiceProcess, sluice_serve

OUTAGE_S = 60.0  # real time, by design: what operators mean by "the database was down a minute"
TOKEN = "fault-token"
DOMAIN = "faults"

# descriptor key -> (algorithm, requests_per_unit per hour, burst). Every rule admits a fresh
# key's first `cap` hits in a row (cap = burst for the buckets and GCRA, else the limit) and
# refuses the rest: an hour is long enough that nothing refills within one round.
RULES: dict[str, tuple[str, int, int | None]] = {
    "fixed": ("fixed_window", 3, None),
    "log": ("sliding_window_log", 4, None),
    "counter": ("sliding_window_counter", 5, None),
    "tokens": ("token_bucket", 3, 3),
    "gcra": ("gcra", 4, 4),
    "leaky": ("leaky_bucket", 2, 2),
}
HITS_PER_ROUND = 7  # the largest cap plus two refusals
WORKERS_PER_SERVER = 2
PACE_S = 0.04  # between one worker's calls: steady, moderate load on a 2-core machine
PROBE_V1 = """domain: probe
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
"""
PROBE_V2 = PROBE_V1.replace("requests_per_unit: 1}", "requests_per_unit: 100}")


def policy() -> str:
    lines = [f"domain: {DOMAIN}", "descriptors:"]
    for key, (algorithm, limit, burst) in RULES.items():
        fields = f"unit: hour, requests_per_unit: {limit}, algorithm: {algorithm}"
        fields += f", burst: {burst}" if burst is not None else ""
        lines += [f"  - key: {key}", f"    rate_limit: {{{fields}}}"]
    return "\n".join(lines) + "\n"


def cap(key: str) -> int:
    _, limit, burst = RULES[key]
    return burst if burst is not None else limit


def request(value: str) -> rls_pb2.RateLimitRequest:
    return rls_pb2.RateLimitRequest(
        domain=DOMAIN,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)]
            )
            for key in RULES
        ],
    )


OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT


def expected(key: str, hit: int) -> tuple[int, int, int]:
    """(code, limit_remaining, requests_per_unit) of a fresh key's ``hit``-th hit in a row."""
    allowed = hit <= cap(key)
    return (OK if allowed else OVER, cap(key) - hit if allowed else 0, RULES[key][1])


@dataclass
class Load:
    """What the clients sent and got, by phase ("before", "outage", "after")."""

    phase: str = "before"
    calls: Counter[str] = field(default_factory=Counter)
    over_limit_answers: Counter[str] = field(default_factory=Counter)
    max_latency_s: dict[str, float] = field(default_factory=dict)
    hits: Counter[tuple[str, str]] = field(default_factory=Counter)  # (rule id, kind)
    errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    window_crossings: int = 0  # rounds whose fixed window rolled over (fixed rule not checked)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    async def worker(self, name: str, stub: rls_pb2_grpc.RateLimitServiceStub) -> None:
        rounds = 0
        while not self.stopping.is_set():
            rounds += 1
            value = f"{name}-{rounds}"
            hour = int(time.time() // 3600)
            answers = []
            for _ in range(HITS_PER_ROUND):
                phase, started = self.phase, time.monotonic()
                try:
                    response = await stub.ShouldRateLimit(request(value), timeout=5)
                except grpc.aio.AioRpcError as exc:
                    self.errors.append(f"{phase} {name}: {exc.code().name} {exc.details()}")
                    return  # an answer is missing: this worker's counts can't be exact
                latency = time.monotonic() - started
                self.calls[phase] += 1
                self.max_latency_s[phase] = max(self.max_latency_s.get(phase, 0.0), latency)
                if response.overall_code == OVER:
                    self.over_limit_answers[phase] += 1
                for key, status in zip(RULES, response.statuses, strict=True):
                    kind = "allowed" if status.code == OK else "over_limit"
                    self.hits[(f"{DOMAIN}.{key}", kind)] += 1
                answers.append((phase, response))
                await asyncio.sleep(PACE_S)
            self.check(value, answers, crossed=int(time.time() // 3600) != hour)

    def check(self, value: str, answers: list[Any], *, crossed: bool) -> None:
        self.window_crossings += crossed
        for hit, (phase, response) in enumerate(answers, start=1):
            got, want = [], []
            for key, status in zip(RULES, response.statuses, strict=True):
                if key == "fixed" and crossed:
                    continue  # a new hour's window starts counting afresh
                got.append(
                    (status.code, status.limit_remaining, status.current_limit.requests_per_unit)
                )
                want.append(expected(key, hit))
            any_over = any(s.code == OVER for s in response.statuses)
            if got != want or response.overall_code != (OVER if any_over else OK):
                self.mismatches.append(f"{phase} {value} hit {hit}: got {got}, want {want}")


async def get_json(server: SluiceProcess, path: str) -> dict[str, Any]:
    def fetch() -> dict[str, Any]:
        with urllib.request.urlopen(server.http_url + path, timeout=5) as response:
            return json.loads(response.read())

    return await asyncio.to_thread(fetch)


async def rlconfig(server: SluiceProcess) -> str:
    def fetch() -> str:
        with urllib.request.urlopen(server.http_url + "/rlconfig", timeout=5) as response:
            return response.read().decode()

    return await asyncio.to_thread(fetch)


async def put_policy(server: SluiceProcess, domain: str, body: dict[str, Any]) -> int:
    def send() -> int:
        req = urllib.request.Request(
            f"{server.http_url}/api/v1/domains/{domain}",
            method="PUT",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=15) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    return await asyncio.to_thread(send)


async def until(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
) -> float:
    """Poll ``predicate`` (plain or async); seconds it took. A readiness wait, not a race fix."""
    started = time.monotonic()
    while not await _value(predicate()):
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)
    return time.monotonic() - started


async def probe_limit(stub: rls_pb2_grpc.RateLimitServiceStub, user: str) -> int:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)
    response = await stub.ShouldRateLimit(
        rls_pb2.RateLimitRequest(
            domain="probe", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
        ),
        timeout=5,
    )
    return response.statuses[0].current_limit.requests_per_unit


@dataclass
class Outage:
    detected_s: float = 0.0
    flush_failures: list[int] = field(default_factory=list)
    database_errors: list[int] = field(default_factory=list)
    write_during_outage: int = 0
    database_up_s: float = 0.0
    usage_up_s: float = 0.0
    publish_live_s: float = 0.0


async def scenario(pg: PrivatePostgres, servers: list[SluiceProcess], load: Load) -> Outage:
    outage = Outage()
    channels = [grpc.aio.insecure_channel(s.grpc_target) for s in servers]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
    workers = [
        asyncio.ensure_future(load.worker(f"s{i}w{w}", stub))
        for i, stub in enumerate(stubs)
        for w in range(WORKERS_PER_SERVER)
    ]
    try:
        # Steady load, and usage reaching the store, before anything breaks.
        await until(lambda: load.calls["before"] >= 100, 30, "load before the outage")
        rules_before = [await rlconfig(s) for s in servers]

        await asyncio.to_thread(pg.stop)
        down = time.monotonic()
        load.phase = "outage"

        async def both_see_it_down() -> bool:
            for s in servers:
                status = await get_json(s, "/status")
                if status["config"]["database"] != "unreachable":
                    return False
                if status["usage"]["store"] != "unreachable":
                    return False
            return True

        outage.detected_s = await until(both_see_it_down, 10, "the servers to see the outage")
        # A write during the outage is refused cleanly, and changes nothing.
        outage.write_during_outage = await put_policy(
            servers[0], "probe", {"document": PROBE_V2, "base_version": 1}
        )
        while time.monotonic() - down < OUTAGE_S:
            for s in servers:
                status = await get_json(s, "/status")
                assert status["serving"] is True
                assert status["config"]["database"] == "unreachable", status
                assert status["config"]["version"] == "faults@v1,probe@v1", status
                assert status["usage"]["store"] == "unreachable", status
            await asyncio.sleep(1.0)
        for s in servers:
            status = await get_json(s, "/status")
            outage.flush_failures.append(status["usage"]["flush_failures"])
            outage.database_errors.append(status["config"]["database_errors"])
        assert [await rlconfig(s) for s in servers] == rules_before

        await asyncio.to_thread(pg.start)
        up = time.monotonic()
        load.phase = "after"

        async def database_up() -> bool:
            statuses = [await get_json(s, "/status") for s in servers]
            return all(st["config"]["database"] == "up" for st in statuses)

        async def usage_up() -> bool:
            statuses = [await get_json(s, "/status") for s in servers]
            return all(st["usage"]["store"] == "up" for st in statuses)

        await until(database_up, 30, "the servers to see the database again")
        outage.database_up_s = time.monotonic() - up
        await until(usage_up, 30, "usage flushes to succeed again")
        outage.usage_up_s = time.monotonic() - up

        published = time.monotonic()
        code = await put_policy(servers[0], "probe", {"document": PROBE_V2, "base_version": 1})
        assert code == 200, code
        users = iter(range(10**6))

        async def live_on_both() -> bool:
            limits = [await probe_limit(stub, f"probe-{next(users)}") for stub in stubs]
            return limits == [100, 100]

        await until(live_on_both, 30, "the new policy on both servers", interval_s=0.01)
        outage.publish_live_s = time.monotonic() - published
        calls_after = load.calls["after"]
        await until(lambda: load.calls["after"] >= calls_after + 100, 30, "load after")
    finally:
        load.stopping.set()
        await asyncio.gather(*workers, return_exceptions=True)
        for channel in channels:
            await channel.close()
    return outage


async def _value(result: bool | Awaitable[bool]) -> bool:
    return await result if inspect.isawaitable(result) else result


def store_totals(url: str) -> dict[int, Counter[tuple[str, str]]]:
    """Per resolution: (rule id, kind) -> hits, summed over every bucket in the store."""
    out: dict[int, Counter[tuple[str, str]]] = {}
    with PolicyStore(url) as store:
        usage = UsageStore(store.database)
        for resolution in (SECOND, MINUTE):
            totals: Counter[tuple[str, str]] = Counter()
            series = usage.series(f"{DOMAIN}.", since_s=0, resolution_s=resolution)
            for rule, points in series.items():
                totals[(rule, "allowed")] += sum(p.allowed for p in points)
                totals[(rule, "over_limit")] += sum(p.over_limit for p in points)
            out[resolution] = +totals
    return out


def serve_two(stack: ExitStack, tmp_path: Path, url: str) -> list[SluiceProcess]:
    """Two servers on ``url``; the first imports the policies as it starts."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "faults.yaml").write_text(policy())
    (policies / "probe.yaml").write_text(PROBE_V1)
    servers = []
    for name in ("a", "b"):
        workdir = tmp_path / name
        workdir.mkdir()
        args = ["--api-token", TOKEN, "--snapshot-cache", str(workdir / "cache.json")]
        config = policies if name == "a" else None
        servers.append(
            stack.enter_context(
                sluice_serve(workdir, database_url=url, config=config, extra_args=args)
            )
        )
    return servers


def describe(load: Load) -> str:
    return (
        f"decisions: {dict(load.calls)} (over-limit answers {dict(load.over_limit_answers)}), "
        f"checked against the policy, mismatches {len(load.mismatches)}, errors "
        f"{len(load.errors)}, rounds across an hour edge {load.window_crossings}"
        f"\nslowest answer by phase: "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in load.max_latency_s.items())
    )


def describe_usage(sent: Counter[tuple[str, str]], stored: dict[int, Counter]) -> str:
    return (
        f"usage hits sent {sum(sent.values())}, in the store {sum(stored[SECOND].values())} "
        f"(per second) / {sum(stored[MINUTE].values())} (per minute); by rule: "
        + ", ".join(f"{rule} {kind} {n}" for (rule, kind), n in sorted(sent.items()))
    )


def test_config_database_stopped_for_60s_changes_no_decision_and_recovers(tmp_path: Path) -> None:
    load = Load()
    with private_postgres() as pg, ExitStack() as stack:
        url = pg.create_database("sluice")
        servers = serve_two(stack, tmp_path, url)
        outage = asyncio.run(scenario(pg, servers, load))
        exit_codes = [s.terminate() for s in servers]  # the final flush happens on the way out
        logs = [s.log() for s in servers]
        stored = store_totals(url)

    sent = +load.hits
    print(
        "\n" + describe(load) + f"\noutage {OUTAGE_S:.0f} s: seen by both servers after "
        f"{outage.detected_s:.2f} s; usage flush failures {outage.flush_failures}, config poll "
        f"errors {outage.database_errors}; API write during it -> HTTP "
        f"{outage.write_during_outage}"
        f"\nrecovery: database up on both after {outage.database_up_s:.2f} s, usage flushing "
        f"after {outage.usage_up_s:.2f} s; a policy published after recovery live on both "
        f"{outage.publish_live_s:.2f} s after the publish\n" + describe_usage(sent, stored)
    )
    assert load.errors == []
    assert load.mismatches == [], load.mismatches[:10]
    assert load.calls["outage"] >= 1000  # the load really ran through the outage
    assert load.over_limit_answers["outage"] > 0
    assert outage.write_during_outage == 503
    assert all(n >= OUTAGE_S / 2 for n in outage.flush_failures)  # one failed flush a second
    assert all(n > 0 for n in outage.database_errors)
    assert outage.database_up_s < 5
    assert outage.usage_up_s < 5
    assert outage.publish_live_s < 3
    assert exit_codes == [0, 0]
    for log in logs:
        assert "config database unreachable" in log
        assert "config database reachable again" in log
        assert "usage store unreachable" in log
        assert "usage store reachable again" in log
    # Nothing lost, nothing counted twice: the store holds exactly what the clients caused.
    assert stored[SECOND] == sent
    assert stored[MINUTE] == sent


HANG_TIMEOUT_S = 5.0  # after this long without an answer the servers call the database down


@dataclass
class Hang:
    detected_s: float = 0.0
    database_error: str = ""
    stop_exit_code: int | None = None
    stop_s: float = 0.0
    frozen_s: float = 0.0
    database_up_s: float = 0.0
    usage_up_s: float = 0.0


async def hang_scenario(
    pg: PrivatePostgres, loaded: SluiceProcess, stopped: SluiceProcess, load: Load
) -> Hang:
    hang = Hang()
    channel = grpc.aio.insecure_channel(loaded.grpc_target)
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    workers = [
        asyncio.ensure_future(load.worker(f"w{w}", stub)) for w in range(2 * WORKERS_PER_SERVER)
    ]
    try:
        await until(lambda: load.calls["before"] >= 100, 30, "load before the hang")
        await asyncio.to_thread(pg.freeze)
        frozen = time.monotonic()
        load.phase = "outage"

        async def reported() -> bool:
            a, b = await get_json(loaded, "/status"), await get_json(stopped, "/status")
            hang.database_error = a["config"]["database_error"]
            return (
                a["config"]["database"] == "unreachable"
                and a["usage"]["store"] == "unreachable"
                and b["config"]["database"] == "unreachable"
            )

        hang.detected_s = await until(reported, 4 * HANG_TIMEOUT_S, "the hang to be reported")

        # A server told to stop while its config poll is stuck in a query exits regardless.
        signalled = time.monotonic()
        stopped.process.send_signal(signal.SIGTERM)
        hang.stop_exit_code = await asyncio.to_thread(stopped.process.wait, 30)
        hang.stop_s = time.monotonic() - signalled

        await asyncio.to_thread(pg.thaw)
        thawed = time.monotonic()
        hang.frozen_s = thawed - frozen
        load.phase = "after"

        async def database_up() -> bool:
            return (await get_json(loaded, "/status"))["config"]["database"] == "up"

        async def usage_up() -> bool:
            return (await get_json(loaded, "/status"))["usage"]["store"] == "up"

        await until(database_up, 30, "the database to be seen again")
        hang.database_up_s = time.monotonic() - thawed
        await until(usage_up, 30, "usage flushes to succeed again")
        hang.usage_up_s = time.monotonic() - thawed
        calls_after = load.calls["after"]
        await until(lambda: load.calls["after"] >= calls_after + 100, 30, "load after")
    finally:
        await asyncio.to_thread(pg.thaw)
        load.stopping.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await channel.close()
    return hang


def test_a_hung_database_changes_no_decision_is_reported_and_never_blocks_shutdown(
    tmp_path: Path,
) -> None:
    load = Load()
    with private_postgres() as pg, ExitStack() as stack:
        url = pg.create_database("sluice")
        loaded, stopped = serve_two(stack, tmp_path, url)
        hang = asyncio.run(hang_scenario(pg, loaded, stopped, load))
        exit_code = loaded.terminate()
        log = loaded.log()
        stored = store_totals(url)

    sent = +load.hits
    print(
        "\n" + describe(load) + f"\nhung {hang.frozen_s:.1f} s: reported by both servers after "
        f"{hang.detected_s:.2f} s ({hang.database_error!r}); a server sent SIGTERM during it "
        f"exited {hang.stop_exit_code} after {hang.stop_s:.2f} s"
        f"\nthawed: database up after {hang.database_up_s:.2f} s, usage flushing after "
        f"{hang.usage_up_s:.2f} s\n" + describe_usage(sent, stored)
    )
    assert load.errors == []
    assert load.mismatches == [], load.mismatches[:10]
    assert load.calls["outage"] >= 100
    assert hang.detected_s < 2 * HANG_TIMEOUT_S
    assert hang.database_error == f"config database: no answer within {HANG_TIMEOUT_S:g}s"
    assert hang.stop_exit_code == 0
    assert hang.stop_s < 5
    assert hang.database_up_s < 5
    assert hang.usage_up_s < 5
    assert exit_code == 0
    assert "usage store: no answer within" in log and "usage store reachable again" in log
    # The send that hung was waited for, not repeated: the store holds each hit once.
    assert stored[SECOND] == sent
    assert stored[MINUTE] == sent
