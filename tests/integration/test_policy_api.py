"""The policy write API on a live server: authentication, rules, validation, deletion."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import SluiceProcess, sluice_serve

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("api")
    with sluice_serve(workdir, extra_args=["--api-token", TOKEN]) as process:
        yield process


def call(
    server: SluiceProcess, method: str, path: str, body: Any = None, token: str | None = TOKEN
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body else None
    request = urllib.request.Request(
        server.http_url + path, method=method, data=data, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_every_route_needs_the_token(server: SluiceProcess) -> None:
    assert call(server, "GET", "/api/v1/domains", token=None) == (
        401,
        {"error": "missing or wrong bearer token"},
    )
    assert call(server, "GET", "/api/v1/domains", token="wrong")[0] == 401


def test_the_api_is_off_without_a_token(tmp_path: Path) -> None:
    with sluice_serve(tmp_path) as plain:
        assert call(plain, "GET", "/api/v1/domains") == (
            403,
            {"error": "the write API is disabled: set --api-token"},
        )


def test_rules_are_added_replaced_and_deleted_one_at_a_time(server: SluiceProcess) -> None:
    code, body = call(
        server,
        "PUT",
        "/api/v1/domains/rules-demo/rules",
        {
            "path": [{"key": "tenant", "value": None}],
            "rule": {"key": "tenant", "rate_limit": {"unit": "minute", "requests_per_unit": 5}},
            "base_version": 0,
            "comment": "first rule",
        },
    )
    assert (code, body["version"]) == (200, 1), body
    code, body = call(
        server,
        "PUT",
        "/api/v1/domains/rules-demo/rules",
        {
            "path": [{"key": "tenant", "value": None}, {"key": "user", "value": "vip"}],
            "rule": {
                "key": "user",
                "value": "vip",
                "rate_limit": {"unit": "minute", "requests_per_unit": 50, "algorithm": "gcra"},
            },
            "base_version": 1,
        },
    )
    assert (code, body["version"]) == (200, 2), body
    _, domain = call(server, "GET", "/api/v1/domains/rules-demo")
    assert domain["descriptors"] == [
        {
            "key": "tenant",
            "rate_limit": {"unit": "minute", "requests_per_unit": 5},
            "descriptors": [
                {
                    "key": "user",
                    "value": "vip",
                    "rate_limit": {"unit": "minute", "requests_per_unit": 50, "algorithm": "gcra"},
                }
            ],
        }
    ]
    code, body = call(
        server,
        "DELETE",
        "/api/v1/domains/rules-demo/rules",
        {
            "path": [{"key": "tenant", "value": None}, {"key": "user", "value": "vip"}],
            "base_version": 2,
        },
    )
    assert (code, body["version"]) == (200, 3)
    code, body = call(
        server,
        "DELETE",
        "/api/v1/domains/rules-demo/rules",
        {"path": [{"key": "nope", "value": None}]},
    )
    assert (code, body) == (
        400,
        {"error": "invalid policy", "problems": ["path: no rule 'nope' to delete"]},
    )


def test_a_bad_rule_is_refused_with_the_loaders_message(server: SluiceProcess) -> None:
    code, body = call(
        server,
        "PUT",
        "/api/v1/domains/bad-rule/rules",
        {
            "path": [{"key": "k", "value": None}],
            "rule": {
                "key": "k",
                "rate_limit": {"unit": "second", "requests_per_unit": 1, "burst": 2},
            },
        },
    )
    assert code == 400
    assert body["problems"] == [
        "rule:1: 'burst' applies only to token_bucket, leaky_bucket and gcra, not fixed_window"
    ]


def test_validate_publishes_nothing(server: SluiceProcess) -> None:
    assert call(server, "POST", "/api/v1/validate", {"document": "domain: dry-run\n"}) == (
        200,
        {"valid": True, "domains": ["dry-run"]},
    )
    assert call(server, "GET", "/api/v1/domains/dry-run")[0] == 404
    code, body = call(server, "POST", "/api/v1/validate", {"document": "domain: x\nfoo: 1\n"})
    assert (code, body["problems"]) == (400, ["document:2: unknown key 'foo' in a policy document"])


def test_a_document_must_define_the_domain_it_is_put_at(server: SluiceProcess) -> None:
    code, body = call(server, "PUT", "/api/v1/domains/one", {"document": "domain: two\n"})
    assert (code, body["problems"]) == (
        400,
        ["document: must define exactly domain 'one' (found: two)"],
    )


def test_delete_a_domain_and_see_it_in_history(server: SluiceProcess) -> None:
    assert call(server, "PUT", "/api/v1/domains/temp", {"document": "domain: temp\n"})[0] == 200
    assert call(
        server, "DELETE", "/api/v1/domains/temp", {"base_version": 1, "comment": "bye"}
    ) == (200, {"domain": "temp", "version": 2, "deleted": True})
    assert call(server, "GET", "/api/v1/domains/temp")[0] == 404
    _, history = call(server, "GET", "/api/v1/domains/temp/history")
    assert [(v["version"], v["deleted"], v["comment"]) for v in history["versions"]] == [
        (2, True, "bye"),
        (1, False, ""),
    ]
    code, body = call(server, "GET", "/api/v1/domains/temp/diff?from=1&to=2")
    assert code == 200 and body["diff"].startswith("--- temp@v1\n+++ /dev/null\n")


def test_malformed_bodies_are_400(server: SluiceProcess) -> None:
    code, body = call(server, "PUT", "/api/v1/domains/x", b"{nope")
    assert code == 400 and body["problems"][0].startswith("body: not valid JSON")
    code, body = call(server, "POST", "/api/v1/domains/x/rollback", {"to_version": "one"})
    assert (code, body["problems"]) == (400, ["to_version: must be a version number"])
