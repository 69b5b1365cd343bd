"""PostgreSQL buckets under faults, on a server of this module's own (eventing.testing.postgres): the server
killed (kill -9 of the postmaster) and started again while threads write, a server that stays away longer
than the store's wait, a connection dropped in the middle of apply_effects and just before its COMMIT, and
the wake listener's connection lost with its server.
What must hold, checked by counting rows: every acknowledged write is there afterwards, no write is half
applied, every vBucket's seqnos run 1..high without a gap or a repeat, and effects apply exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict

import pytest

from eventing.core.mutation import OP_UPDATE, decode_document, encode_document
from eventing.storage import postgres as pg_buckets
from eventing.storage.postgres import PostgresWakeListener
from eventing.storage.postgres.effects import EffectApplier
from eventing.storage.values import EffectGroup, Write
from eventing.testing.postgres import ThrowawayPostgres
from metadata.errors import StoreUnavailableError
from metadata.postgres import PostgresDatabase
from sharding import NUM_VBUCKETS, vbucket_of

pytestmark = pytest.mark.integration

BATCH = 10  # documents a write, spread over vBuckets


@pytest.fixture(scope="module")
def server():
    pg = ThrowawayPostgres()
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def db(server, request):
    if not server.running():
        server.start()
    store = PostgresDatabase.open(
        server.create_database(f"f_{request.node.name[:30].lower()}_{time.monotonic_ns() % 10**6}")
    )
    yield store
    store.close()


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Writers:
    """Threads writing batches of BATCH documents, each batch one write; every outcome is recorded."""

    def __init__(self, bucket, threads: int = 4):
        self.bucket = bucket
        self.acked: list[tuple[int, int]] = []  # (thread, batch)
        self.failed: list[tuple[int, int, StoreUnavailableError]] = []
        self.spans: list[tuple[float, float, bool]] = []  # (start, end, acknowledged)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(t,)) for t in range(threads)]

    def _run(self, t: int) -> None:
        j = 0
        while not self.stop.is_set():
            writes = [
                Write(f"t{t}-b{j}-{i}", OP_UPDATE, encode_document({"t": t, "j": j})) for i in range(BATCH)
            ]
            started = time.monotonic()
            try:
                self.bucket.write(writes)
            except StoreUnavailableError as exc:
                with self.lock:
                    self.failed.append((t, j, exc))
                    self.spans.append((started, time.monotonic(), False))
            else:
                with self.lock:
                    self.acked.append((t, j))
                    self.spans.append((started, time.monotonic(), True))
            j += 1

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
            assert not t.is_alive()


def _check_log(bucket) -> dict[tuple[int, int], int]:
    """Seqnos 1..high in every vBucket, none missing or twice; the documents present per (thread, batch)."""
    highs = bucket.high_seqnos()
    entries = 0
    for vb in range(NUM_VBUCKETS):
        seqnos = [m.seqno for m in bucket.read_vb(vb, 0, 1_000_000)]
        assert seqnos == list(range(1, highs[vb] + 1)), vb
        entries += len(seqnos)
    present: Counter[tuple[int, int]] = Counter()
    for _key, doc, _meta in bucket.scan():
        present[(doc["t"], doc["j"])] += 1
    assert entries == sum(present.values())  # every write is one entry of the log and one live document
    return present


def test_the_server_killed_and_started_again_during_writes(server, db, monkeypatch):
    monkeypatch.setenv("EVENTING_STORE_WAIT_S", "60")  # writes wait for the server to come back
    bucket = pg_buckets.create_bucket(db, "b")
    writers = Writers(bucket)
    writers.start()
    _wait_for(lambda: len(writers.acked) >= 40)
    server.kill()
    dead_at = time.monotonic()  # the postmaster and its children are gone
    server.start()  # crash recovery, then it takes connections again
    before = len(writers.acked)
    _wait_for(lambda: len(writers.acked) >= before + 40)
    writers.finish()

    present = _check_log(bucket)
    assert all(present[batch] == BATCH for batch in writers.acked)  # nothing acknowledged is lost
    assert all(n == BATCH for n in present.values())  # no write half applied
    for t, j, exc in writers.failed:  # a commit whose answer was lost: all of it or none of it
        assert exc.ambiguous and present[(t, j)] in (0, BATCH), str(exc)
    # Writes in flight while the server was away waited for it and were acknowledged once it was back.
    assert any(ok and start < dead_at < end for start, end, ok in writers.spans)


def test_a_server_away_longer_than_the_wait_fails_writes_with_one_line(server, db, monkeypatch):
    monkeypatch.setenv("EVENTING_STORE_WAIT_S", "1.5")
    bucket = pg_buckets.create_bucket(db, "b")
    bucket.upsert("before", {"x": 1})
    server.kill()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as caught:
            bucket.write([Write(f"k{i}", OP_UPDATE, encode_document({"i": i})) for i in range(BATCH)])
        assert 1.5 <= time.monotonic() - started < 15
        message = str(caught.value)
        assert (
            "\n" not in message
            and f"PostgreSQL at 127.0.0.1:{server.port}" in message
            # a transaction that never reached its COMMIT waited; a write that is one statement (its own
            # transaction) was sent, and whether it committed is unknown until the server answers again
            and ("waited" in message or "may or may not have been committed" in message)
        )
    finally:
        server.start()
    assert bucket.get("before") == {"x": 1} and bucket.count() == 1  # the failed write left nothing
    bucket.upsert("after", {"x": 2})
    assert bucket.keys() == ["after", "before"]


def _groups(epoch: int, seqnos: range) -> list[EffectGroup]:
    return [
        EffectGroup(
            vb,
            epoch,
            [
                (s, Write(f"out-{vb}-{s}-{j}", OP_UPDATE, encode_document({"s": s})))
                for s in seqnos
                for j in range(25)
            ],
        )
        for vb in (3, 900)
    ]


@pytest.mark.parametrize("where", ["mid-transaction", "before-commit"])
def test_a_connection_dropped_during_apply_effects(db, monkeypatch, where):
    """The server ends the applying connection (pg_terminate_backend) after the writes are sent and before
    the marks are (mid-transaction: the transaction runs again whole on a new connection), or after both
    (before-commit: the COMMIT finds the connection gone; its commit token says it did not commit, so it runs
    again). Either way each write is applied exactly once, and a replay from the checkpoint applies none."""
    bucket = pg_buckets.create_bucket(db, "b")
    bucket.fence("fn", {3: 1, 900: 1})
    killer = db.connect()
    dropped: list[int] = []
    original = EffectApplier._set_marks

    def set_marks(self, cur, function, marks):
        if where == "before-commit":
            original(self, cur, function, marks)
        if not dropped:
            pid = cur.raw.connection.info.backend_pid
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
            dropped.append(pid)
        if where == "mid-transaction":
            original(self, cur, function, marks)

    monkeypatch.setattr(EffectApplier, "_set_marks", set_marks)
    groups = _groups(1, range(1, 5))
    try:
        # Mid-transaction: retried whole. Before the commit: the COMMIT's answer is lost; the store looks up
        # the transaction's commit token once the server answers again, finds it did not commit, and runs it
        # again (metadata.postgres.commits): applied once either way, and a replay changes nothing.
        result = bucket.apply_effects("fn", groups)
        again = bucket.apply_effects("fn", groups)
        assert (again.applied, again.duplicates) == (0, 200)
    finally:
        killer.close()
    assert len(dropped) == 1
    assert (result.applied, result.duplicates) == (200, 0)
    logged: dict[str, int] = defaultdict(int)
    for vb in range(NUM_VBUCKETS):
        for m in bucket.read_vb(vb, 0, 10_000):
            logged[m.key] += 1
            assert decode_document(m.doc)["s"] == int(m.key.split("-")[2])
    assert len(logged) == 200 and set(logged.values()) == {1}  # each write once, none twice
    assert bucket.effect_marks("fn") == {3: (1, 4), 900: (1, 4)}
    again = bucket.apply_effects("fn", groups)
    assert (again.applied, again.duplicates) == (0, 200) and sum(bucket.high_seqnos()) == 200


def test_the_wake_listener_comes_back_with_the_server(server, db):
    """Notifications sent while the listener's connection is down are lost: once connected again, it
    reports every vBucket of every bucket as written, so each caught-up worker looks once."""
    bucket = pg_buckets.create_bucket(db, "b")
    listener = PostgresWakeListener(db)
    assert listener.start()
    try:
        bucket.upsert("k1", {})
        assert listener.wait(10) and listener.take() == {"b": {vbucket_of("k1")}}
        server.kill()
        server.start()
        _wait_for(lambda: listener.reconnects >= 1)
        assert listener.take() == {"b": set(range(NUM_VBUCKETS))}
        bucket.upsert("k2", {})  # and it listens again
        assert listener.wait(30) and listener.take() == {"b": {vbucket_of("k2")}}
    finally:
        listener.close()
