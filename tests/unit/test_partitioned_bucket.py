"""Partitioned buckets: the same answers as a one-file bucket, one file per vBucket range, effects exactly
once across partitions even when a writer dies between two partitions' commits."""

from __future__ import annotations

import os

import pytest

from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.errors import ConfigError, StoreError
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import create_bucket, drop_bucket, open_bucket
from eventing.storage.files import list_buckets, partition_path
from eventing.storage.partitions import PartitionedBucket, partition_ranges
from eventing.storage.protocol import FileBucket
from eventing.storage.values import EffectGroup, Write
from sharding import NUM_VBUCKETS, vbucket_of
from sharding.plan import worker_plan


def _fill(bucket: LocalBucket) -> None:
    """The same writes, deletes, effects and marks for every bucket under comparison."""
    bucket.write(
        [
            Write(f"k{i}", OP_UPDATE, encode_document({"i": i}), expiry=(5 if i % 50 == 0 else 0))
            for i in range(400)
        ],
        arrival_ms=1_000,
    )
    bucket.write(
        [Write(f"k{i}", OP_DELETE) for i in range(0, 400, 7)] + [Write("missing", OP_DELETE)],
        arrival_ms=2_000,
    )
    bucket.upsert("k3", {"i": "again"}, arrival_ms=3_000)
    groups = [
        EffectGroup(
            vb, 1, [(s, Write(f"e{vb}-{s}", OP_UPDATE, encode_document({"s": s}))) for s in (1, 2, 3)]
        )
        for vb in (5, 600, 1000)
    ]
    bucket.apply_effects("fn", groups)
    bucket.expire_due(now_s=10)


def _view(bucket: LocalBucket) -> dict:
    """Everything a reader can ask, without the cas values (fresh on every write) and the arrival times of
    the writes that took the clock's (effects, expirations)."""
    log = [
        m._replace(cas=0, arrival_ms=m.arrival_ms if m.arrival_ms <= 3_000 else -1)
        for batch in bucket.scan_log(batch=97)
        for m in batch
    ]
    stats = bucket.stats()
    return {
        "highs": bucket.high_seqnos(),
        "log": log,
        "index": [row for batch in bucket.log_index(batch=101) for row in batch],
        "keys": bucket.keys(),
        "keys_k1": bucket.keys("k1", limit=7),
        "scan": [(k, d, {**m, "cas": 0}) for k, d, m in bucket.scan("e", limit=5)],
        "docs": {k: bucket.get(k) for k in ("k1", "k3", "k7", "missing", "e5-2")},
        "count": bucket.count(),
        "stats": {k: stats[k] for k in ("documents", "tombstones", "mutations", "vbuckets_with_data")},
        "logged": bucket.logged_writes("k"),
        "before": bucket.seqnos_before(2_000 * 1_000_000),
        "first_arrival": bucket.first_arrival_after({vb: 1 for vb in range(NUM_VBUCKETS)}),
        "rows": [bucket.read_vb_rows(vbucket_of(k), 0, 10)[0][:4] for k in ("k1", "k2", "e600-1")],
        "packed": bucket.read_vb_packed(vbucket_of("k2"), 0, 10, "x"),
        "max_doc": [bucket.max_doc_bytes(vb, 0, 100) for vb in range(0, NUM_VBUCKETS, 7)],
        "meta": {**(bucket.get_meta("k2") or {}), "cas": 0},
    }


def test_a_partitioned_bucket_answers_exactly_as_a_one_file_bucket(data_dir):
    one = create_bucket(data_dir, "one")
    four = create_bucket(data_dir, "four", partitions=4)
    assert isinstance(four, PartitionedBucket) and type(one) is LocalBucket
    for bucket in (one, four):
        _fill(bucket)
    assert _view(four) == _view(one)
    assert four.stats()["partitions"] == 4 and one.stats()["partitions"] == 1
    reopened = open_bucket(data_dir, "four")
    assert _view(reopened) == _view(one) and reopened.uuid == four.uuid


def test_each_vbucket_lives_in_one_partition_and_the_ranges_are_a_functions_worker_ranges(data_dir):
    for n in (2, 3, 4, 16):
        assert [list(r) for r in partition_ranges(n)] == worker_plan(list(range(NUM_VBUCKETS)), n)
    bucket = create_bucket(data_dir, "p", partitions=4)
    assert isinstance(bucket, PartitionedBucket)
    keys = [f"doc::{i}" for i in range(300)]
    bucket.write([Write(k, OP_UPDATE, encode_document({})) for k in keys])
    for part, vbs in zip(bucket.parts, bucket.ranges, strict=True):
        held = part.keys()
        assert held and all(vbucket_of(k) in vbs for k in held)
    assert sorted(k for part in bucket.parts for k in part.keys()) == sorted(keys)


