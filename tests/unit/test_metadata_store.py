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
from metadata.sqlite_io import run_transaction


@pytest.fixture
def store(tmp_path):
    s = SqliteMetadataStore(tmp_path / "metadata.sqlite3")
    yield s
    s.close()


def _dlq(vb: int, seqno: int) -> DlqRow:
    return DlqRow("fn", vb, seqno, "k", "error", "boom", "tb", 1, 1.0, 1.0, b"m")


def test_a_locked_store_makes_writes_wait_with_a_warning(tmp_path, caplog, monkeypatch):
    # SQLite's busy timeout shortened from 2 s: the lock outlasts it, so the write waits in retry_locked.
    monkeypatch.setattr("metadata.sqlite.store.BUSY_TIMEOUT_MS", 200)
    path = tmp_path / "metadata.sqlite3"
    store = SqliteMetadataStore(path)
    store.init_checkpoints("fn", {0: 0}, "uuid")
    e = store.claim("fn", [0], "w")[0].epoch
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.6, lambda: holder.execute("ROLLBACK")).start()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="eventing.metadata"):
        store.commit("fn", {0: e}, {0: 3})
    assert time.monotonic() - start >= 0.5
    assert store.checkpoints("fn")[0].seqno == 3
    assert any("locked by another process" in r.message for r in caplog.records)


def test_a_store_locked_too_long_fails_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr("metadata.sqlite.store.BUSY_TIMEOUT_MS", 100)  # each try waits 0.1 s, not 2 s
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


def _holder_and_waiter(tmp_path, timeout_s: float):
    path = tmp_path / "t.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t(x)")
    waiter = sqlite3.connect(path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
    return path, holder, waiter


def test_a_polling_writer_takes_the_write_lock_within_milliseconds_of_its_release(tmp_path):
    """SQLite's busy handler would sleep 50-100 ms at a time by now; polling every millisecond takes the
    lock right after the holder commits."""
    path, holder, waiter = _holder_and_waiter(tmp_path, 5.0)
    holder.execute("BEGIN IMMEDIATE")
    took: dict[str, float] = {}

    def write() -> None:
        run_transaction(waiter, path, lambda: waiter.execute("INSERT INTO t VALUES (2)"), poll_lock_s=0.001)
        took["at"] = time.monotonic()

    t = threading.Thread(target=write)
    t.start()
    time.sleep(0.25)
    holder.execute("INSERT INTO t VALUES (1)")
    holder.execute("COMMIT")
    released = time.monotonic()
    t.join(5)
    assert took["at"] - released < 0.04
    assert waiter.execute("SELECT x FROM t ORDER BY rowid").fetchall() == [(1,), (2,)]
    assert waiter.execute("PRAGMA busy_timeout").fetchone() == (5000,)  # the connection's own, back


def test_a_polling_writer_gives_up_after_the_connections_busy_timeout_as_sqlite_would(tmp_path):
    path, holder, waiter = _holder_and_waiter(tmp_path, 0.2)
    holder.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        run_transaction(waiter, path, lambda: None, poll_lock_s=0.001)
    assert 0.15 < time.monotonic() - started < 2.0
    assert not waiter.in_transaction
    assert waiter.execute("PRAGMA busy_timeout").fetchone() == (200,)
    holder.execute("ROLLBACK")
