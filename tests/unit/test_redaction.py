from __future__ import annotations

import pytest

from sluice.redaction import redact_url


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("postgresql://u:p%40ss@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:p@ss:w@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        (
            "postgresql://h/db?user=u&password=pw&sslmode=require",
            "postgresql://h/db?user=u&password=***&sslmode=require",
        ),
        ("sqlite:///var/lib/sluice/sluice.db", "sqlite:///var/lib/sluice/sluice.db"),
        (
            "rediss://sluice:pw@h:6380/0?ssl_cert_reqs=required",
            "rediss://sluice:***@h:6380/0?ssl_cert_reqs=required",
        ),
        ("redis://:pw@h:6379", "redis://:***@h:6379"),
        ("redis+cluster://u:pw@a:1,b:2", "redis+cluster://u:***@a:1,b:2"),
        ("redis+sentinel://a:26379,b:26379/main", "redis+sentinel://a:26379,b:26379/main"),
        ("https://h/x?api_token=abc&x=1", "https://h/x?api_token=***&x=1"),
        ("::garbage://u:secret@host", "::garbage://u:***@host"),
        ("not a url :topsecret@host", "***@host"),
    ],
)
def test_passwords_and_tokens_are_hidden(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
