"""A document's extended attributes (eventing.core.xattrs) in both stores: kept beside the document in its
live row and in each log entry (so a reader of the log sees them as of that mutation), kept by a write that
carries none (as Couchbase's full-document writes keep them; test_binding_writes_keep_xattrs has the rest),
left off by one that carries xattrs.NONE, dropped by a delete, left to the row reads by the bulk reads, the
cas and seqno macros expanded by the check-and-set, through each batch size of the PostgreSQL writer (one row,
arrays, COPY); and a bucket file or a PostgreSQL store written by the previous version opens and takes
them."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from eventing.core import xattrs as X
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.storage import files
from eventing.storage import postgres as pg_buckets
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.postgres import schema as pg_schema
from eventing.storage.postgres.functions import FUNCTIONS
from eventing.storage.values import Write
from metadata.postgres import PostgresDatabase, ensure_schema
from sharding import vbucket_of


@pytest.fixture(scope="module")
def pg_module_url(pg_server) -> str:
    return pg_server.create_database(f"xattrs_{uuid.uuid4().hex[:8]}")


def _store_url(request) -> str:
    return request.getfixturevalue("pg_module_url") + f"?schema=t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["local", "partitioned", "postgres"])
def bucket(request, data_dir) -> Iterator[Any]:
    if request.param == "postgres":
        db = PostgresDatabase.open(_store_url(request))
        try:
            with pg_buckets.create_bucket(db, "b") as pg:
                yield pg
        finally:
            db.close()
        return
    with create_bucket(data_dir, "b", partitions=4 if request.param == "partitioned" else 1) as b:
        yield b


def _doc(i: int) -> bytes:
    return encode_document({"i": i})


def _entries(bucket, key: str) -> list[tuple[int, bytes | None]]:
    """(op, xattrs) of each log entry of `key`, in order."""
    return [(m.op, m.xattrs) for m in bucket.read_vb(vbucket_of(key), 0, 100) if m.key == key]


@pytest.mark.parametrize("count", [1, 5, 250])  # PostgreSQL: one row, arrays, COPY
def test_xattrs_live_beside_the_document_and_in_each_log_entry(bucket, count):
    keys = [f"k{i:03d}" for i in range(count)]
    tagged = X.encode({"owner": "ada", "_sys": {"n": 1}})
    bucket.write(
        [Write(k, OP_UPDATE, _doc(i), xattrs=tagged if i % 2 == 0 else None) for i, k in enumerate(keys)]
    )
    for i, key in enumerate(keys):
        meta = bucket.get_meta(key)
        assert meta.get("xattrs") == (tagged if i % 2 == 0 else None)
        assert _entries(bucket, key) == [(OP_UPDATE, tagged if i % 2 == 0 else None)]
    first = keys[0]
    assert X.user_xattrs(bucket.get_meta(first)["xattrs"]) == {"owner": "ada"}
    # a write that carries none keeps them (as Couchbase's full-document writes do), one that carries
    # xattrs.NONE leaves none; a delete drops them; the log keeps each version
    bucket.write([Write(first, OP_UPDATE, _doc(7))])
    assert bucket.get_meta(first)["xattrs"] == tagged
    bucket.write([Write(first, OP_UPDATE, _doc(8), xattrs=X.NONE)])
    assert "xattrs" not in bucket.get_meta(first)
    bucket.write([Write(first, OP_UPDATE, _doc(9), xattrs=tagged), Write(first, OP_DELETE)])
    assert bucket.get_meta(first) is None
    assert _entries(bucket, first) == [
        (OP_UPDATE, tagged),
        (OP_UPDATE, tagged),
        (OP_UPDATE, None),
        (OP_UPDATE, tagged),
        (OP_DELETE, None),
    ]


def test_the_bulk_reads_leave_entries_with_xattrs_to_the_rows(bucket):
    plain = [f"p{i}" for i in range(30)]
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(plain)])
    vb = vbucket_of(plain[0])
    high = bucket.high_seqnos()[vb]
    assert bucket.read_vb_packed(vb, 0, high, "fn") is not None  # the plain case, taken in bulk
    assert bucket.read_vb_columns(vb, 0, high) is not None
    bucket.write([Write(plain[0], OP_UPDATE, _doc(99), xattrs=X.encode({"a": 1}))])
    assert bucket.read_vb_packed(vb, 0, high + 1, "fn") is None
    assert bucket.read_vb_columns(vb, 0, high + 1) is None
    rows = bucket.read_vb_rows(vb, 0, high + 1)
    assert [len(r) for r in rows] == [11] * len(rows) and rows[-1][10] == X.encode({"a": 1})


def test_the_check_and_set_keeps_xattrs_and_expands_the_cas_and_seqno_macros(bucket):
    bucket.write([Write("d", OP_UPDATE, _doc(1), xattrs=X.encode({"keep": True}))])
    before = bucket.get_meta("d")
    seen: list[Any] = []

    def change(cur):
        seen.append(cur.xattrs)
        return Write("d", OP_UPDATE, cur.doc, xattrs=X.encode({"cas": X.CAS_MACRO, "seq": X.SEQNO_MACRO}))

    [done] = bucket.change_documents([("d", change)])
    assert seen == [X.encode({"keep": True})]
    stored = X.decode(bucket.get_meta("d")["xattrs"])
    swapped = int.from_bytes(done.cas.to_bytes(8, "big"), "little")  # kv_engine's order for ${Mutation.CAS}
    assert stored == {"cas": f"0x{swapped:016x}", "seq": f"0x{before['seqno'] + 1:016x}"}
    assert done.seqno == before["seqno"] + 1 and X.decode(done.after.xattrs) == stored
    assert _entries(bucket, "d")[-1] == (OP_UPDATE, bucket.get_meta("d")["xattrs"])


OLD_FILE_SCHEMA = "\n".join(
    line
    for line in files.SCHEMA.replace(", xattrs BLOB) WITHOUT ROWID", ") WITHOUT ROWID")
    .replace(" xattrs BLOB,", "")
    .splitlines()
    if "docs_xattrs" not in line
)


def test_a_bucket_file_written_before_xattrs_opens_and_takes_them(data_dir, monkeypatch):
    assert "xattrs" not in OLD_FILE_SCHEMA
    monkeypatch.setattr(files, "SCHEMA", OLD_FILE_SCHEMA)
    files.create_files(data_dir, "old")
    monkeypatch.undo()
    path = files.bucket_path(data_dir, "old")
    db = sqlite3.connect(path)  # a document the previous version wrote
    vb = vbucket_of("kept")
    db.execute(
        "INSERT INTO log(vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms) "
        "VALUES(?,1,'kept',0,5,?,NULL,0,0,1)",
        (vb, _doc(1)),
    )
    db.execute("INSERT INTO docs VALUES('kept', ?, 1, 5, 0, ?, 0, 0)", (vb, _doc(1)))
    db.execute("UPDATE high SET seqno = 1, arrival_ms = 1 WHERE vb = ?", (vb,))
    db.commit()
    assert "xattrs" not in {r[1] for r in db.execute("PRAGMA table_info(docs)")}
    db.close()
    with open_bucket(data_dir, "old") as b:
        # the partial index a write probes for XATTRs to keep (a full scan of the documents without it)
        plan = b.file.db.execute("EXPLAIN QUERY PLAN SELECT 1 FROM docs WHERE xattrs IS NOT NULL LIMIT 1")
        assert "USING INDEX docs_xattrs" in str(plan.fetchall())
        assert b.get("kept") == {"i": 1} and "xattrs" not in b.get_meta("kept")
        assert b.read_vb(vb, 0, 10)[0].xattrs is None
        b.write([Write("kept", OP_UPDATE, _doc(2), xattrs=X.encode({"v": 2}))])
        assert X.decode(b.get_meta("kept")["xattrs"]) == {"v": 2}
        assert [m.xattrs for m in b.read_vb(vb, 0, 10)] == [None, X.encode({"v": 2})]


def test_a_postgresql_store_written_before_xattrs_opens_and_takes_them(request):
    db = PostgresDatabase.open(_store_url(request))
    try:
        # schema 1: neither the XATTR columns and index nor the server's functions
        old_ddl = [s for s in pg_schema.DDL if "xattrs" not in s and s not in FUNCTIONS]
        assert len(old_ddl) == len(pg_schema.DDL) - 3 - len(FUNCTIONS)
        ensure_schema(db, pg_schema.COMPONENT, 1, old_ddl)  # the store as schema 1 left it
        pg_schema._ready.clear()  # as a process of this version meeting it for the first time
        columns = (
            "SELECT count(*) FROM information_schema.columns WHERE column_name = 'xattrs' AND table_schema = "
            "current_schema()"
        )
        assert db.read(columns) == [(0,)]
        b = pg_buckets.create_bucket(db, "b")
        assert db.read(columns) == [(2,)]
        index = (
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'bucket_docs_xattrs' "
            "AND schemaname = current_schema()"
        )
        assert db.read(index) == [(1,)]
        assert db.read("SELECT version FROM eventing_schema WHERE component = 'buckets'") == [
            (pg_schema.VERSION,)
        ]
        b.write([Write("k", OP_UPDATE, _doc(1), xattrs=X.encode({"v": 1})), Write("j", OP_UPDATE, _doc(2))])
        assert X.decode(b.get_meta("k")["xattrs"]) == {"v": 1} and "xattrs" not in b.get_meta("j")
        b.close()
    finally:
        db.close()


def test_names_macros_and_the_crc():
    assert X.valid_name("owner") and X.valid_name("_sync") and X.valid_name("$document")
    assert (
        not X.valid_name("_")
        and not X.valid_name("#x")
        and not X.valid_name("x" * 16)
        and not X.valid_name("")
    )
    assert X.name_of("a.b[0]") == "a" and X.name_of("tags[1]") == "tags"
    assert X.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert X.encode({}) is None and X.decode(None) == {}
    raw = X.encode({"c": X.CAS_MACRO, "other": "text"})
    assert X.has_macros(raw) and not X.has_macros(X.encode({"c": "${Mutation.CAS}"}))
    assert msgpack.unpackb(X.expand(raw, 1, 2)) == {"c": "0x0100000000000000", "other": "text"}


def test_a_scan_gives_each_documents_xattrs_in_its_meta(bucket):
    tagged = X.encode({"owner": "ada"})
    bucket.write([Write("s1", OP_UPDATE, _doc(1), xattrs=tagged), Write("s2", OP_UPDATE, _doc(2))])
    scanned = {key: (doc, meta) for key, doc, meta in bucket.scan("s")}
    assert scanned["s1"][0] == {"i": 1} and scanned["s1"][1]["xattrs"] == tagged  # as get_meta gives them
    assert "xattrs" not in scanned["s2"][1] and set(scanned) == {"s1", "s2"}
