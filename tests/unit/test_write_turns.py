"""Writers of one bucket file take turns, and the WAL stays short while several processes write without pause
(eventing.storage.write_turns)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
import tempfile
import time

import msgpack
import pytest

from eventing.core.mutation import OP_UPDATE
from eventing.errors import NotFoundError
from eventing.storage import write_turns
from eventing.storage.factory import create_bucket, drop_bucket, open_bucket
from eventing.storage.files import bucket_path
from eventing.storage.values import Write

LIMIT = 1_000_000
TRANSACTIONS, WRITES = 25, 500


def _writes(worker: int, n: int) -> list[Write]:
    doc = msgpack.packb({"body": "x" * 150, "worker": worker})
    return [Write(f"doc::{(worker * 7919 + n * 31 + i) % 3000}", OP_UPDATE, doc) for i in range(WRITES)]


def _write_without_pause(data_dir: str, worker: int, sizes) -> None:
    write_turns.WAL_LIMIT_BYTES = LIMIT
    bucket = open_bucket(data_dir, "dst")
    wal = f"{bucket.path}-wal"
    largest = 0
    for n in range(TRANSACTIONS):
        bucket.write(_writes(worker, n))
        with write_turns.turn(bucket.path):  # look while nobody appends
            largest = max(largest, os.stat(wal).st_size if os.path.exists(wal) else 0)
    sizes.put(largest)


@pytest.fixture
def disk_dir():
    """A directory on a disk, not on the unit run's in-memory TMPDIR (scripts/test.sh): on tmpfs SQLite's
    own checkpoint keeps up and the WAL is empty at every turn, which says nothing of the bound."""
    path = tempfile.mkdtemp(dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_several_processes_writing_one_bucket_keep_its_wal_near_the_limit(disk_dir):
    """Before, SQLite's checkpoint after each commit never caught up with three writers and the WAL grew
    with every transaction (420 MB over 1M effect writes)."""
    tmp_path = disk_dir
    bucket = create_bucket(tmp_path, "dst")
    context = multiprocessing.get_context("fork")
    sizes = context.Queue()
    writers = [context.Process(target=_write_without_pause, args=(str(tmp_path), w, sizes)) for w in range(3)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    largest = max(sizes.get(timeout=5) for _ in writers)
    # Without the turns the WAL grew to 170-190 MB here. With them, looked at inside a turn, it stays near
    # the limit (0.6-0.9 MB seen): the transaction that crossed it, plus a few more when a TRUNCATE
    # checkpoint finds another writer's read (it plans its batch before its turn) on an older snapshot and
    # leaves the truncation to a later turn.
    assert largest < LIMIT + 4_000_000, largest
    assert sum(1 for _ in bucket.scan_log(10_000) for _ in _) == 3 * TRANSACTIONS * WRITES


def _hold_turn(path: str, held, release_at) -> None:
    with write_turns.turn(path):
        held.set()
        time.sleep(0.4)
        release_at.value = time.time()


def test_a_write_waits_while_another_process_has_the_turn(tmp_path):
    bucket = create_bucket(tmp_path, "dst")
    context = multiprocessing.get_context("fork")
    held, release_at = context.Event(), context.Value("d", 0.0)
    holder = context.Process(target=_hold_turn, args=(str(bucket.path), held, release_at))
    holder.start()
    try:
        assert held.wait(10)
        bucket.write(_writes(0, 0))
        wrote_at = time.time()
    finally:
        holder.join(10)
    assert release_at.value > 0 and wrote_at >= release_at.value


def test_a_reader_on_an_old_snapshot_holds_no_writer_up_and_the_wal_is_truncated_after_it(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(write_turns, "WAL_LIMIT_BYTES", 200_000)
    bucket = create_bucket(tmp_path, "dst")
    bucket.write(_writes(0, 0))
    reader = sqlite3.connect(bucket.path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM log").fetchone()  # keeps its snapshot: the WAL cannot be emptied
    started = time.monotonic()
    for n in range(1, 11):
        bucket.write(_writes(0, n))
    # Each checkpoint gives up at once instead of waiting out the 2 s busy timeout for the reader (ten writes
    # that waited would take 20 s; the bound leaves room for a loaded machine).
    assert time.monotonic() - started < 10
    wal = f"{bucket.path}-wal"
    assert os.stat(wal).st_size > 200_000
    reader.execute("COMMIT")
    reader.close()
    bucket.write(_writes(0, 11))
    assert os.stat(wal).st_size == 0
    assert sum(1 for _ in bucket.scan_log(10_000) for _ in _) == 12 * WRITES


def test_dropping_a_bucket_removes_its_turn_file(tmp_path):
    bucket = create_bucket(tmp_path, "dst")
    bucket.write(_writes(0, 0))
    turn_file = f"{bucket_path(tmp_path, 'dst')}{write_turns.TURN_SUFFIX}"
    assert os.path.exists(turn_file)
    bucket.close()
    drop_bucket(tmp_path, "dst")
    assert not os.path.exists(turn_file)
    with pytest.raises(NotFoundError):
        open_bucket(tmp_path, "dst")


def test_writes_go_on_without_turns_where_the_file_system_has_no_flock(tmp_path, monkeypatch):
    import fcntl

    def no_flock(fd, operation):
        raise OSError(37, "No locks available")

    bucket = create_bucket(tmp_path, "dst")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    bucket.write(_writes(0, 0))
    bucket.write(_writes(0, 1))
    assert sum(1 for _ in bucket.scan_log(10_000) for _ in _) == 2 * WRITES


def test_a_writer_alone_never_truncates_the_wal(tmp_path, monkeypatch):
    """SQLite's own checkpoint keeps a lone writer's WAL short; truncating would cost it ~10% (the file grows
    again)."""
    calls = []
    monkeypatch.setattr(write_turns, "WAL_LIMIT_BYTES", 3_000_000)
    bucket = create_bucket(tmp_path, "dst")
    bucket.file.db.execute(
        "PRAGMA wal_autocheckpoint=200"
    )  # ~0.8 MB: SQLite's checkpoint well under the limit
    real = bucket.file.db

    class Watch:
        def __getattr__(self, name):
            return getattr(real, name)

        def execute(self, sql, *args):
            if "wal_checkpoint" in sql:
                calls.append(sql)
            return real.execute(sql, *args)

    bucket.file.db = Watch()
    for n in range(40):
        bucket.write(_writes(0, n))
    assert calls == []
    assert os.stat(f"{bucket.path}-wal").st_size < 3_000_000


def test_small_transactions_keep_the_wal_short_and_large_ones_keep_the_long_interval(tmp_path):
    """Single-document writes checkpoint every SMALL_TX_CHECKPOINT_PAGES (short stalls, a short WAL); a load
    keeps SQLite's checkpoint at WAL_AUTOCHECKPOINT_PAGES."""
    from eventing.storage.files import SMALL_TX_CHECKPOINT_PAGES, WAL_AUTOCHECKPOINT_PAGES

    create_bucket(str(tmp_path), "b").close()
    wal = f"{bucket_path(str(tmp_path), 'b')}-wal"
    page = 4096
    with open_bucket(str(tmp_path), "b") as bucket:
        for i in range(2000):  # ~4 pages a transaction: ~30 MB of WAL on the long interval
            bucket.upsert(f"doc-{i:05d}", {"i": i, "pad": "x" * 200})
        small_peak = os.stat(wal).st_size
        assert small_peak < 2 * SMALL_TX_CHECKPOINT_PAGES * page, small_peak
        bucket.write(
            [
                Write(f"big-{i:06d}", OP_UPDATE, msgpack.packb({"i": i, "pad": "y" * 400}))
                for i in range(20_000)
            ]
        )
        assert os.stat(wal).st_size > 2 * SMALL_TX_CHECKPOINT_PAGES * page  # not checkpointed after a load
        assert os.stat(wal).st_size < 2 * WAL_AUTOCHECKPOINT_PAGES * page
