"""Policy lifecycle across real processes: publish through the API, every server follows
within a second; stale edits, invalid versions and database outages change no decision."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy.engine import make_url

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.policies.store import PolicyStore
from tests.support.processes import SluiceProcess, run_sluice, sluice_serve, wait_until
from tests.support.tcp_proxy import TcpProxy

TOKEN = "test-token"
V1 = """domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
"""
V2 = V1.replace("requests_per_unit: 1}", "requests_per_unit: 100}")


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'config.db'}"
    return request.getfixturevalue("postgres_url")


def seed(database_url: str, tmp_path: Path, document: str = V1) -> None:
    (tmp_path / "seed.yaml").write_text(document)
    result = run_sluice(
        ["import", str(tmp_path / "seed.yaml"), "--database-url", database_url, "--author", "ops"]
    )
    assert result.returncode == 0, result.stderr


def serve(stack: ExitStack, tmp_path: Path, database_url: str, name: str) -> SluiceProcess:
    workdir = tmp_path / name
    workdir.mkdir()
    return stack.enter_context(
        sluice_serve(
            workdir,
            database_url=database_url,
            extra_args=["--api-token", TOKEN, "--snapshot-cache", str(workdir / "cache.json")],
        )
    )


def limit_for(server: SluiceProcess, user: str) -> int | None:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)
    request = rls_pb2.RateLimitRequest(
        domain="shop", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=2)
    status = response.statuses[0]
    return status.current_limit.requests_per_unit if status.HasField("current_limit") else None


def api(
    server: SluiceProcess, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        server.http_url + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def status(server: SluiceProcess) -> dict[str, Any]:
    with urllib.request.urlopen(server.http_url + "/status", timeout=5) as response:
        return json.loads(response.read())["config"]


POLL_INTERVAL_S = 0.25  # the servers' --config-poll-interval (the default)


def measured_poll_period_s(ticks: int = 4) -> float:
    """The actual period of an asyncio loop sleeping POLL_INTERVAL_S between steps (what the
    reloader's Periodic does), on this machine now: a busy machine wakes sleepers late."""

    async def period() -> float:
        start = time.monotonic()
        for _ in range(ticks):
            await asyncio.sleep(POLL_INTERVAL_S)
        return (time.monotonic() - start) / ticks

    return max(POLL_INTERVAL_S, asyncio.run(period()))


def propagation_budget_s(polls: int) -> float:
    """How long a change may take to reach every server: ``polls`` poll periods, each the
    period measured on this run. The servers are real processes on a machine others share,
    so the promise ("within a second" is four 0.25 s polls on an idle machine) is checked
    against the machine's own pace, not against a fixed number of wall-clock seconds."""
    budget = polls * measured_poll_period_s()
    print(f"\npropagation budget: {polls} polls = {budget:.3f}s")
    return budget


def seconds_until_both_serve(
    servers: list[SluiceProcess], limit: int, start: float, budget_s: float
) -> float:
    users = iter(range(10**6))
    wait_until(
        lambda: all(limit_for(s, f"probe-{next(users)}") == limit for s in servers),
        timeout_s=max(5, 2 * budget_s),
        what=f"every server to serve a limit of {limit}",
        interval_s=0.01,
    )
    elapsed = time.monotonic() - start
    print(f"every server serves a limit of {limit} after {elapsed:.3f}s")
    return elapsed


@pytest.mark.slow
def test_a_publish_through_the_api_reaches_every_server_within_a_second(
    database_url: str, tmp_path: Path
) -> None:
    seed(database_url, tmp_path)
    with ExitStack() as stack:
        a = serve(stack, tmp_path, database_url, "a")
        b = serve(stack, tmp_path, database_url, "b")
        assert limit_for(a, "x") == limit_for(b, "y") == 1

        budget = propagation_budget_s(polls=4)  # 1.0 s on an idle machine
        start = time.monotonic()
        code, body = api(
            a,
            "PUT",
            "/api/v1/domains/shop",
            {"document": V2, "base_version": 1, "comment": "raise"},
        )
        assert (code, body["version"]) == (200, 2), body
        elapsed = seconds_until_both_serve([a, b], 100, start, budget)
        assert elapsed < budget, f"took {elapsed:.2f}s, more than {budget:.2f}s"
        assert status(b)["version"] == "shop@v2"
        with urllib.request.urlopen(b.http_url + "/rlconfig", timeout=5) as response:
            assert response.read().decode() == (
                "version: shop@v2\n"
                "shop.user: unit=HOUR requests_per_unit=100 algorithm=fixed_window "
                "shadow_mode=false\n"
            )


def test_stale_edits_are_refused_and_rollback_restores_the_exact_rules(
    database_url: str, tmp_path: Path
) -> None:
    seed(database_url, tmp_path)
    with ExitStack() as stack:
        a = serve(stack, tmp_path, database_url, "a")
        _, v1 = api(a, "GET", "/api/v1/domains/shop")
        assert (
            api(
                a,
                "PUT",
                "/api/v1/domains/shop",
                {"document": V2, "base_version": 1, "author": "alice", "comment": "raise"},
            )[0]
            == 200
        )
        # Bob edits from the version he loaded before Alice published: refused, nothing lost.
        code, body = api(
            a,
            "PUT",
            "/api/v1/domains/shop",
            {"document": V1.replace(": 1}", ": 5}"), "base_version": 1, "author": "bob"},
        )
        assert code == 409
        assert body == {
            "error": "domain 'shop' is at version 2, not the expected 1; reload it and try again"
        }

        # Measured before the rollback: measuring takes four polls, time enough to reload.
        budget = propagation_budget_s(polls=4)  # 1.0 s on an idle machine
        code, body = api(
            a,
            "POST",
            "/api/v1/domains/shop/rollback",
            {"to_version": 1, "base_version": 2, "author": "carol", "comment": "too generous"},
        )
        assert (code, body["version"]) == (200, 3)
        _, v3 = api(a, "GET", "/api/v1/domains/shop")
        assert v3["document"] == v1["document"]
        assert v3["descriptors"] == v1["descriptors"]

        _, history = api(a, "GET", "/api/v1/domains/shop/history")
        trail = [
            (v["version"], v["author"], v["comment"], v["restored_from"])
            for v in history["versions"]
        ]
        assert trail == [
            (3, "carol", "too generous", 1),
            (2, "alice", "raise", None),
            (1, "ops", "", None),
        ]
        assert all(v["created_at"] for v in history["versions"])
        assert (
            "-    requests_per_unit: 1\n+    requests_per_unit: 100\n"
            in history["versions"][1]["diff"]
        )
        assert (
            "-    requests_per_unit: 100\n+    requests_per_unit: 1\n"
            in history["versions"][0]["diff"]
        )
        assert seconds_until_both_serve([a], 1, time.monotonic(), budget) < budget


def test_an_invalid_version_never_goes_live(database_url: str, tmp_path: Path) -> None:
    seed(database_url, tmp_path)
    with ExitStack() as stack:
        a = serve(stack, tmp_path, database_url, "a")
        bad = V1.replace("unit: hour", "unit: fortnight")
        code, body = api(a, "PUT", "/api/v1/domains/shop", {"document": bad, "base_version": 1})
        assert code == 400
        assert body == {
            "error": "invalid policy",
            "problems": ["document:4: invalid rate limit unit 'fortnight'"],
        }
        # A document that reaches the database another way (an older or newer Sluice, a
        # hand edit) is refused by the servers: the last good version keeps answering.
        with PolicyStore(database_url) as store:
            store.publish({"shop": bad}, author="manual", comment="hand edit")
        wait_until(lambda: status(a)["invalid_versions"] >= 1, 5, "the bad version to be seen")
        assert status(a)["version"] == "shop@v1"
        assert limit_for(a, "z") == 1
        assert "refused config version shop@v2" in a.log()


@pytest.mark.slow
def test_servers_ride_out_a_database_outage_and_catch_up(postgres_url: str, tmp_path: Path) -> None:
    seed(postgres_url, tmp_path)
    real = make_url(postgres_url)
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 5432)
    through_proxy = real.set(port=proxy.port).render_as_string(hide_password=False)
    try:
        with ExitStack() as stack:
            a = serve(stack, tmp_path, through_proxy, "a")
            b = serve(stack, tmp_path, through_proxy, "b")
            proxy.cut()
            wait_until(lambda: status(a)["database"] == "unreachable", 5, "a to notice")
            # Decisions continue, unchanged, while the database is gone.
            for n in range(20):
                assert limit_for(a, f"during-{n}") == limit_for(b, f"during-{n}") == 1
            with PolicyStore(postgres_url) as store:  # published while they can't see it
                store.publish({"shop": V2}, author="ops", comment="during outage")
            assert status(b)["version"] == "shop@v1"

            budget = propagation_budget_s(polls=8)  # 2.0 s on an idle machine
            restored = time.monotonic()
            proxy.restore()
            elapsed = seconds_until_both_serve([a, b], 100, restored, budget)
            assert elapsed < budget, f"took {elapsed:.2f}s to catch up, more than {budget:.2f}s"
            assert status(a)["database"] == "up"
            assert "config database unreachable" in a.log()
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_server_starts_from_its_cache_while_the_database_is_down(
    postgres_url: str, tmp_path: Path
) -> None:
    seed(postgres_url, tmp_path)
    real = make_url(postgres_url)
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 5432)
    through_proxy = real.set(port=proxy.port).render_as_string(hide_password=False)
    cache = tmp_path / "cache.json"
    args = ["--snapshot-cache", str(cache), "--database-url", through_proxy]
    try:
        with sluice_serve(tmp_path, extra_args=args):
            pass  # a first run writes the cache
        assert cache.is_file()
        proxy.cut()
        with sluice_serve(tmp_path, extra_args=args) as server:
            assert status(server)["source"] == "cache"
            assert limit_for(server, "cached") == 1
            assert "from the local cache" in server.log()
            proxy.restore()
            wait_until(lambda: status(server)["source"] == "database", 5, "the database")
    finally:
        proxy.close()


