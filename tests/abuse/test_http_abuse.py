"""The HTTP /json endpoint of a real `sluice serve` under abuse (tests/integration/test_http.py
covers the plain bad inputs: invalid JSON, an unknown field, missing domain or descriptors,
a non-UTF-8 body, an oversized body with a Content-Length).

Here: oversized bodies that arrive chunked, compressed or with a length promised but never
sent are refused with 413; a valid request with one thing wrong (a value of the wrong kind,
empty, too long, out of range, an unknown field or unit) gets a 400 whose message is exactly
the one that names that field; JSON of any shape and arbitrary bytes get 200/429 or a 400
naming a field of that very body and a problem it has (or the body as a whole), never a 500;
a client that disconnects midway, or speaks broken HTTP, costs nothing; and after all of it
the server still answers.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import socket
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
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


# --- each kind of bad request: the exact answer -------------------------------------------------

NOT_A_REQUEST = "body: not a valid RateLimitRequest in JSON: "
UNITS = ["SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "YEAR"]  # as the answers list them
# An override's unit is envoy.type.v3.RateLimitUnit, which has no WEEK: 7 only by number.
OVERRIDE_UNITS = [unit for unit in UNITS if unit != "WEEK"]
# A value of each JSON kind, by the name the answers give the kind.
OF_KIND: dict[str, Any] = {
    "null": None,
    "a boolean": True,
    "a number": 5,
    "a string": "x",
    "an array": [],
    "an object": {},
}
# What each field must be, as the answers say it, and the kinds that are not that. A string is
# a number too (proto3 JSON writes 64-bit numbers as strings), and a number an enum's value.
MUST_BE = {
    "string": ("a string", ["a boolean", "a number", "an array", "an object"]),
    "number": ("a number", ["a boolean", "an array", "an object"]),
    "enum": ("a name or a number", ["a boolean", "an array", "an object"]),
    "array": ("a JSON array", ["a boolean", "a number", "a string", "an object"]),
    "object": ("a JSON object", ["a boolean", "a number", "a string", "an array"]),
}

valid_entries = st.lists(
    st.fixed_dictionaries(
        {"key": st.sampled_from(["user", "k", "path"])},
        optional={"value": st.text(max_size=8)},
    ),
    min_size=1,
    max_size=3,
)
valid_descriptors = st.lists(
    st.fixed_dictionaries(
        {"entries": valid_entries},
        optional={
            "limit": st.fixed_dictionaries(
                {
                    "requestsPerUnit": st.integers(0, 2**32 - 1),
                    "unit": st.sampled_from([*OVERRIDE_UNITS, 7]),
                }
            ),
            "hitsAddend": st.integers(0, 1000),
        },
    ),
    min_size=1,
    max_size=4,
)
valid_requests = st.fixed_dictionaries(
    {"domain": st.sampled_from(["http-abuse", "elsewhere"]), "descriptors": valid_descriptors},
    optional={"hitsAddend": st.integers(0, 1000)},
)


def fields(request: dict[str, Any]) -> Iterator[tuple[str, Any, Any, str, bool]]:
    """Every field of a valid request: (path as answers name it, its container, its key or
    index there, what it must be, whether it is an array's item)."""
    yield "domain", request, "domain", "string", False
    yield "descriptors", request, "descriptors", "array", False
    if "hitsAddend" in request:
        yield "hitsAddend", request, "hitsAddend", "number", False
    for i, descriptor in enumerate(request["descriptors"]):
        at = f"descriptors[{i}]"
        yield at, request["descriptors"], i, "object", True
        yield f"{at}.entries", descriptor, "entries", "array", False
        for j, entry in enumerate(descriptor["entries"]):
            yield f"{at}.entries[{j}]", descriptor["entries"], j, "object", True
            for name in entry:
                yield f"{at}.entries[{j}].{name}", entry, name, "string", False
        if "limit" in descriptor:
            yield f"{at}.limit", descriptor, "limit", "object", False
            limit = descriptor["limit"]
            yield f"{at}.limit.requestsPerUnit", limit, "requestsPerUnit", "number", False
            yield f"{at}.limit.unit", limit, "unit", "enum", False
        if "hitsAddend" in descriptor:
            yield f"{at}.hitsAddend", descriptor, "hitsAddend", "number", False


@dataclass(frozen=True)
class Refusal:
    """The 400 a bad request must get: its message exactly, or (``within``) a message of the
    JSON parser's that names the field by ``names`` (protobuf's own wording)."""

    message: str
    names: str = ""

    def check(self, answer: dict[str, Any]) -> None:
        if not self.names:
            assert answer == {"error": self.message}
        else:
            assert answer["error"].startswith(self.message), answer
            assert self.names in answer["error"], (self.names, answer)


def wrong_kind(draw: st.DrawFn, request: dict[str, Any]) -> Refusal:
    path, container, key, must, item = draw(st.sampled_from(list(fields(request))))
    what, wrong = MUST_BE[must]
    kind = draw(st.sampled_from(wrong + ["null"] * item))  # null is an absent field, not item
    container[key] = OF_KIND[kind]
    return Refusal(f"{path}: must be {what}, not {kind}")


def empty(draw: st.DrawFn, request: dict[str, Any]) -> Refusal:
    descriptors = request["descriptors"]
    i = draw(st.integers(0, len(descriptors) - 1))
    entries = descriptors[i]["entries"]
    j = draw(st.integers(0, len(entries) - 1))
    choices = {
        "domain": lambda: request.update(domain=draw(st.sampled_from(["", None]))),
        "descriptors": lambda: request.update(descriptors=[]),
        f"descriptors[{i}].entries": lambda: descriptors[i].update(entries=[]),
        f"descriptors[{i}].entries[{j}].key": lambda: entries[j].update(key=""),
    }
    path = draw(st.sampled_from(sorted(choices)))
    choices[path]()
    return Refusal(f"{path}: must not be empty")


def too_long(draw: st.DrawFn, request: dict[str, Any]) -> Refusal:
    descriptors = request["descriptors"]
    i = draw(st.integers(0, len(descriptors) - 1))
    entries = descriptors[i]["entries"]
    what = draw(st.sampled_from(["domain", "descriptors", "entries", "key", "value"]))
    if what == "domain":
        request["domain"] = "d" * 257
        return Refusal("domain: 257 characters, more than the maximum of 256")
    if what == "descriptors":
        request["descriptors"] = [{"entries": [{"key": "k"}]}] * 65
        return Refusal("descriptors: 65 descriptors, more than the maximum of 64")
    if what == "entries":
        descriptors[i]["entries"] = [{"key": "k"}] * 17
        return Refusal(f"descriptors[{i}].entries: 17 entries, more than the maximum of 16")
    entries[0][what] = "k" * {"key": 257, "value": 1025}[what]
    maximum = {"key": 256, "value": 1024}[what]
    return Refusal(
        f"descriptors[{i}].entries[0].{what}: {maximum + 1} characters, "
        f"more than the maximum of {maximum}"
    )


def unknown_field(draw: st.DrawFn, request: dict[str, Any]) -> Refusal:
    objects = [request, *request["descriptors"]]
    objects += [e for d in request["descriptors"] for e in d["entries"]]
    objects += [d["limit"] for d in request["descriptors"] if "limit" in d]
    name = draw(st.sampled_from(["unknown", "Domain", "entry", "limits", "hits"]))
    draw(st.sampled_from(objects))[name] = draw(any_json)
    return Refusal(NOT_A_REQUEST, f'has no field named "{name}"')


def out_of_range(draw: st.DrawFn, request: dict[str, Any]) -> Refusal:
    # Numbers out of their field's range (uint32, uint64), or not whole.
    places: list[tuple[dict[str, Any], str, list[Any], str]] = [
        (request, "hitsAddend", [-1, 2**32, 0.5, "abc"], "Failed to parse hitsAddend field: ")
    ]
    for descriptor in request["descriptors"]:
        places.append(
            (
                descriptor,
                "hitsAddend",
                [-1, 2**64, 0.5],
                "Failed to parse descriptors field: Failed to parse hitsAddend field: ",
            )
        )
        if "limit" in descriptor:
            places.append(
                (
                    descriptor["limit"],
                    "requestsPerUnit",
                    [-1, 2**32, 1.5, "abc"],
                    "Failed to parse descriptors field: Failed to parse limit field: "
                    "Failed to parse requestsPerUnit field: ",
                )
            )
    container, name, values, chain = draw(st.sampled_from(places))
    container[name] = draw(st.sampled_from(values))
    if container is request:  # the chain then starts the message
        return Refusal(NOT_A_REQUEST + chain, "hitsAddend")
    return Refusal(NOT_A_REQUEST, chain)


def bad_unit(draw: st.DrawFn, request: dict[str, Any]) -> Refusal:
    i = draw(st.integers(0, len(request["descriptors"]) - 1))
    limit = request["descriptors"][i].setdefault("limit", {"requestsPerUnit": 5})
    unit = draw(st.sampled_from(["FORTNIGHT", "second", 0, 8, 99, None]))
    if unit is None:
        limit.pop("unit", None)
    else:
        limit["unit"] = unit
    if isinstance(unit, str):
        return Refusal(NOT_A_REQUEST, f"Failed to parse unit field: Invalid enum value {unit} ")
    return Refusal(f"descriptors[{i}].limit.unit: must be one of {', '.join(UNITS)}")


DEFECTS = [wrong_kind, empty, too_long, unknown_field, out_of_range, bad_unit]


@st.composite
def bad_requests(draw: st.DrawFn) -> tuple[bytes, Refusal]:
    """A valid request with one thing wrong, and the answer that names it."""
    request = copy.deepcopy(draw(valid_requests))
    refusal = draw(st.sampled_from(DEFECTS))(draw, request)
    return json.dumps(request).encode(), refusal


@pytest.mark.slow
@settings(
    max_examples=cases(ci=300, nightly=6000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(case=bad_requests())
def test_each_bad_request_is_a_400_naming_its_field(
    server: SluiceProcess, case: tuple[bytes, Refusal]
) -> None:
    body, refusal = case
    status, answer = post(server, body)
    assert status == 400, (status, answer)
    refusal.check(answer)
    event(re.sub(r"\[\d+\]", "[i]", (refusal.names or refusal.message).split(": ")[0]))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"5", "must be a JSON object, not a number"),
        (b'"abc"', "must be a JSON object, not a string"),
        (b"[]", "must be a JSON object, not an array"),
        (b"null", "must be a JSON object, not null"),
        (b'{"domain": "d", "domain": "e"}', "Failed to load JSON: duplicate key 'domain'"),
        (b'{"domain": ', "Failed to load JSON: Expecting value: line 1 column 12 (char 11)"),
        (b"[" * 2000 + b"]" * 2000, "Failed to load JSON: maximum recursion depth exceeded"),
        (b'\xef\xbb\xbf{"domain": "d"}', "Failed to load JSON: Unexpected UTF-8 BOM"),
        (
            b"\xff\xfe",
            "not UTF-8 ('utf-8' codec can't decode byte 0xff in position 0: invalid start byte)",
        ),
    ],
)
def test_a_body_that_is_no_request_object_is_a_400_saying_so(
    server: SluiceProcess, body: bytes, message: str
) -> None:
    status, answer = post(server, body)
    assert status == 400, (status, answer)
    assert answer["error"].startswith(NOT_A_REQUEST + message), answer


