"""Fixtures of the abuse tests: a private Redis of their own (the integration tests' fixture,
registered here again, so a run of both directories starts one server for each and a SCAN
over this one sees only what the abuse tests wrote)."""

from __future__ import annotations

from tests.integration.conftest import redis_server  # noqa: F401 (a fixture)
