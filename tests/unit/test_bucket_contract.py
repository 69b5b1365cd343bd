"""The Bucket contract (eventing/storage/protocol.py; docs/architecture.md, 'Buckets: one interface'): one
suite run over a one-file LocalBucket, a PartitionedBucket of 4 files, a RemoteBucket answered by a data
service in this process (every call and answer pickled both ways, as Ray would) and a PostgresBucket on a
throwaway PostgreSQL server (a schema of its own per test). Every method of Bucket is tested over the four
(`bucket`), every method FileBucket adds over the three that implement it (`file_bucket`)."""

from __future__ import annotations

import pickle
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from eventing.core.filters import compile_filter
from eventing.core.keyspaces import key_prefix
from eventing.core.mutation import OP_DELETE, OP_EXPIRE, OP_UPDATE, Mutation, decode_document, encode_document
from eventing.errors import ConfigError, NotFoundError, StoreError
from eventing.storage import postgres as postgres_buckets
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.partitions import PartitionedBucket
from eventing.storage.postgres import PostgresBucket
from eventing.storage.protocol import Bucket, FileBucket
from eventing.storage.remote import DataService, RemoteBucket
from eventing.storage.rows_ahead import rows_of_columns
from eventing.storage.values import Changed, EffectGroup, StoredDocument, Write
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


def _open(kind: str, request, data_dir: str, name: str = "b") -> Iterator[Any]:
    """A new, empty bucket `name` of that kind (the partitioned one and the PostgreSQL one created with 4
    partitions: a PostgreSQL bucket records them, nothing more)."""
    if kind == "postgres":
        # A schema of its own per test (the store's `schema=` parameter): an empty store in milliseconds.
        url = request.getfixturevalue("pg_module_url") + f"?schema=t_{uuid.uuid4().hex[:12]}"
        db = PostgresDatabase.open(url)
        try:
            with postgres_buckets.create_bucket(db, name, partitions=4) as pg:
                assert type(pg) is PostgresBucket
                yield pg
        finally:
            db.close()
        return
    with create_bucket(data_dir, name, partitions=4 if kind == "partitioned" else 1) as files:
        assert type(files) is (PartitionedBucket if kind == "partitioned" else LocalBucket)
        if kind != "remote":
            yield files
            return
        line = _PickledService(str(data_dir))
        try:
            with RemoteBucket(line, name) as remote:
                yield remote
        finally:
            line.service.close()


@pytest.fixture(params=["local", "partitioned", "remote", "postgres"])
def bucket(request, data_dir) -> Iterator[Bucket]:
    """Every implementation of Bucket."""
    yield from _open(request.param, request, data_dir)


@pytest.fixture(params=["local", "partitioned", "postgres"])
def file_bucket(request, data_dir) -> Iterator[FileBucket]:
    """Every implementation of FileBucket (what ops, the CLI and the Data API call besides Bucket)."""
    yield from _open(request.param, request, data_dir)


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


def test_keys_in_byte_order_beyond_ascii(bucket):
    """Keys sort as their UTF-8 bytes (code points) everywhere, as a bucket file orders them, whatever the
    database's collation; a prefix of characters beyond ASCII is a prefix like any other."""
    keys = [
        "Zed",
        "a",
        "a\u00e9",
        "a\u00e9\u00e9",
        "a\u00ff",
        "a\u0100",
        "a\u4e2d",
        "a\U0001f600",
        "b",
        "\u00e9t\u00e9",
    ]
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(reversed(keys))])
    assert bucket.keys() == sorted(keys) == keys
    assert bucket.keys("a\u00e9") == ["a\u00e9", "a\u00e9\u00e9"] and bucket.count("a\u00e9") == 2
    assert [k for k, _, _ in bucket.scan("a\U0001f601")] == [] and bucket.keys("a\U0001f600") == [
        "a\U0001f600"
    ]
    assert bucket.count("a") == 7 and bucket.keys("a", limit=2) == ["a", "a\u00e9"]


def test_the_log_of_a_vbucket_in_seqno_order(bucket):
    key = "k042"
    vb = vbucket_of(key)
    for i in range(5):
        bucket.upsert(key, {"v": i})
    bucket.delete(key)
    log = bucket.read_vb(vb, 0, 100)
    assert [(m.seqno, m.key, m.op) for m in log] == [(s, key, OP_UPDATE) for s in range(1, 6)] + [
        (6, key, OP_DELETE)
    ]
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


