"""Bucket files on disk: where a bucket's files live (``bucket_path``, ``partition_path``), the schema of each
file, creating a bucket's files, connecting to one (WAL mode and its checkpoint size), upgrading a file
written by an earlier version when it is opened, retrying a transaction while a file is locked or its disk
is full, and listing and dropping buckets by their files. ``LocalBucket`` (eventing.storage.bucket) opens
its file through these; what a damaged file looks like, and the lines that say so, are in
eventing.storage.file_health.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
import uuid
from pathlib import Path

from eventing.core.names import check_bucket_name
from eventing.errors import ConfigError, StoreError
from eventing.storage import write_turns
from eventing.storage.file_health import bucket_file_error
from metadata.sqlite_io import private_file, private_folder, retry_locked, run_transaction
from sharding import NUM_VBUCKETS

SCHEMA = """
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS docs(
    key TEXT PRIMARY KEY, vb INTEGER NOT NULL, seqno INTEGER NOT NULL, cas INTEGER NOT NULL,
    deleted INTEGER NOT NULL, doc BLOB, expiry INTEGER NOT NULL, flags INTEGER NOT NULL, xattrs BLOB) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log(
    vb INTEGER NOT NULL, seqno INTEGER NOT NULL, key TEXT NOT NULL, op INTEGER NOT NULL,
    cas INTEGER NOT NULL, doc BLOB, origin TEXT, expiry INTEGER NOT NULL, flags INTEGER NOT NULL,
    arrival_ms INTEGER NOT NULL DEFAULT 0, xattrs BLOB,
    PRIMARY KEY(vb, seqno)) WITHOUT ROWID;
-- Per vBucket: its high seqno and the arrival time of that entry (what the next entry may not go below),
-- so a write reads this small, always-cached table instead of a log page per vBucket.
-- The documents with extended attributes, and only those (a partial index: a document without any costs it
-- nothing): whether the file holds any is one probe, which a write that keeps them makes first.
CREATE INDEX IF NOT EXISTS docs_xattrs ON docs(key) WHERE xattrs IS NOT NULL;
CREATE TABLE IF NOT EXISTS high(vb INTEGER PRIMARY KEY, seqno INTEGER NOT NULL, arrival_ms INTEGER NOT NULL DEFAULT 0);
-- Per (function, source vBucket): the owner epoch and the last source seqno whose effects are applied.
-- Effects carry their source seqno, so a replay after a crash applies nothing twice, and a stale
-- owner (lower epoch) is rejected: this is what makes binding writes exactly-once and fenced.
CREATE TABLE IF NOT EXISTS effect_marks(
    function TEXT NOT NULL, vb INTEGER NOT NULL, epoch INTEGER NOT NULL, seqno INTEGER NOT NULL,
    PRIMARY KEY(function, vb)) WITHOUT ROWID;
"""  # noqa: E501

# The log's columns in Mutation's field order (eventing.core.mutation.Mutation). ``xattrs`` (a document's
# extended attributes, eventing.core.xattrs) is NULL for a document without any, and the statements that
# write a row without them leave it out, so such a write costs what it did before the column.
_LOG_COLUMNS = "vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms, xattrs"
_LOG_COLUMNS_PLAIN = "vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms"
_DOCS_COLUMNS_PLAIN = "key, vb, seqno, cas, deleted, doc, expiry, flags"

WAL_AUTOCHECKPOINT_PAGES = 10_000
# A small transaction (fewer than SMALL_TX_ROWS rows changed: a write or a caught-up worker's flush of a few
# effects) commits with SQLite's checkpoint every SMALL_TX_CHECKPOINT_PAGES instead: whoever commits when the
# WAL passes the mark copies it back, and copying ~40 MB took 30-40 ms, a stall every ~1.2 s for the writes
# queued behind it at 2,000 writes/s; ~4 MB at a time stalls ~10 times less each. Large transactions (loads,
# a worker catching up) keep the longer interval, which costs them less CPU (docs/benchmarks.md).
SMALL_TX_ROWS = 256
SMALL_TX_CHECKPOINT_PAGES = 1_000
MAX_PARTITIONS = 64


def bucket_path(data_dir: str | os.PathLike[str], name: str) -> Path:
    return Path(data_dir) / "buckets" / f"{name}.sqlite3"


def create_files(
    data_dir: str | os.PathLike[str], name: str, *, exist_ok: bool = False, partitions: int = 1
) -> None:
    """Create a bucket's files. ``partitions`` > 1 spreads its vBuckets over that many files (see
    eventing.storage.partitions): writers of different vBucket ranges then never wait for each other. With
    ``exist_ok`` an existing bucket of that name is kept as it is."""
    check_bucket_name(name)
    path = bucket_path(data_dir, name)
    if path.exists():
        if exist_ok:
            return
        raise ConfigError(f"bucket '{name}' already exists in {path.parent}; pick another name")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"a bucket has 1 to {MAX_PARTITIONS} partitions, not {partitions}")
    info = [("uuid", uuid.uuid4().hex), ("name", name), ("created_at", str(time.time()))]
    try:
        private_folder(path.parent)
        # Partition files without their main file belong to no bucket (a drop cut short, a main file
        # deleted by hand): they, and above all their WAL files, must never meet the new bucket.
        leftovers = partition_path(data_dir, name, 1).parent
        if leftovers.is_dir():
            shutil.rmtree(leftovers)
        if partitions > 1:
            info.append(("partitions", str(partitions)))
            for part in range(1, partitions):
                part_path = partition_path(data_dir, name, part)
                private_folder(part_path.parent)
                _create_file(part_path, [*info, ("partition", str(part))])
        _create_file(path, info)  # the main file last: a bucket appears whole or not at all
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(
            f"cannot create bucket '{name}' in {path.parent}: {exc}; check that the data directory is "
            "writable"
        ) from None


def partition_path(data_dir: str | os.PathLike[str], name: str, part: int) -> Path:
    """Partition ``part`` (>= 1) of a partitioned bucket; partition 0 is the bucket's own file."""
    return Path(data_dir) / "buckets" / f"{name}.partitions" / f"{part}.sqlite3"


