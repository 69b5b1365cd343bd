"""Counts in messages: `counted(1, "document")` is "1 document", `counted(1200, "document")` "1,200
documents"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` (with thousands separators) and the noun, singular for exactly one."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
