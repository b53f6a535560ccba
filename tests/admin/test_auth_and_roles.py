"""Password hashes, the users setting, sign-in throttling, and roles enforced in data.py."""

from __future__ import annotations

import pytest

from sluice.app import make_backend
from sluice.clock import ManualClock
from sluice.policies.yaml_format import load_text
from sluice.settings import Settings
from sluice_admin.auth import (
    Account,
    Role,
    User,
    hash_password,
    parse_users,
    sign_in,
    verify_password,
)
from sluice_admin.data import AdminData, NotAllowedError
from sluice_admin.throttle import SignInLimiter, SignInRefused, SignInUnavailable
from tests.admin._harness import ON_BOTH_DATABASES
from tests.support.processes import free_port, run_sluice

VIEWER, EDITOR = User("vi", Role.VIEWER), User("ed", Role.EDITOR)


def test_hashes_are_salted_scrypt_and_verify() -> None:
    first, second = hash_password("pw-12345"), hash_password("pw-12345")
    assert first != second  # per-user salt
    assert first.startswith("scrypt$16384$8$1$")
    assert verify_password("pw-12345", first)
    assert not verify_password("pw-12346", first)
    for broken in ("", "md5$x", "scrypt$1$2$3$zz$zz", first.rsplit("$", 1)[0]):
        assert not verify_password("pw-12345", broken)


def test_users_setting() -> None:
    hashed = hash_password("x")
    accounts = parse_users(f" ann:editor:{hashed}, bob:viewer:{hashed} ,")
    assert accounts["ann"] == Account("ann", Role.EDITOR, hashed)
    assert accounts["bob"].role is Role.VIEWER
    with pytest.raises(ValueError, match="entry 1: expected NAME:ROLE:HASH"):
        parse_users("ann:editor")


def test_five_attempts_then_one_every_twelve_seconds_per_name() -> None:
    clock = ManualClock(1000.0)
    limiter = SignInLimiter(clock=clock)
    for _ in range(5):
        limiter.attempt("ann")
    with pytest.raises(SignInRefused) as refused:
        limiter.attempt("ann")
    assert refused.value.retry_after_s == pytest.approx(12.0)
    assert str(refused.value) == "Too many sign-in attempts for 'ann'. Try again in 12 s."
    clock.set(1011.9)
    with pytest.raises(SignInRefused):
        limiter.attempt("ann")
    clock.set(1012.0)
    limiter.attempt("ann")
    limiter.attempt("bob")  # per name


def test_spraying_names_from_one_address_is_refused_after_twenty() -> None:
    # The attack found: 20 names x 5 guesses = 100 checks, all let through by a per-name limit.
    accounts = {"ann": Account("ann", Role.EDITOR, hash_password("right"))}
    limiter = SignInLimiter(clock=ManualClock(1000.0))
    outcomes = []
    for guess in range(5):
        for n in range(20):
            try:
                sign_in(accounts, limiter, f"user{n}", f"guess{guess}", "203.0.113.9")
                outcomes.append("checked")
            except SignInRefused as exc:
                outcomes.append(str(exc))
    assert outcomes[:20] == ["checked"] * 20
    assert outcomes[20:] == ["Too many sign-in attempts from your address. Try again in 3 s."] * 80
    # Another address is not held back by this one.
    assert sign_in(accounts, limiter, "ann", "right", "198.51.100.7") == User("ann", Role.EDITOR)


def test_failed_sign_ins_overall_have_a_ceiling(caplog: pytest.LogCaptureFixture) -> None:
    accounts = {"ann": Account("ann", Role.EDITOR, hash_password("right"))}
    clock = ManualClock(1000.0)
    limiter = SignInLimiter(clock=clock)
    # Sixty failures, each from its own address and name: no per-name or per-address limit.
    for n in range(60):
        assert sign_in(accounts, limiter, f"user{n}", "guess", f"10.0.0.{n}") is None
    assert caplog.messages[-1] == "sign-in failed for 'user59' from 10.0.0.59"
    with pytest.raises(SignInRefused) as refused:
        sign_in(accounts, limiter, "ann", "right", "192.0.2.1")
    expected = "Too many failed sign-ins just now, from anywhere. Try again in 60 s."
    assert str(refused.value) == expected
    clock.advance(1.0)  # one failure's worth of the ceiling (60 a minute) is back
    assert sign_in(accounts, limiter, "ann", "right", "192.0.2.1") == User("ann", Role.EDITOR)