def test_reading_what_changed_gives_fresh_high_seqnos_and_the_rows_a_plain_read_gives(bucket):
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)])
    vbs = sorted({vbucket_of(k) for k in KEYS})[:3]
    bucket.read_changed([(vb, 0) for vb in vbs], 1000)
    highs, fresh = bucket.high_seqnos(prefetched=True), bucket.high_seqnos()
    assert [highs[vb] for vb in vbs] == [fresh[vb] for vb in vbs]  # others may answer 0
    plain = {vb: bucket.read_vb_rows(vb, 0, 100) for vb in vbs}
    assert all(plain.values())
    bucket.read_changed([(vb, 0) for vb in vbs], 1000)
    assert {vb: bucket.read_vb_rows(vb, 0, 100) for vb in vbs} == plain
    # Written after the last look: a new look sees the write, with its row.
    key = next(k for k in (f"late{i}" for i in range(1000)) if vbucket_of(k) == vbs[0])
    bucket.write([Write(key, OP_UPDATE, _doc(-1))])
    last = plain[vbs[0]][-1][1]
    bucket.read_changed([(vbs[0], last)], 1000)
    assert bucket.high_seqnos(prefetched=True)[vbs[0]] == last + 1
    assert [r[2] for r in bucket.read_vb_rows(vbs[0], last, 100)] == [key]


def _groups(epoch: int, seqnos: range, tag: str = "") -> list[EffectGroup]:
    """Writes of source vBuckets 3 and 900, each source seqno writing keys all over the partitions."""
    return [
        EffectGroup(
            vb,
            epoch,
            [(s, Write(f"out-{vb}-{s}-{j}{tag}", OP_UPDATE, _doc(s))) for s in seqnos for j in range(40)],
        )
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
    groups = [
        EffectGroup(
            7,
            1,
            [
                (1, Write("counter", OP_UPDATE, _doc(1), expect_cas=cas + 1)),  # stale cas: source 1 fails
                (1, Write(side[0], OP_UPDATE, _doc(1))),
                (2, Write(side[1], OP_UPDATE, _doc(2))),
                (2, Write("counter", OP_UPDATE, None, delta=5)),
            ],
            conditional=True,
        )
    ]
    result = bucket.apply_effects("fn", groups)
    assert result.conflicts == [(7, 1)]
    assert (
        bucket.get(side[0]) is None
        and bucket.get(side[1]) == {"i": 2}
        and bucket.get("counter") == {"count": 6}
    )


def test_flush_empties_the_bucket_and_gives_it_a_new_identity(bucket):
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)])
    bucket.delete("k001")
    bucket.fence("fn", {3: 2})
    old_uuid = bucket.uuid
    went = bucket.flush()
    assert (
        went["documents"] == len(KEYS) - 1 and went["tombstones"] == 1 and went["mutations"] == len(KEYS) + 1
    )
    assert went["old_uuid"] == old_uuid and went["uuid"] == bucket.uuid != old_uuid
    assert bucket.count() == 0 and bucket.keys() == [] and set(bucket.high_seqnos()) == {0}
    assert bucket.effect_marks("fn") == {} and bucket.get("k002") is None
    assert bucket.upsert("k002", {}) == (vbucket_of("k002"), 1)  # seqnos start again


def _same_vb(prefix: str, count: int, vb: int | None = None) -> list[str]:
    """``count`` keys starting with ``prefix`` that all hash to one vBucket (``vb``, or the first key's)."""
    found: list[str] = []
    for i in range(200_000):
        key = f"{prefix}{i}"
        if (vb is None and not found) or vbucket_of(key) == (vbucket_of(found[0]) if vb is None else vb):
            found.append(key)
            if len(found) == count:
                return found
    raise AssertionError("no such keys")


def test_name_uuid_path_and_closing(bucket, request):
    kind = request.node.callspec.params["bucket"]
    assert bucket.name == "b" and len(bucket.uuid) == 32 and int(bucket.uuid, 16) >= 0
    # The main file where the bucket has files this process opens; None behind the data service or on a
    # server.
    assert (bucket.path is None) == (kind in ("remote", "postgres"))
    if bucket.path is not None:
        assert bucket.path.name == "b.sqlite3" and bucket.path.exists()
    with bucket as same:
        assert same is bucket


