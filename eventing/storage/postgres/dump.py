"""A PostgreSQL bucket whole, as the portable rows of eventing.storage.dumps (`eventing store copy`): read
in batches from one snapshot (a REPEATABLE READ transaction on a connection of its own), and loaded into a
new, empty bucket with COPY, a transaction a table."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator

from eventing.errors import ConfigError
from eventing.storage.dumps import BATCH, COLUMNS, BucketMeta
from eventing.storage.postgres.registry import BucketRef
from metadata.postgres.connection import Cursor

_TABLES = {"docs": "bucket_docs", "log": "bucket_log", "high": "bucket_high", "marks": "bucket_effect_marks"}
_ORDER = {"docs": "key", "log": "vb, seqno", "high": "vb", "marks": "function, vb"}


def meta_of(ref: BucketRef) -> BucketMeta:
    rows = ref.db.read(
        "SELECT uuid, created_at, partitions, collections FROM bucket_registry WHERE id = %s", (ref.id,)
    )
    if not rows:
        raise ref.gone()
    uuid, created_at, partitions, collections = rows[0]
    return BucketMeta(str(uuid), float(created_at), int(partitions), str(collections or "{}"))


def rows_of(ref: BucketRef, table: str) -> Iterator[list[tuple]]:
    """The bucket's rows of `table`, BATCH at a time, through a server-side cursor in one snapshot."""
    conn = ref.db.connect()
    try:
        conn.autocommit = False
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        with conn.cursor(name=f"dump_{table}") as cur:
            cur.itersize = BATCH
            cur.execute(
                f"SELECT {', '.join(COLUMNS[table])} FROM {_TABLES[table]} WHERE bucket = %s "
                f"ORDER BY {_ORDER[table]}",
                (ref.id,),
            )
            while True:
                rows = cur.fetchmany(BATCH)
                if not rows:
                    break
                yield [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows]
        conn.rollback()
    finally:
        conn.close()


def load(ref: BucketRef, meta: BucketMeta, tables: Iterable[tuple[str, Iterable[list[tuple]]]]) -> None:
    """Load a dump into this new, empty bucket: its uuid and collections, then each table by COPY."""
    json.loads(meta.collections)  # a registry that is not JSON would be refused by every later read
    bucket = ref.id

    def registry(cur: Cursor) -> None:
        if cur.execute(
            "SELECT EXISTS(SELECT 1 FROM bucket_log WHERE bucket = %s) OR "
            "EXISTS(SELECT 1 FROM bucket_docs WHERE bucket = %s)",
            (bucket, bucket),
        ).fetchone()[0]:
            raise ConfigError(f"bucket '{ref.name}' is not empty; a copy goes into a new bucket")
        cur.execute(
            "UPDATE bucket_registry SET uuid = %s, created_at = %s, collections = %s WHERE id = %s",
            (meta.uuid, meta.created_at, meta.collections, bucket),
        )

    ref.db.transaction(registry)
    for table, batches in tables:
        for rows in batches:
            if rows:
                ref.db.transaction(functools.partial(_copy_in, bucket=bucket, table=table, rows=rows))


def _copy_in(cur: Cursor, bucket: int, table: str, rows: list[tuple]) -> None:
    columns = COLUMNS[table]
    if table == "high":  # every bucket has its 1,024 high rows from its creation: replaced, not added
        cur.execute(
            "DELETE FROM bucket_high WHERE bucket = %s AND vb = ANY(%s)", (bucket, [r[0] for r in rows])
        )
    with cur.copy(f"COPY {_TABLES[table]}(bucket, {', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row((bucket, *row))
