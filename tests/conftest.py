"""Fixtures shared across the test suites."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import settings
from psycopg import sql
from sqlalchemy.engine import make_url

# Locally every run explores new examples; CI replays a fixed sequence, so a submission's
# result does not depend on the draw (run locally to hunt for new counterexamples).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
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
