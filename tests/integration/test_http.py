"""The HTTP port of a real `sluice serve`: /healthcheck and /json."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.processes import SluiceProcess, sluice_serve

POLICY = """
domain: http-test
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: hour, requests_per_unit: 1}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("http")
    (workdir / "policy.yaml").write_text(POLICY)
    with sluice_serve(
        workdir,
        config=workdir / "policy.yaml",
        extra_args=["--http-max-body-bytes", "2048", "--response-headers"],
    ) as process:
        yield process


def post(server: SluiceProcess, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        server.http_url + "/json", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def body(user: str) -> bytes:
    request = {
        "domain": "http-test",
        "descriptors": [{"entries": [{"key": "user", "value": user}]}],
    }
    return json.dumps(request).encode()


def test_healthcheck(server: SluiceProcess) -> None:
    with urllib.request.urlopen(server.http_url + "/healthcheck", timeout=5) as response:
        assert (response.status, response.read()) == (200, b"OK")


def test_json_answers_200_then_429(server: SluiceProcess) -> None:
    status, first = post(server, body("alice"))
    assert status == 200
    assert first["overallCode"] == "OK"
    assert first["statuses"][0]["currentLimit"] == {
        "name": "per_user",
        "requestsPerUnit": 1,
        "unit": "HOUR",
    }
    status, second = post(server, body("alice"))
    assert status == 429
    assert second["overallCode"] == "OVER_LIMIT"
    headers = {h["key"]: h["value"] for h in second["responseHeadersToAdd"]}
    assert headers["RateLimit-Policy"] == '"per_user";q=1;w=3600'
    assert 0 < int(headers["Retry-After"]) <= 3600


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b"{not json", "body: not a valid RateLimitRequest in JSON: Failed to load JSON: "),
        (b'{"domian": "x"}', "body: not a valid RateLimitRequest in JSON: Message type "),
        (b'{"descriptors": [{"entries": [{"key": "k"}]}]}', "domain: must not be empty"),
        (b'{"domain": "d"}', "descriptors: must not be empty"),
        (b"\xff\xfe", "body: not a valid RateLimitRequest in JSON: "),
    ],
)
def test_json_bad_input_is_400_naming_the_problem(
    server: SluiceProcess, payload: bytes, error: str
) -> None:
    status, answer = post(server, payload)
    assert status == 400
    assert answer["error"].startswith(error)


def test_json_refuses_oversized_bodies(server: SluiceProcess) -> None:
    status, answer = post(server, b" " * 4096)
    assert status == 413
    assert answer == {"error": "body: larger than the maximum of 2048 bytes"}
