"""Sign-in attempts, rate limited by Sluice itself.

Every attempt is a decision of a :class:`~sluice.limiter.RateLimiter`, the code that answers
ShouldRateLimit, over the backend the settings name: with ``--backend redis`` every admin
replica counts against the same Redis counters; with ``memory`` each process counts alone.
The policy is built in and lives in the reserved domain ``sluice_admin``, so no operator
edit can switch it off.

Three limits, each a rule of the built-in policy, all decided before the password is
checked (a throttled attempt costs no scrypt either):

- per user name: a guessing script gets five tries a minute per name however it spreads
  them over sessions and tabs;
- per client address: password spraying (a few guesses at each of many names) from one
  address gets twenty tries a minute in all;
- failed sign-ins overall: once sixty have failed within a minute, from anywhere, every
  attempt waits (a distributed spray), told the time until the failures have all aged out.
  This can also hold back a rightful admin while an attack goes on: that is the price of
  the ceiling, and it clears a minute after the failures stop.
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
from sluice.model import Code, Decision, Descriptor, RateLimitRequest
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

__all__ = ["DOMAIN", "SignInLimiter", "SignInRefused", "SignInUnavailable"]

DOMAIN = "sluice_admin"
KEY = "sign_in_attempt"
ADDRESS_KEY = "sign_in_address"
FAILURES_KEY = "sign_in_failures"
# GCRA throughout, each in a burst of its rate: a typo or two never locks anyone out; once a
# burst is spent, attempts are spaced evenly (one every 12 s per name, every 3 s per address).
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
  - key: {ADDRESS_KEY}
    rate_limit:
      name: sign-in attempts per client address
      unit: minute
      requests_per_unit: 20
      algorithm: gcra
      burst: 20
  - key: {FAILURES_KEY}
    rate_limit:
      name: failed sign-ins overall
      unit: minute
      requests_per_unit: 60
      algorithm: gcra
      burst: 60
"""
# The address used when Streamlit does not know the client's (it reports none for
# localhost): such attempts share one counter.
UNKNOWN_ADDRESS = "unknown"


class SignInRefused(Exception):
    """Too many sign-in attempts (``why`` says of what); ``retry_after_s`` says when to try
    again."""

    def __init__(self, why: str, retry_after_s: float) -> None:
        super().__init__(why, retry_after_s)
        self.why = why
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        seconds = max(1, math.ceil(self.retry_after_s))
        return f"Too many {self.why}. Try again in {seconds} s."


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

    def attempt(self, name: str, address: str | None = None) -> None:
        """Count one attempt for ``name`` from ``address``; SignInRefused if it is one too
        many (or failed sign-ins are over their ceiling), SignInUnavailable if the limiter
        cannot tell."""
        failures = self._decide(
            Descriptor(((FAILURES_KEY, "all"),), hits_addend=0),  # looked at, not counted
        )
        if failures.statuses[0].limit_remaining == 0:
            wait = failures.statuses[0].duration_until_reset_s
            raise SignInRefused("failed sign-ins just now, from anywhere", wait)
        decision = self._decide(
            Descriptor(((KEY, name),)),
            Descriptor(((ADDRESS_KEY, address or UNKNOWN_ADDRESS),)),
        )
        per_name, per_address = decision.statuses
        if per_name.code is Code.OVER_LIMIT:
            raise SignInRefused(f"sign-in attempts for '{name}'", per_name.duration_until_reset_s)
        if per_address.code is Code.OVER_LIMIT:
            wait = per_address.duration_until_reset_s
            raise SignInRefused("sign-in attempts from your address", wait)

    def failed(self) -> None:
        """Count one failed sign-in towards the ceiling of failures overall."""
        self._decide(Descriptor(((FAILURES_KEY, "all"),)))

    def _decide(self, *descriptors: Descriptor) -> Decision:
        request = RateLimitRequest(DOMAIN, descriptors)
        future = asyncio.run_coroutine_threadsafe(
            self._limiter.should_rate_limit(request), self._loop
        )
        try:
            return future.result(self._timeout_s)
        except (BackendUnavailableError, TimeoutError):
            future.cancel()
            raise SignInUnavailable() from None
