"""GET /api/v1/leases and /api/v1/rlqs/buckets against a real `sluice serve`: leases taken
through the Python client, RLQS streams opened over gRPC, the listing bounded; with Redis,
one server lists the leases taken through another."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice_client import Client
from tests.integration.test_rlqs_server import Response, Stream, report
from tests.support.processes import SluiceProcess, sluice_serve, wait_until

TOKEN = "runtime-token"
# Also the policy of tests/admin/test_runtime_pages.py and tests/e2e/test_admin_runtime.py.
POLICY = """\
domain: jobs
descriptors:
  - key: job
    rate_limit: {name: jobs, concurrency: 3, lease_ttl: 60s}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
"""


def get(server: SluiceProcess, path: str, token: str = TOKEN) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        server.http_url + path, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def lease_rows(server: SluiceProcess, query: str = "domain=jobs") -> list[tuple[str, int, int]]:
    code, body = get(server, f"/api/v1/leases?{query}")
    assert code == 200, body
    return [(row["entries"][0][1], row["held"], row["max_leases"]) for row in body["rows"]]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("runtime")
    config = workdir / "policy.yaml"
    config.write_text(POLICY)
    with sluice_serve(workdir, config=config, extra_args=["--api-token", TOKEN]) as process:
        yield process


def test_leases_held_per_descriptor_with_their_rule_and_expiry(server: SluiceProcess) -> None:
    with Client(server.grpc_target, on_unavailable="raise") as client:
        nightly = [client.lease("jobs", {"job": "nightly"}) for _ in range(2)]
        hourly = client.lease("jobs", {"job": "hourly"})
        assert all(lease.granted for lease in [*nightly, hourly])
        code, body = get(server, "/api/v1/leases?domain=jobs")
        assert code == 200, body
        assert (body["store"], body["shared"], body["tables"], body["leases"]) == (
            "memory",
            False,
            2,
            3,
        )
        [first, second] = body["rows"]
        assert (first["entries"], first["rule"], first["held"], first["max_leases"]) == (
            [["job", "nightly"]],
            "jobs.job",
            2,
            3,
        )
        assert 50 < first["next_expiry_s"] <= first["last_expiry_s"] <= 60
        assert (second["entries"], second["held"]) == ([["job", "hourly"]], 1)
        # Bounded: the fullest first, the rest counted.
        code, body = get(server, "/api/v1/leases?domain=jobs&limit=1")
        assert (len(body["rows"]), body["tables"], body["omitted"]) == (1, 2, 1)
        assert lease_rows(server, "domain=other") == []
        nightly[0].release()
        assert lease_rows(server) == [("nightly", 1, 3), ("hourly", 1, 3)]
        for lease in (nightly[1], hourly):
            lease.release()
        assert lease_rows(server) == []


def test_rlqs_buckets_with_the_assignment_sent(server: SluiceProcess) -> None:
    stream = Stream(server)
    try:
        stream.send(report("jobs", {"tenant": "acme"}, {"tenant": "zed"}))
        response = stream.next()
        assert isinstance(response, Response), response
        assert len(response.bucket_action) == 2
        code, body = get(server, "/api/v1/rlqs/buckets?domain=jobs&limit=1")
        assert code == 200, body
        assert (body["streams"], body["buckets"], body["omitted"]) == (1, 2, 1)
        [row] = body["rows"]
        assert row["bucket"] in ({"tenant": "acme"}, {"tenant": "zed"})
        assert (row["rule"], row["rate_per_s"], row["burst"], row["share"]) == (
            "jobs.tenant",
            10.0,
            10,
            1.0,
        )
        assert row["assignment"] == {
            "strategy": "token_bucket",
            "ttl_s": 15,
            "token_bucket": {"max_tokens": 10, "tokens_per_fill": 10, "fill_interval_s": 1},
        }
        assert 0 < row["expires_in_s"] <= 15
    finally:
        stream.close()


def test_ten_thousand_buckets_answer_with_a_page_busiest_first(server: SluiceProcess) -> None:
    stream = Stream(server)
    try:
        stream.send(report("jobs", *({"tenant": f"t{i}"} for i in range(10_000))))
        assert isinstance(stream.next(), Response)
        busy = report("jobs", {"tenant": "t7"})
        busy.bucket_quota_usages[0].time_elapsed.FromSeconds(2)
        busy.bucket_quota_usages[0].num_requests_allowed = 50
        stream.send(busy)
        # Not "the next response": the server may push an assignment unasked (a rebalance
        # after the 10,000 new buckets) before it answers this report. The route, asked
        # until it shows t7's report taken, says when it has been.
        answers: list[tuple[int, Any]] = []

        def busiest_is_t7() -> bool:
            answers.append(get(server, "/api/v1/rlqs/buckets?domain=jobs"))
            code, body = answers[-1]
            return code == 200 and body["rows"][0]["bucket"] == {"tenant": "t7"}

        wait_until(busiest_is_t7, 10, "t7's report to be taken")
        code, body = answers[-1]
        assert (len(body["rows"]), body["buckets"], body["omitted"]) == (100, 10_000, 9_900)
        assert body["rows"][0]["demand_per_s"] == 25
    finally:
        stream.close()


def test_the_runtime_routes_need_the_token_and_a_sane_limit(server: SluiceProcess) -> None:
    assert get(server, "/api/v1/leases", token="wrong") == (
        401,
        {"error": "missing or wrong bearer token"},
    )
    assert get(server, "/api/v1/rlqs/buckets?limit=0") == (
        400,
        {"error": "limit: '0' is not a whole number from 1 to 1000"},
    )


def test_with_redis_any_server_lists_the_leases_taken_through_another(
    tmp_path: Path, redis_server: str
) -> None:
    args = [
        "--api-token", TOKEN,
        "--backend", "redis",
        "--redis-url", redis_server,
        "--redis-key-prefix", f"runtime-{uuid.uuid4().hex[:8]}:",
    ]  # fmt: skip
    config = tmp_path / "policy.yaml"
    config.write_text(POLICY)
    database_url = f"sqlite:///{tmp_path / 'sluice.db'}"
    long_job = "j" * 200  # a counter Redis names by a hash: listed, but not by name
    with (
        sluice_serve(tmp_path, config=config, database_url=database_url, extra_args=args) as a,
        sluice_serve(tmp_path, database_url=database_url, extra_args=args) as b,
        Client(a.grpc_target, on_unavailable="raise") as client,
    ):
        leases = [client.lease("jobs", {"job": job}) for job in ("nightly", "nightly", long_job)]
        assert all(lease.granted for lease in leases)
        code, body = get(b, "/api/v1/leases?domain=jobs")
        assert code == 200, body
        assert body["shared"] and body["store"].startswith(redis_server)
        assert [(r["entries"], r["held"], r["max_leases"]) for r in body["rows"]] == [
            ([["job", "nightly"]], 2, 3)
        ]
        assert 50 < body["rows"][0]["next_expiry_s"] <= 60
        # Every domain's: the hashed one too, by its Redis key.
        code, body = get(b, "/api/v1/leases")
        [unnamed] = [r for r in body["rows"] if not r["domain"]]
        assert (unnamed["held"], unnamed["rule"], unnamed["max_leases"]) == (1, "", None)
        assert unnamed["stored_as"].endswith(":lease") and "{#" in unnamed["stored_as"]
        for lease in leases:
            lease.release()
        assert get(b, "/api/v1/leases")[1]["rows"] == []
