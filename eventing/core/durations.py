"""Durations as users write them ('500ms', '30s', '1m30s', a number of seconds): one rule for every
setting."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

_MS = timedelta(milliseconds=1)
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_DURATION_HELP = "write it like '500ms', '30s', '1m', '2h', '1m30s' or a number of seconds"


class DurationError(ValueError):
    """A value that is not a duration; the message reads "has FIELD VALUE, which ..." after its owner."""


def parse_duration(value: Any, *, field: str = "duration") -> timedelta:
    """A non-negative whole number of milliseconds from '500ms', '30s', '1m', '2h', '1d', '1m30s', a number
    of seconds (int, float or numeric string) or a timedelta; anything else raises DurationError, whose
    message names ``field``."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DurationError(f"has {field} {value!r}, which is not a duration; {_DURATION_HELP}")
    else:
        text = str(value).strip().replace(" ", "")
        negative = text.startswith("-")
        text = text.removeprefix("-")
        try:
            if _DURATION.fullmatch(text):
                total = sum(
                    (Decimal(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(text)), start=Decimal(0)
                )
            else:
                total = Decimal(text) * 1000  # a bare number is seconds
        except (InvalidOperation, OverflowError):
            raise DurationError(f"has {field} {value!r}, which is not a duration; {_DURATION_HELP}") from None
        if not total.is_finite() or total != total.to_integral_value():
            raise DurationError(
                f"has {field} {value!r}, which is not a whole number of milliseconds; {_DURATION_HELP}"
            )
        try:
            result = timedelta(milliseconds=-int(total) if negative else int(total))
        except OverflowError:
            raise DurationError(
                f"has {field} {value!r}, which is too long; use at most 999999999 days"
            ) from None
    if result < timedelta(0):
        raise DurationError(f"has negative {field} {value!r}; durations are zero or more")
    if result % _MS:
        raise DurationError(
            f"has {field} {value!r}, which is not a whole number of milliseconds; round it to 1ms"
        )
    return result


def format_duration(value: timedelta) -> str:
    """The exact duration in its largest whole unit: '2h', '90s', '500ms', '0s'; parse_duration reads it
    back."""
    total_ms = value // _MS
    if total_ms == 0:
        return "0s"
    for unit in ("d", "h", "m", "s", "ms"):
        if total_ms % _UNIT_MS[unit] == 0:
            return f"{total_ms // _UNIT_MS[unit]}{unit}"
    raise AssertionError("unreachable: every whole number of milliseconds divides by 1ms")


def duration_ms(value: timedelta) -> int:
    """Whole milliseconds of a validated duration."""
    return value // _MS
