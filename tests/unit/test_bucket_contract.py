"""The Bucket contract (eventing/storage/protocol.py; docs/architecture.md, 'Buckets: one interface'): one
suite run over a one-file LocalBucket, a PartitionedBucket of 4 files and a RemoteBucket answered by a
data service in this process (every call and answer pickled both ways, as Ray would)."""

from __future__ import annotations

import pickle
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from eventing.core.mutation import OP_DELETE, OP_UPDATE, decode_document, encode_document
from eventing.errors import NotFoundError
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import create_bucket
from eventing.storage.partitions import PartitionedBucket
from eventing.storage.protocol import Bucket
from eventing.storage.remote import DataService, RemoteBucket
from eventing.storage import postgres as postgres_buckets
from eventing.storage.values import EffectGroup, Write
from metadata.postgres import PostgresDatabase
from sharding import NUM_VBUCKETS, vbucket_of


class _PickledService:
    """A data service line without Ray: calls a DataService here, pickling arguments and answers."""

    def __init__(self, data_dir: str):
        self.service = DataService(data_dir)

    def call(self, method: str, *args: Any) -> Any:
        return pickle.loads(pickle.dumps(self.service.call(method, *pickle.loads(pickle.dumps(args)))))

    def submit(self, method: str, *args: Any):
        answer = self.call(method, *args)
        return lambda: answer


@pytest.fixture(scope="module")
def pg_module_url(pg_server) -> str:
    """One database of the session's PostgreSQL server for this module; each test takes a schema of it."""
    return pg_server.create_database(f"contract_{uuid.uuid4().hex[:8]}")


@pytest.fixture(params=["local", "partitioned", "remote", "postgres"])
def bucket(request, data_dir) -> Iterator[Bucket]:
    kind = request.param
    if kind == "postgres":
        # A schema of its own per test (the store's `schema=` parameter): an empty store in milliseconds.
        url = request.getfixturevalue("pg_module_url") + f"?schema=t_{uuid.uuid4().hex[:12]}"
        db = PostgresDatabase.open(url)
        try:
            with postgres_buckets.create_bucket(db, "b", partitions=4) as pg:
                yield pg
        finally:
            db.close()
        return
    with create_bucket(data_dir, "b", partitions=4 if kind == "partitioned" else 1) as files:
        assert type(files) is (PartitionedBucket if kind == "partitioned" else LocalBucket)
        if kind != "remote":
            yield files
            return
        line = _PickledService(str(data_dir))
        try:
            with RemoteBucket(line, "b") as remote:
                yield remote
        finally:
            line.service.close()


def _doc(i: int) -> bytes:
    return encode_document({"i": i})


KEYS = [f"k{i:03d}" for i in range(200)]  # spread over every partition of 4


def test_each_write_gets_the_next_seqno_of_its_vbucket(bucket):
    placed = bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)])
    placed += bucket.write([Write(k, OP_UPDATE, _doc(-i)) for i, k in enumerate(KEYS[:50])])
    by_vb: dict[int, list[int]] = defaultdict(list)
    for key, where in zip(KEYS + KEYS[:50], placed, strict=True):
        assert where is not None and where[0] == vbucket_of(key)
        by_vb[where[0]].append(where[1])
    assert all(seqnos == list(range(1, len(seqnos) + 1)) for seqnos in by_vb.values())
    highs = bucket.high_seqnos()
    assert len(highs) == NUM_VBUCKETS
    assert {vb: h for vb, h in enumerate(highs) if h} == {vb: len(s) for vb, s in by_vb.items()}
    assert bucket.high_seqnos(prefetched=True) == highs
    # a worker's own vBuckets: those spans are read, the rest may answer 0
    spans = ((0, 99), (600, 1023))
    owned = [vb for first, last in spans for vb in range(first, last + 1)]
    part = bucket.high_seqnos(spans=spans)
    assert [part[vb] for vb in owned] == [highs[vb] for vb in owned] and any(part[vb] for vb in owned)
    bucket.write([Write(k, OP_UPDATE, _doc(0)) for k in KEYS])  # read again after a commit
    assert [bucket.high_seqnos(spans=spans)[vb] for vb in owned] == [bucket.high_seqnos()[vb] for vb in owned]


