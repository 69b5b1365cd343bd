"""A worker's own wait for writes on a PostgreSQL store (eventing.storage.postgres.wake_wait): woken by a
committed write to one of its vBuckets of its bucket, not by others'; the vBuckets it owns as they are at
each wait; a lost connection wakes it once and is made again. A throwaway server, never skipped."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from eventing.storage import postgres as pg_buckets
from eventing.storage.postgres.wake import INTEREST_REFRESH_S, channel_of, sender_for
from eventing.storage.postgres.wake_wait import PostgresWriteWaiter
from metadata.postgres import PostgresDatabase
from sharding import vbucket_of


@pytest.fixture
def db(pg_url):
    store = PostgresDatabase.open(f"{pg_url}?schema=t_{uuid.uuid4().hex[:12]}")
    yield store
    store.close()


def _key_in(vbs: set[int], avoid: set[int] | None = None) -> str:
    """A key of one of ``vbs`` (or, with ``avoid``, of none of those)."""
    for i in range(100_000):
        key = f"k{i}"
        vb = vbucket_of(key)
        if (avoid is None and vb in vbs) or (avoid is not None and vb not in avoid):
            return key
    raise AssertionError("no such key")


def _write_soon(bucket, key: str, delay: float = 0.15) -> threading.Thread:
    writer = threading.Thread(target=lambda: (time.sleep(delay), bucket.upsert(key, {"x": 1})))
    writer.start()
    return writer


def test_a_write_to_an_owned_vbucket_wakes_the_waiter_and_others_do_not(db):
    src, other = pg_buckets.create_bucket(db, "src"), pg_buckets.create_bucket(db, "other")
    owned = {vbucket_of("mine"), 5, 6}
    waiter = PostgresWriteWaiter.open(db, "src", owned)
    assert waiter is not None
    try:
        for bucket, key in ((src, _key_in(owned, avoid=owned)), (other, "mine")):  # another vBucket, bucket
            writer = _write_soon(bucket, key)
            started = time.monotonic()
            assert not waiter.wait(0.6)
            assert time.monotonic() - started >= 0.55
            writer.join()
        # the other vBucket's was read and passed over; the other bucket's was not sent: nobody listens for it
        assert waiter.received >= 1 and sender_for(db).skipped >= 1
        writer = _write_soon(src, "mine")
        started = time.monotonic()
        assert waiter.wait(5.0)
        assert time.monotonic() - started < 2.0
        writer.join()
        owned.add(vbucket_of("later"))  # a vBucket claimed meanwhile counts from the next wait
        writer = _write_soon(src, "later")
        assert waiter.wait(5.0)
        writer.join()
        src.upsert("mine", {"x": 2})
        assert sender_for(db).flush()
        deadline = time.monotonic() + 5
        while not waiter.drain():  # the notification reaches the connection a little after the commit
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not waiter.drain()  # drained: nothing left
    finally:
        waiter.close()


def test_a_lost_connection_wakes_the_waiter_once_and_it_listens_again(db):
    src = pg_buckets.create_bucket(db, "src")
    waiter = PostgresWriteWaiter.open(db, "src", {vbucket_of("mine")})
    assert waiter is not None
    try:
        pid = waiter._conn.info.backend_pid
        db.read("SELECT pg_terminate_backend(%s)", (pid,))
        assert waiter.wait(5.0)  # writes may have gone unannounced: look once
        assert not waiter.wait(0.2)  # no new connection within RECONNECT_S: waits out as a poll
        time.sleep(1.0)
        writer = _write_soon(src, "mine", delay=0.5)
        assert waiter.wait(5.0)  # connected again (and listening before the write committed)
        writer.join()
        assert waiter._conn is not None and waiter._conn.info.backend_pid != pid
    finally:
        waiter.close()


def test_the_waiter_names_the_owned_vbuckets_announced_since_it_was_last_asked(db):
    src, other = pg_buckets.create_bucket(db, "src"), pg_buckets.create_bucket(db, "other")
    owned = {vbucket_of("mine"), vbucket_of("also")}
    waiter = PostgresWriteWaiter.open(db, "src", owned)
    assert waiter is not None
    try:
        src.upsert(_key_in(owned, avoid=owned), {"x": 1})  # not one of its vBuckets
        other.upsert("mine", {"x": 1})  # another bucket
        src.upsert("mine", {"x": 1})
        src.upsert("also", {"x": 1})
        assert sender_for(db).flush()
        deadline = time.monotonic() + 5
        woken: set[int] = set()
        while woken != owned:  # the notifications reach the connection a little after the commits
            assert time.monotonic() < deadline, woken
            waiter.wait(0.2)
            found = waiter.take_woken()
            assert found is not None and found <= owned
            woken |= found
        assert waiter.take_woken() == set()  # taken: nothing announced since
        db.read("SELECT pg_terminate_backend(%s)", (waiter._conn.info.backend_pid,))
        assert waiter.wait(5.0)
        assert waiter.take_woken() is None  # writes may have gone unannounced: any vBucket
        assert waiter.take_woken() == set()
    finally:
        waiter.close()


def _listen_raw(db, bucket: str | None):
    """A listener of "another process": its interest written by a connection of its own (this process's
    senders are not told), then LISTEN."""
    conn = psycopg.connect(db.target.url, autocommit=True)
    if db.target.schema:
        conn.execute(f'SET search_path TO "{db.target.schema}"')
    if bucket is not None:
        conn.execute(
            "INSERT INTO eventing_wake_interest VALUES (%s, extract(epoch FROM clock_timestamp()) + 30) "
            "ON CONFLICT (bucket) DO UPDATE SET until = excluded.until",
            (bucket,),
        )
    conn.execute(f'LISTEN "{channel_of(db)}"')
    return conn


def _announced(conn, bucket: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for note in conn.notifies(timeout=0.1, stop_after=1):
            if note.payload.split(" ")[0] == bucket:
                return True
    return False


def test_only_buckets_someone_listens_for_are_announced(db):
    sender = sender_for(db)
    quiet, heard = pg_buckets.create_bucket(db, "quiet"), pg_buckets.create_bucket(db, "heard")
    conn = _listen_raw(db, None)  # listens, but noted no interest
    try:
        skipped, sent = sender.skipped, sender.sent
        quiet.upsert("a", {"x": 1})
        assert sender.flush()
        assert sender.sent == sent and sender.skipped == skipped + 1  # no statement at all
        assert not _announced(conn, "quiet", 0.3)
        # a listener of this process: its interest is seen at the next notification
        waiter = PostgresWriteWaiter.open(db, "heard", {vbucket_of("b")})
        assert waiter is not None
        try:
            heard.upsert("b", {"x": 1})
            assert sender.flush() and sender.sent == sent + 1
            assert waiter.wait(5.0)
        finally:
            waiter.close()
    finally:
        conn.close()


def test_another_processs_listener_is_announced_to_within_the_refresh_and_an_old_interest_lapses(db):
    sender = sender_for(db)
    bucket = pg_buckets.create_bucket(db, "late")
    bucket.upsert("a", {"x": 1})  # the sender reads who listens: nobody for "late"
    assert sender.flush()
    conn = _listen_raw(db, "late")
    try:
        started = time.monotonic()
        while not _announced(conn, "late", 0.05):  # each write announced once the sender looked again
            assert time.monotonic() - started < INTEREST_REFRESH_S + 5
            bucket.upsert("a", {"x": 1})
        db.read(
            "UPDATE eventing_wake_interest SET until = 0 WHERE bucket = 'late' RETURNING bucket"
        )  # lapsed
        started, skipped = time.monotonic(), sender.skipped
        while sender.skipped == skipped:  # no longer announced once the sender looked again
            assert time.monotonic() - started < INTEREST_REFRESH_S + 5
            bucket.upsert("a", {"x": 2})
            assert sender.flush()
    finally:
        conn.close()
