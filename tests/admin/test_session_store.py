"""Sessions in the config database, on SQLite and PostgreSQL: a ticket traded once for the
cookie, the token checked, sessions ended for a user everywhere, the signing key made once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice_admin.auth import Role, User
from sluice_admin.data import AdminData
from sluice_admin.session_cookie import CookieSession
from sluice_admin.session_store import TICKET_TTL_S, Ended, SessionRow, verdict

ED = User("ed", Role.EDITOR)
VI = User("vi", Role.VIEWER)
T0 = 1_764_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'config.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def data(database_url: str) -> Iterator[AdminData]:
    opened = AdminData.open(database_url)
    yield opened
    opened.close()


def test_a_ticket_is_traded_once_for_the_cookie(data: AdminData) -> None:
    session_id, ticket = data.sessions.start(ED, now_s=T0, lifetime_s=3600)
    traded = data.sessions.redeem(ticket, now_s=T0 + 1)
    assert traded is not None
    cookie, expires_s = traded
    assert cookie.session_id == session_id and expires_s == int(T0 + 3600)
    assert data.sessions.redeem(ticket, now_s=T0 + 2) is None  # used
    row = data.sessions.by_cookie(cookie)
    assert row == SessionRow(session_id, ED, T0, T0 + 3600, None, False)
    assert data.sessions.by_cookie(CookieSession(session_id, "not-the-token")) is None


def test_a_late_or_unknown_ticket_is_refused(data: AdminData) -> None:
    _, ticket = data.sessions.start(ED, now_s=T0, lifetime_s=3600)
    assert data.sessions.redeem(ticket, now_s=T0 + TICKET_TTL_S) is None
    assert data.sessions.redeem("made-up", now_s=T0) is None


def test_signing_out_ends_every_session_of_the_user_and_no_other(data: AdminData) -> None:
    mine = [data.sessions.start(ED, now_s=T0, lifetime_s=3600)[0] for _ in range(3)]
    theirs, ticket = data.sessions.start(VI, now_s=T0, lifetime_s=3600)
    assert data.sessions.end_user("ed", Ended.SIGNED_OUT, now_s=T0 + 5) == 3
    for session_id in mine:
        row = data.sessions.get(session_id)
        assert row is not None and verdict(row, T0 + 5, 0) is Ended.SIGNED_OUT
    row = data.sessions.get(theirs)
    assert row is not None and verdict(row, T0 + 5, 0) is None
    assert data.sessions.end_user("ed", Ended.SIGNED_OUT, now_s=T0 + 6) == 0  # already ended
    # An ended session's ticket is worthless too.
    data.sessions.end(theirs, Ended.SIGNED_OUT, now_s=T0 + 7)
    assert data.sessions.redeem(ticket, now_s=T0 + 8) is None


def test_idle_and_lifetime(data: AdminData) -> None:
    session_id, _ = data.sessions.start(ED, now_s=T0, lifetime_s=100)
    data.sessions.touch(session_id, now_s=T0 + 50)
    row = data.sessions.get(session_id)
    assert row is not None and row.last_seen_s == T0 + 50
    assert verdict(row, T0 + 80, idle_timeout_s=30) is None
    assert verdict(row, T0 + 80.5, idle_timeout_s=30) is Ended.IDLE
    assert verdict(row, T0 + 99, idle_timeout_s=0) is None  # 0: no idle timeout
    assert verdict(row, T0 + 100, idle_timeout_s=0) is Ended.EXPIRED


def test_a_used_single_sign_on_identity_is_remembered(data: AdminData) -> None:
    assert not data.sessions.identity_used("mark")
    session_id, _ = data.sessions.start(ED, now_s=T0, lifetime_s=60, identity="mark")
    assert data.sessions.identity_used("mark")
    row = data.sessions.get(session_id)
    assert row is not None and row.sso


def test_the_signing_key_is_made_once_for_every_replica(database_url: str) -> None:
    first, second = AdminData.open(database_url), AdminData.open(database_url)
    try:
        key = first.sessions.signing_key(now_s=T0)
        assert len(key) >= 48
        assert second.sessions.signing_key(now_s=T0 + 1) == key
    finally:
        first.close()
        second.close()


def test_rows_long_past_their_expiry_are_deleted(data: AdminData) -> None:
    old, _ = data.sessions.start(ED, now_s=T0, lifetime_s=60)
    data.sessions.start(ED, now_s=T0 + 60 + 86_401, lifetime_s=60)
    assert data.sessions.get(old) is None
