"""Sign-in attempts, rate limited by Sluice itself.

Every attempt is a decision of a :class:`~sluice.limiter.RateLimiter`, the code that answers
ShouldRateLimit, over the backend the settings name: with ``--backend redis`` every admin
replica counts against the same Redis counters; with ``memory`` each process counts alone.
The policy is built in and lives in the reserved domain ``sluice_admin``, so no operator
edit can switch it off.

Attempts are counted per user name, before the password is checked: a guessing script gets
five tries a minute per name however it spreads them over sessions and tabs, and a
throttled attempt costs no scrypt either.
"""

from __future__ import annotations

import asyncio
import math
import threading

from sluice.backends import Backend
from sluice.backends.memory import MemoryBackend
from sluice.clock import Clock, SystemClock
from sluice.errors import BackendUnavailableError
from sluice.limiter import LimiterSettings, RateLimiter
from sluice.model import Code, Descriptor, RateLimitRequest
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

__all__ = ["DOMAIN", "SignInLimiter", "SignInRefused", "SignInUnavailable"]

DOMAIN = "sluice_admin"
KEY = "sign_in_attempt"
# 5 a minute in a burst of 5 (GCRA): a typo or two never locks anyone out; once the burst
# is spent, one attempt every 12 s.
POLICY = f"""\
domain: {DOMAIN}
descriptors:
  - key: {KEY}
    rate_limit:
      name: sign-in attempts per user name
      unit: minute
      requests_per_unit: 5
      algorithm: gcra
      burst: 5
"""


class SignInRefused(Exception):
    """Too many sign-in attempts for this name; ``retry_after_s`` says when to try again."""

    def __init__(self, name: str, retry_after_s: float) -> None:
        super().__init__(name, retry_after_s)
        self.name = name
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        seconds = max(1, math.ceil(self.retry_after_s))
        return f"Too many sign-in attempts for '{self.name}'. Try again in {seconds} s."


class SignInUnavailable(Exception):
    """The rate limiter cannot decide (its Redis is down): sign-in fails closed."""

    def __str__(self) -> str:
        return "Sign-in is unavailable: its rate limiter cannot be reached. Try again shortly."


class SignInLimiter:
    """Decides whether one more sign-in attempt for a name may go ahead.

    The limiter's backend is asyncio; Streamlit runs pages in threads. One event loop in a
    daemon thread serves every page, so a Redis connection pool lives on one loop.
    """

    def __init__(
        self, backend: Backend | None = None, clock: Clock | None = None, timeout_s: float = 2.0
    ) -> None:
        snapshot = Snapshot(load_text(POLICY, "<built-in sign-in policy>"))
        self._limiter = RateLimiter(
            lambda: snapshot,
            backend if backend is not None else MemoryBackend(max_keys=100_000),
            clock or SystemClock(),
            LimiterSettings(failure_mode="error"),
        )
        self._timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="sign-in-limiter", daemon=True).start()

    def attempt(self, name: str) -> None:
        """Count one attempt; SignInRefused if it is one too many, SignInUnavailable if the
        limiter cannot tell."""
        request = RateLimitRequest(DOMAIN, (Descriptor(((KEY, name),)),))
        future = asyncio.run_coroutine_threadsafe(
            self._limiter.should_rate_limit(request), self._loop
        )
        try:
            decision = future.result(self._timeout_s)
        except (BackendUnavailableError, TimeoutError):
            future.cancel()
            raise SignInUnavailable() from None
        if decision.overall_code is Code.OVER_LIMIT:
            raise SignInRefused(name, decision.statuses[0].duration_until_reset_s)
