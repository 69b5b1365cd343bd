"""A bucket whole, as portable rows: what `eventing store copy` moves between a data directory and a
PostgreSQL store (eventing.ops.store_copy), with every seqno, cas, origin, arrival time, tombstone, high
seqno, effect mark and collection id kept, so checkpoints and effect marks mean the same in the copy, and
each document's and log entry's extended attributes (``xattrs``, eventing.core.xattrs; NULL: none) with them.

Both kinds of bucket keep the same columns (the PostgreSQL tables add the bucket's id):

- ``docs``:  key, vb, seqno, cas, deleted, doc, expiry, flags, xattrs
- ``log``:   vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms, xattrs
- ``high``:  vb, seqno, arrival_ms
- ``marks``: function, vb, epoch, seqno

and ``BucketMeta`` (uuid, creation time, partitions, the collections registry). A dump is read in batches
(``rows(table)``) and loaded into a new, empty bucket of the same name (``load_dump``). This module is the
data directory's side (one file, or the files of a partitioned bucket); eventing.storage.postgres.dump is
the server's.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from eventing.errors import ConfigError

if TYPE_CHECKING:
    from eventing.storage.bucket import LocalBucket

TABLES = ("docs", "log", "high", "marks")
COLUMNS = {
    "docs": ("key", "vb", "seqno", "cas", "deleted", "doc", "expiry", "flags", "xattrs"),
    "log": ("vb", "seqno", "key", "op", "cas", "doc", "origin", "expiry", "flags", "arrival_ms", "xattrs"),
    "high": ("vb", "seqno", "arrival_ms"),
    "marks": ("function", "vb", "epoch", "seqno"),
}
_FILE_TABLES = {"docs": "docs", "log": "log", "high": "high", "marks": "effect_marks"}
_ORDER = {"docs": "key", "log": "vb, seqno", "high": "vb", "marks": "function, vb"}
BATCH = 20_000


@dataclass(frozen=True)
class BucketMeta:
    uuid: str
    created_at: float
    partitions: int
    collections: str  # the registry of scopes and collections, as JSON


class Dumpable(Protocol):
    """What a bucket answers to be copied: its meta, its rows table by table, and a load into an empty one."""

    def dump_meta(self) -> BucketMeta: ...
    def dump_rows(self, table: str) -> Iterator[list[tuple]]: ...
    def load_dump(self, meta: BucketMeta, tables: Iterable[tuple[str, Iterable[list[tuple]]]]) -> None: ...


# -- one bucket file (LocalBucket) ----------------------------------------------------------------------


def file_meta(bucket: LocalBucket) -> BucketMeta:
    info = dict(bucket.file.db.execute("SELECT key, value FROM info").fetchall())
    return BucketMeta(
        info["uuid"],
        float(info.get("created_at", 0) or 0),
        int(info.get("partitions", 1) or 1),
        info.get("collections") or "{}",
    )


def file_rows(bucket: LocalBucket, table: str) -> Iterator[list[tuple]]:
    """The file's rows of `table`, BATCH at a time, read in one snapshot (a read transaction)."""
    columns = ", ".join(COLUMNS[table])
    cur = bucket.file.db.cursor()
    cur.execute("BEGIN")
    try:
        cur.execute(f"SELECT {columns} FROM {_FILE_TABLES[table]} ORDER BY {_ORDER[table]}")
        while True:
            rows = cur.fetchmany(BATCH)
            if not rows:
                return
            if table == "docs":
                rows = [(*r[:4], bool(r[4]), *r[5:]) for r in rows]
            yield rows
    finally:
        cur.execute("COMMIT")
        cur.close()


class FileLoader:
    """Loads a dump into an empty bucket file, a transaction a batch (a copy goes into a new bucket: one cut
    short is dropped and made again); `vbuckets`: the file holds those alone (a partition), so rows of the
    others are left out, while marks are kept whole (each partition keeps its own)."""

    def __init__(self, bucket: LocalBucket, *, vbuckets: range | None = None):
        self.bucket, self.vbuckets = bucket, vbuckets
        db = bucket.file.db
        if db.execute("SELECT EXISTS(SELECT 1 FROM log) OR EXISTS(SELECT 1 FROM docs)").fetchone()[0]:
            raise ConfigError(f"bucket '{bucket.name}' is not empty; a copy goes into a new bucket")

    def _tx(self, body: Callable[[sqlite3.Connection], object]) -> None:
        from metadata.sqlite_io import run_transaction

        file = self.bucket.file
        run_transaction(file.db, file.path, lambda: body(file.db))
        file.forget_highs()  # this connection's own commit: SQLite's data_version does not count it

    def meta(self, meta: BucketMeta) -> None:
        json.loads(meta.collections)  # a registry that is not JSON would be refused by every later read

        def body(db: sqlite3.Connection) -> None:
            db.execute("UPDATE info SET value=? WHERE key='uuid'", (meta.uuid,))
            db.execute("INSERT OR REPLACE INTO info VALUES('created_at', ?)", (str(meta.created_at),))
            db.execute("INSERT OR REPLACE INTO info VALUES('collections', ?)", (meta.collections,))

        self._tx(body)
        self.bucket.uuid = meta.uuid

    def rows(self, table: str, rows: list[tuple]) -> None:
        if self.vbuckets is not None and table != "marks":
            at = COLUMNS[table].index("vb")
            rows = [r for r in rows if r[at] in self.vbuckets]
        if table == "docs":
            rows = [(*r[:4], int(bool(r[4])), *r[5:]) for r in rows]
        if not rows:
            return
        columns = COLUMNS[table]
        verb = "INSERT OR REPLACE" if table == "high" else "INSERT"
        sql = (
            f"{verb} INTO {_FILE_TABLES[table]}({', '.join(columns)}) VALUES({','.join('?' * len(columns))})"
        )
        self._tx(lambda db: db.executemany(sql, rows))


def merged_marks(parts: list[Iterator[list[tuple]]]) -> list[tuple]:
    """The marks of a partitioned bucket as one bucket's: per (function, vb) the highest epoch and seqno of
    its partitions (each keeps the marks of the writes it received; eventing.ops.store_copy refuses a copy
    where a flush was cut short between partitions)."""
    best: dict[tuple[str, int], tuple[int, int]] = {}
    for batches in parts:
        for rows in batches:
            for function, vb, epoch, seqno in rows:
                old = best.get((function, vb), (0, 0))
                best[(function, vb)] = (max(old[0], epoch), max(old[1], seqno))
    return [(f, vb, e, s) for (f, vb), (e, s) in sorted(best.items())]