def test_a_partitioned_bucket_holds_its_parts_and_answers_every_bucket_method(data_dir):
    assert not issubclass(PartitionedBucket, LocalBucket)  # nothing reaches partition 0 alone through a base
    wanted = {name for name in dir(FileBucket) if not name.startswith("_")}
    with create_bucket(data_dir, "p", partitions=2) as bucket:
        assert wanted and wanted <= set(dir(bucket))


def test_only_the_factory_opens_a_partitioned_bucket(data_dir):
    create_bucket(data_dir, "p", partitions=3).close()
    with pytest.raises(ConfigError, match="bucket 'p' has 3 partitions; open it with .*open_bucket"):
        LocalBucket.open(data_dir, "p")
    with open_bucket(data_dir, "p") as bucket:
        assert isinstance(bucket, PartitionedBucket) and len(bucket.parts) == 3


class _DiesAfterCommits:
    """Partition ``dies_at`` raises once, as a worker killed between two partitions' commits."""

    def __init__(self, bucket: PartitionedBucket, dies_at: int):
        self.part = bucket.parts[dies_at]
        self.real = self.part.apply_effects
        self.part.apply_effects = self  # type: ignore[method-assign]

    def __call__(self, *args, **kwargs):
        self.part.apply_effects = self.real  # type: ignore[method-assign]
        raise StoreError("killed")


def test_effects_stay_exactly_once_when_a_writer_dies_between_two_partitions_commits(data_dir):
    bucket = create_bucket(data_dir, "dst", partitions=4)
    assert isinstance(bucket, PartitionedBucket)

    def groups():  # writes of three source vBuckets, to keys all over the partitions
        return [
            EffectGroup(
                vb,
                1,
                [
                    (s, Write(f"out-{vb}-{s}-{j}", OP_UPDATE, encode_document({"s": s})))
                    for s in range(1, 6)
                    for j in range(4)
                ],
            )
            for vb in (1, 300, 900)
        ]

    total = 3 * 5 * 4
    _DiesAfterCommits(bucket, dies_at=2)
    with pytest.raises(StoreError, match="killed"):
        bucket.apply_effects("fn", groups())
    partial = bucket.count()
    assert 0 < partial < total  # partitions 0 and 1 committed, 2 and 3 did not
    replay = bucket.apply_effects("fn", groups())  # the worker's replay after its restart
    assert (replay.applied, replay.duplicates) == (total - partial, partial)
    assert bucket.count() == total and sum(bucket.high_seqnos()) == total  # each write logged once
    again = bucket.apply_effects("fn", groups())
    assert (again.applied, again.duplicates) == (0, total)
    # A worker learns the marks every partition holds: here all of them, after the replay.
    assert bucket.effect_marks("fn") == {vb: (1, 5) for vb in (1, 300, 900)}


def test_fencing_and_rewinding_marks_reach_every_partition(data_dir):
    bucket = create_bucket(data_dir, "dst", partitions=3)
    bucket.fence("fn", {7: 2})
    stale = [EffectGroup(7, 1, [(1, Write(f"z{i}", OP_UPDATE, encode_document({}))) for i in range(30)])]
    result = bucket.apply_effects("fn", stale)
    assert result.fenced_vbs == {7} and result.fenced_writes == 30 and bucket.count() == 0
    fresh = [EffectGroup(7, 2, [(s, Write(f"z{s}", OP_UPDATE, encode_document({}))) for s in range(1, 31)])]
    assert bucket.apply_effects("fn", fresh).applied == 30
    assert bucket.lower_effect_marks("fn", {7: 10}) == {7: 30}
    assert bucket.apply_effects("fn", fresh).applied == 20  # sources 11-30 apply again after the rewind
    bucket.drop_effect_marks("fn")
    assert bucket.effect_marks("fn") == {}


