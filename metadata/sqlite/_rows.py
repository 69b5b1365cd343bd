"""Messages shared by the SQLite store's modules (private to metadata/sqlite/). The row conversions and
writes both SQL backends share are metadata/sql/rows.py."""

from __future__ import annotations

CORRUPT_RECOVERY = (
    "stop every eventing process, then restore it from a backup (replays after the restored checkpoints "
    "apply no effect twice), or move it aside and redeploy the functions (they restart from their feed "
    "boundary); see 'Damaged metadata store' in docs/operations.md"
)


def one_line(value: object) -> str:
    """SQLite's integrity reports span lines; an error message is one line."""
    return " ".join(str(value).split())
