"""How many cases each test of tests/abuse generates.

By default, and in CI, a small set: 2,000 generated cases, and tests/abuse runs in about
40 s (20 s of it the million-value key-space test, which runs its full size always).
With ``SLUICE_FUZZ=nightly`` (which also selects the "nightly" hypothesis profile, registered
in tests/conftest.py: fresh random examples, no per-example deadline) the nightly-sized set,
114,600 generated cases in all, and a million values through Redis (about 10 min in all on
two cores):

    SLUICE_FUZZ=nightly .venv/bin/python -m pytest tests/abuse --hypothesis-show-statistics

Each module raises its per-test timeout to ``TIMEOUT_S`` for that run.
"""

from __future__ import annotations

from tests.support.examples import NIGHTLY

__all__ = ["NIGHTLY", "TIMEOUT_S", "cases"]


def cases(*, ci: int, nightly: int) -> int:
    """The number of examples a fuzz test generates in this run."""
    return nightly if NIGHTLY else ci


# Per test: the suite's default in CI; hours for the nightly-sized run.
TIMEOUT_S = cases(ci=120, nightly=4 * 3600)
