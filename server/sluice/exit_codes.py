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

__all__ = ["run_reporting_errors"]


def run_reporting_errors(command: Callable[[], int]) -> int:
    """Run ``command``; Sluice's errors become a message on stderr and their exit code."""
    try:
        return command()
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    except ConfigDatabaseError as exc:
        print(f"sluice: config database: {exc}", file=sys.stderr)
        return 3
    except SluiceError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