def test_a_write_keeps_its_origin_expiry_flags_and_arrival_time(bucket):
    key = "k001"
    vb = vbucket_of(key)
    bucket.write(
        [Write(key, OP_UPDATE, _doc(1), expiry=2_000_000_000, flags=7)], origin="fn@3", arrival_ms=1_000
    )
    bucket.write([Write(key, OP_UPDATE, _doc(2))], arrival_ms=500)  # a clock behind: the vBucket's time holds
    assert bucket.get_meta(key) == {
        "vb": vb,
        "seqno": 2,
        "cas": bucket.get_doc(key)[1],
        "expiry": 0,
        "flags": 0,
    }
    bucket.write([Write(key, OP_DELETE)], arrival_ms=2_000)
    log = bucket.read_vb(vb, 0, 10)
    assert [(m.seqno, m.key, m.op, m.origin, m.expiry, m.flags, m.arrival_ms) for m in log] == [
        (1, key, OP_UPDATE, "fn@3", 2_000_000_000, 7, 1_000),
        (2, key, OP_UPDATE, None, 0, 0, 1_000),
        (3, key, OP_DELETE, None, 0, 0, 2_000),
    ]
    assert log[2].doc is None and log[0].cas < log[1].cas < log[2].cas  # a fresh cas per write
    assert bucket.get_meta(key) is None and bucket.get_doc(key) is None


def test_a_batch_sees_its_own_earlier_writes(bucket):
    """Deletes in a batch: of a key the batch created (logged), of one it deleted already (nothing), and a
    key created again after its delete; a delete of a key that never existed logs nothing."""
    placed = bucket.write(
        [
            Write("a", OP_UPDATE, _doc(1)),
            Write("a", OP_DELETE),
            Write("a", OP_DELETE),
            Write("a", OP_UPDATE, _doc(2)),
            Write("never", OP_DELETE),
            Write("b", OP_UPDATE, _doc(3)),
        ]
    )
    vb = vbucket_of("a")
    assert placed[:3] == [(vb, 1), (vb, 2), None] and placed[3] == (vb, 3) and placed[4] is None
    assert placed[5] == (vbucket_of("b"), 1 + (vbucket_of("b") == vb) * 3)
    assert bucket.get("a") == {"i": 2} and [m.op for m in bucket.read_vb(vb, 0, 10) if m.key == "a"] == [
        OP_UPDATE,
        OP_DELETE,
        OP_UPDATE,
    ]
    assert bucket.high_seqnos()[vbucket_of("never")] == (3 if vbucket_of("never") == vb else 0) + (
        1 if vbucket_of("never") == vbucket_of("b") else 0
    )


def test_reading_a_vbucket_packed(bucket):
    keys = _same_vb("p", 4)
    vb = vbucket_of(keys[0])
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(keys[:3])], arrival_ms=1_000)
    bucket.write([Write(keys[0], OP_DELETE)], arrival_ms=1_500)
    bucket.write([Write(keys[3], OP_UPDATE, _doc(3))], arrival_ms=5_000)
    packed = bucket.read_vb_packed(vb, 0, 100, "fn")
    assert (packed.vb, packed.after_seqno, packed.last_seqno, packed.count) == (vb, 0, 5, 5)
    assert packed.other_seqnos == [4] and packed.update_count == 4
    assert packed.keys == b"\0".join(k.encode() for k in [*keys[:3], keys[3]])
    assert packed.docs == b"".join(_doc(i) for i in range(4))
    assert (packed.arrival_min_ms, packed.arrival_max_ms, packed.arrivals) == (1_000, 5_000, None)
    exact = bucket.read_vb_packed(vb, 0, 100, "fn", exact_arrivals_over_ms=4_000)
    assert exact.arrivals == [1_000, 1_000, 1_000, 5_000]
    assert bucket.read_vb_packed(vb, 0, 100, "fn", exact_arrivals_over_ms=4_001).arrivals is None
    two = bucket.read_vb_packed(vb, 1, 2, "fn")
    assert (two.after_seqno, two.last_seqno, two.update_count, two.keys) == (
        1,
        3,
        2,
        "\0".join(keys[1:3]).encode(),
    )
    assert bucket.read_vb_packed(vb, 5, 100, "fn") is None  # nothing after the high seqno
    # An entry written by a deployment of the reader's own function: read those rows one by one instead.
    bucket.write([Write(keys[1], OP_UPDATE, _doc(9))], origin="fn@2")
    assert (
        bucket.read_vb_packed(vb, 0, 100, "fn") is None and bucket.read_vb_packed(vb, 0, 5, "fn") is not None
    )
    assert bucket.read_vb_packed(vb, 0, 100, "other").last_seqno == 6


def test_a_new_bucket_has_only_its_default_collection(bucket):
    assert bucket.collections() == {}


