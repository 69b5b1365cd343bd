"""What only a PostgreSQL bucket has to show (eventing.storage.postgres; the contract it shares with the files
is test_bucket_contract.py): opening, creating, listing and dropping buckets of a store, the versioned
schema, many buckets in one set of tables, the row locks that keep seqnos in order while writers of other
vBuckets go on, fences that a zombie's batch in flight cannot undo, the per-bucket key index, keys a
server cannot hold, and write notifications through LISTEN/NOTIFY. A throwaway server, never skipped."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import psycopg
import pytest

from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.errors import ConfigError, InvalidKeyError, NotFoundError, StoreCorruptError, StoreError
from eventing.storage import postgres as pg_buckets
from eventing.storage import wake as file_wake
from eventing.storage.postgres import PostgresWakeListener, schema
from eventing.storage.postgres.wake import channel_of, decode_payload, encode_payload, sender_for
from eventing.storage.values import EffectGroup, Write
from metadata.postgres import PostgresDatabase
from sharding import NUM_VBUCKETS, vbucket_of


@pytest.fixture(scope="module")
def module_url(pg_server) -> str:
    return pg_server.create_database(f"pgb_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def db(module_url):
    """An empty store: a schema of its own in the module's database."""
    store = PostgresDatabase.open(f"{module_url}?schema=t_{uuid.uuid4().hex[:12]}")
    yield store
    store.close()


def _doc(i: int) -> bytes:
    return encode_document({"i": i})


def _rows(db: PostgresDatabase, table: str) -> int:
    return int(db.read(f"SELECT count(*) FROM {table}")[0][0])


def test_buckets_are_created_listed_opened_and_dropped(db):
    with pytest.raises(
        NotFoundError,
        match=r"^unknown bucket 'orders' \(not in the store at postgresql://"
        r"[^ ]+\); create it with `eventing bucket create orders`$",
    ):
        pg_buckets.open_bucket(db, "orders")
    orders = pg_buckets.create_bucket(db, "orders", partitions=8)
    pg_buckets.create_bucket(db, "audit").upsert("a", {"x": 1})
    assert pg_buckets.bucket_names(db) == ["audit", "orders"]
    with pytest.raises(
        ConfigError, match=r"bucket 'orders' already exists in the store at .*; pick another name"
    ):
        pg_buckets.create_bucket(db, "orders")
    assert pg_buckets.create_bucket(db, "orders", exist_ok=True).uuid == orders.uuid
    with pytest.raises(ConfigError, match="a bucket has 1 to 64 partitions, not 0"):
        pg_buckets.create_bucket(db, "other", partitions=0)
    with pytest.raises(ConfigError, match="bucket name 'bad name' is not valid"):
        pg_buckets.create_bucket(db, "bad name")
    assert orders.partitions() == 8 and orders.stats()["partitions"] == 8 and orders.path is None
    orders.write([Write(f"k{i}", OP_UPDATE, _doc(i)) for i in range(300)])
    orders.fence("fn", {1: 1})
    orders.ensure_key_index()
    pg_buckets.drop_bucket(db, "orders")
    assert pg_buckets.bucket_names(db) == ["audit"]
    # Everything of it went, and nothing of the other bucket.
    assert (
        _rows(db, "bucket_log") == 1
        and _rows(db, "bucket_docs") == 1
        and _rows(db, "bucket_effect_marks") == 0
    )
    assert _rows(db, "bucket_high") == NUM_VBUCKETS
    assert db.read("SELECT to_regclass(%s)", (schema.key_index_name(orders.ref.id),))[0][0] is None
    with pytest.raises(NotFoundError, match="unknown bucket 'orders'"):
        pg_buckets.drop_bucket(db, "orders")
    with pytest.raises(NotFoundError, match="unknown bucket 'orders'"):
        orders.upsert("late", {})  # a handle on a dropped bucket writes nothing
    again = pg_buckets.create_bucket(db, "orders")
    assert (
        again.ref.id != orders.ref.id
        and again.count() == 0
        and again.upsert("k1", {}) == (vbucket_of("k1"), 1)
    )


