"""The ``sluice`` command's exit codes: 0 success, 1 invalid input (a policy or a setting),
2 usage, 3 config database; and running a command so that Sluice's errors become them.

A module of its own, importing nothing heavy, so that a ``--workers`` process that only
drives an Envoy (sluice/workers.py) does not load the policy layer that sluice/cli.py needs:
~30 MiB less per pyvoy worker.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from sluice.errors import ConfigDatabaseError, ConfigError, SluiceError

__all__ = ["describe", "run_reporting_errors"]


def describe(exc: SluiceError) -> tuple[int, list[str]]:
    """One of Sluice's errors as the command reports it: the exit code and the stderr lines."""
    if isinstance(exc, ConfigError):
        return 1, list(exc.problems)
    if isinstance(exc, ConfigDatabaseError):
        return 3, [f"sluice: config database: {exc}"]
    return 1, [f"sluice: {exc}"]


def run_reporting_errors(command: Callable[[], int]) -> int:
    """Run ``command``; Sluice's errors become a message on stderr and their exit code."""
    try:
        return command()
    except SluiceError as exc:
        code, lines = describe(exc)
        for line in lines:
            print(line, file=sys.stderr)
        return code