def test_a_partitioned_bucket_is_copied_flushed_and_dropped_whole(data_dir, tmp_path):
    bucket = create_bucket(data_dir, "p", partitions=4)
    bucket.write([Write(f"k{i}", OP_UPDATE, encode_document({"i": i})) for i in range(100)])
    bucket.copy_to(tmp_path / "copy")
    copy = open_bucket(tmp_path / "copy", "p")
    assert (
        copy.keys() == bucket.keys()
        and copy.high_seqnos() == bucket.high_seqnos()
        and copy.uuid == bucket.uuid
    )
    old = bucket.uuid
    flushed = bucket.flush()
    assert flushed["documents"] == 100 and bucket.count() == 0 and bucket.uuid != old
    assert open_bucket(data_dir, "p").uuid == bucket.uuid  # every partition has the new identity
    assert list_buckets(data_dir) == ["p"]
    drop_bucket(data_dir, "p")
    assert list_buckets(data_dir) == [] and os.listdir(os.path.join(data_dir, "buckets")) == []


def test_a_missing_partition_file_and_a_bad_partition_count_name_the_fix(data_dir):
    with pytest.raises(ConfigError, match="1 to 64 partitions"):
        create_bucket(data_dir, "p", partitions=0)
    create_bucket(data_dir, "p", partitions=4).close()
    partition_path(data_dir, "p", 3).unlink()
    with pytest.raises(StoreError, match=r"4 partitions but .*3\.sqlite3 is missing; restore it"):
        open_bucket(data_dir, "p")


def test_partition_files_left_without_their_main_file_never_meet_a_new_bucket(data_dir):
    old = create_bucket(data_dir, "p", partitions=4)
    old.write([Write(f"k{i}", OP_UPDATE, encode_document({})) for i in range(50)])
    old.close()
    os.unlink(os.path.join(data_dir, "buckets", "p.sqlite3"))  # the main file deleted by hand
    new = create_bucket(data_dir, "p", partitions=2)
    assert new.count() == 0 and sum(new.high_seqnos()) == 0
    left = os.listdir(partition_path(data_dir, "p", 1).parent)
    assert "1.sqlite3" in left and not [f for f in left if f.startswith(("2.", "3."))]


def test_a_crash_between_two_partitions_commits_leaves_no_replayed_copy_for_later_mutations(data_dir):
    """A worker dies after the partition of a document's history committed a batch and before the others
    did. Its replacement replays the batch: the history's partition already holds those writes, so the
    replayed copies are dropped at once, and a later mutation of the document reads the history the
    bucket holds, not one with the replayed seqnos appended a second time."""
    from eventing.testing import check_ledger, deploy_function, ledger_definition
    from eventing.workers.worker import WorkerCore, WorkerSpec
    from metadata import open_store

    source = LocalBucket.create(data_dir, "src")
    create_bucket(data_dir, "ledger", partitions=4).close()
    key = next(
        f"customer::{i}"
        for i in range(1000)  # the history and the first effect in two partitions
        if len(
            {
                partition_ranges(4).index(r)
                for r in partition_ranges(4)
                for k in (f"h|fn_p|customer::{i}", f"e|fn_p|customer::{i}|1")
                if vbucket_of(k) in r
            }
        )
        == 2
    )
    for rev in (1, 2):
        source.upsert(key, {"rev": rev})
    deploy_function(data_dir, ledger_definition("fn_p", "src", "ledger", workers=1, checkpoint_interval="1h"))

    def worker() -> WorkerCore:
        store = open_store(data_dir)
        generation = store.get_function("fn_p").generation
        store.close()
        return WorkerCore(WorkerSpec(data_dir, "fn_p", generation, "n/w0", tuple(range(NUM_VBUCKETS))))

    first = worker()
    assert first.step().handled == 2  # effects flushed to every partition, no checkpoint yet
    first.close()  # dies: the checkpoint stays at 0
    ledger = open_bucket(data_dir, "ledger")
    assert isinstance(ledger, PartitionedBucket)
    vb, history_part = vbucket_of(key), ledger._part_of_vb[vbucket_of(f"h|fn_p|{key}")]
    for i, part in enumerate(ledger.parts):  # only the history's partition had committed
        if i != history_part:
            part.lower_effect_marks("fn_p", {vb: 0})
    ledger.close()
    source.upsert(key, {"rev": 3})

    second = worker()
    assert second.step().handled == 3  # the two replayed, then the new one
    second.stop()
    second.close()
    ledger = open_bucket(data_dir, "ledger")
    assert ledger.get(f"h|fn_p|{key}")["seqs"] == [1, 2, 3]
    # (The effects `e|...` of 1 and 2 count twice here: their partitions held them although their marks
    # were lowered to stand for commits that never happened.)
    assert check_ledger(source, ledger).out_of_order == []