# --- any JSON, any bytes --------------------------------------------------------------------------

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
unknown_fields = st.builds(lambda r, v: {**r, "unknown": v}, requests, any_json)
as_json = requests.map(lambda r: json.dumps(r).encode())
bodies = either(
    as_json,  # requests, with a wrong value here and there; half the time, any of these:
    one_in=2,
    anything=st.one_of(
        unknown_fields.map(lambda r: json.dumps(r).encode()),
        as_json.map(lambda b: b[: len(b) // 2]),  # cut off
        any_json.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=100),
        st.text(max_size=50).map(lambda t: t.encode("utf-16")),
    ),
)

_STEP = re.compile(r"(\w+)|\[(\d+)\]")
_MISSING = object()


def at_path(document: Any, path: str) -> Any:
    """The value at ``path`` (``descriptors[0].entries[1].key``), or _MISSING."""
    value = document
    for name, index in _STEP.findall(path):
        if name and isinstance(value, dict):
            value = value.get(name, _MISSING)
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def kind_of(value: Any) -> str:
    """A JSON value's kind, as the answers name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def is_number(value: Any) -> bool:
    """A JSON number, or a string protobuf's JSON parser reads as one."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True


def check_names_its_field(body: bytes, error: str) -> None:
    """A 400's message names ``body`` (the parser's word, which names a field itself when it
    can), or a field of this very body and a problem that field has."""
    if error.startswith(NOT_A_REQUEST):
        return
    path, _, problem = error.partition(": ")
    document = json.loads(body)
    value = at_path(document, path)
    if problem == "must not be empty":
        assert value in (_MISSING, None, "", []), (path, value)
    elif problem.startswith("must be one of"):  # a unit: absent, or a number not a unit's
        assert value in (_MISSING, None) or is_number(value), (path, value)
    elif (wrong := re.fullmatch(r"must be .+, not (.+)", problem)) is not None:
        assert value is not _MISSING and kind_of(value) == wrong[1], (path, value, problem)
    elif (size := re.fullmatch(r"(\d+) \w+, more than the maximum of (\d+)", problem)) is not None:
        assert len(value) == int(size[1]) > int(size[2]), (path, problem)
    else:
        raise AssertionError(f"a 400 saying what no test expects: {error!r}")


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
        check_names_its_field(body, answer["error"])
        event("400: " + re.sub(r"\[\d+\]", "[i]", answer["error"].split(":")[0]))
    else:
        assert answer["overallCode"] == ("OK" if status == 200 else "OVER_LIMIT")
        event(str(status))


def test_after_all_that_the_server_still_serves(server: SluiceProcess) -> None:
    assert_still_serving(server)
