"""What only the SQLite metadata store does: waiting on locks, failing closed on damage. Everything every
backend does is in the contract suite, test_metadata_contract.py."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

import pytest

from metadata import (
    DlqRow,
    NotFoundError,
    SqliteMetadataStore,
    StoreCorruptError,
    StoreLockedError,
)


@pytest.fixture
def store(tmp_path):
    s = SqliteMetadataStore(tmp_path / "metadata.sqlite3")
    yield s
    s.close()


def _dlq(vb: int, seqno: int) -> DlqRow:
    return DlqRow("fn", vb, seqno, "k", "error", "boom", "tb", 1, 1.0, 1.0, b"m")


def test_a_locked_store_makes_writes_wait_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metadata.sqlite3"
    store = SqliteMetadataStore(path)
    store.init_checkpoints("fn", {0: 0}, "uuid")
    e = store.claim("fn", [0], "w")[0].epoch
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(2.5, lambda: holder.execute("ROLLBACK")).start()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="eventing.metadata"):
        store.commit("fn", {0: e}, {0: 3})
    assert time.monotonic() - start >= 2.0
    assert store.checkpoints("fn")[0].seqno == 3
    assert any("locked by another process" in r.message for r in caplog.records)


def test_a_store_locked_too_long_fails_with_the_fix(tmp_path):
    path = tmp_path / "metadata.sqlite3"
    store = SqliteMetadataStore(path, lock_wait_s=0.5)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreLockedError, match="stop the process holding it"):
            store.put_function("fn", {}, "")
    finally:
        holder.execute("ROLLBACK")


def test_a_corrupted_store_fails_closed(tmp_path):
    path = tmp_path / "metadata.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreCorruptError, match="restore it from a backup"):
        SqliteMetadataStore(path)


def test_a_truncated_store_fails_its_integrity_check(tmp_path):
    path = tmp_path / "metadata.sqlite3"
    store = SqliteMetadataStore(path)
    store.init_checkpoints("fn", {vb: 0 for vb in range(1024)}, "uuid")
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreCorruptError):
        s = SqliteMetadataStore(path)
        s.verify_integrity()
        s.checkpoints("fn")


def test_a_missing_store_is_not_created_by_readers(tmp_path):
    with pytest.raises(NotFoundError, match="pass the right --data-dir"):
        SqliteMetadataStore(tmp_path / "absent.sqlite3", create=False)
