"""Reading a schedule: a time, an interval or a cron expression, in the user's timezone.

    "2026-12-01 09:00", "in 20 minutes", "tomorrow at 9"     -> date
    "every 2 hours", "every 30 minutes"                      -> interval
    "every day at 9:00", "every weekday at 9", "every monday at 17:30" -> cron
    "*/15 9-17 * * mon-fri"                                  -> cron
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from bot.core.errors import ToolError

UNITS = {"second": "seconds", "minute": "minutes", "hour": "hours", "day": "days",
         "week": "weeks"}
DAYS = {"monday": "mon", "tuesday": "tue", "wednesday": "wed", "thursday": "thu",
        "friday": "fri", "saturday": "sat", "sunday": "sun", "day": "*", "weekday": "mon-fri",
        "weekend": "sat,sun"}
_EVERY_N = re.compile(r"^every\s+(\d+)?\s*(second|minute|hour|day|week)s?$")
_EVERY_AT = re.compile(
    r"^every\s+(day|weekday|weekend|monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
    r"(?:\s+at\s+(\d{1,2})(?::(\d{2}))?\s*(am|pm)?)?$")
_CRON = re.compile(r"^\S+(\s+\S+){4}$")
MIN_INTERVAL_S = 60


@dataclass(frozen=True, slots=True)
class Spec:
    kind: str
    """date | interval | cron"""
    trigger: Any
    text: str


def parse(when: str, tz: ZoneInfo, now: datetime | None = None) -> Spec:
    """A trigger for `when`, or a ToolError saying what forms are understood."""
    text = " ".join(when.strip().lower().split())
    now = now or datetime.now(tz)
    if not text:
        raise ToolError("`when` is empty")
    if m := _EVERY_N.match(text):
        amount = int(m.group(1) or 1)
        unit = UNITS[m.group(2)]
        if timedelta(**{unit: amount}).total_seconds() < MIN_INTERVAL_S:
            raise ToolError("the shortest interval is one minute")
        return Spec("interval", IntervalTrigger(**{unit: amount}, timezone=tz), text)
    if m := _EVERY_AT.match(text):
        hour, minute = _clock(m.group(2), m.group(3), m.group(4))
        trigger = CronTrigger(day_of_week=DAYS[m.group(1)], hour=hour, minute=minute,
                              timezone=tz)
        return Spec("cron", trigger, text)
    if _CRON.match(text) and not text.startswith(("in ", "at ", "on ")):
        try:
            return Spec("cron", CronTrigger.from_crontab(text, timezone=tz), text)
        except ValueError as exc:
            raise ToolError(f"not a valid cron expression: {exc}") from None
    return Spec("date", DateTrigger(_moment(text, tz, now), timezone=tz), text)


def _clock(hour: str | None, minute: str | None, ampm: str | None) -> tuple[int, int]:
    h, mi = int(hour or 9), int(minute or 0)
    if ampm == "pm" and h < 12:
        h += 12
    if ampm == "am" and h == 12:
        h = 0
    if not (0 <= h < 24 and 0 <= mi < 60):
        raise ToolError("the time of day is not valid")
    return h, mi


def _moment(text: str, tz: ZoneInfo, now: datetime) -> datetime:
    import dateparser

    settings = {"TIMEZONE": str(tz), "RETURN_AS_TIMEZONE_AWARE": True,
                "PREFER_DATES_FROM": "future", "RELATIVE_BASE": now.replace(tzinfo=None)}
    moment = dateparser.parse(text, settings=settings)  # type: ignore[arg-type]
    if moment is None:
        raise ToolError(
            f"could not read {text!r} as a time; use e.g. '2026-12-01 09:00', 'in 20 minutes', "
            "'every 2 hours', 'every weekday at 9' or a cron expression like '0 9 * * mon-fri'")
    if moment <= now:
        raise ToolError(f"{moment:%Y-%m-%d %H:%M %Z} is in the past")
    result: datetime = moment
    return result


def previous_fire(trigger: Any, since: datetime, now: datetime, limit: int = 10_000
                  ) -> datetime | None:
    """The latest fire time in (since, now], or None (missed runs coalesce into one)."""
    last = None
    cursor = trigger.get_next_fire_time(None, since + timedelta(microseconds=1))
    for _ in range(limit):
        if cursor is None or cursor > now:
            break
        last = cursor
        cursor = trigger.get_next_fire_time(cursor, cursor + timedelta(microseconds=1))
    return last
