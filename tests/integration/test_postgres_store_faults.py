"""The PostgreSQL metadata store while its server is killed (kill -9 of the postmaster and its processes)
and started again: a worker's sequence of commits waits and carries on, every commit that returned is
there after the restart, and none is applied twice (its counters add up exactly)."""

from __future__ import annotations

import threading
import time

import pytest

from eventing.testing.postgres import ThrowawayPostgres
from metadata import DlqRow
from metadata.errors import StoreUnavailableError
from metadata.postgres import PostgresDatabase, PostgresMetadataStore, parse_postgres_url

pytestmark = pytest.mark.integration

VBS = list(range(256))
COMMITS = 240


def _wait_for(condition, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_commits_wait_through_server_restarts_and_none_is_lost_or_applied_twice():
    server = ThrowawayPostgres()
    server.start()
    try:
        url = server.create_database("faults")
        store = PostgresMetadataStore(PostgresDatabase(parse_postgres_url(url)))
        store.init_checkpoints("fn", dict.fromkeys(range(1024), 0), "uuid")
        epochs = {vb: cp.epoch for vb, cp in store.claim("fn", VBS, "n/w0").items()}
        returned: list[int] = []
        failed: list[BaseException] = []

        def commits() -> None:
            try:
                for n in range(1, COMMITS + 1):
                    letter = DlqRow("fn", n % 256, n, f"k{n}", "error", "boom", "tb", 1, 1.0, 1.0, b"m")
                    assert (
                        store.commit("fn", epochs, dict.fromkeys(VBS, n), [letter], {"success": 1}) == set()
                    )
                    returned.append(n)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failed.append(exc)

        writer = threading.Thread(target=commits)
        writer.start()
        for at in (40, 120, 200):
            _wait_for(lambda at=at: len(returned) >= at or bool(failed))
            attempts = store.db.failed_attempts
            server.kill()
            last = returned[-1]
            # The writer is now failing and waiting (it retries); the server comes back after that.
            _wait_for(lambda attempts=attempts: store.db.failed_attempts > attempts or bool(failed))
            server.start()
            check = PostgresMetadataStore(PostgresDatabase(parse_postgres_url(url)))
            assert min(cp.seqno for vb, cp in check.checkpoints("fn").items() if vb in VBS) >= last
            check.close()
            check.db.close()
        writer.join(180)
        assert failed == []
        assert returned == list(range(1, COMMITS + 1))
        assert {cp.seqno for vb, cp in store.checkpoints("fn").items() if vb in VBS} == {COMMITS}
        assert store.counters("fn") == {"success": COMMITS}  # none lost, none applied twice
        letters = store.dlq_rows("fn")
        assert sorted(r.seqno for r in letters) == list(range(1, COMMITS + 1)) and {
            r.attempts for r in letters
        } == {1}
        assert sum(store.db.retried.values()) >= 3
        store.db.close()
    finally:
        server.stop()


def test_transactions_after_a_long_outage_do_not_wait_for_the_pools_reconnection_backoff(monkeypatch):
    """psycopg_pool doubles its wait between reconnection attempts (1, 2, 4, 8 s...): after ~10 s away, its
    next attempt may be seconds after the server is back. Every transaction meanwhile would wait POOL_WAIT_S
    for a pooled connection and then run on one of its own (6 s for these 10): the pool is replaced once a
    connection of its own succeeds, or refilled by the check a lost connection starts, so the rest run on
    pooled connections at once."""
    monkeypatch.setenv("EVENTING_STORE_WAIT_S", "60")
    server = ThrowawayPostgres()
    server.start()
    try:
        db = PostgresDatabase(parse_postgres_url(server.create_database("backoff")))
        db.transaction(lambda cur: cur.execute("CREATE TABLE t(n BIGINT)"))
        server.kill()
        # The pool tries again (and fails) while the server is away, backing off: 1 + 2 + 4 s.
        with pytest.raises(StoreUnavailableError):
            db.wait_s = 7.5
            db.transaction(lambda cur: cur.execute("INSERT INTO t VALUES(0)"))
        db.wait_s = None
        server.start()
        started = time.monotonic()
        for n in range(1, 11):
            db.transaction(lambda cur, n=n: cur.execute("INSERT INTO t VALUES(%s)", (n,)))
        took = time.monotonic() - started
        assert db.read("SELECT count(*), sum(n) FROM t") == [(10, 55)]
        assert took < 3.0, f"10 transactions took {took:.1f}s after the server came back"
        db.close()
    finally:
        server.stop()


def test_a_worker_started_while_the_server_is_away_waits_for_it(monkeypatch):
    """A worker (re)started by a running service while the server is away (its process's first connection)
    waits for the server as any transaction does, instead of naming it unreachable after FIRST_CONTACT_S,
    which is for a command given a wrong --store: the function would stop on that line."""
    from eventing.storage.remote import DataAccess
    from metadata.postgres import connection

    monkeypatch.setattr(connection, "FIRST_CONTACT_S", 1.0)
    monkeypatch.setattr(connection.PostgresDatabase, "_opened", {})  # this test's "worker process"
    server = ThrowawayPostgres()
    server.start()
    try:
        url = server.create_database("worker")
        server.kill()
        found: list = []
        opened_at = time.monotonic()

        def worker_start() -> None:
            try:
                found.append(DataAccess(url, None).metadata().list_functions())
            except BaseException as exc:  # noqa: BLE001 - reported below
                found.append(exc)

        starting = threading.Thread(target=worker_start)
        starting.start()
        _wait_for(lambda: time.monotonic() - opened_at > 2.5 or bool(found))  # past FIRST_CONTACT_S
        server.start()
        starting.join(60)
        assert found == [[]], found
    finally:
        server.stop()
