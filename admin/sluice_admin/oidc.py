"""Optional single sign-on through OpenID Connect, by Streamlit's own ``st.login``.

Pure (no Streamlit): the settings checked and turned into the ``[auth]`` secrets Streamlit
reads, and an identity provider's claims turned into an admin user. The provider signs the
user in; the role comes from one claim (``--admin-oidc-role-claim``, e.g. ``groups``) mapped
by ``--admin-oidc-roles`` (``sluice-admins:admin,sluice-editors:editor,…``); someone whose
claim maps to no role is refused.

Streamlit keeps the provider's answer in its own cookie for 30 days. Sluice does not take
that cookie as a session: it starts one of its own (session_store.py) only from an identity
token issued within ``FRESH_S`` and never used before, so signing out ends the session
everywhere even though Streamlit's cookie lingers in other browsers.
"""

from __future__ import annotations

import hashlib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.settings import Settings, flag_name
from sluice_admin.auth import Role

__all__ = [
    "CALLBACK_PATH",
    "FRESH_S",
    "PROVIDER",
    "OidcConfig",
    "identity",
    "is_fresh",
    "oidc_config",
    "parse_roles",
    "role_for",
    "streamlit_secrets",
    "user_name",
]

PROVIDER = "sso"  # the name st.login is given (Streamlit allows no underscore in it)
CALLBACK_PATH = "/oauth2callback"  # where Streamlit receives the provider's answer
FRESH_S = 300  # how old an identity token may be when it starts a session
_REQUIRED = (
    "admin_oidc_metadata_url",
    "admin_oidc_client_id",
    "admin_oidc_client_secret",
    "admin_oidc_redirect_uri",
    "admin_oidc_roles",
)
# Claims naming the user, best first (every provider sends ``sub``; people read the others).
_NAME_CLAIMS = ("email", "preferred_username", "sub")


@dataclass(frozen=True)
class OidcConfig:
    metadata_url: str
    client_id: str
    client_secret: str
    redirect_uri: str
    role_claim: str
    roles: dict[str, Role]


def parse_roles(text: str) -> dict[str, Role]:
    """``CLAIM_VALUE:ROLE,…`` as a mapping; ValueError names the bad entry. A claim value
    may hold colons (``urn:group:ops:editor`` maps ``urn:group:ops`` to editor)."""
    roles: dict[str, Role] = {}
    for index, entry in enumerate(e.strip() for e in text.split(",")):
        if not entry:
            continue
        value, colon, role = entry.rpartition(":")
        if not colon or not value.strip():
            raise ValueError(
                f"{flag_name('admin_oidc_roles')} entry {index + 1}: expected CLAIM_VALUE:ROLE"
            )
        try:
            roles[value.strip()] = Role(role.strip())
        except ValueError:
            raise ValueError(
                f"{flag_name('admin_oidc_roles')} entry {index + 1}: role must be "
                f"{', '.join(r.value for r in Role)}, not '{role.strip()}'"
            ) from None
    return roles


def _check_url(name: str, url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    local = parts.hostname in ("localhost", "127.0.0.1", "::1")
    if parts.scheme != "https" and not (parts.scheme == "http" and local):
        raise ValueError(
            f"{flag_name(name)}: '{url}' must be an https:// URL (http:// only for localhost)"
        )
    if not parts.hostname:
        raise ValueError(f"{flag_name(name)}: '{url}' has no host")


def oidc_config(settings: Settings) -> OidcConfig | None:
    """Single sign-on as the settings configure it; None when they leave it off. ValueError
    names the setting at fault: set all of the provider's settings or none."""
    given = [name for name in _REQUIRED if getattr(settings, name)]
    if not given:
        return None
    missing = [flag_name(name) for name in _REQUIRED if name not in given]
    if missing:
        raise ValueError(
            f"single sign-on needs {', '.join(missing)} too (or unset "
            f"{', '.join(flag_name(n) for n in given)})"
        )
    _check_url("admin_oidc_metadata_url", settings.admin_oidc_metadata_url)
    _check_url("admin_oidc_redirect_uri", settings.admin_oidc_redirect_uri)
    if urllib.parse.urlsplit(settings.admin_oidc_redirect_uri).path != CALLBACK_PATH:
        raise ValueError(
            f"{flag_name('admin_oidc_redirect_uri')}: must be the app's address plus "
            f"{CALLBACK_PATH} (where Streamlit receives the provider's answer)"
        )
    if not settings.admin_oidc_role_claim.strip():
        raise ValueError(f"{flag_name('admin_oidc_role_claim')}: may not be empty")
    roles = parse_roles(settings.admin_oidc_roles)
    if not roles:
        raise ValueError(f"{flag_name('admin_oidc_roles')}: maps no claim value to a role")
    return OidcConfig(
        settings.admin_oidc_metadata_url,
        settings.admin_oidc_client_id,
        settings.admin_oidc_client_secret,
        settings.admin_oidc_redirect_uri,
        settings.admin_oidc_role_claim.strip(),
        roles,
    )


def streamlit_secrets(config: OidcConfig, cookie_secret: str) -> dict[str, object]:
    """The ``[auth]`` secrets ``st.login(PROVIDER)`` reads (given to ``st.App``, never
    written to a file)."""
    return {
        "auth": {
            "redirect_uri": config.redirect_uri,
            "cookie_secret": cookie_secret,
            PROVIDER: {
                "client_id": config.client_id,
                "client_secret": config.client_secret,
                "server_metadata_url": config.metadata_url,
            },
        }
    }


# When several of a user's claim values map to roles, the one that may do most wins.
_RANK = {Role.VIEWER: 0, Role.EDITOR: 1, Role.ADMIN: 2}


def role_for(claims: Mapping[str, object], config: OidcConfig) -> Role | None:
    """The role the role claim maps to (the highest, if several of its values map to one),
    or None. The claim may be one string or a list of them (``groups`` usually is)."""
    found = claims.get(config.role_claim)
    values = [found] if isinstance(found, str) else found if isinstance(found, list) else []
    roles = {config.roles[v] for v in values if isinstance(v, str) and v in config.roles}
    return max(roles, key=_RANK.__getitem__) if roles else None


def user_name(claims: Mapping[str, object]) -> str | None:
    for claim in _NAME_CLAIMS:
        value = claims.get(claim)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def is_fresh(claims: Mapping[str, object], now_s: float) -> bool:
    """Whether the identity token was issued within ``FRESH_S`` (and not in the future by
    more than a minute of clock skew)."""
    issued = claims.get("iat")
    if isinstance(issued, bool) or not isinstance(issued, int | float):
        return False
    return -60 <= now_s - issued <= FRESH_S


def identity(claims: Mapping[str, object]) -> str:
    """One identity token's mark (issuer, subject, issue time, hashed): a session started
    from it is remembered, so the same token cannot start a second one."""
    parts = [str(claims.get(k, "")) for k in ("iss", "sub", "iat")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