def test_without_a_database_or_a_cache_the_server_refuses_to_start(tmp_path: Path) -> None:
    result = run_sluice(
        [
            "serve",
            "--database-url",
            "postgresql://nobody@127.0.0.1:1/none",
            "--snapshot-cache",
            str(tmp_path / "missing.json"),
            "--grpc-port",
            "0",
            "--http-port",
            "0",
        ]
    )
    assert result.returncode == 3
    assert "config database" in result.stderr


def remaining_for(server: SluiceProcess, domain: str, key: str, value: str) -> int:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
    request = rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=2)
    return response.statuses[0].limit_remaining


def test_counts_of_unchanged_rules_survive_a_reload(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'config.db'}"
    two_rules = V1.replace("requests_per_unit: 1}", "requests_per_unit: 10}") + (
        "  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
    )
    seed(database_url, tmp_path, two_rules)
    with ExitStack() as stack:
        a = serve(stack, tmp_path, database_url, "a")
        assert [remaining_for(a, "shop", "user", "kept") for _ in range(3)] == [9, 8, 7]
        changed = two_rules.replace("requests_per_unit: 5}", "requests_per_unit: 50}")
        code, _ = api(a, "PUT", "/api/v1/domains/shop", {"document": changed, "base_version": 1})
        assert code == 200
        wait_until(lambda: status(a)["version"] == "shop@v2", 5, "the new version")
        # The user rule did not change: its counter carries on where it was.
        assert remaining_for(a, "shop", "user", "kept") == 6
        assert remaining_for(a, "shop", "plan", "p") == 49
