"""Hiding credentials before a value reaches a log line, an error message or a page.

Settings marked secret (sluice.settings) are redacted whole or, for URLs, down to their
password: an operator still sees which host and database a server uses.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact_url"]

REDACTED = "***"

# user:password@ in the authority; the password may itself contain ':' or '@' when written
# unescaped, so everything up to the last '@' before the path goes.
_USERINFO_PASSWORD = re.compile(r"(?P<head>://[^:/@?#]*:)[^/?#]*@")
# ?password=…, &sslpassword=…, token, secret: libpq, redis-py and SQLAlchemy all accept
# credentials as query parameters too.
_SECRET_QUERY = re.compile(
    r"(?P<head>[?&][^=&#]*(?:password|passwd|pwd|secret|token)[^=&#]*=)[^&#]*", re.IGNORECASE
)


def redact_url(url: str) -> str:
    """``url`` with every password and token in it replaced by ``***``."""
    redacted = _USERINFO_PASSWORD.sub(rf"\g<head>{REDACTED}@", url)
    if redacted == url and "@" in url and "://" not in url:
        # Not a URL at all, yet it may hold credentials: over-redacting is the safe side.
        redacted = REDACTED + "@" + url.rpartition("@")[2]
    return _SECRET_QUERY.sub(rf"\g<head>{REDACTED}", redacted)
