"""Pending edits in the config database, per user, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice_admin.data import AdminData
from sluice_admin.draft_store import StoredDraft


@pytest.fixture(params=["sqlite", "postgresql"])
def data(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AdminData]:
    url = (
        f"sqlite:///{tmp_path / 'config.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    opened = AdminData.open(url)
    yield opened
    opened.close()


def test_each_user_has_their_own_drafts(data: AdminData) -> None:
    shop = StoredDraft("shop", 3, "domain: shop\ndescriptors: []\n", "domain: shop\n")
    new = StoredDraft("edge", 0, "domain: edge\ndescriptors: [{key: ip}]\n", None)
    data.drafts.put("ed", shop)
    data.drafts.put("ed", new)
    data.drafts.put("al", StoredDraft("shop", 2, "x", "y"))
    assert data.drafts.all("ed") == [new, shop]  # by domain
    assert data.drafts.get("al", "shop") == StoredDraft("shop", 2, "x", "y")
    assert data.drafts.get("vi", "shop") is None


def test_a_draft_is_replaced_and_dropped(data: AdminData) -> None:
    data.drafts.put("ed", StoredDraft("shop", 1, "a", "b"))
    data.drafts.put("ed", StoredDraft("shop", 2, "c", None))
    assert data.drafts.all("ed") == [StoredDraft("shop", 2, "c", None)]
    data.drafts.drop("ed", "shop")
    data.drafts.drop("ed", "shop")  # nothing there: no error
    assert data.drafts.all("ed") == []
