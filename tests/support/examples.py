"""How many examples a property test runs: its own number, ten times it in the nightly run.

``@settings(max_examples=N)`` on a test wins over any profile, so the nightly profile
(tests/conftest.py) cannot raise it: a test with a number of its own passes it through
``examples(N)``. Tests without one get the profile's: 100 (Hypothesis's default), 1,000
nightly. tests/unit/support/test_examples.py holds every property test to this.
"""

from __future__ import annotations

import os

__all__ = ["NIGHTLY", "NIGHTLY_FACTOR", "examples"]

# SLUICE_FUZZ=nightly also selects the "nightly" Hypothesis profile (tests/conftest.py) and
# the fuzz tests' nightly sizes (tests/abuse/_volume.py).
NIGHTLY = os.environ.get("SLUICE_FUZZ") == "nightly"
NIGHTLY_FACTOR = 10


def examples(n: int) -> int:
    """``max_examples`` for a property test whose own number is ``n``."""
    return n * NIGHTLY_FACTOR if NIGHTLY else n
