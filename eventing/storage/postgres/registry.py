"""The buckets of a PostgreSQL store: the registry row of each (its id, uuid, partitions and collections),
and registering, finding, listing and dropping them. ``BucketRef`` is what every part of a
``PostgresBucket`` holds: the database, the bucket's id and name.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from eventing.core.names import check_bucket_name
from eventing.errors import ConfigError, NotFoundError, StoreCorruptError
from eventing.storage.files import MAX_PARTITIONS
from eventing.storage.postgres.schema import ensure_bucket_schema, key_index_name
from metadata.postgres import PostgresDatabase
from metadata.postgres.connection import Cursor
from sharding import NUM_VBUCKETS


@dataclass(frozen=True)
class BucketRef:
    """One bucket of a store: what its parts need to reach its rows."""

    db: PostgresDatabase
    id: int
    name: str

    @property
    def shown(self) -> str:
        """The store's URL without its password, for messages."""
        return self.db.target.shown

    def gone(self) -> NotFoundError:
        """The error of a bucket dropped while this process had it open."""
        return unknown_bucket(self.db, self.name)

    def missing_rows(self) -> NotFoundError | StoreCorruptError:
        """The error for rows of this bucket that are not there: it was dropped, or its high seqno rows were
        deleted behind its back (damaged: never a seqno made up)."""
        rows = self.db.read(
            "SELECT (SELECT count(*) FROM bucket_high WHERE bucket = r.id) FROM bucket_registry r WHERE r.id "
            "= %s",
            (self.id,),
        )
        if not rows:
            return self.gone()
        return StoreCorruptError(
            f"bucket '{self.name}' in the store at {self.shown} has {rows[0][0]} of its {NUM_VBUCKETS} high "
            "seqno rows; restore the store from a backup, or drop the bucket (`eventing bucket drop "
            f"{self.name}`) and load it again"
        )


def unknown_bucket(db: PostgresDatabase, name: str) -> NotFoundError:
    return NotFoundError(
        f"unknown bucket '{name}' (not in the store at {db.target.shown}); create it with "
        f"`eventing bucket create {name}`"
    )


def find(db: PostgresDatabase, name: str) -> tuple[int, str, int] | None:
    """(id, uuid, partitions) of a registered bucket, else None."""
    check_bucket_name(name)
    ensure_bucket_schema(db)
    rows = db.read("SELECT id, uuid, partitions FROM bucket_registry WHERE name = %s", (name,))
    return (int(rows[0][0]), str(rows[0][1]), int(rows[0][2])) if rows else None


def register(db: PostgresDatabase, name: str, *, exist_ok: bool, partitions: int) -> None:
    """Register a new bucket with its 1,024 high seqno rows, in one transaction: it appears whole or not at
    all. ``partitions`` is recorded (``stats`` reports it) and changes nothing else: PostgreSQL takes
    concurrent writers of one table, so a bucket needs no files per vBucket range to write in parallel."""
    check_bucket_name(name)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"a bucket has 1 to {MAX_PARTITIONS} partitions, not {partitions}")
    ensure_bucket_schema(db)

    def body(cur: Cursor) -> bool:
        row = cur.execute(
            "INSERT INTO bucket_registry(name, uuid, created_at, partitions) VALUES(%s, %s, %s, %s) "
            "ON CONFLICT(name) DO NOTHING RETURNING id",
            (name, uuid.uuid4().hex, time.time(), partitions),
        ).fetchone()
        if row is None:
            return False
        cur.execute(
            "INSERT INTO bucket_high(bucket, vb, seqno, arrival_ms) SELECT %s, vb, 0, 0 FROM "
            "generate_series(0, %s) vb",
            (row[0], NUM_VBUCKETS - 1),
        )
        return True

    created = db.transaction(body)
    if not created and not exist_ok:
        raise ConfigError(
            f"bucket '{name}' already exists in the store at {db.target.shown}; pick another name"
        )
    if created:
        # The planner's picture of the high seqno table, with this bucket's 1,024 rows in it: without it, a
        # write's lock of its vBuckets' rows read the bucket's every row (statistics of a smaller table).
        db.run(lambda conn: conn.execute("ANALYZE bucket_high"))


def names(db: PostgresDatabase) -> list[str]:
    ensure_bucket_schema(db)
    return [r[0] for r in db.read('SELECT name FROM bucket_registry ORDER BY name COLLATE "C"')]


def drop(db: PostgresDatabase, name: str) -> None:
    """Delete a bucket: its registry row, documents, log, high seqnos, effect marks and key index, in one
    transaction. NotFoundError when there is no such bucket."""
    check_bucket_name(name)
    ensure_bucket_schema(db)

    def body(cur: Cursor) -> int | None:
        row = cur.execute("DELETE FROM bucket_registry WHERE name = %s RETURNING id", (name,)).fetchone()
        if row is None:
            return None
        bucket = int(row[0])
        for table in ("bucket_docs", "bucket_log", "bucket_high", "bucket_effect_marks"):
            cur.execute(f"DELETE FROM {table} WHERE bucket = %s", (bucket,))
        return bucket

    bucket = db.transaction(body)
    if bucket is None:
        raise unknown_bucket(db, name)
    drop_key_index(db, bucket)


def drop_key_index(db: PostgresDatabase, bucket: int) -> None:
    """Drop a dropped bucket's key index, if it had one. CONCURRENTLY, outside any transaction: a plain DROP
    INDEX would lock the log of every bucket until it commits. Left behind (the server went away), it is
    an empty index no later bucket uses (ids are never reused)."""
    index = key_index_name(bucket)
    if db.read("SELECT to_regclass(%s) IS NOT NULL", (index,))[0][0]:
        db.run(lambda conn: conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index}"))
