"""Maintenance windows and freezes, read on the fleet clock (a unix time).

A stop starts only if, by its estimate, it finishes inside the window it starts in; otherwise it
waits for the next window that is long enough. Freeze dates stop new stops for the whole day.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from railyard.domain.config import DAYS, FreezeSpec, WindowSpec


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def openings(window: WindowSpec, t: float, days: int = 8) -> list[tuple[float, float]]:
    """The window's open intervals [start, end) that end after `t`, for the next `days` days."""
    tz = ZoneInfo(window.timezone)
    local = datetime.fromtimestamp(t, tz)
    start_m, end_m = _minutes(window.start), _minutes(window.end)
    length = (end_m - start_m) if end_m > start_m else (24 * 60 - start_m + end_m)
    out = []
    for d in range(-1, days):
        day = (local + timedelta(days=d)).date()
        if DAYS[day.weekday()] not in window.days:
            continue
        opens = datetime(day.year, day.month, day.day, tzinfo=tz) + timedelta(minutes=start_m)
        closes = opens + timedelta(minutes=length)
        if closes.timestamp() > t:
            out.append((opens.timestamp(), closes.timestamp()))
    return out


def fits(window: WindowSpec | None, t: float, duration_s: float) -> tuple[bool, float | None]:
    """(True, None) when a stop of `duration_s` started at `t` ends inside one opening;
    otherwise (False, when the next long-enough opening starts, or None if none within a week)."""
    if window is None:
        return True, None
    for opens, closes in openings(window, t):
        if opens <= t and t + duration_s <= closes:
            return True, None
        if opens > t and closes - opens >= duration_s:
            return False, opens
    return False, None


def frozen(freeze: FreezeSpec, t: float) -> bool:
    if not freeze.dates:
        return False
    return datetime.fromtimestamp(t, ZoneInfo(freeze.timezone)).date() in set(freeze.dates)


def describe(window: WindowSpec) -> str:
    days = ",".join(window.days) if len(window.days) < 7 else "daily"
    return f"{days} {window.start}-{window.end} {window.timezone}"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, ZoneInfo("UTC")).strftime("%Y-%m-%d %H:%M UTC")
