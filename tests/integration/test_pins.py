"""The per-descriptor commands against running servers: SQLite and PostgreSQL, memory and
Redis. Each change is made with the CLI against the config database, as an operator would,
and must reach the server within the reload budget, show in the history and roll back."""

from __future__ import annotations

import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from tests.integration.test_policy_lifecycle import api, propagation_budget_s, seed, serve
from tests.support.processes import SluiceProcess, run_sluice, sluice_serve, wait_until

POLICY = """domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 2}
"""
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT


# Every config database and every backend once, in two runs rather than four: a pin lives
# in the policy document (so its database matters) and acts on the counter (so its backend).
DEPLOYMENTS = [("sqlite", "redis"), ("postgresql", "memory")]


@pytest.fixture(params=DEPLOYMENTS, ids=["-".join(d) for d in DEPLOYMENTS])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[str]]:
    """(database URL, the backend's serve arguments)."""
    database, backend = request.param
    if database == "sqlite":
        url = f"sqlite:///{tmp_path / 'config.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    if backend == "memory":
        return url, []
    redis_url = request.getfixturevalue("redis_server")
    return url, [
        "--backend",
        "redis",
        "--redis-url",
        redis_url,
        "--redis-key-prefix",
        f"{tmp_path.name}:",
    ]


def decide(server: SluiceProcess, tenant: str) -> tuple[int, int | None, str]:
    """(code, the reported limit's requests_per_unit, the reason in the metadata)."""
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="tenant", value=tenant)
    request = rls_pb2.RateLimitRequest(
        domain="shop", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5)
    status = response.statuses[0]
    limit = status.current_limit.requests_per_unit if status.HasField("current_limit") else None
    reasons = response.dynamic_metadata.fields.get("sluice_reasons")
    reason = reasons.list_value.values[0].string_value if reasons is not None else ""
    return status.code, limit, reason


def metrics(server: SluiceProcess) -> str:
    with urllib.request.urlopen(server.http_url + "/metrics", timeout=5) as response:
        return str(response.read().decode())


def cli(database_url: str, *args: str) -> str:
    """Run a command that writes (as author "ops") and return what it printed."""
    return read(database_url, *args, "--author", "ops")


def read(database_url: str, *args: str) -> str:
    result = run_sluice([*args, "--database-url", database_url])
    assert result.returncode == 0, result.stderr
    return result.stdout


def live_within(budget_s: float, what: str, predicate: Any) -> float:
    start = time.monotonic()
    wait_until(predicate, timeout_s=max(5, 2 * budget_s), what=what, interval_s=0.01)
    elapsed = time.monotonic() - start
    assert elapsed < budget_s, f"{what}: took {elapsed:.2f}s, more than {budget_s:.2f}s"
    return elapsed


@pytest.mark.slow
def test_override_block_allow_reset_through_the_cli(
    deployment: tuple[str, list[str]], tmp_path: Path
) -> None:
    database_url, backend_args = deployment
    seed(database_url, tmp_path, POLICY)
    with ExitStack() as stack:
        workdir = tmp_path / "a"
        workdir.mkdir()
        server = stack.enter_context(
            sluice_serve(workdir, database_url=database_url, extra_args=backend_args)
        )
        budget = propagation_budget_s(polls=4)
        db = database_url

        # An override: its own limit, its own counter.
        assert decide(server, "acme")[:2] == (OK, 2)
        cli(
            db,
            "override",
            "set",
            "--domain",
            "shop",
            "--descriptor",
            "tenant=acme",
            "--requests-per-unit",
            "5",
            "--unit",
            "hour",
            "--comment",
            "5 for acme",
        )
        live_within(budget, "the override", lambda: decide(server, "acme")[1] == 5)
        assert [decide(server, "acme")[0] for _ in range(5)] == [OK] * 4 + [OVER]
        assert "tenant=acme\t5/hour fixed_window\tno expiry" in read(
            db, "override", "list", "--domain", "shop"
        )

        # A block: refused at once, reason "blocked" (that it counts nothing: the unit tests);
        # unblocked, the rule applies again. (Polls before a change is live are counted.)
        cli(db, "block", "--domain", "shop", "--descriptor", "tenant=evil")
        live_within(budget, "the block", lambda: decide(server, "evil") == (OVER, None, "blocked"))
        wait_until(lambda: 'result="blocked"' in metrics(server), 10, "blocked hits in /metrics")
        cli(db, "unblock", "--domain", "shop", "--descriptor", "tenant=evil")
        live_within(budget, "the unblock", lambda: decide(server, "evil")[1:] == (2, ""))

        # An allow: never limited.
        cli(db, "allow", "--domain", "shop", "--descriptor", "tenant=health")
        live_within(budget, "the allow", lambda: decide(server, "health")[1] is None)
        assert all(decide(server, "health")[0] == OK for _ in range(5))

        # A reset: the exhausted counter starts afresh.
        assert decide(server, "bob")[0] == OK and decide(server, "bob")[0] == OK
        assert decide(server, "bob")[0] == OVER
        cli(db, "reset", "--domain", "shop", "--descriptor", "tenant=bob")
        live_within(budget, "the reset", lambda: decide(server, "bob")[0] == OK)

        # Expiry, in real time (a real server): a block for 2 s stops applying by itself.
        cli(db, "block", "--domain", "shop", "--descriptor", "tenant=late", "--expires-in", "2s")
        live_within(budget, "the expiring block", lambda: decide(server, "late")[2] == "blocked")
        start = time.monotonic()
        wait_until(lambda: decide(server, "late")[2] == "", 10, "the block to expire")
        # Rounded up to the whole second after "now + 2 s": never early, at most 3 s late.
        assert time.monotonic() - start < 3 + budget

        # Every change is a version in the history, with its author and comment.
        history = read(db, "history", "--domain", "shop").splitlines()
        assert len(history) == 7  # the seed + 6 changes
        assert "\tops\t5 for acme" in history[-2]

        # A rollback to the version with the block brings the block back.
        cli(db, "rollback", "--domain", "shop", "--to", "3")
        live_within(budget, "the rollback", lambda: decide(server, "evil")[2] == "blocked")
        assert decide(server, "health")[1] == 2  # the allow came later: gone again