def test_successful_sign_ins_do_not_count_as_failures() -> None:
    accounts = {"ann": Account("ann", Role.EDITOR, hash_password("right"))}
    clock = ManualClock(1000.0)
    limiter = SignInLimiter(clock=clock)
    for _ in range(70):
        clock.advance(13.0)  # within the per-name and per-address limits
        assert sign_in(accounts, limiter, "ann", "right", "192.0.2.1") is not None


def test_a_throttled_name_is_refused_even_with_the_right_password() -> None:
    accounts = {"ann": Account("ann", Role.EDITOR, hash_password("right"))}
    clock = ManualClock()
    limiter = SignInLimiter(clock=clock)
    for _ in range(5):
        assert sign_in(accounts, limiter, "ann", "wrong") is None
    with pytest.raises(SignInRefused):
        sign_in(accounts, limiter, "ann", "right")
    clock.advance(12.0)
    assert sign_in(accounts, limiter, "ann", "right") == User("ann", Role.EDITOR)


def test_impossible_names_are_neither_counted_nor_hashed() -> None:
    accounts = {"ann": Account("ann", Role.EDITOR, hash_password("right"))}
    limiter = SignInLimiter(clock=ManualClock())
    for name in ("", "x" * 256):
        for _ in range(10):
            assert sign_in(accounts, limiter, name, "right") is None
    assert sign_in(accounts, limiter, "ann", "right") == User("ann", Role.EDITOR)


def test_sign_in_fails_closed_when_the_limiters_redis_is_down() -> None:
    # A Redis backend pointed at a port nothing listens on: the limiter cannot decide, so
    # nobody signs in (an outage must not switch the throttle off).
    backend = make_backend(
        Settings(backend="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0", local_cache=False)
    )
    limiter = SignInLimiter(backend)
    accounts = {"ann": Account("ann", Role.EDITOR, hash_password("right"))}
    with pytest.raises(SignInUnavailable):
        sign_in(accounts, limiter, "ann", "right")


@ON_BOTH_DATABASES
def test_viewers_cannot_change_anything_even_bypassing_the_ui(database_url: str) -> None:
    data = AdminData.open(database_url)
    [policy] = load_text("domain: shop\ndescriptors:\n  - key: other\n")
    with pytest.raises(NotAllowedError, match="vi is a viewer: only editors may publish"):
        data.publish(VIEWER, policy, base_version=1, comment="")
    with pytest.raises(NotAllowedError):
        data.rollback(VIEWER, "shop", 1, base_version=1)
    with pytest.raises(NotAllowedError):
        data.import_document(VIEWER, "domain: x\n", "x.yaml", comment="")
    assert data.get("shop").version == 1
    assert data.publish(EDITOR, policy, base_version=1, comment="ok") == 2
    data.close()


@ON_BOTH_DATABASES
def test_admin_user_add_stores_a_user_or_prints_an_entry(database_url: str) -> None:
    added = run_sluice(
        ["admin-user", "add", "zoe", "--role", "editor", "--database-url", database_url],
        input="long enough pw\n",
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout == "zoe: created (editor)\n"
    data = AdminData.open(database_url)
    assert verify_password("long enough pw", data.accounts()["zoe"].password_hash)
    data.close()

    printed = run_sluice(
        ["admin-user", "add", "amy", "--role", "viewer", "--print"], input="pw-pw-pw-pw\n"
    )
    name, role, hashed = printed.stdout.strip().split(":")
    assert (name, role) == ("amy", "viewer") and verify_password("pw-pw-pw-pw", hashed)

    short = run_sluice(["admin-user", "add", "x", "--role", "viewer", "--print"], input="short\n")
    assert short.returncode == 1
