"""A PostgreSQL bucket's reads ahead and its write transactions' plans (eventing.storage.postgres.read_ahead,
writer): rows read ahead are what plain reads answer, in any order and under the cap, and go stale when
positions move back; the high seqnos read with them are the bucket's; a worker on a PostgreSQL store looks
at all its vBuckets in one statement rather than one per vBucket; the lookups of several keys keep using the
key in the index after the bucket grew from empty. A throwaway server, never skipped."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter

import pytest

from eventing.control.service import EventingService
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.storage import postgres as pg_buckets
from eventing.storage.postgres import log_reader, read_ahead
from eventing.storage.postgres.wake import sender_for
from eventing.storage.state import open_state
from eventing.storage.values import StoredDocument, Write
from eventing.testing import (
    check_ledger,
    deploy_function,
    ledger_definition,
    load_source,
    read_call_log,
    wait_for,
)
from eventing.workers.executor import InProcessExecutor
from eventing.workers.looks import FULL_LOOK_S
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata import open_store
from metadata.postgres import PostgresDatabase
from sharding import NUM_VBUCKETS, vbucket_of


@pytest.fixture(scope="module")
def module_url(pg_server) -> str:
    return pg_server.create_database(f"pgra_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def db(module_url):
    store = PostgresDatabase.open(f"{module_url}?schema=t_{uuid.uuid4().hex[:12]}")
    yield store
    store.close()


def _doc(i: int) -> bytes:
    return encode_document({"i": i})


def _load(bucket, rng: random.Random, writes: int, keys: int) -> None:
    batch = []
    for i in range(writes):
        key = f"k{rng.randrange(keys)}"
        batch.append(Write(key, OP_DELETE) if rng.random() < 0.1 else Write(key, OP_UPDATE, _doc(i)))
        if len(batch) == 500:
            bucket.write(batch)
            batch = []
    bucket.write(batch)


def _plain(db, name: str, vb: int, after: int, limit: int) -> list[tuple]:
    """A fresh bucket object's read: nothing read ahead."""
    return [tuple(r) for r in pg_buckets.open_bucket(db, name).read_vb_rows(vb, after, limit)]


@pytest.mark.parametrize("partial", [False, True], ids=["look", "partial look"])
def test_rows_read_ahead_are_what_plain_reads_answer_in_any_order_and_size(db, monkeypatch, partial):
    monkeypatch.setattr(
        read_ahead, "LOOK_AHEAD_ROWS", 900
    )  # the cap cuts the runs short: the rest on the spot
    bucket = pg_buckets.create_bucket(db, "src")
    rng = random.Random(3)
    _load(bucket, rng, 6000, 700)
    highs = pg_buckets.open_bucket(db, "src").high_seqnos()
    owned = rng.sample(range(NUM_VBUCKETS), 300)  # in no particular order, as a worker's rotation
    positions = {vb: rng.randrange(highs[vb] + 1) for vb in owned}
    expected = {vb: _plain(db, "src", vb, positions[vb], 10_000) for vb in owned}
    got: dict[int, list[tuple]] = {vb: [] for vb in owned}
    looks = 0
    while any(positions[vb] < highs[vb] for vb in owned):
        # a partial look (one statement, _ANNOUNCED) reads what a look at all of them reads
        bucket.prefetch([(vb, positions[vb], rng.choice((3, 50, 4000))) for vb in owned], partial=partial)
        looks += 1
        looked = bucket.high_seqnos(prefetched=True)
        assert [looked[vb] for vb in owned] == [highs[vb] for vb in owned]  # the runs' vBuckets (others: 0)
        for vb in rng.sample(owned, 40):
            rows = [tuple(r) for r in bucket.read_vb_rows(vb, positions[vb], rng.choice((1, 7, 100)))]
            assert (
                rows == _plain(db, "src", vb, positions[vb], len(rows))
                if rows
                else positions[vb] == highs[vb]
            )
            got[vb] += rows
            if rows:
                positions[vb] = rows[-1][1]
    assert got == expected
    assert bucket._ahead.looks >= 2 and looks > 2  # reads were served ahead, in several looks under the cap