BAD_INPUT = [
    (["block", "--domain", "nope", "--descriptor", "tenant=x"], "no policy for domain 'nope'"),
    (
        ["block", "--domain", "shop", "--descriptor", "user=x"],
        "descriptor: no rule of domain 'shop' limits user=x",
    ),
    (
        ["block", "--domain", "shop", "--descriptor", "tenant"],
        "descriptor: 'tenant' is not KEY=VALUE",
    ),
    (
        ["allow", "--domain", "shop", "--descriptor", "tenant=x", "--expires-in", "soon"],
        "expires_in: 'soon' is neither a duration",
    ),
    (
        [
            "allow",
            "--domain",
            "shop",
            "--descriptor",
            "tenant=x",
            "--expires-in",
            "2001-01-01T00:00:00Z",
        ],
        "expires_in: '2001-01-01T00:00:00Z' is not in the future",
    ),
    (
        [
            "override",
            "set",
            "--domain",
            "shop",
            "--descriptor",
            "tenant=x",
            "--requests-per-unit",
            "5",
            "--unit",
            "fortnight",
        ],
        "rate_limit: invalid rate limit unit 'fortnight'",
    ),
    (
        [
            "override",
            "set",
            "--domain",
            "shop",
            "--descriptor",
            "tenant=x",
            "--requests-per-unit",
            "-1",
            "--unit",
            "hour",
        ],
        "rate_limit: 'requests_per_unit' must be between 0",
    ),
    (
        [
            "override",
            "set",
            "--domain",
            "shop",
            "--descriptor",
            "tenant=x",
            "--requests-per-unit",
            "5",
            "--unit",
            "hour",
            "--algorithm",
            "magic",
        ],
        "rate_limit: unknown algorithm 'magic'",
    ),
    (
        [
            "override",
            "set",
            "--domain",
            "shop",
            "--descriptor",
            "tenant=x",
            "--requests-per-unit",
            "5",
            "--unit",
            "hour",
            "--burst",
            "3",
        ],
        "rate_limit: 'burst' applies only to",
    ),
    (
        ["override", "delete", "--domain", "shop", "--descriptor", "tenant=x"],
        "descriptor: tenant=x is not in overrides",
    ),
    (
        ["unblock", "--domain", "shop", "--descriptor", "tenant=x"],
        "descriptor: tenant=x is not in blocks",
    ),
    (
        ["reset", "--domain", "shop", "--descriptor", "plan=x"],
        "descriptor: no rule of domain 'shop' limits plan=x",
    ),
]


@pytest.mark.parametrize(
    ("args", "message"),
    BAD_INPUT,
    ids=[" ".join(a[:1]) + str(i) for i, (a, _) in enumerate(BAD_INPUT)],
)
def test_bad_input_names_the_field_and_changes_nothing(
    args: list[str], message: str, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'config.db'}"
    seed(db, tmp_path, POLICY)
    result = run_sluice([*args, "--database-url", db])
    assert result.returncode == 1
    assert message in result.stderr
    assert len(read(db, "history", "--domain", "shop").splitlines()) == 1


def test_the_write_api_pins_and_resets(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'config.db'}"
    seed(db, tmp_path, POLICY)
    with ExitStack() as stack:
        server = serve(stack, tmp_path, db, "a")
        path = "/api/v1/domains/shop"
        body = {
            "descriptor": "tenant=acme",
            "rate_limit": {"unit": "hour", "requests_per_unit": 9},
            "expires_in": "1d",
            "comment": "trial",
        }
        code, answer = api(server, "PUT", f"{path}/overrides", body)
        assert (code, answer["version"]) == (200, 2), answer
        code, answer = api(server, "GET", f"{path}/overrides")
        assert code == 200
        [override] = answer["overrides"]
        assert override["rate_limit"] == {"unit": "hour", "requests_per_unit": 9}
        assert override["descriptor"] == "tenant=acme" and override["expires_at"].endswith("Z")
        assert api(server, "PUT", f"{path}/blocks", {"descriptor": "tenant=evil"})[0] == 200
        assert api(server, "GET", f"{path}/blocks")[1] == {
            "blocks": [{"descriptor": "tenant=evil"}]
        }
        assert api(server, "DELETE", f"{path}/blocks", {"descriptor": "tenant=evil"})[0] == 200
        assert (
            api(server, "POST", f"{path}/reset", {"descriptor": "tenant=acme"})[1]["version"] == 5
        )
        code, answer = api(
            server, "PUT", f"{path}/allows", {"descriptor": "tenant=x", "expires_in": "1y"}
        )
        assert code == 400
        assert answer["problems"] == [
            "expires_in: '1y' is neither a duration (30s, 10m, 2h, 7d, 1w) nor an ISO 8601 time"
        ]
        code, answer = api(server, "PUT", f"{path}/blocks", {"descriptor": 5})
        assert (code, answer["problems"]) == (
            400,
            ["descriptor: must be a string KEY=VALUE[,KEY=VALUE…]"],
        )
        assert api(server, "PUT", "/api/v1/domains/nope/blocks", {"descriptor": "a=b"})[0] == 404
        assert api(server, "GET", f"{path}/history")[1]["versions"][0]["version"] == 5
