"""The HTTP /json endpoint of a real `sluice serve` under abuse (tests/integration/test_http.py
covers the plain bad inputs: invalid JSON, an unknown field, missing domain or descriptors,
a non-UTF-8 body, an oversized body with a Content-Length).

Here: oversized bodies that arrive chunked, compressed or with a length promised but never
sent are refused with 413; JSON of any shape, malformed, of the wrong types or with wrong
content, and arbitrary bytes, get 200/429 or a 400 that names the problem, never a 500; a
client that disconnects midway, or speaks broken HTTP, costs nothing; and after all of it
the server still answers.
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.abuse._volume import TIMEOUT_S, cases
from tests.support.processes import SluiceProcess, sluice_serve

pytestmark = pytest.mark.timeout(TIMEOUT_S)

POLICY = """
domain: http-abuse
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: hour, requests_per_unit: 1}
"""
MAX_BODY = 4096
TOO_LARGE = {"error": f"body: larger than the maximum of {MAX_BODY} bytes"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("http-abuse")
    (workdir / "policy.yaml").write_text(POLICY)
    with sluice_serve(
        workdir,
        config=workdir / "policy.yaml",
        extra_args=["--http-max-body-bytes", str(MAX_BODY), "--response-headers"],
    ) as process:
        yield process
    # No request ever reached the handler's error path (aiohttp logs those with a traceback).
    assert "json_endpoint" not in process.log(), process.log()


def post(
    server: SluiceProcess, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    request = urllib.request.Request(
        server.http_url + "/json",
        data=body,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def raw(server: SluiceProcess, data: bytes) -> tuple[int, bytes]:
    """Send ``data`` as it is on a fresh connection; the status and body of the answer."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection without answering: {received!r}"
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", head)[1])
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection mid-answer"
            body += chunk
    return int(head.split()[1]), body


def assert_still_serving(server: SluiceProcess) -> None:
    with urllib.request.urlopen(server.http_url + "/healthcheck", timeout=5) as response:
        assert response.status == 200
    status, answer = post(
        server, b'{"domain": "elsewhere", "descriptors": [{"entries": [{"key": "k"}]}]}'
    )
    assert (status, answer["overallCode"]) == (200, "OK")
    assert server.process.poll() is None


POST = b"POST /json HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"


# --- oversized bodies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(
            POST
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + b"".join(b"400\r\n" + b" " * 1024 + b"\r\n" for _ in range(5))
            + b"0\r\n\r\n",
            id="chunked-no-content-length",
        ),
        # Promised, never sent: refused at once, not waited for.
        pytest.param(POST + b"Content-Length: 1000000000\r\n\r\n{}", id="length-promised"),
        pytest.param(
            POST
            + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
            % (len(gzip.compress(b" " * 50_000_000)), gzip.compress(b" " * 50_000_000)),
            id="gzip-bomb",
        ),
        pytest.param(
            POST
            + b"Content-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%s"
            % (len(zlib.compress(b" " * 10_000_000)), zlib.compress(b" " * 10_000_000)),
            id="deflate-bomb",
        ),
    ],
)
def test_oversized_bodies_are_413(server: SluiceProcess, request_bytes: bytes) -> None:
    status, body = raw(server, request_bytes)
    assert (status, json.loads(body)) == (413, TOO_LARGE)
    assert_still_serving(server)


def test_a_body_of_exactly_the_maximum_is_read(server: SluiceProcess) -> None:
    request = b'{"domain": "elsewhere", "descriptors": [{"entries": [{"key": "k"}]}]}'
    status, answer = post(server, request + b" " * (MAX_BODY - len(request)))
    assert (status, answer["overallCode"]) == (200, "OK")
    status, answer = post(server, request + b" " * (MAX_BODY + 1 - len(request)))
    assert (status, answer) == (413, TOO_LARGE)


# --- broken HTTP and clients that leave -----------------------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(b"\x00\x01\x02 / HTTP/9\r\n\r\n", 400, id="garbage-request-line"),
        pytest.param(
            POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400, id="bad-chunk"
        ),
        pytest.param(
            POST + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
            400,
            id="chunked-and-length",
        ),
        pytest.param(b"GET /json HTTP/1.1\r\nHost: sluice\r\n\r\n", 405, id="get"),
    ],
)
def test_broken_http_is_a_4xx(server: SluiceProcess, request_bytes: bytes, status: int) -> None:
    assert raw(server, request_bytes)[0] == status
    assert_still_serving(server)