def test_the_high_seqnos_of_a_look_are_answered_once_and_new_writes_are_found_by_the_next_look(db):
    bucket = pg_buckets.create_bucket(db, "src")
    bucket.write([Write(f"a{i}", OP_UPDATE, _doc(i)) for i in range(50)])
    vb = vbucket_of("a1")
    high = bucket.high_seqnos()[vb]
    bucket.prefetch([(vb, 0, 1000)])
    assert bucket.has_ahead(vb)
    assert bucket.high_seqnos(prefetched=True)[vb] == high
    assert bucket._ahead.highs is None  # taken once: the next answer is read again
    bucket.upsert("a1", {"i": -1})  # after the look: the run read ahead ended at the old high seqno
    rows = bucket.read_vb_rows(vb, 0, 1000)
    assert [r[1] for r in rows] == list(range(1, high + 1))
    bucket.prefetch([(vb, high, 1000)])
    assert bucket.high_seqnos(prefetched=True)[vb] == high + 1
    assert [(r[1], r[2]) for r in bucket.read_vb_rows(vb, high, 1000)] == [(high + 1, "a1")]


def test_rows_read_ahead_that_no_longer_follow_the_position_are_not_used(db):
    bucket = pg_buckets.create_bucket(db, "src")
    bucket.write([Write("same", OP_UPDATE, _doc(i)) for i in range(20)])
    vb = vbucket_of("same")
    bucket.prefetch([(vb, 5, 1000)])
    assert bucket.read_vb_rows(vb, 2, 3) == _plain(db, "src", vb, 2, 3)  # a rewind: read on the spot
    assert [r[1] for r in bucket.read_vb_rows(vb, 5, 4)] == [6, 7, 8, 9]  # still there for its position
    bucket.forget_prefetched({vb: 0})
    assert not bucket.has_ahead(vb)


def test_a_partial_look_reads_its_vbuckets_and_keeps_the_rows_held_for_the_others(db):
    bucket = pg_buckets.create_bucket(db, "src")
    bucket.write([Write(k, OP_UPDATE, _doc(i)) for i, k in enumerate(["a1", "b7"] * 10)])
    vb_a, vb_b = vbucket_of("a1"), vbucket_of("b7")
    assert vb_a != vb_b
    bucket.prefetch([(vb_a, 0, 1000), (vb_b, 0, 1000)])
    highs = bucket.high_seqnos(prefetched=True)
    bucket.upsert("a1", {"i": -1})
    bucket.upsert("b7", {"i": -2})
    bucket.prefetch([(vb_b, highs[vb_b], 1000)], partial=True)
    found = bucket.high_seqnos(prefetched=True)
    assert found[vb_b] == highs[vb_b] + 1  # the vBucket looked at: its new high seqno and its new row
    assert found[vb_a] == 0  # not looked at: the caller keeps what it knew
    assert bucket.has_ahead(vb_a)  # the rows held for the other vBucket stay
    assert [r[1] for r in bucket.read_vb_rows(vb_a, 0, highs[vb_a])] == list(range(1, highs[vb_a] + 1))
    assert [(r[1], r[2]) for r in bucket.read_vb_rows(vb_b, highs[vb_b], 1000)] == [(highs[vb_b] + 1, "b7")]


@pytest.fixture
def reads(monkeypatch) -> Counter:
    """Counts of this process's log statements: looks (read ahead) and reads of one vBucket's run."""
    counts: Counter = Counter()
    look, read = read_ahead.ReadAhead.look, log_reader.LogReader.read_vb_rows

    def counted_look(self, wanted, *, partial=False):
        counts["looks"] += 1
        counts["partial looks"] += partial
        return look(self, wanted, partial=partial)

    def counted_read(self, vb, after, limit):
        counts["runs read on the spot"] += 1
        return read(self, vb, after, limit)

    monkeypatch.setattr(read_ahead.ReadAhead, "look", counted_look)
    monkeypatch.setattr(log_reader.LogReader, "read_vb_rows", counted_read)
    return counts