def _create_file(path: Path, info: list[tuple[str, str]]) -> None:
    tmp = path.with_suffix(".creating")
    tmp.unlink(missing_ok=True)
    private_file(tmp)  # 0600, and so its -wal and -shm
    db = _connect(tmp)
    db.executescript(SCHEMA)
    # One transaction for the rows: in autocommit each of the 1,024 rows of `high` was a commit of its own
    # (~50 ms to create a file, ~1 ms now).
    db.execute("BEGIN")
    db.executemany("INSERT INTO info VALUES(?,?)", info)
    db.executemany("INSERT INTO high VALUES(?,0,0)", [(vb,) for vb in range(NUM_VBUCKETS)])
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    os.replace(tmp, path)


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=2.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    # Checkpoint the WAL every ~40 MB instead of SQLite's ~4 MB: a batch of writes dirties pages all over
    # the docs B-tree, and each checkpoint copies (and syncs) every page changed since the last one, so
    # fewer checkpoints copy the same hot pages fewer times (measured 1.3x CPU, 1.5x wall on effect writes).
    # Several writers take turns so that it completes (eventing.storage.write_turns).
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
    return db


# What _upgrade adds, by table: a file missing any of these was written by an earlier version.
_ADDED_COLUMNS = {"log": ("arrival_ms", "xattrs"), "high": ("arrival_ms",), "docs": ("xattrs",)}
_ADDED_INDEXES = {
    "docs_xattrs": "CREATE INDEX IF NOT EXISTS docs_xattrs ON docs(key) WHERE xattrs IS NOT NULL"
}


def _upgrade(db: sqlite3.Connection, path: Path) -> None:
    """Bring a bucket file written by an earlier version up to date: the log's ``arrival_ms`` column
    (existing entries get the time of their cas, nanoseconds since the epoch taken when the entry was
    written), then the high table's (each vBucket's last entry's arrival time), then the ``xattrs`` columns
    of the log and the documents (NULL: no extended attributes, which is what every existing row has; adding
    a nullable column rewrites nothing), and the partial index of the documents that have some."""
    if not {r[1] for r in db.execute("PRAGMA table_info(log)")}:
        return  # not a bucket: the caller's read reports it

    def missing() -> list[tuple[str, str]]:
        return [
            (table, column)
            for table, columns in _ADDED_COLUMNS.items()
            for have in [{r[1] for r in db.execute(f"PRAGMA table_info({table})")}]
            for column in columns
            if column not in have
        ] + [
            ("docs", index)
            for index in _ADDED_INDEXES
            if db.execute("SELECT 1 FROM sqlite_master WHERE type='index' AND name=?", (index,)).fetchone()
            is None
        ]

    def body() -> None:
        # Checked again inside the transaction: another process may have upgraded the file first.
        if "arrival_ms" not in {r[1] for r in db.execute("PRAGMA table_info(log)")}:
            db.execute("ALTER TABLE log ADD COLUMN arrival_ms INTEGER NOT NULL DEFAULT 0")
            db.execute("UPDATE log SET arrival_ms = cas / 1000000")
        if "arrival_ms" not in {r[1] for r in db.execute("PRAGMA table_info(high)")}:
            db.execute("ALTER TABLE high ADD COLUMN arrival_ms INTEGER NOT NULL DEFAULT 0")
            db.execute(
                "UPDATE high SET arrival_ms = COALESCE("
                "(SELECT arrival_ms FROM log WHERE log.vb = high.vb AND log.seqno = high.seqno), 0)"
            )
        for table, column in missing():
            if column == "xattrs":
                db.execute(f"ALTER TABLE {table} ADD COLUMN xattrs BLOB")
        db.execute(_ADDED_INDEXES["docs_xattrs"])

    if not missing():
        return
    _retry_locked(path, lambda: run_transaction(db, path, body))


def _retry_locked(path: Path, fn):
    try:
        return retry_locked(path, fn)
    except sqlite3.DatabaseError as exc:
        raise bucket_file_error(path, exc) from None


def drop_damaged(data_dir: str | os.PathLike[str], name: str) -> Path:
    """Delete the files of a bucket that cannot be opened (a file of it damaged): its partitions' folder,
    then its main file, each with its WAL, shared-memory and write-turn files."""
    path = bucket_path(data_dir, name)
    partitions = partition_path(data_dir, name, 1).parent
    files = sorted(partitions.glob("*.sqlite3")) if partitions.is_dir() else []
    for file in [*files, path]:
        write_turns.forget(file)
        for suffix in ("-wal", "-shm", write_turns.TURN_SUFFIX):
            Path(f"{file}{suffix}").unlink(missing_ok=True)
        file.unlink(missing_ok=True)
    if partitions.is_dir():
        shutil.rmtree(partitions)
    return path


def list_buckets(data_dir: str | os.PathLike[str]) -> list[str]:
    folder = Path(data_dir) / "buckets"
    return sorted(p.stem for p in folder.glob("*.sqlite3")) if folder.exists() else []