def test_upsert_delete_and_a_delete_of_a_missing_document(bucket):
    vb, seqno = bucket.upsert("a", {"x": 1}, expiry=0)
    assert (vb, seqno) == (vbucket_of("a"), 1)
    assert bucket.delete("a") == (vb, 2)
    assert bucket.write([Write("a", OP_DELETE)]) == [None]  # nothing logged
    with pytest.raises(NotFoundError, match="document 'a' does not exist in bucket 'b'"):
        bucket.delete("a")
    assert bucket.high_seqnos()[vb] == 2


def test_reads_of_documents(bucket):
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)])
    _, seqno = bucket.upsert("k007", {"i": "new"})
    assert bucket.get("k007") == {"i": "new"}
    assert decode_document(bucket.get_raw("k005")) == {"i": 5}
    raw, cas, expiry = bucket.get_doc("k005")
    meta = bucket.get_meta("k005")
    assert meta == {"vb": vbucket_of("k005"), "seqno": meta["seqno"], "cas": cas, "expiry": 0, "flags": 0}
    assert decode_document(raw) == {"i": 5} and expiry == 0
    bucket.ensure_key_index()
    assert decode_document(bucket.previous_doc("k007", seqno)) == {"i": 7}
    assert bucket.previous_doc("k007", 1) is None
    for missing in ("nope", "k999"):
        assert bucket.get(missing) is None and bucket.get_raw(missing) is None
        assert bucket.get_doc(missing) is None and bucket.get_meta(missing) is None


def test_keys_scan_and_count_in_key_order(bucket):
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(reversed(KEYS))])
    bucket.delete("k010")
    live = [k for k in KEYS if k != "k010"]
    assert bucket.keys() == live and bucket.count() == len(live)
    assert bucket.keys("k01") == [f"k01{i}" for i in range(1, 10)]
    assert bucket.keys(limit=3) == live[:3]
    scanned = list(bucket.scan("k19", limit=4))
    assert [key for key, _, _ in scanned] == ["k190", "k191", "k192", "k193"]
    for key, doc, meta in scanned:
        assert doc == bucket.get(key) and meta["vb"] == vbucket_of(key) and meta == bucket.get_meta(key)


def test_the_log_of_a_vbucket_in_seqno_order(bucket):
    key = "k042"
    vb = vbucket_of(key)
    for i in range(5):
        bucket.upsert(key, {"v": i})
    bucket.delete(key)
    log = bucket.read_vb(vb, 0, 100)
    assert [(m.seqno, m.key, m.op) for m in log] == [(s, key, OP_UPDATE) for s in range(1, 6)] + [(6, key, OP_DELETE)]
    assert [decode_document(m.doc) for m in log[:5]] == [{"v": i} for i in range(5)]
    assert bucket.read_vb(vb, 2, 2) == log[2:4]
    assert [tuple(r) for r in bucket.read_vb_rows(vb, 1, 100)] == [tuple(m) for m in log[1:]]
    assert bucket.read_vb(vb, 6, 10) == [] and bucket.read_vb((vb + 1) % NUM_VBUCKETS, 0, 10) == []
    packed = bucket.read_vb_packed(vb, 0, 100, "someone")
    assert packed.last_seqno == 6 and packed.update_count == 5 and packed.other_seqnos == [6]
    assert bucket.max_doc_bytes(vb, 0, 6) == max(len(m.doc) for m in log[:5])


def test_reading_ahead_gives_the_answer_a_plain_read_gives(bucket):
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)])
    vbs = sorted({vbucket_of(k) for k in KEYS})[:3]
    plain = {vb: bucket.read_vb_rows(vb, 0, 100) for vb in vbs}
    bucket.prefetch([(vb, 0, 100) for vb in vbs])
    assert all(bucket.has_ahead(vb) == bucket.reads_ahead for vb in vbs)
    assert {vb: bucket.read_vb_rows(vb, 0, 100) for vb in vbs} == plain
    bucket.prefetch([(vbs[0], 0, 100)])
    bucket.forget_prefetched({vbs[0]: 1})  # a rewind: what was read ahead no longer follows the position
    assert bucket.read_vb_rows(vbs[0], 1, 100) == plain[vbs[0]][1:]
    assert bucket.read_vb_rows(vbs[0], 0, 100) == plain[vbs[0]]