def test_the_schema_is_versioned_and_a_newer_one_refused(db):
    pg_buckets.create_bucket(db, "b")
    assert db.read("SELECT version FROM eventing_schema WHERE component = 'buckets'") == [(schema.VERSION,)]
    db.transaction(
        lambda cur: cur.execute("UPDATE eventing_schema SET version = 99 WHERE component = 'buckets'")
    )
    schema._ready.clear()  # as a process started after the newer version wrote the store
    with pytest.raises(
        StoreError,
        match=r"written by a newer version of eventing \(buckets schema 99; this one "
        rf"knows {schema.VERSION}\); upgrade eventing on this machine",
    ):
        pg_buckets.open_bucket(db, "b")


def test_buckets_of_one_store_keep_apart(db):
    a, b = pg_buckets.create_bucket(db, "a"), pg_buckets.create_bucket(db, "b")
    a.write([Write(f"k{i}", OP_UPDATE, _doc(i)) for i in range(50)])
    b.write([Write("k1", OP_UPDATE, _doc(-1))])
    a.fence("fn", {3: 2})
    assert b.get("k1") == {"i": -1} and a.get("k1") == {"i": 1} and b.count() == 1 and a.count() == 50
    assert b.high_seqnos()[vbucket_of("k1")] == 1 and b.effect_marks("fn") == {}
    assert a.flush()["documents"] == 50 and b.get("k1") == {"i": -1}


def test_keys_a_server_cannot_hold(db):
    bucket = pg_buckets.create_bucket(db, "b")
    with pytest.raises(InvalidKeyError, match=r"holds a NUL character, which a PostgreSQL store cannot keep"):
        bucket.write([Write("a\x00b", OP_UPDATE, _doc(1))])
    assert bucket.get("a\x00b") is None and bucket.previous_doc("a\x00b", 5) is None and bucket.count() == 0
    done = bucket.change_documents(
        [
            ("a\x00b", lambda cur: Write("a\x00b", OP_UPDATE, _doc(1))),
            ("ok", lambda cur: Write("ok", OP_UPDATE, _doc(2))),
        ]
    )
    assert isinstance(done[0], InvalidKeyError) and bucket.get("ok") == {"i": 2}


def test_damage_and_the_way_out(db):
    bucket = pg_buckets.create_bucket(db, "b")
    bucket.verify_integrity()
    db.transaction(lambda cur: cur.execute("DELETE FROM bucket_high WHERE vb < 10"))
    with pytest.raises(
        StoreCorruptError, match=r"bucket 'b' in the store at .* has 1014 of its 1024 high seqno rows"
    ):
        bucket.verify_integrity()
    with pytest.raises(StoreCorruptError, match="has 1014 of its 1024"):  # never a seqno made up
        bucket.write(
            [Write(next(f"k{i}" for i in range(999) if vbucket_of(f"k{i}") < 10), OP_UPDATE, _doc(1))]
        )
    pg_buckets.drop_bucket(db, "b")
    with pytest.raises(NotFoundError, match="unknown bucket 'b'"):
        bucket.verify_integrity()


def _hold(db: PostgresDatabase, sql: str, args: tuple) -> psycopg.Connection:
    """A connection of the test's own with a transaction left open after ``sql`` (its locks held)."""
    conn = db.connect()
    conn.execute("BEGIN")
    conn.execute(sql, args)
    return conn