def test_a_client_leaving_mid_body_costs_nothing(server: SluiceProcess) -> None:
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
            sock.sendall(POST + b"Content-Length: 100\r\n\r\n" + b'{"domain": ')
    assert_still_serving(server)


# --- any JSON, any bytes --------------------------------------------------------------------------

# What a 400 says first: the body as a whole, or the field of the request that is wrong.
PROBLEM = re.compile(r"(body|\w+(\[\d+\])?(\.\w+(\[\d+\])?)*): \S.*", re.DOTALL)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([-1, 0, 2**32 - 1, 2**32, 2**64 - 1, 2**64, 10**400]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
    st.sampled_from(["", "\x00", "\u200f", "😀", "SECOND", "FORTNIGHT", "1e400", "-5"]),
)
any_json = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def either(
    good: st.SearchStrategy, one_in: int = 12, anything: st.SearchStrategy = any_json
) -> st.SearchStrategy:
    """Usually ``good``; once in ``one_in`` draws ``anything`` (any JSON) in its place."""
    return st.integers(1, one_in).flatmap(lambda n: anything if n == 1 else good)


entries = st.lists(
    either(
        st.fixed_dictionaries(
            {"key": either(st.sampled_from(["user", "k", ""]))},
            optional={"value": either(st.text(max_size=8))},
        )
    ),
    min_size=1,
    max_size=3,
)
limits = st.fixed_dictionaries(
    {
        "requestsPerUnit": either(st.integers(0, 2**32 - 1)),
        "unit": either(st.sampled_from(["SECOND", "MINUTE", "HOUR", "DAY", "WEEK", 3, 7])),
    }
)
descriptors = st.fixed_dictionaries(
    {"entries": either(entries)},
    optional={"limit": either(limits), "hitsAddend": either(st.integers(0, 2**64 - 1))},
)
requests = st.fixed_dictionaries(
    {
        "domain": either(st.sampled_from(["http-abuse", "http-abuse", "elsewhere", ""])),
        "descriptors": either(st.lists(either(descriptors), min_size=1, max_size=4)),
    },
    optional={"hitsAddend": either(st.integers(0, 2**32 - 1)), "hits_addend": st.integers(0, 3)},
)
unknown_field = st.builds(lambda r, v: {**r, "unknown": v}, requests, any_json)
as_json = requests.map(lambda r: json.dumps(r).encode())
bodies = either(
    as_json,  # requests, with a wrong value here and there; half the time, any of these:
    one_in=2,
    anything=st.one_of(
        unknown_field.map(lambda r: json.dumps(r).encode()),
        as_json.map(lambda b: b[: len(b) // 2]),  # cut off
        any_json.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=100),
        st.text(max_size=50).map(lambda t: t.encode("utf-16")),
    ),
)


@pytest.mark.slow
@settings(
    max_examples=cases(ci=300, nightly=6000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(body=bodies)
@example(body=b"5")  # these were Python errors ("'int' object is not iterable")…
@example(body=b'"abc"')
@example(body=b'{"domain": "d", "descriptors": [5]}')
@example(body=b'{"domain": "d", "descriptors": [{"hitsAddend": {}}]}')
@example(body=b"[]")  # …or taken for an empty request
@example(body=b'{"domain": "d", "descriptors": [{"entries": [[]]}]}')
@example(body=b'{"domain": "d", "descriptors": [{"limit": []}]}')
@example(body=b'{"domain": "\\ud800", "descriptors": [{"entries": [{"key": "k"}]}]}')
@example(body=b'{"domain": "d", "domain": "e"}')
@example(body=b"[" * 3000 + b"]" * 1000)
@example(body=b'\xef\xbb\xbf{"domain": "d"}')
def test_any_body_gets_an_answer_or_a_400_naming_the_problem(
    server: SluiceProcess, body: bytes
) -> None:
    status, answer = post(server, body)
    if len(body) > MAX_BODY:
        assert (status, answer) == (413, TOO_LARGE)
        return
    assert status in (200, 429, 400), (status, answer)
    if status == 400:
        assert PROBLEM.fullmatch(answer["error"]), answer
        event("400: " + re.sub(r"\[\d+\]", "[i]", answer["error"].split(":")[0]))
    else:
        assert answer["overallCode"] == ("OK" if status == 200 else "OVER_LIMIT")
        event(str(status))


def test_after_all_that_the_server_still_serves(server: SluiceProcess) -> None:
    assert_still_serving(server)