def test_effect_groups_without_writes_and_of_one_vbucket_twice(bucket):
    """A group without writes (a batch of mutations that wrote nothing) still moves its vBucket's mark;
    two groups of one vBucket in a batch end at the later epoch and the higher seqno; a replay of the
    batch applies nothing (the group of the older epoch is fenced now)."""
    spread = [f"t-{i}" for i in range(40)]  # keys all over the partitions of 4
    batch = [
        EffectGroup(5, 2, []),
        EffectGroup(6, 1, [(4, Write(k + "a", OP_UPDATE, _doc(4))) for k in spread]),
        EffectGroup(6, 2, [(9, Write(k + "b", OP_UPDATE, _doc(9))) for k in spread]),
    ]
    first = bucket.apply_effects("fn", batch)
    assert (first.applied, first.duplicates, first.fenced_vbs) == (80, 0, set())
    marks = bucket.effect_marks("fn")
    assert marks[6] == (2, 9) and marks[5][0] == 2
    again = bucket.apply_effects("fn", batch)
    assert (again.applied, again.duplicates, again.fenced_vbs, again.fenced_writes) == (0, 40, {6}, 40)
    assert bucket.count() == 80
    # The older epoch is fenced now on vBucket 6, whatever its seqno.
    stale = bucket.apply_effects("fn", [EffectGroup(6, 1, [(10, Write("late", OP_UPDATE, _doc(10)))])])
    assert stale.fenced_vbs == {6} and stale.fenced_writes == 1 and bucket.get("late") is None


def test_conditions_insert_counters_and_chains(bucket):
    """expect_cas=0 inserts only where no document is; a counter starts from 0 where none is and fails on a
    document whose count is not a whole number; a condition sees the writes made before it in the batch."""
    keys = _same_vb("c", 5)
    taken, fresh, counter, bad, chain = keys
    bucket.upsert(taken, {"x": 1})
    bucket.upsert(bad, {"count": "many"})
    groups = [
        EffectGroup(
            9,
            1,
            [
                (1, Write(taken, OP_UPDATE, _doc(1), expect_cas=0)),  # exists: source 1 fails
                (2, Write(fresh, OP_UPDATE, _doc(2), expect_cas=0)),  # missing: inserted
                (3, Write(counter, OP_UPDATE, None, delta=3)),
                (4, Write(counter, OP_UPDATE, None, delta=4)),  # sees the 3 written just before
                (5, Write(bad, OP_UPDATE, None, delta=1)),  # not a number: source 5 fails
                (6, Write(chain, OP_UPDATE, _doc(6), expect_cas=0)),
                (7, Write(chain, OP_DELETE, expect_cas=0)),  # chain exists now (written by source 6): fails
            ],
            conditional=True,
        )
    ]
    result = bucket.apply_effects("fn", groups)
    assert result.conflicts == [(9, 1), (9, 5), (9, 7)] and result.applied == 4
    assert (
        bucket.get(taken) == {"x": 1}
        and bucket.get(fresh) == {"i": 2}
        and bucket.get(counter) == {"count": 7}
    )
    assert bucket.get(bad) == {"count": "many"} and bucket.get(chain) == {"i": 6}
    assert bucket.effect_marks("fn")[9][0] == 1  # (a partitioned bucket: seqno 0 where a partition got none)
    assert bucket.apply_effects("fn", groups).duplicates == 7  # a replay is dropped before any condition


# -- FileBucket: what ops, the CLI, verify, rewind, the window coordinator and the Data API call -------------


def test_stats_count_documents_tombstones_and_mutations(file_bucket, request):
    kind = request.node.callspec.params["file_bucket"]
    file_bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)])
    file_bucket.delete("k001")
    stats = file_bucket.stats()
    assert (stats["name"], stats["uuid"]) == ("b", file_bucket.uuid)
    assert (stats["documents"], stats["tombstones"], stats["mutations"]) == (len(KEYS) - 1, 1, len(KEYS) + 1)
    assert stats["vbuckets_with_data"] == len({vbucket_of(k) for k in KEYS})
    assert stats["partitions"] == (
        1 if kind == "local" else 4
    )  # a PostgreSQL bucket records what it was given
    assert stats["path"] == (None if file_bucket.path is None else str(file_bucket.path))


def test_verify_integrity_passes_on_a_sound_bucket(file_bucket):
    file_bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)])
    assert (
        file_bucket.verify_integrity() is None
    )  # damaged ones: test_damaged_files.py, test_postgres_buckets.py


