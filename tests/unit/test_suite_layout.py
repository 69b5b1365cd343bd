"""The test folders are not packages, so pytest imports each test module by its file name: two modules of
the same name in tests/unit and tests/integration cannot be collected in one run (the integration run
collects both folders), however well each runs alone."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(TESTS)} and {path.relative_to(TESTS)}")
        seen.setdefault(path.name, path)
    assert not clashes, "rename one of each: " + "; ".join(clashes)
