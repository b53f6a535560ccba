"""check_server_log (tests/support/processes.py), which fails every test whose `sluice serve`
logged a traceback or exited non-zero: each way it must fail, in both log formats, and the
allow-list for tests that provoke errors on purpose."""

from __future__ import annotations

import json

import pytest

from tests.support.processes import check_server_log

TEXT = """\
2026-11-26 06:53:13,612 INFO sluice: serving
2026-11-26 06:53:13,612 ERROR sluice.periodic: usage flush failed
Traceback (most recent call last):
  File "/srv/sluice/periodic.py", line 48, in _run
    await self._step()

RuntimeError: the usage flusher raises on every tick
2026-11-26 06:53:14,000 INFO sluice: signal received: draining for up to 10.0s
"""


def json_line(message: str) -> str:
    return json.dumps({"@timestamp": "2026-11-26T06:53:13Z", "@message": message})


def test_a_clean_log_and_exit_0_pass() -> None:
    check_server_log("2026-11-26 06:53:13,612 INFO sluice: serving\n", 0)


def test_a_non_zero_exit_fails() -> None:
    with pytest.raises(AssertionError, match="sluice serve exited with -9"):
        check_server_log("", -9)


def test_a_traceback_fails_naming_its_exception() -> None:
    with pytest.raises(AssertionError, match="RuntimeError: the usage flusher raises"):
        check_server_log(TEXT, 0)


def test_a_traceback_inside_a_json_line_fails() -> None:
    message = "usage flush failed\n" + TEXT[TEXT.index("Traceback") : TEXT.index("2026", 100)]
    log = json_line("serving") + "\n" + json_line(message) + "\n"
    with pytest.raises(AssertionError, match="RuntimeError: the usage flusher raises"):
        check_server_log(log, 0)


def test_an_allowed_traceback_passes_and_only_that_one() -> None:
    check_server_log(TEXT, 0, allowed_tracebacks=[r"^RuntimeError: the usage flusher"])
    other = TEXT.replace("RuntimeError: the usage", "KeyError: the usage")
    with pytest.raises(AssertionError, match="KeyError"):
        check_server_log(other, 0, allowed_tracebacks=[r"^RuntimeError: the usage flusher"])