def test_a_function_behind_on_a_postgresql_store_reads_ahead_and_handles_every_mutation_once(
    pg_url, tmp_path, monkeypatch, reads
):
    monkeypatch.setattr(read_ahead, "LOOK_AHEAD_ROWS", 700)  # several looks per worker, runs cut by the cap
    mutations = 6000
    source = load_source(pg_url, 600, mutations, chunk=2000, seed=5)
    log = tmp_path / "calls"
    deploy_function(
        pg_url, ledger_definition("fn_pg", "src", "ledger", workers=3, call_log=str(log), batch_size=250)
    )
    summary = EventingService(pg_url, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors and summary.functions["fn_pg"].handled == mutations
    report = check_ledger(source, open_state(pg_url).open_bucket("ledger"))
    assert report.ok and report.handled == mutations, report.summary()
    calls = read_call_log(log)
    assert sum(len(v) for v in calls.values()) == mutations
    assert all(seqs == sorted(set(seqs)) for seqs in calls.values())
    # 3 workers, ~2,000 mutations each over ~340 vBuckets: a statement per vBucket's run before
    assert reads["looks"] >= 6 and reads["runs read on the spot"] < 300, reads


def test_a_caught_up_function_on_a_postgresql_store_takes_each_new_write_from_its_look(
    pg_url, tmp_path, reads
):
    log = tmp_path / "calls"
    state = open_state(pg_url)
    source = state.create_bucket("src")
    deploy_function(pg_url, ledger_definition("fn_live", "src", "ledger", workers=2, call_log=str(log)))
    service = EventingService(pg_url, InProcessExecutor())
    runner = threading.Thread(target=service.run, daemon=True)
    runner.start()
    try:
        wait_for(
            lambda: service.supervisors.get("fn_live") and service.supervisors["fn_live"].ready, "workers up"
        )
        reads.clear()
        for i in range(200):
            source.upsert(f"d{i % 40}", {"i": i})
        wait_for(lambda: sum(len(v) for v in read_call_log(log).values()) >= 200, "every write handled")
    finally:
        service.stop()
        runner.join(60)
    assert not runner.is_alive()
    assert reads["runs read on the spot"] == 0 and reads["looks"] > 0, reads
    calls = read_call_log(log)
    assert sum(len(v) for v in calls.values()) == 200
    assert all(seqs == sorted(set(seqs)) for seqs in calls.values())
    report = check_ledger(source, state.open_bucket("ledger"))
    assert report.ok and report.handled == 200, report.summary()


def _waiting_core(pg_url) -> WorkerCore:
    """One worker of a ledger function on ``src``, caught up, whose steps wait for writes (its own LISTEN)."""
    load_source(pg_url, 20, 100, seed=3)
    deploy_function(pg_url, ledger_definition("fn_wait", "src", "ledger", workers=1))
    generation = open_store(pg_url).get_function("fn_wait").generation
    everything = tuple(range(NUM_VBUCKETS))
    spec = WorkerSpec(pg_url, "fn_wait", generation, "local/w0", everything, wake_address="pg")
    core = WorkerCore(spec)
    assert core.waiter is not None and core.step().handled == 100
    return core


def test_a_waiting_worker_on_a_postgresql_store_looks_again_only_at_the_vbuckets_announced(pg_url, reads):
    core = _waiting_core(pg_url)
    state = open_state(pg_url)
    source, ledger = state.open_bucket("src"), state.open_bucket("ledger")
    done = threading.Event()

    def write_one_at_a_time() -> None:
        for i in range(30):
            key = f"w{i}"
            source.upsert(key, {"i": i})
            wait_for(  # looked at often: 30 effects, each handled within milliseconds of its notification
                lambda key=key: ledger.get(f"h|fn_wait|{key}") is not None,
                f"the effect of {key}",
                every=0.005,
            )
        done.set()

    try:
        reads.clear()
        started = time.monotonic()
        writer = threading.Thread(target=write_one_at_a_time)
        writer.start()
        handled = steps = 0
        while not done.is_set():
            handled += core.step(None, 1.0).handled
            steps += 1
        writer.join()
        handled += core.step().handled
        assert handled == 30
        # The looks after the first look at every vBucket are at the vBuckets announced since, in this step
        # and the next ones; one at all of them every FULL_LOOK_S at least.
        assert reads["partial looks"] >= 25, reads
        full_looks = reads["looks"] - reads["partial looks"]
        assert full_looks <= 2 + (time.monotonic() - started) / FULL_LOOK_S, reads
        report = check_ledger(source, ledger)
        assert report.ok and report.handled == 130, report.summary()
    finally:
        core.close()


def test_a_write_whose_notification_was_lost_is_found_by_the_next_step(pg_url, monkeypatch):
    core = _waiting_core(pg_url)
    state = open_state(pg_url)
    source, ledger = state.open_bucket("src"), state.open_bucket("ledger")
    sender = sender_for(PostgresDatabase.open(pg_url))
    monkeypatch.setattr(sender, "notify", lambda bucket, vbuckets: None)  # every notification lost
    try:
        writer = threading.Timer(0.2, lambda: source.upsert("unannounced", {"n": 1}))
        writer.start()
        handled = core.step(None, 0.6).handled  # waits, unwoken: the write is not looked for at once
        writer.join()
        deadline = time.monotonic() + 3 * FULL_LOOK_S + 2
        while not handled:  # a look at every vBucket, at least every FULL_LOOK_S, finds it
            assert time.monotonic() < deadline
            handled += core.step(None, 0.05).handled
        assert handled == 1 and ledger.get("h|fn_wait|unannounced") is not None
        report = check_ledger(source, ledger)
        assert report.ok and report.handled == 101, report.summary()
    finally:
        core.close()


def _indexed_rows_read(db: PostgresDatabase) -> int:
    """Entries read so far from the bucket_docs primary key of the store's schema, by the pool's one
    connection (its statistics flushed first)."""
    db.run(lambda conn: conn.execute("SELECT pg_stat_force_next_flush()"))
    return int(
        db.run(
            lambda conn: conn.execute(
                "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'bucket_docs_pkey' "
                "AND schemaname = current_schema()"
            ).fetchone()[0]
        )
    )


def test_a_group_of_document_writes_reads_its_keys_only_after_the_bucket_grew_from_empty(module_url):
    """The Data API's check-and-set reads the group's documents by key. Planned while the bucket was empty
    and cached (prepared on the connection from its sixth run, a generic plan from the sixth run after), the
    lookup read every index entry of the bucket and kept the keys asked for: 1-2 ms a group after a few
    thousand documents."""
    db = PostgresDatabase(
        PostgresDatabase.open(f"{module_url}?schema=t_{uuid.uuid4().hex[:12]}").target, pool_size=1
    )
    try:
        bucket = pg_buckets.create_bucket(db, "docs")

        def put(keys: list[str]) -> None:
            done = bucket.change_documents(
                [(k, lambda current, k=k: Write(k, OP_UPDATE, _doc(1))) for k in keys]
            )
            assert all(not isinstance(d, Exception) for d in done)

        for n in range(16):  # on the nearly empty bucket, on the one pooled connection
            put([f"early-{n}-{j}" for j in range(4)])
        bucket.write([Write(f"bulk{i:05d}", OP_UPDATE, _doc(i)) for i in range(4000)])
        before = _indexed_rows_read(db)
        for n in range(5):
            put([f"late-{n}-{j}" for j in range(16)])
        read = _indexed_rows_read(db) - before
        # 5 groups of 16 new keys: their lookups and the inserts' conflict checks, not 5 x 4,000 entries
        assert read < 1000, read
        assert isinstance(bucket.change_documents([("bulk00001", lambda c: None)])[0].after, StoredDocument)
    finally:
        db.close()
