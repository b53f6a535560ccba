"""Calendar windows: days, ISO weeks (from Monday), months and years as a zone's clock has them.

A window starts at the first instant at which the zone's local clock shows the window's
first day or a later one: its midnight where that midnight exists, the end of the gap where
a daylight-saving change skips midnight, the first of two midnights where the clock goes
back across midnight. Windows follow each other without gaps or overlaps; a day the zone
skipped entirely (Pacific/Apia, 2011-12-30) has no window.

The algorithms never call zoneinfo per hit: ``Calendar.boundaries(now)`` returns ``SPAN``
window boundaries around ``now`` (``now`` lies in ``[b[3], b[4])``), computed once and kept
until ``now`` leaves that window. The same numbers go to the Redis script in place of the
limit's period (``argument``), so Redis steps with exactly the boundaries the memory backend
uses; the windows on either side let the script, which reads Redis's own clock, find its
window while the two clocks disagree by less than a window.
"""

from __future__ import annotations

import functools
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from sluice.model import Unit

__all__ = [
    "CALENDAR_UNITS",
    "SPAN",
    "Calendar",
    "calendar_for",
    "known_zone",
    "window_index",
]

SPAN = 8  # boundaries handed to the algorithms: now's window is [b[3], b[4])
_CENTER = 3
CALENDAR_UNITS = (Unit.DAY, Unit.WEEK, Unit.MONTH, Unit.YEAR)


def window_index(bounds: tuple[int, ...], t: float) -> int:
    """The ``i`` with ``bounds[i] <= t < bounds[i + 1]``, clamped to ``1 .. len - 2`` so the
    window before it is known too (the Lua prelude's ``cal_index`` does the same)."""
    i = 1
    last = len(bounds) - 2
    while i < last and bounds[i + 1] <= t:
        i += 1
    return i


@functools.cache
def known_zone(name: str) -> bool:
    """Whether ``name`` is an IANA time zone zoneinfo can load."""
    if name not in available_timezones():
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


class Calendar:
    """The calendar windows of one unit in one zone (shared: see ``calendar_for``)."""

    __slots__ = ("_bounds", "unit", "zone")

    def __init__(self, unit: Unit, zone: str) -> None:
        if unit not in CALENDAR_UNITS:
            raise ValueError(f"calendar windows are days, weeks, months or years, not {unit}")
        self.unit = unit
        self.zone = ZoneInfo(zone)
        # One tuple, replaced whole: a reader on another thread sees the old or the new one.
        self._bounds: tuple[int, ...] = (0,) * SPAN

    def __repr__(self) -> str:
        return f"<calendar {self.unit.name.lower()} {self.zone.key}>"

    def boundaries(self, now: float) -> tuple[int, ...]:
        """``SPAN`` window boundaries (Unix seconds) with ``now`` in ``[b[3], b[4])``."""
        bounds = self._bounds
        if bounds[_CENTER] <= now < bounds[_CENTER + 1]:
            return bounds
        bounds = self._bounds = self._compute(now)
        return bounds

    def argument(self, now: float) -> str:
        """The boundaries as the Redis script takes them in place of a period."""
        return ",".join(map(str, self.boundaries(now)))

    def _compute(self, now: float) -> tuple[int, ...]:
        first = self._truncate(datetime.fromtimestamp(now, self.zone).date())
        # Wide enough that SPAN distinct boundaries remain on both sides after skipped days.
        starts = sorted({self._start_of(self._shift(first, n)) for n in range(-SPAN, SPAN + 2)})
        i = max(j for j, s in enumerate(starts) if s <= now)
        return tuple(starts[i - _CENTER : i - _CENTER + SPAN])

    def _truncate(self, day: date) -> date:
        if self.unit is Unit.WEEK:
            return day - timedelta(days=day.weekday())
        if self.unit is Unit.MONTH:
            return day.replace(day=1)
        if self.unit is Unit.YEAR:
            return day.replace(month=1, day=1)
        return day

    def _shift(self, first: date, n: int) -> date:
        """The first day of the window ``n`` windows after the one starting on ``first``."""
        if self.unit is Unit.DAY:
            return first + timedelta(days=n)
        if self.unit is Unit.WEEK:
            return first + timedelta(weeks=n)
        months = n if self.unit is Unit.MONTH else 12 * n
        index = first.year * 12 + first.month - 1 + months
        return date(index // 12, index % 12 + 1, 1)

    def _start_of(self, day: date) -> int:
        """The first instant at which the local clock shows ``day`` or a later day."""
        midnight = datetime.combine(day, time())
        candidates = [
            int(midnight.replace(tzinfo=self.zone, fold=fold).timestamp()) for fold in (0, 1)
        ]
        real = [t for t in candidates if self._local(t) == midnight]
        if real:
            return min(real)  # the first midnight, if the clock shows it twice
        # Midnight falls in a gap: the day starts where the clock jumps over it.
        lo, hi = min(candidates) - 2 * 86400, max(candidates) + 2 * 86400
        while lo + 1 < hi:  # invariant: local(lo) < midnight <= local(hi)
            mid = (lo + hi) // 2
            if self._local(mid) >= midnight:
                hi = mid
            else:
                lo = mid
        return hi

    def _local(self, t: int) -> datetime:
        return datetime.fromtimestamp(t, UTC).astimezone(self.zone).replace(tzinfo=None)


@functools.cache
def calendar_for(unit: Unit, zone: str) -> Calendar:
    """The one ``Calendar`` of ``unit`` in ``zone``: every snapshot shares its cache."""
    return Calendar(unit, zone)