def _groups(epoch: int, seqnos: range, tag: str = "") -> list[EffectGroup]:
    """Writes of source vBuckets 3 and 900, each source seqno writing keys all over the partitions."""
    return [
        EffectGroup(vb, epoch, [(s, Write(f"out-{vb}-{s}-{j}{tag}", OP_UPDATE, _doc(s))) for s in seqnos for j in range(40)])
        for vb in (3, 900)
    ]


def test_effects_apply_exactly_once_behind_fences_and_marks(bucket):
    bucket.fence("fn", {3: 5, 900: 5})
    assert bucket.effect_marks("fn") == {3: (5, 0), 900: (5, 0)}
    first = bucket.apply_effects("fn", _groups(5, range(1, 4)))
    assert (first.applied, first.duplicates, first.fenced_vbs) == (240, 0, set())
    assert bucket.effect_marks("fn") == {3: (5, 3), 900: (5, 3)}
    # A replay after a crash: seqnos 1..3 are held already, 4..5 are new.
    again = bucket.apply_effects("fn", _groups(5, range(1, 6)))
    assert (again.applied, again.duplicates) == (160, 240)
    assert bucket.effect_marks("fn") == {3: (5, 5), 900: (5, 5)}
    assert bucket.count() == 400
    # A new owner fences vBucket 3: the old owner's writes there are rejected, whatever their seqno.
    bucket.fence("fn", {3: 6})
    stale = bucket.apply_effects("fn", _groups(5, range(6, 8)))
    assert stale.fenced_vbs == {3} and stale.fenced_writes == 80 and stale.applied == 80
    assert bucket.effect_marks("fn") == {3: (6, 5), 900: (5, 7)}
    assert bucket.get("out-3-6-0") is None and bucket.get("out-900-6-0") == {"i": 6}
    assert bucket.get_meta("out-900-6-0")["seqno"] >= 1
    # Another function's marks are its own; without marks every write applies as it comes.
    assert bucket.effect_marks("other") == {}
    loose = bucket.apply_effects("other", _groups(1, range(1, 2), "x"), marks=False)
    loose_again = bucket.apply_effects("other", _groups(1, range(1, 2), "x"), marks=False)
    assert loose.applied == loose_again.applied == 80 and bucket.effect_marks("other") == {}
    assert bucket.read_vb(vbucket_of("out-3-1-0x"), 0, 10)[-1].origin == "other"


def test_a_failed_cas_condition_applies_none_of_its_sources_writes(bucket):
    # Keys of the counter's vBucket: a partitioned bucket keeps a source's writes together per partition.
    side = [k for k in (f"side-{i}" for i in range(20_000)) if vbucket_of(k) == vbucket_of("counter")][:2]
    bucket.upsert("counter", {"count": 1})
    _, cas, _ = bucket.get_doc("counter")
    groups = [EffectGroup(7, 1, [
        (1, Write("counter", OP_UPDATE, _doc(1), expect_cas=cas + 1)),  # stale cas: source 1 fails
        (1, Write(side[0], OP_UPDATE, _doc(1))),
        (2, Write(side[1], OP_UPDATE, _doc(2))),
        (2, Write("counter", OP_UPDATE, None, delta=5)),
    ], conditional=True)]
    result = bucket.apply_effects("fn", groups)
    assert result.conflicts == [(7, 1)]
    assert bucket.get(side[0]) is None and bucket.get(side[1]) == {"i": 2} and bucket.get("counter") == {"count": 6}


def test_flush_empties_the_bucket_and_gives_it_a_new_identity(bucket):
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)])
    bucket.delete("k001")
    bucket.fence("fn", {3: 2})
    old_uuid = bucket.uuid
    went = bucket.flush()
    assert went["documents"] == len(KEYS) - 1 and went["tombstones"] == 1 and went["mutations"] == len(KEYS) + 1
    assert went["old_uuid"] == old_uuid and went["uuid"] == bucket.uuid != old_uuid
    assert bucket.count() == 0 and bucket.keys() == [] and set(bucket.high_seqnos()) == {0}
    assert bucket.effect_marks("fn") == {} and bucket.get("k002") is None
    assert bucket.upsert("k002", {}) == (vbucket_of("k002"), 1)  # seqnos start again
