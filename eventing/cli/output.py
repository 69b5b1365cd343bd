"""Human and machine output for the CLI: tables, JSON, and live progress on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Sequence
from typing import Any

# Columns of identifiers: printed as plain integers (vBucket 1105, not 1,105); counts get separators.
ID_COLUMNS = frozenset({"vb", "seqno", "checkpoint", "high seqno"})


def emit_json(data: Any, out: Any = None) -> None:
    print(json.dumps(data, indent=2, sort_keys=False, default=str), file=out or sys.stdout)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], plain: Collection[str] = ID_COLUMNS) -> str:
    """Aligned columns; numbers with thousands separators except in the `plain` columns (identifiers)."""
    ids = [h in plain for h in headers]
    cells = [[str(h) for h in headers]] + [
        [_fmt(c, is_id) for c, is_id in zip(row, ids, strict=True)] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any, is_id: bool = False) -> str:
    if is_id and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "-" if value is None else str(value)


def progress_enabled() -> bool:
    return sys.stderr.isatty()
