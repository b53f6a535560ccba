"""Configuration of the whole test run: the shared fixtures (``tests/support/fixtures.py``, a
plugin), the markers each test directory gives its tests, and Hypothesis's profiles.

Markers (registered in pyproject.toml): ``faults``, ``abuse`` and ``e2e`` name a directory's
tests; ``slow`` is every test of tests/faults plus each test elsewhere that takes more than
about two seconds (marked where it is written). ``pytest -m "not slow"`` is the quick loop;
CI runs everything (docs/testing.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.examples import NIGHTLY, NIGHTLY_FACTOR

# Fixtures every test package may use (Redis, PostgreSQL), from the one shared place.
pytest_plugins = ["tests.support.fixtures"]

TESTS = Path(__file__).resolve().parent

# The markers every test below a directory of tests/ carries.
DIRECTORY_MARKERS = {
    "faults": ("faults", "slow"),  # each kills or freezes real servers under load: seconds
    "abuse": ("abuse",),
    "e2e": ("e2e",),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.resolve()
        if not path.is_relative_to(TESTS):
            continue
        for name in DIRECTORY_MARKERS.get(path.relative_to(TESTS).parts[0], ()):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)


# Locally every run explores new examples; CI replays a fixed sequence, so a submission's
# result does not depend on the draw (run locally to hunt for new counterexamples).
settings.register_profile("ci", derandomize=True)
# SLUICE_FUZZ=nightly: the nightly-sized fuzz run (tests/abuse/_volume.py sizes each fuzz test;
# every other property test runs ten times its examples: 1,000 here for those without a number
# of their own, Hypothesis's default being 100, and ``examples(N)`` for those with one, which
# no profile can override: tests/support/examples.py). Always fresh examples, even under CI,
# and no per-example deadline: a slow example is not a failure there, a crash is.
settings.register_profile(
    "nightly",
    max_examples=100 * NIGHTLY_FACTOR,
    derandomize=False,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
if NIGHTLY:
    settings.load_profile("nightly")
elif os.environ.get("CI"):
    settings.load_profile("ci")
