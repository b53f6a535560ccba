"""The admin app's session cookie: what it holds, how it is signed, how it is sent.

Pure (no Streamlit, no database). The cookie is ``ID.TOKEN.EXPIRES.MAC``: the session's id,
a random token whose SHA-256 only the server's session row holds, when the cookie stops
counting (Unix seconds), and an HMAC-SHA256 over the three under the signing key. A cookie
is only as good as its row (see session_store.py): the signature lets a forged or garbled
cookie be refused without a database read, and changing the key ends every session at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

__all__ = [
    "COOKIE_NAME",
    "SIGN_OUT_PATH",
    "TICKET_PATH",
    "CookieSession",
    "cookie_header",
    "expired_cookie_header",
    "new_token",
    "seal",
    "token_hash",
    "unseal",
]

COOKIE_NAME = "sluice_admin_session"
# served.py's routes: trade a sign-in ticket for the cookie; drop the cookie.
TICKET_PATH = "/_sluice/session"
SIGN_OUT_PATH = "/_sluice/sign-out"
_TOKEN_BYTES = 32


@dataclass(frozen=True)
class CookieSession:
    """What a valid cookie says: which session, and the token proving it was handed out."""

    session_id: str
    token: str


def new_token() -> str:
    """A random secret for a session token or a sign-in ticket (256 bits, URL-safe)."""
    return secrets.token_urlsafe(_TOKEN_BYTES)


def token_hash(token: str) -> str:
    """What the database keeps of a token or ticket: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def _mac(key: bytes, payload: str) -> str:
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def seal(session: CookieSession, expires_s: int, key: bytes) -> str:
    """The cookie's value for ``session``, valid until ``expires_s``."""
    payload = f"{session.session_id}.{session.token}.{expires_s}"
    return f"{payload}.{_mac(key, payload)}"


def unseal(value: str, key: bytes, now_s: float) -> CookieSession | None:
    """The session a cookie names, or None if it is malformed, not signed with ``key``, or
    past its expiry."""
    parts = value.split(".")
    if len(parts) != 4:
        return None
    session_id, token, expires, mac = parts
    if not hmac.compare_digest(mac, _mac(key, f"{session_id}.{token}.{expires}")):
        return None
    if not expires.isdigit() or int(expires) <= now_s:
        return None
    return CookieSession(session_id, token)


def cookie_header(value: str, *, max_age_s: int, secure: bool, path: str = "/") -> str:
    """The Set-Cookie value: script cannot read it (HttpOnly), no other site's page or link
    sends it (SameSite=Strict), HTTPS only when the app is served over HTTPS (Secure)."""
    attributes = [
        f"{COOKIE_NAME}={value}",
        f"Max-Age={max(0, max_age_s)}",
        f"Path={path}",
        "HttpOnly",
        "SameSite=Strict",
    ]
    if secure:
        attributes.append("Secure")
    return "; ".join(attributes)


def expired_cookie_header(*, secure: bool, path: str = "/") -> str:
    """A Set-Cookie value that makes the browser drop the cookie."""
    return cookie_header("", max_age_s=0, secure=secure, path=path)
