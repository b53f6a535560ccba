"""Configuration of the whole test run: the shared fixtures (``tests/support/fixtures.py``, a
plugin) and Hypothesis's profiles."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Fixtures every test package may use (Redis, PostgreSQL), from the one shared place.
pytest_plugins = ["tests.support.fixtures"]

# Locally every run explores new examples; CI replays a fixed sequence, so a submission's
# result does not depend on the draw (run locally to hunt for new counterexamples).
settings.register_profile("ci", derandomize=True)
# SLUICE_FUZZ=nightly: the nightly-sized fuzz run (tests/abuse/_volume.py sizes each fuzz test;
# other property tests get ten times their default). Always fresh examples, even under CI,
# and no per-example deadline: a slow example is not a failure there, a crash is.
settings.register_profile(
    "nightly",
    max_examples=1000,
    derandomize=False,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
if os.environ.get("SLUICE_FUZZ") == "nightly":
    settings.load_profile("nightly")
elif os.environ.get("CI"):
    settings.load_profile("ci")