def test_copy_to_copies_files_and_names_the_way_where_there_are_none(file_bucket, tmp_path):
    file_bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)], origin="fn@1")
    file_bucket.fence("fn", {3: 4})
    target = tmp_path / "copy"
    if file_bucket.path is None:
        with pytest.raises(StoreError, match=r"is in the PostgreSQL store .*`eventing store copy --from "):
            file_bucket.copy_to(target)
        assert not target.exists()
        return
    main = file_bucket.copy_to(target)
    assert main == target / "buckets" / "b.sqlite3"
    with open_bucket(target, "b") as copy:
        assert copy.uuid == file_bucket.uuid and copy.keys() == file_bucket.keys()
        assert copy.high_seqnos() == file_bucket.high_seqnos() and copy.effect_marks("fn") == {3: (4, 0)}
        assert [b for b in copy.scan_log()] == [b for b in file_bucket.scan_log()]


def test_a_dump_loaded_into_an_empty_bucket_holds_the_same_rows(file_bucket, request, data_dir):
    """dump_meta, dump_rows and load_dump (`eventing store copy`): every seqno, cas, origin, arrival time,
    tombstone, high seqno, effect mark and collection id comes back, and the copy takes the uuid."""
    kind = request.node.callspec.params["file_bucket"]
    assert file_bucket.create_collection("s", "c") == 8
    file_bucket.write(
        [Write(k, OP_UPDATE, _doc(i), expiry=i % 3, flags=i % 2) for i, k in enumerate(KEYS)],
        origin="fn@1",
        arrival_ms=5_000,
    )
    file_bucket.write([Write(key_prefix(8) + "x", OP_UPDATE, _doc(1)), Write("k001", OP_DELETE)])
    file_bucket.apply_effects("fn", _groups(2, range(1, 4)))
    meta = file_bucket.dump_meta()
    assert meta.uuid == file_bucket.uuid and '"s"' in meta.collections
    tables = ("docs", "log", "high", "marks")
    rows = {table: sorted(r for batch in file_bucket.dump_rows(table) for r in batch) for table in tables}
    assert [len(rows[t]) for t in ("docs", "log", "high")] == [
        len(KEYS) + 1 + 240,
        len(KEYS) + 2 + 240,
        NUM_VBUCKETS,
    ]
    for got in _open(kind, request, data_dir, "c"):
        got.load_dump(meta, ((table, file_bucket.dump_rows(table)) for table in tables))
        assert got.uuid == file_bucket.uuid and got.dump_meta().collections == meta.collections
        assert {table: sorted(r for batch in got.dump_rows(table) for r in batch) for table in tables} == rows
        assert got.high_seqnos() == file_bucket.high_seqnos() and got.effect_marks(
            "fn"
        ) == file_bucket.effect_marks("fn")
        assert (
            got.collections() == {("s", "c"): 8}
            and got.get("k001") is None
            and got.keys() == file_bucket.keys()
        )
        vb = vbucket_of(KEYS[5])
        assert got.read_vb_rows(vb, 0, 1000) == file_bucket.read_vb_rows(vb, 0, 1000)
        with pytest.raises(ConfigError, match="is not empty"):
            got.load_dump(meta, ((table, file_bucket.dump_rows(table)) for table in tables))


def test_load_rows_logs_as_write_does(file_bucket):
    rows = [
        ("k1", OP_UPDATE, _doc(1), 0),
        ("k2", OP_UPDATE, _doc(2), 2_000_000_000),
        ("k1", OP_DELETE, None, 0),
        ("nope", OP_DELETE, None, 0),
    ]
    assert file_bucket.load_rows(rows, arrival_ms=1_234) == 3  # the delete of nothing is not logged
    assert file_bucket.get("k1") is None and file_bucket.get_doc("k2")[2] == 2_000_000_000
    logged = [m for vb in {vbucket_of("k1"), vbucket_of("k2")} for m in file_bucket.read_vb(vb, 0, 10)]
    assert sorted((m.key, m.op, m.arrival_ms, m.origin) for m in logged) == [
        ("k1", OP_UPDATE, 1_234, None),
        ("k1", OP_DELETE, 1_234, None),
        ("k2", OP_UPDATE, 1_234, None),
    ]
    assert file_bucket.high_seqnos()[vbucket_of("nope")] == sum(
        vbucket_of(k) == vbucket_of("nope") for k in ("k1", "k1", "k2")
    )


