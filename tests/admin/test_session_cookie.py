"""The session cookie: signed, expiring, and sent with the flags that keep it to this app."""

from __future__ import annotations

from sluice_admin.session_cookie import (
    CookieSession,
    cookie_header,
    expired_cookie_header,
    new_token,
    seal,
    token_hash,
    unseal,
)

KEY = b"k" * 32
SESSION = CookieSession("0123456789abcdef0123456789abcdef", new_token())


def test_a_sealed_cookie_reads_back_until_it_expires() -> None:
    value = seal(SESSION, 1_000, KEY)
    assert unseal(value, KEY, now_s=999.5) == SESSION
    assert unseal(value, KEY, now_s=1_000) is None


def test_a_cookie_signed_with_another_key_or_altered_is_refused() -> None:
    value = seal(SESSION, 1_000, KEY)
    assert unseal(value, b"x" * 32, now_s=0) is None
    session_id, token, expires, mac = value.split(".")
    other = CookieSession("f" * 32, token)
    assert unseal(f"{other.session_id}.{token}.{expires}.{mac}", KEY, now_s=0) is None
    assert unseal(f"{session_id}.{token}.99999.{mac}", KEY, now_s=0) is None  # longer life
    for garbled in ("", "a.b.c", value + ".x", value.replace(".", "")):
        assert unseal(garbled, KEY, now_s=0) is None


def test_tokens_are_random_and_only_their_hash_is_kept() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    token = tokens.pop()
    assert len(token) >= 43 and "." not in token  # 256 bits; the cookie splits on dots
    assert token_hash(token) != token and len(token_hash(token)) == 64


def test_the_cookie_is_http_only_same_site_strict_and_secure_over_https() -> None:
    assert cookie_header("v", max_age_s=60, secure=False) == (
        "sluice_admin_session=v; Max-Age=60; Path=/; HttpOnly; SameSite=Strict"
    )
    assert cookie_header("v", max_age_s=60, secure=True).endswith("; Secure")
    assert expired_cookie_header(secure=False) == (
        "sluice_admin_session=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"
    )
