"""Sign-in attempts counted in Redis: two admin replicas share one budget per name."""

from __future__ import annotations

import pytest

from sluice.app import make_backend
from sluice.settings import Settings
from sluice_admin.throttle import SignInLimiter, SignInRefused


def test_replicas_on_one_redis_share_the_attempt_budget(redis_server: str) -> None:
    settings = Settings(backend="redis", redis_url=redis_server, redis_key_prefix="throttle-test:")
    first, second = (SignInLimiter(make_backend(settings)) for _ in range(2))
    for limiter in (first, second, first, second, first):
        limiter.attempt("ann")
    for limiter in (first, second):
        with pytest.raises(SignInRefused) as refused:
            limiter.attempt("ann")
        assert 0 < refused.value.retry_after_s <= 12
    second.attempt("bob")