def test_expire_due_turns_passed_expiries_into_expirations(file_bucket):
    file_bucket.write(
        [
            Write("gone1", OP_UPDATE, _doc(1), expiry=100),
            Write("gone2", OP_UPDATE, _doc(2), expiry=200),
            Write("later", OP_UPDATE, _doc(3), expiry=10**10),
            Write("plain", OP_UPDATE, _doc(4)),
            Write("deleted", OP_UPDATE, _doc(5), expiry=50),
        ]
    )
    file_bucket.delete("deleted")
    assert file_bucket.expire_due(now_s=150) == 1
    assert file_bucket.get("gone1") is None and file_bucket.get("gone2") == {"i": 2}
    assert file_bucket.expire_due(now_s=1_000) == 1 and file_bucket.expire_due(now_s=1_000) == 0
    assert file_bucket.keys() == ["later", "plain"]
    last = file_bucket.read_vb(vbucket_of("gone1"), 0, 10)[-1]
    assert (last.key, last.op, last.doc) == ("gone1", OP_EXPIRE, None)


def test_columns_of_a_vbucket_rebuild_its_rows(file_bucket):
    keys = _same_vb("col", 5)
    vb = vbucket_of(keys[0])
    file_bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(keys)])
    file_bucket.delete(keys[2])
    rows = [tuple(r) for r in file_bucket.read_vb_rows(vb, 0, 100)]
    columns = file_bucket.read_vb_columns(vb, 0, 100)
    assert columns[:3] == (6, 6, "6:1") and list(rows_of_columns(vb, 0, columns)) == rows
    assert list(rows_of_columns(vb, 1, file_bucket.read_vb_columns(vb, 1, 2))) == rows[1:3]
    assert file_bucket.read_vb_columns(vb, 6, 100) is None  # nothing there
    file_bucket.write([Write(keys[0], OP_UPDATE, _doc(0), flags=1)])  # not the plain case: read the rows
    assert (
        file_bucket.read_vb_columns(vb, 0, 100) is None and file_bucket.read_vb_columns(vb, 0, 6) is not None
    )
    file_bucket.write([Write(keys[1], OP_UPDATE, _doc(0))], origin="fn@1")
    assert file_bucket.read_vb_columns(vb, 7, 1) is None


def test_matching_reads_leave_out_what_the_prefilter_rules_out(file_bucket):
    keys = _same_vb("m", 6)
    vb = vbucket_of(keys[0])
    cid = file_bucket.create_collection("s", "c")
    own = _same_vb("u", 1, vb)[0]
    file_bucket.write(
        [
            Write(keys[0], OP_UPDATE, encode_document({"type": "order"})),  # 1 matches
            Write(keys[1], OP_UPDATE, encode_document({"type": "other"})),  # 2 ruled out
            Write(keys[2], OP_UPDATE, encode_document({"type": "other"})),  # 3 ruled out
            Write(key_prefix(cid) + own, OP_UPDATE, encode_document({"type": "x"})),  # 4 a named collection's
            Write(keys[1], OP_DELETE),  # 5 a delete: its bytes tell nothing
            Write(keys[3], OP_UPDATE, encode_document({"type": "other"})),  # 6 ruled out
            Write(keys[4], OP_UPDATE, encode_document({"type": "other"})),  # 7 ruled out
        ]
    )
    file_bucket.write([Write(keys[5], OP_UPDATE, encode_document({"type": "other"}))], origin="fn@2")  # 8 own
    prefilter = compile_filter({"field": "type", "eq": "order"}).prefilter
    rows, scanned, last = file_bucket.read_vb_matching(vb, 0, 100, 8, prefilter, "fn")
    assert [r[1] for r in rows] == [1, 4, 5, 8] and (scanned, last) == (8, 8)
    assert [tuple(r) for r in rows] == [
        tuple(r) for r in file_bucket.read_vb_rows(vb, 0, 8) if r[1] in (1, 4, 5, 8)
    ]
    # The range's last entry comes back as the check of its count, whatever the prefilter says of it.
    rows, scanned, last = file_bucket.read_vb_matching(vb, 0, 3, 8, prefilter, "fn")
    assert [r[1] for r in rows] == [1, 3] and (scanned, last) == (3, 3)
    rows, scanned, last = file_bucket.read_vb_matching(vb, 5, 100, 7, prefilter, "other")
    assert [r[1] for r in rows] == [7] and (scanned, last) == (2, 7)
    assert file_bucket.read_vb_matching(vb, 8, 100, 8, prefilter, "fn") == ([], 0, 8)
    by_key = compile_filter({"key_prefix": keys[0]}).prefilter
    assert [r[1] for r in file_bucket.read_vb_matching(vb, 0, 100, 8, by_key, "fn")[0]] == [1, 4, 8]