def test_writers_of_other_vbuckets_do_not_wait_for_each_other(db):
    bucket = pg_buckets.create_bucket(db, "b")
    held_key = "k1"
    other = next(f"k{i}" for i in range(2, 999) if vbucket_of(f"k{i}") != vbucket_of(held_key))
    holder = _hold(
        db,
        "SELECT 1 FROM bucket_high WHERE bucket = %s AND vb = %s FOR UPDATE",
        (bucket.ref.id, vbucket_of(held_key)),
    )
    try:
        started = time.monotonic()
        assert bucket.upsert(other, {"x": 1}) == (vbucket_of(other), 1)  # not held: at once
        assert time.monotonic() - started < 2
        waiting = threading.Thread(target=lambda: bucket.upsert(held_key, {"x": 2}))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and bucket.get(held_key) is None  # its vBucket is held: it waits
    finally:
        holder.execute("COMMIT")
        holder.close()
    waiting.join(10)
    assert not waiting.is_alive() and bucket.get(held_key) == {"x": 2}


def test_concurrent_writers_get_every_seqno_once_and_in_order(db):
    bucket = pg_buckets.create_bucket(db, "b")
    keys = [f"hot{i}" for i in range(12)]
    placed: list[tuple[int, int]] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        for i in range(40):
            got = bucket.write(
                [
                    Write(keys[(t + i) % len(keys)], OP_UPDATE, _doc(t * 1000 + i)),
                    Write(keys[(t * 7 + i) % len(keys)], OP_UPDATE, _doc(i)),
                ]
            )
            with lock:
                placed.extend(p for p in got if p is not None)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_vb: dict[int, list[int]] = defaultdict(list)
    for vb, seqno in placed:
        by_vb[vb].append(seqno)
    highs = bucket.high_seqnos()
    assert len(placed) == 8 * 40 * 2
    for vb, seqnos in by_vb.items():
        assert sorted(seqnos) == list(range(1, len(seqnos) + 1)) and highs[vb] == len(
            seqnos
        )  # no gap, none twice
        assert [m.seqno for m in bucket.read_vb(vb, 0, 1000)] == sorted(seqnos)
        arrivals = [m.arrival_ms for m in bucket.read_vb(vb, 0, 1000)]
        assert arrivals == sorted(arrivals)  # never backwards within a vBucket
    for key in keys:  # each document is its key's newest log entry
        meta = bucket.get_meta(key)
        assert meta["seqno"] == max(m.seqno for m in bucket.read_vb(meta["vb"], 0, 1000) if m.key == key)


def test_a_fence_committed_while_a_batch_waits_rejects_that_batch(db):
    """The new owner's fence holds the mark's row when the old owner's batch reads it: the batch waits for
    the fence and is rejected. (Read without the lock, the batch would see the old epoch and apply.)"""
    bucket = pg_buckets.create_bucket(db, "b")
    bucket.fence("fn", {3: 1})
    new_owner = _hold(
        db,
        "UPDATE bucket_effect_marks SET epoch = 2 WHERE bucket = %s AND function = 'fn' AND vb = 3",
        (bucket.ref.id,),
    )
    results = []
    zombie = threading.Thread(
        target=lambda: results.append(
            bucket.apply_effects("fn", [EffectGroup(3, 1, [(7, Write("z", OP_UPDATE, _doc(7)))])])
        )
    )
    zombie.start()
    zombie.join(0.5)
    assert zombie.is_alive()  # waits for the fence's transaction
    new_owner.execute("COMMIT")
    new_owner.close()
    zombie.join(10)
    assert results[0].fenced_vbs == {3} and results[0].applied == 0
    assert bucket.get("z") is None and bucket.effect_marks("fn") == {3: (2, 0)}


def test_the_key_index_belongs_to_its_bucket(db):
    a, b = pg_buckets.create_bucket(db, "a"), pg_buckets.create_bucket(db, "b")
    for i in range(3):
        a.upsert("k", {"v": i})
    a.ensure_key_index()
    a.ensure_key_index()  # again: nothing to do
    index = schema.key_index_name(a.ref.id)
    assert (
        db.read(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "WHERE i.indexrelid = to_regclass(%s)",
            (index,),
        )[0][0]
        is True
    )
    assert (
        f"WHERE (bucket = {a.ref.id})" in db.read("SELECT pg_get_indexdef(to_regclass(%s))", (index,))[0][0]
    )
    assert db.read("SELECT to_regclass(%s)", (schema.key_index_name(b.ref.id),))[0][0] is None
    assert a.previous_doc("k", 3) == encode_document({"v": 1}) and a.previous_doc("k", 1) is None


