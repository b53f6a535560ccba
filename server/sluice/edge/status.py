"""gRPC status codes and the error a handler raises to answer with one."""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

__all__ = ["GrpcError", "Status"]


class Status(IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """Raised by a handler (or the edge) to end a call with ``status`` and ``message``;
    ``trailers`` are added to the response's trailing metadata."""

    def __init__(
        self,
        status: Status,
        message: str = "",
        trailers: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message
        self.trailers = tuple(trailers)
