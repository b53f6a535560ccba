"""Sluice's exception tree. Third-party errors are translated at the boundary (``raise … from``).

    SluiceError
    ├── ConfigError            a policy document is invalid (names source, line and reason)
    ├── InvalidRequestError    a ShouldRateLimit request is malformed (names the field)
    ├── ConfigDatabaseError    the config database cannot be reached or failed
    ├── BackendUnavailableError  algorithm state (e.g. Redis) cannot be reached
    └── StaleVersionError      (sluice.policies.store) a publish based on a superseded version

Callers catch SluiceError to tell a refusal or a configuration problem from a bug.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ConfigDatabaseError",
    "ConfigError",
    "InvalidRequestError",
    "SluiceError",
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
