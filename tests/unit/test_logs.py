"""Log lines: text, or JSON shaped like envoyproxy/ratelimit's LOG_FORMAT=json."""

from __future__ import annotations

import json
import logging
import sys

from sluice.logs import JsonFormatter


def record(level: int, message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("sluice", level, __file__, 1, message, args, None)


def test_json_lines_carry_upstreams_keys_and_level_names() -> None:
    line = JsonFormatter().format(record(logging.WARNING, "listening on %s", ":8081"))
    parsed = json.loads(line)
    assert (parsed["@message"], parsed["level"], parsed["logger"]) == (
        "listening on :8081",
        "warning",
        "sluice",
    )
    assert parsed["@timestamp"].endswith("+00:00")
    assert json.loads(JsonFormatter().format(record(logging.DEBUG, "x")))["level"] == "debug"


def test_a_traceback_stays_inside_its_one_json_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failing = record(logging.ERROR, "failed")
        failing.exc_info = sys.exc_info()
    line = JsonFormatter().format(failing)
    assert "\n" not in line
    message = json.loads(line)["@message"]
    assert message.startswith("failed\nTraceback (most recent call last):")
    assert message.endswith("RuntimeError: boom")
