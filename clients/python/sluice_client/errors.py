"""Every exception the client raises, in one tree.

::

    SluiceError
     ├── SluiceUnavailable   Sluice could not be asked (unreachable, deadline, server error)
     │                       and the client was built with on_unavailable="raise"
     ├── InvalidRequest      the request is malformed: refused before sending, or by Sluice
     │                       (INVALID_ARGUMENT); also a ValueError
     └── RateLimited         acquire() was not admitted within max_wait_s; carries the decision

``check()`` never raises for a refusal: a refused request is an answer, not an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

    from sluice_client.types import Decision

__all__ = ["InvalidRequest", "RateLimited", "SluiceError", "SluiceUnavailable"]


class SluiceError(Exception):
    """Base of every exception this package raises."""


class SluiceUnavailable(SluiceError):
    """Sluice gave no decision; ``code`` is the gRPC status (None if there was no call)."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class InvalidRequest(SluiceError, ValueError):
    """A malformed request. Never degraded to a decision: it is a bug in the caller, and
    failing open would hide it."""


class RateLimited(SluiceError):
    """``acquire()`` gave up; ``decision`` is the last answer (``decision.retry_after_s`` says
    when trying again could succeed, None when it never will)."""

    def __init__(self, message: str, *, decision: Decision) -> None:
        super().__init__(message)
        self.decision = decision
