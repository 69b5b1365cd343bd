"""The SQLite metadata store: lifecycle transitions, epochs and fencing, checkpoints, DLQ, locks, corruption."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

import pytest

from metadata import (
    TRANSITIONS,
    DlqRow,
    FunctionState,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
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


ALL_STATES = list(FunctionState)


@pytest.mark.parametrize("current", ALL_STATES)
@pytest.mark.parametrize("target", ALL_STATES)
def test_only_transitions_in_the_table_are_allowed(store, current, target):
    store.put_function("fn", {"name": "fn"}, "src")
    store._db.execute("UPDATE functions SET state=? WHERE name='fn'", (current.value,))
    if target in TRANSITIONS[current]:
        assert store.transition("fn", target, "move").state is target
    else:
        with pytest.raises(LifecycleError, match="cannot move function 'fn'"):
            store.transition("fn", target, "move")
        assert store.get_function("fn").state is current


def test_deploying_a_deployed_function_names_the_fix(store):
    store.put_function("fn", {"name": "fn"}, "src")
    store.transition("fn", FunctionState.DEPLOYING, "deploy")
    store.transition("fn", FunctionState.DEPLOYED, "deploy")
    with pytest.raises(LifecycleError, match="it is deployed; undeploy it first"):
        store.transition("fn", FunctionState.DEPLOYING, "deploy")


def test_unknown_function_names_the_known_ones(store):
    store.put_function("fn_a", {}, "")
    with pytest.raises(NotFoundError, match="known: fn_a"):
        store.get_function("fn_b")


def test_claim_raises_the_epoch_and_fences_the_previous_owner(store):
    store.init_checkpoints("fn", {0: 0, 1: 0}, "uuid")
    old = store.claim("fn", [0, 1], "n/w0")
    new = store.claim("fn", [0], "n/w1")
    assert new[0].epoch == old[0].epoch + 1
    fenced = store.commit("fn", {0: old[0].epoch, 1: old[1].epoch}, {0: 5, 1: 6}, [_dlq(0, 3)])
    assert fenced == {0}
    cps = store.checkpoints("fn")
    assert cps[0].seqno == 0 and cps[1].seqno == 6
    assert store.dlq_rows("fn") == []  # the zombie's DLQ row for vb 0 was rejected too
    assert store.counters("fn")["fenced_checkpoint_writes"] == 1


def test_checkpoint_never_moves_backwards(store):
    store.init_checkpoints("fn", {0: 0}, "uuid")
    e = store.claim("fn", [0], "w")[0].epoch
    store.commit("fn", {0: e}, {0: 10})
    with pytest.raises(OrderViolationError, match="backwards"):
        store.commit("fn", {0: e}, {0: 9})
    assert store.checkpoints("fn")[0].seqno == 10


def test_dlq_rows_are_keyed_by_function_vbucket_and_seqno(store):
    store.init_checkpoints("fn", {0: 0}, "uuid")
    e = store.claim("fn", [0], "w")[0].epoch
    store.commit("fn", {0: e}, {0: 1}, [_dlq(0, 1)])
    store.commit("fn", {0: e}, {0: 1}, [_dlq(0, 1)])
    assert len(store.dlq_rows("fn")) == 1


def test_epoch_base_keeps_older_deployments_fenced(store):
    store.init_checkpoints("fn", {0: 0}, "uuid", epoch_base=1 << 32)
    assert store.claim("fn", [0], "w")[0].epoch == (1 << 32) + 1


def test_release_keeps_owner_and_epoch_but_clears_the_lease(store):
    store.init_checkpoints("fn", {0: 0}, "uuid")
    e = store.claim("fn", [0], "w")[0].epoch
    assert store.release("fn", {0: e}) == set()
    cp = store.checkpoints("fn")[0]
    assert (cp.owner, cp.epoch, cp.leased) == ("w", e, False)


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
