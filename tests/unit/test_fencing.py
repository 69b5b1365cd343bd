"""The fence rule (metadata/fencing.py), written once for every metadata backend, and the SQLite backend's
layout: its helper modules stay inside metadata/sqlite/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from metadata.fencing import fenced_vbuckets, holds, next_epoch

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_stored_epoch_may_write():
    assert holds(7, 7)
    assert not holds(7, 6)  # a zombie: someone claimed since
    assert not holds(7, 8)  # an epoch this store never handed out (restored from an older backup)
    assert not holds(None, 7)  # no checkpoint: the function was undeployed
    assert not holds(7, None)  # the writer never claimed this vBucket


def test_fenced_vbuckets_are_those_the_writer_lost_or_never_held():
    stored = {0: 5, 1: 9, 2: 4}
    claimed = {0: 5, 1: 8, 3: 2}
    assert fenced_vbuckets([0, 1, 2, 3], stored, claimed) == {1, 2, 3}
    assert fenced_vbuckets([0], stored, claimed) == set()
    assert fenced_vbuckets([], stored, claimed) == set()


@pytest.mark.parametrize(
    ("stored", "floor", "expected"), [(0, 0, 1), (41, 0, 42), (41, 40, 42), (41, 100, 100)]
)
def test_a_claim_takes_an_epoch_above_the_stored_one_and_at_least_the_floor(stored, floor, expected):
    epoch = next_epoch(stored, floor)
    assert epoch == expected
    assert not holds(epoch, stored)  # the previous owner is fenced from then on


def test_every_backend_takes_the_rule_from_metadata_fencing():
    # The SQL backends (SQLite, PostgreSQL) share metadata/sql/; Couchbase has its own.
    for path in ("metadata/sql/store.py", "metadata/sql/records.py", "metadata/couchbase/store.py"):
        source = (ROOT / path).read_text()
        assert "from metadata.fencing import" in source, path
        assert '["epoch"] !=' not in source and "epoch) !=" not in source, path


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


@pytest.mark.parametrize("backend", ["sqlite", "couchbase"])
def test_a_backends_modules_are_imported_through_its_package_only(backend):
    folder = ROOT / "metadata" / backend
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for top in ("sharding", "metadata", "eventing")
        for path in sorted((ROOT / top).rglob("*.py"))
        if folder not in path.parents
        for name in _imports(path)
        if name.startswith(f"metadata.{backend}.")
    ]
    assert wrong == [], f"import metadata.{backend} instead: {wrong}"
