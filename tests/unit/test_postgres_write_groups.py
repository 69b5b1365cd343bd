"""Group commit of a PostgreSQL bucket's writes (eventing.storage.postgres.groups): calls made while a
transaction of the bucket runs share the next one, each answered with its own writes' places only once that
transaction committed, an error reaching every call of its group and none of the next. The queue on its
own, then threads writing to a bucket on a throwaway server."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import pytest

from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.storage import postgres as pg_buckets
from eventing.storage.postgres.groups import WriteGroups
from eventing.storage.values import Write
from metadata.postgres import PostgresDatabase


class _Blocking:
    """A commit that records each group it is given and holds the first until released."""

    def __init__(self) -> None:
        self.groups: list[list[tuple]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.failing = 0  # the transaction (1, 2, ...) that fails

    def __call__(self, items: list[tuple]) -> list:
        self.groups.append(list(items))
        if len(self.groups) == 1:
            self.entered.set()
            assert self.release.wait(10)
        if len(self.groups) == self.failing:
            raise RuntimeError("the server refused the transaction")
        return [(len(self.groups), item[0]) for item in items]


def _item(key: str, xattrs: bytes | None = None) -> tuple:
    base = (key, OP_UPDATE, b"{}", 0, 0, None)
    return base if xattrs is None else (*base, xattrs)


def _queued(groups: WriteGroups, count: int) -> bool:
    with groups._lock:
        return len(groups._queued) == count


def _wait_until(predicate, timeout: float = 10.0) -> None:
    """Until ``predicate()`` holds (a call has queued behind the running transaction)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the calls never queued"
        time.sleep(0.001)


def test_calls_made_during_a_transaction_share_the_next_in_their_order():
    groups, commit = WriteGroups(), _Blocking()
    answers: dict[str, list] = {}

    def call(name: str, items: list[tuple]) -> None:
        answers[name] = groups.run(items, commit)

    first = threading.Thread(target=call, args=("a", [_item("a1")]))
    first.start()
    assert commit.entered.wait(10)
    later = []
    calls = (("b", [_item("b1"), _item("b2")]), ("c", [_item("c1")]), ("d", [_item("d1", b"x")]))
    for n, (name, items) in enumerate(calls, 1):
        thread = threading.Thread(target=call, args=(name, items))
        thread.start()
        later.append(thread)
        _wait_until(lambda n=n: _queued(groups, n))
    assert "b" not in answers  # nothing is answered before its transaction commits
    commit.release.set()
    for thread in [first, *later]:
        thread.join(10)
    # Two transactions for four calls: the second holds b, c and d, in the order they came; a group mixing
    # items with and without XATTRs gives every item the seventh element (None: keep the document's).
    assert [[item[0] for item in group] for group in commit.groups] == [["a1"], ["b1", "b2", "c1", "d1"]]
    assert [len(item) for item in commit.groups[1]] == [7, 7, 7, 7]
    assert commit.groups[1][0][6] is None and commit.groups[1][3][6] == b"x"
    assert answers == {
        "a": [(1, "a1")],
        "b": [(2, "b1"), (2, "b2")],
        "c": [(2, "c1")],
        "d": [(2, "d1")],
    }


def test_an_error_reaches_every_call_of_its_group_and_none_of_the_next():
    groups, commit = WriteGroups(), _Blocking()
    outcome: dict[str, object] = {}

    def call(name: str) -> None:
        try:
            outcome[name] = groups.run([_item(name)], commit)
        except RuntimeError as exc:
            outcome[name] = str(exc)

    first = threading.Thread(target=call, args=("a",))
    first.start()
    assert commit.entered.wait(10)
    commit.failing = 2  # the second transaction (b and c) fails
    waiting = [threading.Thread(target=call, args=(name,)) for name in ("b", "c")]
    for n, thread in enumerate(waiting, 1):
        thread.start()
        _wait_until(lambda n=n: _queued(groups, n))
    commit.release.set()
    for thread in [first, *waiting]:
        thread.join(10)
    assert outcome == {
        "a": [(1, "a")],
        "b": "the server refused the transaction",
        "c": "the server refused the transaction",
    }
    assert groups.run([_item("e")], commit) == [(3, "e")]  # the queue goes on after a failed group
    assert not groups._running


@pytest.fixture
def db(pg_server):
    url = pg_server.create_database(f"pgg_{uuid.uuid4().hex[:8]}")
    store = PostgresDatabase.open(url)
    yield store
    store.close()


def test_threads_writing_to_a_bucket_share_transactions_and_lose_nothing(db):
    bucket = pg_buckets.create_bucket(db, "orders")
    bucket.upsert("warm", {"i": -1})
    tokens_before = int(db.read("SELECT count(*) FROM eventing_commits")[0][0])
    threads, per = 8, 40
    placed: dict[str, tuple[int, int]] = {}
    start = threading.Barrier(threads)

    def writer(t: int) -> None:
        start.wait()
        for i in range(per):
            key = f"t{t}-{i}"
            (place,) = bucket.write([Write(key, OP_UPDATE, encode_document({"t": t, "i": i}))])
            assert place is not None
            placed[key] = place

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    # Every write is there once, with its own seqno; each thread's writes of a vBucket in its order.
    assert len(placed) == threads * per
    assert len(set(placed.values())) == threads * per
    assert bucket.count() == threads * per + 1
    by_thread: dict[tuple[int, int], list[int]] = defaultdict(list)
    for t in range(threads):
        for i in range(per):
            vb, seqno = placed[f"t{t}-{i}"]
            by_thread[(t, vb)].append(seqno)
    assert all(seqnos == sorted(seqnos) for seqnos in by_thread.values())
    assert bucket.get("t3-7") == {"t": 3, "i": 7}
    # Fewer transactions than writes (each transaction leaves one commit token).
    transactions = int(db.read("SELECT count(*) FROM eventing_commits")[0][0]) - tokens_before
    assert transactions < threads * per
