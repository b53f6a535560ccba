"""Bounds on what one ShouldRateLimit request may carry, and the check that enforces them.

Every limit here protects memory and CPU: without them a single request could create
unbounded counters or spend unbounded time matching. Messages name the field and the reason,
because they are returned to the caller as INVALID_ARGUMENT.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.errors import InvalidRequestError
from sluice.model import RateLimitRequest, Unit

__all__ = ["RequestBounds", "check_request"]


@dataclass(frozen=True, slots=True)
class RequestBounds:
    max_domain_length: int = 256
    max_descriptors: int = 64
    max_entries: int = 16
    max_key_length: int = 256
    max_value_length: int = 1024


def check_request(request: RateLimitRequest, bounds: RequestBounds) -> None:
    """Raise InvalidRequestError for the first field that is missing or out of bounds."""
    if not request.domain:
        raise InvalidRequestError("domain: must not be empty")
    if len(request.domain) > bounds.max_domain_length:
        raise InvalidRequestError(
            f"domain: {len(request.domain)} characters, more than the maximum of "
            f"{bounds.max_domain_length}"
        )
    if not request.descriptors:
        raise InvalidRequestError("descriptors: must not be empty")
    if len(request.descriptors) > bounds.max_descriptors:
        raise InvalidRequestError(
            f"descriptors: {len(request.descriptors)} descriptors, more than the maximum of "
            f"{bounds.max_descriptors}"
        )
    for i, descriptor in enumerate(request.descriptors):
        field = f"descriptors[{i}]"
        if not descriptor.entries:
            raise InvalidRequestError(f"{field}.entries: must not be empty")
        if len(descriptor.entries) > bounds.max_entries:
            raise InvalidRequestError(
                f"{field}.entries: {len(descriptor.entries)} entries, more than the maximum of "
                f"{bounds.max_entries}"
            )
        for j, (key, value) in enumerate(descriptor.entries):
            if not key:
                raise InvalidRequestError(f"{field}.entries[{j}].key: must not be empty")
            if len(key) > bounds.max_key_length:
                raise InvalidRequestError(
                    f"{field}.entries[{j}].key: {len(key)} characters, more than the maximum of "
                    f"{bounds.max_key_length}"
                )
            if len(value) > bounds.max_value_length:
                raise InvalidRequestError(
                    f"{field}.entries[{j}].value: {len(value)} characters, more than the maximum "
                    f"of {bounds.max_value_length}"
                )
        if descriptor.limit is not None and descriptor.limit.unit is Unit.UNKNOWN:
            raise InvalidRequestError(
                f"{field}.limit.unit: must be one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR"
            )