def test_first_arrival_after_positions(file_bucket):
    a, b = "k001", next(k for k in KEYS if vbucket_of(k) != vbucket_of("k001"))
    va, vb = vbucket_of(a), vbucket_of(b)
    file_bucket.write([Write(a, OP_UPDATE, _doc(1))], arrival_ms=100)
    file_bucket.write([Write(b, OP_UPDATE, _doc(1))], arrival_ms=150)
    file_bucket.write([Write(a, OP_UPDATE, _doc(2))], arrival_ms=200)
    assert file_bucket.first_arrival_after({va: 0, vb: 0}) == 100
    assert file_bucket.first_arrival_after({va: 1, vb: 0}) == 150
    assert file_bucket.first_arrival_after({va: 1}) == 200
    assert (
        file_bucket.first_arrival_after({va: 2, vb: 1}) is None
        and file_bucket.first_arrival_after({}) is None
    )


def test_scans_of_the_whole_log_in_vbucket_and_seqno_order(file_bucket):
    file_bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS)], origin="fn@1")
    file_bucket.write([Write(k, OP_DELETE) for k in KEYS[:30]])
    every = [m for vb in range(NUM_VBUCKETS) for m in file_bucket.read_vb(vb, 0, 1000)]
    batches = list(file_bucket.scan_log(batch=7))
    assert all(len(b) <= 7 for b in batches) and [m for b in batches for m in b] == every
    assert all(isinstance(m, Mutation) for b in batches for m in b)
    index = [tuple(r) for b in file_bucket.log_index(batch=13) for r in b]
    assert index == [(m.vb, m.seqno, m.key, m.origin) for m in every] and len(index) == len(KEYS) + 30


def test_logged_writes_count_every_upsert_of_a_prefix(file_bucket):
    file_bucket.write(
        [Write("a|1", OP_UPDATE, _doc(1)), Write("a|2", OP_UPDATE, _doc(2)), Write("b|1", OP_UPDATE, _doc(3))]
    )
    file_bucket.write([Write("a|1", OP_UPDATE, _doc(4)), Write("a|1", OP_DELETE)])
    assert file_bucket.logged_writes("a|") == {"a|1": 2, "a|2": 1}
    assert (
        file_bucket.logged_writes("") == {"a|1": 2, "a|2": 1, "b|1": 1}
        and file_bucket.logged_writes("c") == {}
    )


def test_seqnos_before_a_time(file_bucket):
    a, b = "k001", next(k for k in KEYS if vbucket_of(k) != vbucket_of("k001"))
    file_bucket.write([Write(a, OP_UPDATE, _doc(1))], arrival_ms=1_000)
    file_bucket.write([Write(a, OP_UPDATE, _doc(2)), Write(b, OP_UPDATE, _doc(2))], arrival_ms=2_000)
    file_bucket.write([Write(b, OP_UPDATE, _doc(3))], arrival_ms=3_000)
    ms = 1_000_000
    assert file_bucket.seqnos_before(0) == {vbucket_of(a): 0, vbucket_of(b): 0}
    assert file_bucket.seqnos_before(2_000 * ms) == {vbucket_of(a): 1, vbucket_of(b): 0}
    assert file_bucket.seqnos_before(2_500 * ms) == {vbucket_of(b): 1}
    assert file_bucket.seqnos_before(3_001 * ms) == {}


def test_lowering_and_dropping_effect_marks(file_bucket):
    file_bucket.apply_effects("fn", _groups(2, range(1, 6)))
    file_bucket.apply_effects("other", _groups(1, range(1, 2), "o"))
    assert file_bucket.effect_marks("fn") == {3: (2, 5), 900: (2, 5)}
    moved = file_bucket.lower_effect_marks(
        "fn", {3: 2, 900: 9, 77: 1}
    )  # only downwards, only marks that exist
    assert moved == {3: 5} and file_bucket.effect_marks("fn") == {3: (2, 2), 900: (2, 5)}
    again = file_bucket.apply_effects("fn", _groups(2, range(1, 6)))
    assert (again.applied, again.duplicates) == (
        3 * 40,
        2 * 40 + 5 * 40,
    )  # vBucket 3's seqnos 3..5 apply again
    file_bucket.drop_effect_marks("fn")
    assert file_bucket.effect_marks("fn") == {} and file_bucket.effect_marks("other") == {
        3: (1, 1),
        900: (1, 1),
    }
    assert (
        file_bucket.apply_effects("fn", _groups(2, range(1, 2))).applied == 80
    )  # a new deployment starts afresh


