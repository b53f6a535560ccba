"""Fixtures for the admin app tests: a seeded SQLite config database and signed-in users."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import load_text
from sluice_admin.auth import Account, Role, hash_password
from sluice_admin.data import AdminData
from tests.admin._harness import PASSWORD

SHOP = """\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
"""

# Hashing is deliberately slow: once per test session is enough.
_HASH = hash_password(PASSWORD)


@pytest.fixture
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A config database with domain 'shop' at version 1, users 'ed' (editor, from the
    setting) and 'vi' (viewer, from the database), and the app pointed at it: SQLite, or
    a PostgreSQL database of the test's own for tests marked ``ON_BOTH_DATABASES``."""
    if getattr(request, "param", "sqlite") == "postgresql":
        url = request.getfixturevalue("postgres_url")  # dropped after the test
    else:
        url = f"sqlite:///{tmp_path / 'sluice.db'}"
    data = AdminData.open(url)
    data.save_account(Account("vi", Role.VIEWER, _HASH), actor="seed")
    data.close()
    with PolicyStore(url) as store:
        PolicyService(store).publish(load_text(SHOP), author="seed", comment="first")
    monkeypatch.setenv("SLUICE_DATABASE_URL", url)
    monkeypatch.setenv("SLUICE_ADMIN_USERS", f"ed:editor:{_HASH}")
    return url


@pytest.fixture
def store(database_url: str) -> Iterator[PolicyStore]:
    with PolicyStore(database_url) as s:
        yield s


@pytest.fixture
def service(store: PolicyStore) -> PolicyService:
    return PolicyService(store)
