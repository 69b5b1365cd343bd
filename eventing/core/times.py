"""Instants as users read them: epoch milliseconds written as ISO 8601 UTC, one form for every layer."""

from __future__ import annotations

from datetime import UTC, datetime


def iso_ms(ms: int | None) -> str:
    """Epoch milliseconds as ISO 8601 UTC (``2026-01-01T00:01:00Z``, milliseconds only when present)."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"