def test_collections_are_created_with_new_ids_and_dropped_with_their_documents(file_bucket):
    assert file_bucket.create_collection("s", "c") == 8 and file_bucket.create_collection("s", "d") == 9
    with pytest.raises(ConfigError, match=r"collection b\.s\.c exists already"):
        file_bucket.create_collection("s", "c")
    file_bucket.write([Write(key_prefix(8) + k, OP_UPDATE, _doc(i)) for i, k in enumerate(KEYS[:20])])
    file_bucket.write([Write(key_prefix(9) + "x", OP_UPDATE, _doc(1)), Write("plain", OP_UPDATE, _doc(2))])
    file_bucket.delete(key_prefix(8) + KEYS[0])
    assert file_bucket.collections() == {("s", "c"): 8, ("s", "d"): 9}
    assert file_bucket.drop_collection("s", "c") == 19  # live documents only
    assert file_bucket.collections() == {("s", "d"): 9} and file_bucket.count() == 2
    assert file_bucket.get(key_prefix(8) + KEYS[1]) is None and file_bucket.get(key_prefix(9) + "x") == {
        "i": 1
    }
    assert any(
        m.key == key_prefix(8) + KEYS[1] for m in file_bucket.read_vb(vbucket_of(KEYS[1]), 0, 10)
    )  # log stays
    with pytest.raises(NotFoundError, match=r"collection b\.s\.c does not exist"):
        file_bucket.drop_collection("s", "c")
    assert file_bucket.create_collection("s", "c") == 10  # ids are never reused


def _counter(current: StoredDocument | None) -> Write:
    count = decode_document(current.doc)["count"] if current is not None else 0
    return Write("x", OP_UPDATE, encode_document({"count": count + 1}), flags=5)


def _refuse(current: StoredDocument | None) -> Write:
    raise ConfigError("refused")


def test_change_document_reads_checks_and_writes_one_document(file_bucket):
    def insert(current: StoredDocument | None) -> Write:
        if current is not None:
            raise ConfigError("exists")
        return Write("d1", OP_UPDATE, _doc(1), expiry=2_000_000_000, flags=3)

    after = file_bucket.change_document("d1", insert, origin="api")
    meta = file_bucket.get_meta("d1")
    assert after == StoredDocument("d1", _doc(1), meta["cas"], 2_000_000_000, 3, vbucket_of("d1"), 1)
    with pytest.raises(ConfigError, match="exists"):
        file_bucket.change_document("d1", insert)
    assert file_bucket.change_document("d1", lambda current: None) == after  # nothing to write: as it is
    assert file_bucket.change_document("d1", lambda current: Write("d1", OP_DELETE)) is None
    assert (
        file_bucket.get("d1") is None
        and file_bucket.change_document("d1", lambda current: current and None) is None
    )
    log = file_bucket.read_vb(vbucket_of("d1"), 0, 10)
    assert [(m.op, m.origin) for m in log] == [(OP_UPDATE, "api"), (OP_DELETE, None)]


def test_change_documents_one_transaction_each_change_seeing_the_ones_before(file_bucket):
    """The Data API's write path: a group of requests, one transaction; a change that raises takes its
    exception's place and writes nothing, the others go on."""
    file_bucket.upsert("y", {"v": 1})
    done = file_bucket.change_documents(
        [
            ("x", _counter),
            ("x", _counter),
            ("y", _refuse),
            ("z", lambda current: Write("z", OP_DELETE)),
            ("y", lambda current: Write("y", OP_DELETE)),
            ("x", _counter),
            ("w", lambda current: None),
        ],
        origin="api",
    )
    vb = vbucket_of("x")
    assert [d.after.doc for d in (done[0], done[1], done[5])] == [
        encode_document({"count": n}) for n in (1, 2, 3)
    ]
    assert isinstance(done[2], ConfigError) and done[3] == Changed(None) and done[6] == Changed(None)
    assert done[4].after is None and (done[4].vb, done[4].seqno) == (vbucket_of("y"), 2) and done[4].cas > 0
    meta = file_bucket.get_meta("x")
    assert (
        done[5] == Changed(done[5].after, meta["cas"], vb, 3)
        and meta["flags"] == 5
        and done[5].after.cas == meta["cas"]
    )
    assert file_bucket.get("x") == {"count": 3} and file_bucket.get("y") is None
    assert [m.origin for m in file_bucket.read_vb(vb, 0, 10) if m.key == "x"] == ["api"] * 3


def test_a_mirrored_collection_is_known_as_one_until_it_is_dropped(file_bucket):
    plain = file_bucket.create_collection("s", "plain")
    mirrored = file_bucket.create_collection("s", "orders", mirror="table public.orders")
    assert file_bucket.mirrors() == {mirrored: "table public.orders"} and plain not in file_bucket.mirrors()
    file_bucket.drop_collection("s", "orders")
    assert file_bucket.mirrors() == {}
