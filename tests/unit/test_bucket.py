"""Local buckets: per-vBucket logs, seqnos, cas, tombstones, streaming, effects dedup and fencing."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.errors import ConfigError, InvalidDocumentError, InvalidKeyError, NotFoundError
from eventing.storage.bucket import LocalBucket
from eventing.storage.values import EffectGroup, Write
from sharding import vbucket_of


def test_upsert_assigns_strictly_increasing_seqnos_per_vbucket(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    seen: dict[int, list[int]] = {}
    for i in range(500):
        vb, seqno = bucket.upsert(f"k{i % 37}", {"i": i})
        assert vb == vbucket_of(f"k{i % 37}")
        seen.setdefault(vb, []).append(seqno)
    for seqnos in seen.values():
        assert seqnos == list(range(1, len(seqnos) + 1))
    highs = bucket.high_seqnos()
    assert sum(highs) == 500


def test_cas_grows_with_every_mutation_of_a_document(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    cas = []
    for i in range(5):
        bucket.upsert("doc", {"i": i})
        cas.append(bucket.get_meta("doc")["cas"])
    assert cas == sorted(cas) and len(set(cas)) == 5


def test_delete_leaves_a_tombstone_mutation_and_hides_the_document(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    bucket.upsert("doc", {"a": 1})
    vb, seqno = bucket.delete("doc")
    assert bucket.get("doc") is None
    log = bucket.read_vb(vb, 0, 10)
    assert [m.op for m in log] == [OP_UPDATE, OP_DELETE]
    assert log[-1].seqno == seqno and log[-1].doc is None
    assert bucket.stats()["tombstones"] == 1
    with pytest.raises(NotFoundError, match="does not exist"):
        bucket.delete("doc")


def test_read_vb_streams_after_a_seqno_in_batches(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    key = "same-key"
    for i in range(25):
        bucket.upsert(key, {"i": i})
    vb = vbucket_of(key)
    got, after = [], 0
    while batch := bucket.read_vb(vb, after, 10):
        got.extend(m.seqno for m in batch)
        after = batch[-1].seqno
    assert got == list(range(1, 26))


def test_documents_travel_as_msgpack_bytes(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    bucket.upsert("k", {"name": "Ünïcode", "n": [1, 2.5, None, True]})
    m = bucket.read_vb(vbucket_of("k"), 0, 1)[0]
    assert isinstance(m.doc, bytes)
    assert bucket.get("k") == {"name": "Ünïcode", "n": [1, 2.5, None, True]}


@pytest.mark.parametrize("doc", [[1, 2], "text", 3, None])
def test_a_document_must_be_a_json_object(doc):
    with pytest.raises(InvalidDocumentError, match="not an object"):
        encode_document(doc)


@pytest.mark.parametrize("key", ["", "x" * 251, b"\xff\xfe"])
def test_bad_keys_are_refused_at_ingest(data_dir, key):
    bucket = LocalBucket.create(data_dir, "b")
    with pytest.raises(InvalidKeyError):
        bucket.upsert(key, {"a": 1})
    assert sum(bucket.high_seqnos()) == 0


def test_a_key_of_exactly_250_bytes_is_accepted(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    bucket.upsert("é" * 125, {"a": 1})
    assert bucket.get("é" * 125) == {"a": 1}


def test_unknown_bucket_names_the_fix(data_dir):
    with pytest.raises(NotFoundError, match="eventing bucket create nope"):
        LocalBucket.open(data_dir, "nope")


def test_bad_bucket_name_is_refused(data_dir):
    with pytest.raises(ConfigError, match="not valid"):
        LocalBucket.create(data_dir, "../escape")


def test_a_recreated_bucket_has_a_new_identity(data_dir, tmp_path):
    first = LocalBucket.create(data_dir, "b").uuid
    (tmp_path / "data" / "buckets" / "b.sqlite3").unlink()
    assert LocalBucket.create(data_dir, "b").uuid != first


def test_effects_apply_exactly_once_when_replayed(data_dir):
    bucket = LocalBucket.create(data_dir, "dst")

    def group():
        return [
            EffectGroup(5, 1, [(s, Write(f"k{s}", OP_UPDATE, encode_document({"s": s}))) for s in (1, 2, 3)])
        ]

    first = bucket.apply_effects("fn", group())
    again = bucket.apply_effects("fn", group())
    assert (first.applied, first.duplicates) == (3, 0)
    assert (again.applied, again.duplicates) == (0, 3)
    assert sum(bucket.high_seqnos()) == 3


def test_effects_of_a_stale_epoch_are_fenced(data_dir):
    bucket = LocalBucket.create(data_dir, "dst")
    bucket.fence("fn", {7: 2})
    result = bucket.apply_effects(
        "fn", [EffectGroup(7, 1, [(1, Write("z", OP_UPDATE, encode_document({})))])]
    )
    assert result.fenced_vbs == {7} and result.fenced_writes == 1 and result.applied == 0
    assert bucket.get("z") is None


def test_writes_carry_their_origin_for_the_recursion_guard(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    bucket.write([Write("a", OP_UPDATE, encode_document({}))], origin="fn_x")
    assert bucket.read_vb(vbucket_of("a"), 0, 1)[0].origin == "fn_x"


def _reader(path: str, out) -> None:
    db = sqlite3.connect(path, timeout=5)
    counts = []
    for _ in range(50):
        counts.append(db.execute("SELECT COUNT(*) FROM log").fetchone()[0])
    out.put(counts)


def test_a_reader_in_another_process_sees_a_growing_log_while_a_writer_writes(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    queue: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
    proc = multiprocessing.get_context("spawn").Process(target=_reader, args=(str(bucket.path), queue))
    proc.start()
    for i in range(100):
        bucket.write([Write(f"k{i}-{j}", OP_UPDATE, encode_document({"j": j})) for j in range(50)])
    counts = queue.get(timeout=60)
    proc.join(timeout=30)
    assert counts == sorted(counts)  # never goes back: each read sees a committed prefix
    assert all(c % 50 == 0 for c in counts)  # never half a transaction


def test_high_seqnos_follow_other_connections_and_our_own_writes(data_dir):
    reader = LocalBucket.create(data_dir, "b")
    writer = LocalBucket.open(data_dir, "b")
    assert sum(reader.high_seqnos()) == 0
    writer.upsert("a", {"n": 1})  # another connection commits: data_version moves
    assert sum(reader.high_seqnos()) == 1
    reader.upsert("b", {"n": 1})  # our own commit does not move data_version: the cache is dropped instead
    assert sum(reader.high_seqnos()) == 2
    highs = reader.high_seqnos()
    highs[vbucket_of("a")] = 99  # callers get a copy, never the cache itself
    assert reader.high_seqnos()[vbucket_of("a")] == 1


def test_a_copy_holds_the_same_log_and_documents(data_dir, tmp_path):
    bucket = LocalBucket.create(data_dir, "b")
    for i in range(20):
        bucket.upsert(f"k{i % 7}", {"i": i})
    bucket.delete("k0")
    bucket.copy_to(tmp_path / "other")
    copy = LocalBucket.open(tmp_path / "other", "b")
    assert copy.high_seqnos() == bucket.high_seqnos()
    assert copy.keys() == bucket.keys() and copy.get("k3") == bucket.get("k3")
    assert [m for batch in copy.scan_log() for m in batch] == [
        m for batch in bucket.scan_log() for m in batch
    ]


def test_a_bucket_file_from_before_arrival_times_is_upgraded_when_opened(data_dir):
    bucket = LocalBucket.create(data_dir, "old")
    vb, seqno = bucket.upsert("k1", {"a": 1}, arrival_ms=1_000)
    path = bucket.path
    bucket.close()
    # The file as an earlier version wrote it: no arrival_ms in the log or the high table.
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE log DROP COLUMN arrival_ms; ALTER TABLE high DROP COLUMN arrival_ms;")
    cas = db.execute("SELECT cas FROM log WHERE vb=? AND seqno=?", (vb, seqno)).fetchone()[0]
    db.close()
    reopened = LocalBucket.open(data_dir, "old")
    assert reopened.read_vb(vb, 0, 10)[0].arrival_ms == cas // 1_000_000  # the time of its cas
    # The high table learnt the last entry's arrival: a later write with an older clock does not go below it.
    reopened.write([Write("k1", OP_UPDATE, encode_document({"a": 2}))], arrival_ms=5)
    assert [m.arrival_ms for m in reopened.read_vb(vb, 0, 10)] == [cas // 1_000_000] * 2


def test_a_batch_write_gives_each_vbucket_consecutive_seqnos_and_skips_deletes_of_missing_documents(data_dir):
    bucket = LocalBucket.create(data_dir, "b")
    keys = [f"key::{i}" for i in range(300)]
    out = bucket.write(
        [Write(k, OP_UPDATE, encode_document({"i": i})) for i, k in enumerate(keys)]
        + [Write("missing", OP_DELETE), Write("key::1", OP_DELETE), Write("key::1", OP_DELETE)]
        + [Write("key::1", OP_UPDATE, encode_document({"i": "again"}))],
        arrival_ms=7,
    )
    assert out[300] is None and out[302] is None  # deletes of documents missing at that point of the batch
    per_vb: dict[int, list[int]] = {}
    for result in out:
        if result is not None:
            per_vb.setdefault(result[0], []).append(result[1])
    assert all(seqnos == list(range(1, len(seqnos) + 1)) for seqnos in per_vb.values())
    assert bucket.high_seqnos() == [len(per_vb.get(vb, [])) for vb in range(1024)]
    assert bucket.get("key::1") == {"i": "again"} and bucket.get("key::2") == {"i": 2}
    log = [m for vb in per_vb for m in bucket.read_vb(vb, 0, 1000)]
    assert len(log) == 302 and {m.arrival_ms for m in log} == {7}
    assert len({m.cas for m in log}) == 302  # a fresh cas per entry
