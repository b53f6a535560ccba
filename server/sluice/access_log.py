"""Sampled access logging of decisions (``--access-log-sample-rate``): one DEBUG line on the
``sluice.access`` logger for a random share of ShouldRateLimit calls, with the domain, the
descriptors, the overall code (or the refusal: ``invalid``, ``error``), the time the call
took and the caller's address when the transport tells it.

Off unless both the rate is above 0 and the log level is DEBUG: ``AccessLog.create`` then
returns None, and the request path pays one ``is None`` test for it. Sampling, not every
call: at the rates Sluice serves, a line per call would cost more than the decision.
The descriptor values are the caller's data (addresses, user ids): they land in the log.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from sluice.model import RateLimitRequest

__all__ = ["AccessLog"]

log = logging.getLogger("sluice.access")


class AccessLog:
    def __init__(self, sample_rate: float, *, rand: Callable[[], float] = random.random) -> None:
        """``rand``: a number in [0, 1) per call (injected by tests)."""
        self._sample_rate = sample_rate
        self._rand = rand
        self.logged = 0

    @classmethod
    def create(
        cls, sample_rate: float, *, rand: Callable[[], float] = random.random
    ) -> AccessLog | None:
        """An access log when it would write anything; None otherwise (the module docstring)."""
        if sample_rate <= 0 or not log.isEnabledFor(logging.DEBUG):
            return None
        return cls(sample_rate, rand=rand)

    def observe(self, request: object, code: str, elapsed_s: float, context: object) -> None:
        """One call's line, if this call is in the sample."""
        if self._rand() >= self._sample_rate:
            return
        self.logged += 1
        domain = descriptors = ""
        if isinstance(request, RateLimitRequest):
            domain = request.domain
            descriptors = "; ".join(
                ",".join(f"{key}={value}" for key, value in d.entries) for d in request.descriptors
            )
        peer = _peer(context)
        duration_ms = round(elapsed_s * 1000, 3)
        log.debug(
            "decision domain=%s descriptors=[%s] overall_code=%s duration_ms=%s peer=%s",
            domain,
            descriptors,
            code,
            duration_ms,
            peer,
            extra={
                "domain": domain,
                "descriptors": descriptors,
                "overall_code": code,
                "duration_ms": duration_ms,
                "peer": peer,
            },
        )


def _peer(context: object) -> str:
    """The call context's ``peer()`` (grpc.aio's, and the ASGI edge's in its format:
    ``ipv4:10.0.0.7:51234``); "-" where there is none."""
    peer = getattr(context, "peer", None)
    if callable(peer):
        try:
            return str(peer())
        except Exception:  # a transport without it; the line is still worth having
            return "-"
    return "-"
