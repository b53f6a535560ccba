"""Fixtures shared across the test suites."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql
from sqlalchemy.engine import make_url

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

# The machine-wide PostgreSQL used by integration tests (trust auth); override for CI.
POSTGRES_ADMIN_URL = os.environ.get(
    "SLUICE_TEST_POSTGRES_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a brand-new, empty PostgreSQL database, dropped again after the test.

    Fails (never skips) when PostgreSQL is unreachable: a silent skip would hide that half
    of the backend matrix stopped running.
    """
    name = f"sluice_test_{uuid.uuid4().hex}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL for tests not reachable at {POSTGRES_ADMIN_URL}: {exc}")
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(False)
        finally:
            # FORCE: a store the test forgot to close must not keep the database alive.
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
