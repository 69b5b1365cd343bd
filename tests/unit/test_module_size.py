"""Modules stay small enough to read in one sitting: none of the project's is over MAX_LINES lines."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 800


def test_no_module_is_over_the_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for top in ("sharding", "metadata", "eventing", "functions", "scripts")
        for p in (ROOT / top).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these modules (over {MAX_LINES} lines): {long}"
