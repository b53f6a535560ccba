"""request_from_json: what the HTTP /json endpoint makes of a body. Regressions from fuzzing
it (tests/abuse/test_http_abuse.py): a wrong shape was reported as a Python error ("'int'
object is not iterable") or taken for an empty message; now the field is named."""

from __future__ import annotations

import pytest

from sluice.errors import InvalidRequestError
from sluice.grpc.convert import request_from_json
from sluice.model import Descriptor, LimitOverride, RateLimitRequest, Unit

NOT_JSON = "body: not a valid RateLimitRequest in JSON: "


def refusal(body: bytes) -> str:
    with pytest.raises(InvalidRequestError) as info:
        request_from_json(body)
    return str(info.value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"5", NOT_JSON + "must be a JSON object, not a number"),
        (b"[]", NOT_JSON + "must be a JSON object, not an array"),
        (b'"abc"', NOT_JSON + "must be a JSON object, not a string"),
        (b"null", NOT_JSON + "must be a JSON object, not null"),
        (b'{"domain": 5}', "domain: must be a string, not a number"),
        (b'{"domain": "d", "hitsAddend": true}', "hitsAddend: must be a number, not a boolean"),
        (b'{"domain": "d", "descriptors": {}}', "descriptors: must be a JSON array, not an object"),
        (
            b'{"domain": "d", "descriptors": [5]}',
            "descriptors[0]: must be a JSON object, not a number",
        ),
        (
            b'{"domain": "d", "descriptors": [{"entries": [[]]}]}',
            "descriptors[0].entries[0]: must be a JSON object, not an array",
        ),
        (
            b'{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": ["v"]}]}]}',
            "descriptors[0].entries[0].value: must be a string, not an array",
        ),
        (
            b'{"domain": "d", "descriptors": [{"limit": []}]}',
            "descriptors[0].limit: must be a JSON object, not an array",
        ),
        (
            b'{"domain": "d", "descriptors": [{"limit": {"unit": {}}}]}',
            "descriptors[0].limit.unit: must be a name or a number, not an object",
        ),
        (
            b'{"domain": "d", "descriptors": [{"hits_addend": {"value": 1}}]}',
            "descriptors[0].hits_addend: must be a number, not an object",
        ),
        (
            b'{"domain": "d", "domain": "e"}',
            NOT_JSON + "Failed to load JSON: duplicate key 'domain'",
        ),
        (
            b"\xff{}",
            NOT_JSON + "not UTF-8 ('utf-8' codec can't decode byte 0xff in position 0: "
            "invalid start byte)",
        ),
    ],
)
def test_a_wrong_shape_is_refused_naming_the_field(body: bytes, expected: str) -> None:
    assert refusal(body) == expected


def test_json_nested_past_the_recursion_limit_is_refused() -> None:
    assert refusal(b"[" * 100_000 + b"]" * 100_000).startswith(
        NOT_JSON + "Failed to load JSON: maximum recursion depth exceeded"
    )


def test_a_lone_surrogate_is_refused_naming_the_field() -> None:
    message = refusal(b'{"domain": "\\ud800"}')
    assert message.startswith(NOT_JSON + "Failed to parse domain field: ")


def test_the_json_mapping_is_read_as_before() -> None:
    body = (
        b'{"domain": "d", "hitsAddend": "3", "descriptors": [{"entries": [{"key": "k", '
        b'"value": "v"}], "limit": {"requestsPerUnit": 7, "unit": "MINUTE"}, "hitsAddend": 2},'
        b' {"entries": [{"key": "x"}], "hits_addend": "18446744073709551615"}]}'
    )
    assert request_from_json(body) == RateLimitRequest(
        "d",
        (
            Descriptor((("k", "v"),), LimitOverride(7, Unit.MINUTE), 2),
            Descriptor((("x", ""),), None, 2**64 - 1),
        ),
        3,
    )