def test_a_bucket_is_no_file_to_copy(db, tmp_path):
    bucket = pg_buckets.create_bucket(db, "b")
    with pytest.raises(
        StoreError,
        match=r"^bucket 'b' is in the PostgreSQL store at postgresql://[^ ]+, not in a file "
        r"to copy; move it to a data directory with `eventing store copy --from ",
    ):
        bucket.copy_to(tmp_path / "copy")


# -- write notifications --------------------------------------------------------------------------------


def test_notification_payloads_name_the_bucket_and_vbucket_ranges():
    assert encode_payload("orders", [5, 1, 2, 3, 900, 1023, 1022]) == "orders 1-3,5,900,1022-1023"
    assert decode_payload("orders 1-3,5,900,1022-1023") == ("orders", {1, 2, 3, 5, 900, 1022, 1023})
    every = encode_payload("b", range(NUM_VBUCKETS))
    assert every == "b 0-1023" and decode_payload(every) == ("b", set(range(NUM_VBUCKETS)))
    assert len(encode_payload("b", range(0, NUM_VBUCKETS, 2))) < 8000  # PostgreSQL's payload limit
    assert decode_payload("nonsense") is None and decode_payload("b x-y") is None


def _wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_a_committed_write_wakes_the_listener_with_its_vbuckets(db):
    bucket = pg_buckets.create_bucket(db, "b")
    listener = PostgresWakeListener(db)
    forwarded: list[tuple[str, set[int], bytes]] = []
    listener.on_notify = lambda name, vbs, data: forwarded.append((name, vbs, data))
    assert listener.start()
    try:
        keys = ["k1", "k2", "k3"]
        bucket.write([Write(k, OP_UPDATE, _doc(1)) for k in keys])
        assert listener.wait(10)
        assert listener.take() == {"b": {vbucket_of(k) for k in keys}}  # one transaction: one notification
        bucket.upsert("k9", {})
        assert listener.wait(10)
        assert listener.take() == {"b": {vbucket_of("k9")}}
        assert ("b", {vbucket_of("k9")}, file_wake.encode("b", {vbucket_of("k9")})) in forwarded
        # Nothing committed, nothing told: a change that refuses, a delete of nothing.
        sender_for(db).flush()
        listener.take()
        bucket.change_documents([("k1", lambda cur: None)])
        bucket.write([Write("never", OP_DELETE)])
        sender_for(db).flush()
        assert not listener.wait(0.3) and listener.take() == {}
    finally:
        listener.close()
    assert listener._thread is None


def test_notifications_of_concurrent_writers_all_arrive_and_stay_in_their_store(db, module_url):
    bucket = pg_buckets.create_bucket(db, "b")
    other_db = PostgresDatabase.open(f"{module_url}?schema=t_{uuid.uuid4().hex[:12]}")
    other_listener = PostgresWakeListener(other_db)
    listener = PostgresWakeListener(db)
    assert channel_of(db) != channel_of(other_db) and listener.start() and other_listener.start()
    try:
        keys = [f"k{i}" for i in range(200)]
        threads = [threading.Thread(target=bucket.upsert, args=(k, {})) for k in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sender_for(db).flush()
        seen: set[int] = set()
        assert _wait_for(
            lambda: seen.update(listener.take().get("b", set())) or seen == {vbucket_of(k) for k in keys}
        )
        assert other_listener.take() == {}
    finally:
        listener.close()
        other_listener.close()
        other_db.close()
