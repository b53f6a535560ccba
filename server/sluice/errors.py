"""Sluice's exception tree. Third-party errors are translated at the boundary (``raise … from``).

    SluiceError
    ├── ConfigError              a policy document is invalid (names source, line and reason)
    ├── InvalidRequestError      a ShouldRateLimit request is malformed (names the field)
    ├── ConfigDatabaseError      the config database cannot be reached or failed
    ├── BackendUnavailableError  algorithm state (e.g. Redis) cannot be reached
    ├── StaleVersionError        a publish based on a superseded version of a domain
    ├── DomainNotFoundError      no policy for that domain
    ├── NoConcurrencyRuleError   a lease asked for a descriptor no concurrency rule matches
    └── VersionNotFoundError     the domain has no such version

Callers catch SluiceError to tell a refusal or a configuration problem from a bug; every
transport answers one with the status ``status_of`` gives (anything else is a bug: INTERNAL,
500).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BackendUnavailableError",
    "ConfigDatabaseError",
    "ConfigError",
    "DomainNotFoundError",
    "ErrorStatus",
    "InvalidRequestError",
    "NoConcurrencyRuleError",
    "SluiceError",
    "StaleVersionError",
    "VersionNotFoundError",
    "status_of",
]


class SluiceError(Exception):
    """Root of every error Sluice raises on purpose."""


class ConfigError(SluiceError):
    """Problems in policy documents; ``problems`` holds each as 'source:line: reason'."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


class InvalidRequestError(SluiceError):
    """A request field is missing or out of bounds; the message names the field and the reason."""


class ConfigDatabaseError(SluiceError):
    """The config database could not be reached or refused an operation.

    Messages name the database by a redacted URL: they end up in logs and HTTP responses.
    """


class BackendUnavailableError(SluiceError):
    """The backend holding algorithm state cannot answer now (down, timed out, circuit open)."""


class StaleVersionError(SluiceError):
    """A publish was based on a version of a domain that is no longer its latest."""

    def __init__(self, domain: str, expected: int, actual: int) -> None:
        # All fields go to args so the exception survives pickling (multiprocessing, logging).
        super().__init__(domain, expected, actual)
        self.domain = domain
        self.expected = expected
        self.actual = actual

    def __str__(self) -> str:
        return (
            f"domain {self.domain!r} is at version {self.actual}, not the expected "
            f"{self.expected}; reload it and try again"
        )


class DomainNotFoundError(SluiceError):
    """No policy for that domain (never published, or deleted)."""


class NoConcurrencyRuleError(SluiceError):
    """A lease was asked for a descriptor that no ``concurrency`` rule matches."""


class VersionNotFoundError(SluiceError):
    """The domain has no such version."""


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    grpc: str  # a grpc.StatusCode name (this module stays free of grpc)
    http: int


# The one table from errors to what every transport answers; the first match wins.
_STATUS: tuple[tuple[type[SluiceError], ErrorStatus], ...] = (
    (InvalidRequestError, ErrorStatus("INVALID_ARGUMENT", 400)),
    (ConfigError, ErrorStatus("INVALID_ARGUMENT", 400)),
    (DomainNotFoundError, ErrorStatus("NOT_FOUND", 404)),
    (VersionNotFoundError, ErrorStatus("NOT_FOUND", 404)),
    (NoConcurrencyRuleError, ErrorStatus("NOT_FOUND", 404)),
    (StaleVersionError, ErrorStatus("FAILED_PRECONDITION", 409)),
    # Unavailable: the caller may retry, here or on another instance.
    (ConfigDatabaseError, ErrorStatus("UNAVAILABLE", 503)),
    (BackendUnavailableError, ErrorStatus("UNAVAILABLE", 503)),
)


def status_of(exc: BaseException) -> ErrorStatus | None:
    """What to answer for ``exc``; None for an error that is not in the table (a bug)."""
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return None
