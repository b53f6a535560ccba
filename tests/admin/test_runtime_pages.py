"""The Leases and RLQS buckets pages, asking a real `sluice serve` (leases taken through the
Python client, an RLQS stream open over gRPC); without servers, and with one that does not
answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from streamlit.testing.v1 import AppTest

from sluice_admin.auth import hash_password
from sluice_client import Client
from tests.admin._harness import PASSWORD, errors, new_app, open_page, sign_in
from tests.integration.test_rlqs_server import Response, Stream, report
from tests.integration.test_runtime_api import POLICY  # one policy, three views of it
from tests.support.processes import SluiceProcess, free_port, sluice_serve

TOKEN = "pages-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("runtime-pages")
    config = workdir / "policy.yaml"
    config.write_text(POLICY)
    with sluice_serve(workdir, config=config, extra_args=["--api-token", TOKEN]) as process:
        yield process


@pytest.fixture
def admin(server: SluiceProcess, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    """The app on the server's config database, asking it with its token, signed in."""
    monkeypatch.setenv("SLUICE_DATABASE_URL", f"sqlite:///{server.log_path.parent}/sluice.db")
    monkeypatch.setenv("SLUICE_ADMIN_USERS", f"ed:viewer:{hash_password(PASSWORD)}")
    monkeypatch.setenv("SLUICE_ADMIN_SERVERS", server.http_url)
    monkeypatch.setenv("SLUICE_API_TOKEN", TOKEN)
    return sign_in(new_app(), "ed")


def test_the_leases_page_shows_each_descriptors_leases_of_its_rule(
    server: SluiceProcess, admin: AppTest
) -> None:
    with Client(server.grpc_target, on_unavailable="raise") as client:
        held = [client.lease("jobs", {"job": job}) for job in ("nightly", "nightly", "hourly")]
        assert all(lease.granted for lease in held)
        at = open_page(admin, "leases")
        assert errors(at) == []
        [table] = at.dataframe
        rows = table.value.to_dict("records")
        assert [(r["descriptor"], r["rule"], r["held"], r["of"]) for r in rows] == [
            ("job=nightly", "jobs.job", 2, "3"),
            ("job=hourly", "jobs.job", 1, "3"),
        ]
        assert all(r["next expires in"].endswith(" s") for r in rows)
        assert any("3 leases held on 2 descriptors of jobs" in c.value for c in at.caption)
        for lease in held:
            lease.release()
    at.run()
    assert at.dataframe.len == 0
    assert any("0 leases held on 0 descriptors" in c.value for c in at.caption)


def test_the_rlqs_page_shows_each_bucket_with_its_assignment(
    server: SluiceProcess, admin: AppTest
) -> None:
    stream = Stream(server)
    try:
        stream.send(report("jobs", {"tenant": "acme"}))
        assert isinstance(stream.next(), Response)
        at = open_page(admin, "rlqs")
        assert errors(at) == []
        [table] = at.dataframe
        [row] = table.value.to_dict("records")
        assert (row["bucket"], row["rule"], row["assignment"], row["limit"], row["share"]) == (
            "tenant=acme",
            "jobs.tenant",
            "token bucket: 10 every second, at most 10",
            "10 / s, burst 10",
            "100%",
        )
        assert any("1 bucket of jobs on 1 open stream" in c.value for c in at.caption)
    finally:
        stream.close()


def test_a_server_that_does_not_answer_is_named_beside_those_that_do(
    server: SluiceProcess, admin: AppTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    silent = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("SLUICE_ADMIN_SERVERS", f"{server.http_url}, {silent}")
    at = open_page(admin, "leases")
    assert [t.value for t in at.text if t.value.startswith("http")] == [server.http_url, silent]
    [error] = errors(at)
    assert error.startswith("No answer: unreachable:")
    monkeypatch.setenv("SLUICE_API_TOKEN", "stale")
    at = open_page(at, "rlqs")
    refused, unreachable = errors(at)
    assert refused == "No answer: HTTP 401: missing or wrong bearer token"
    assert unreachable.startswith("No answer: unreachable:")


def test_without_servers_the_pages_say_what_to_set(
    admin: AppTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_ADMIN_SERVERS", "")
    for page in ("leases", "rlqs"):
        at = open_page(admin, page)
        [info] = [i.value for i in at.info]
        assert "`--admin-servers` / `SLUICE_ADMIN_SERVERS`" in info
    monkeypatch.setenv("SLUICE_ADMIN_SERVERS", "127.0.0.1:8080")
    at = open_page(admin, "leases")
    assert errors(at) == [
        "`--admin-servers` / `SLUICE_ADMIN_SERVERS`: '127.0.0.1:8080' is not an http:// or "
        "https:// URL"
    ]
