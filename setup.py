"""The build's one addition to pyproject.toml: the request path compiled with mypyc.

These modules run on every ShouldRateLimit call; compiled, Sluice's own cost per call is
about half of the interpreted one (``bench/path_cost.py``). They are plain typed Python
(``mypy --strict`` clean), so the source stays the reference: ``SLUICE_PURE_PYTHON=1`` at
install time builds nothing and runs them interpreted. docs/architecture.md says more.
"""

from __future__ import annotations

import os

from setuptools import setup

COMPILED = [
    "server/sluice/grpc/codec.py",
    "server/sluice/limiter.py",
    "server/sluice/bounds.py",
    "server/sluice/policies/snapshot.py",
    "server/sluice/policies/glob.py",
    "server/sluice/backends/memory.py",
    "server/sluice/usage/recorder.py",
    "server/sluice/algorithms/fixed_window.py",
    "server/sluice/algorithms/sliding_window_log.py",
    "server/sluice/algorithms/sliding_window_counter.py",
    "server/sluice/algorithms/token_bucket.py",
    "server/sluice/algorithms/leaky_bucket.py",
    "server/sluice/algorithms/gcra.py",
    "server/sluice/algorithms/_schedule.py",
    "server/sluice/algorithms/calendar.py",
    # RLQS: per bucket, every report and every rebalance (bench/rlqs_buckets.py).
    "server/sluice/rlqs/assignment.py",
    "server/sluice/rlqs/shares.py",
    "server/sluice/rlqs/buckets.py",
    "server/sluice/rlqs/session.py",
]


def extensions() -> list[object]:
    if os.environ.get("SLUICE_PURE_PYTHON") == "1":
        return []
    from mypyc.build import mypycify

    # The build environment has mypy and setuptools only, not the libraries these modules
    # import: the build compiles and does not judge. mypy --strict ([tool.mypy], CI's gate)
    # checks them against those libraries; here no config file is read and imports it cannot
    # find are Any.
    flags = ["--config-file=", "--ignore-missing-imports"]
    return mypycify([*flags, *COMPILED], opt_level="3")


setup(ext_modules=extensions())
