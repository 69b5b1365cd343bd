"""eventing.core.times.iso_ms: the one ISO 8601 UTC form of epoch milliseconds that every layer prints."""

from __future__ import annotations

from eventing.core.times import iso_ms

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def test_whole_seconds_print_without_milliseconds():
    assert iso_ms(T0 + 60_000) == "2026-01-01T00:01:00Z"


def test_milliseconds_print_when_present():
    assert iso_ms(T0 + 1_005) == "2026-01-01T00:00:01.005Z"


def test_no_instant_prints_as_a_dash():
    assert iso_ms(None) == "-"


def test_before_the_epoch_is_still_utc():
    assert iso_ms(-1_000) == "1969-12-31T23:59:59Z"
