"""Mirrors of PostgreSQL tables (eventing.storage.mirror) end to end, against throwaway PostgreSQL servers
the tests start: every row's history reaches the collection whole, once and in commit order, and a ledger
function handles each change exactly once, across kill -9 of the follower, of the service and of Ray
workers, and a restart of PostgreSQL; the snapshot under concurrent writers; schema changes, a dropped table,
a second mirror of a table, a slot dropped by hand."""

from __future__ import annotations

import os
import signal

import psycopg
import pytest

from eventing.control import lifecycle
from eventing.errors import ConfigError, LifecycleError
from eventing.ops import mirrors
from eventing.ops.verify import verify_function
from eventing.storage.mirror import definition as defs
from eventing.storage.state import open_state
from eventing.testing import LEDGER_HANDLER, ledger_definition, wait_for
from eventing.testing.postgres import ThrowawayPostgres
from metadata.factory import open_store
from tests.integration.mirror_support import (
    Service,
    Writers,
    collection_docs,
    collection_history,
    follower_pid,
    follower_status,
    make_table,
    new_data_dir,
    table_rows,
    wait_until_mirrored,
)

pytestmark = pytest.mark.integration

KS = "shop.pg.orders"


@pytest.fixture
def own_server():
    server = ThrowawayPostgres()
    server.start()
    yield server
    server.stop()


def _slot(url: str, slot: str) -> tuple | None:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn, active FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ).fetchone()


def _applied_mark(data_dir: str, cid: int) -> int:
    state = open_state(data_dir)
    try:
        with state.open_bucket("shop") as bucket:
            return bucket.effect_marks(defs.marks_name(cid))[defs.MARK_LSN][1]
    finally:
        state.close()


def test_a_ledger_function_on_a_mirror_sees_every_row_history_once_in_commit_order_across_kills_and_a_restart(
    own_server, tmp_path
):
    url = own_server.create_database("app")
    make_table(url, rows=120)
    data_dir = new_data_dir(tmp_path / "data", "shop", "ledger")
    created = mirrors.create_mirror(data_dir, KS, source=url, table="public.orders")
    cid = created["id"]
    defn = ledger_definition(
        "fn_orders", "shop", "ledger", workers=2, source_scope="pg", source_collection="orders"
    )
    state = open_state(data_dir)
    lifecycle.save_function(state, defn, LEDGER_HANDLER)
    lifecycle.deploy(state, defn.name)
    state.close()
    service = Service(data_dir, tmp_path / "service.log")
    service.start()
    writers = Writers(url, list(range(1, 121)), threads=3)
    try:
        first = follower_pid(data_dir, KS)
        writers.start(transactions=500)
        wait_for(lambda: writers.commits >= 200, "200 source transactions committed")
        os.kill(first, signal.SIGKILL)  # the process that follows the slot
        second = follower_pid(data_dir, KS, other_than=first)
        wait_for(lambda: writers.commits >= 500, "500 source transactions committed")
        service.kill()  # the driver (its in-process workers and its follower go with it)
        wait_for(lambda: writers.commits >= 700, "700 source transactions committed")
        service.start()
        follower_pid(data_dir, KS, other_than=second)
        # PostgreSQL restarts between two transactions of the writers (kill -9 of the server)
        writers.go.clear()
        own_server.kill()
        own_server.start()
        writers.go.set()
        writers.join()
        wait_until_mirrored(data_dir, url, "shop", cid)
        owed = sum(len(h) for h in collection_history(data_dir, "shop", cid).values())
        wait_for(
            lambda: _verified(data_dir, owed),
            "the ledger function accounts for every change of the collection",
            timeout=180,
            every=0.5,
        )
        # The slot is told (within its status interval) once the changes are applied: it keeps no WAL for
        # them.
        mark = _applied_mark(data_dir, cid)
        wait_for(
            lambda: _slot(url, created["mirror"]["slot"])[0] >= mark, "the slot confirms what was applied"
        )
    finally:
        writers.go.set()
        service.stop()
    # Every row's history reached the collection whole, once and in commit order: the snapshot's version
    # (rev 0) then each committed change.
    history = collection_history(data_dir, "shop", cid)
    for key, changes in writers.history.items():
        expected = ([("u", 0)] if int(key) <= 120 else []) + changes
        assert history[key] == expected, key
    assert set(history) == {str(k) for k in range(1, 121)} | set(writers.history)
    report = verify_function(data_dir, "fn_orders")
    assert report.ok and not report.missing and not report.duplicate_effects and not report.out_of_order
    assert report.handled == report.source_mutations == sum(len(h) for h in history.values())


def _verified(data_dir: str, owed: int) -> bool:
    try:
        report = verify_function(data_dir, "fn_orders")
    except (ConfigError, LifecycleError):  # no checkpoint or no ledger entry yet: the function is starting
        return False
    return report.ok and report.source_mutations == owed and report.handled == owed


def test_kill_9_of_ray_workers_while_a_mirror_feeds_their_function_leaves_the_ledger_exact(
    own_server, tmp_path, ray_executor
):
    """The service in this process on Ray, its mirror's follower following the slot while writers change the
    table; two of the function's Ray workers are killed by pid (kill -9) in the middle. Their vBuckets are
    handled again from their checkpoints: every change is handled once, none applied twice, in order."""
    import threading

    from eventing.control.service import EventingService

    url = own_server.create_database("app")
    make_table(url, rows=60)
    data_dir = new_data_dir(tmp_path / "data", "shop", "ledger")
    cid = mirrors.create_mirror(data_dir, KS, source=url, table="public.orders")["id"]
    defn = ledger_definition(
        "fn_orders", "shop", "ledger", workers=2, source_scope="pg", source_collection="orders"
    )
    state = open_state(data_dir)
    lifecycle.save_function(state, defn, LEDGER_HANDLER)
    lifecycle.deploy(state, defn.name)
    state.close()
    service = EventingService(data_dir, ray_executor)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    writers = Writers(url, list(range(1, 61)), threads=2)
    killed: list[int] = []

    def kill_a_worker(at_commits: int) -> None:
        def ready_worker() -> int | None:
            sup = service.supervisors.get("fn_orders")
            if sup is None or writers.commits < at_commits:
                return None
            pids = [
                slot.pid for slot in sup.slots.values() if slot.ready and slot.pid and slot.pid not in killed
            ]
            return pids[0] if pids else None

        pid = wait_for(
            ready_worker, f"a ready Ray worker of fn_orders after {at_commits} commits", timeout=120
        )
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    try:
        wait_until_mirrored(data_dir, url, "shop", cid)  # the snapshot
        writers.start(transactions=300)
        kill_a_worker(100)
        kill_a_worker(200)
        writers.join()
        wait_until_mirrored(data_dir, url, "shop", cid)
        owed = sum(len(h) for h in collection_history(data_dir, "shop", cid).values())
        wait_for(
            lambda: _verified(data_dir, owed),
            "the ledger function accounts for every change of the collection",
            timeout=180,
            every=0.5,
        )
        sup = service.supervisors["fn_orders"]
        assert sum(slot.restarts for slot in sup.slots.values()) >= 2  # the killed workers were started again
        assert not any(slot.pid in killed for slot in sup.slots.values())
    finally:
        service.stop()
        thread.join(120)
    assert len(killed) == 2 and not thread.is_alive()
    history = collection_history(data_dir, "shop", cid)
    for key, changes in writers.history.items():  # every row's history whole, once, in commit order
        assert history[key] == ([("u", 0)] if int(key) <= 60 else []) + changes, key
    report = verify_function(data_dir, "fn_orders")
    assert report.ok and not report.missing and not report.duplicate_effects and not report.out_of_order
    assert report.handled == report.source_mutations == owed


def test_a_snapshot_of_100000_rows_taken_while_writers_run_misses_and_doubles_no_row(own_server, tmp_path):
    url = own_server.create_database("app")
    make_table(url, rows=100_000)
    data_dir = new_data_dir(tmp_path / "data", "shop")
    cid = mirrors.create_mirror(data_dir, KS, source=url, table="public.orders")["id"]
    service = Service(data_dir, tmp_path / "service.log")
    writers = Writers(url, list(range(1, 100_001, 97)), threads=2)
    writers.start(transactions=400)  # running while the snapshot is taken
    service.start()
    try:
        writers.join()
        wait_until_mirrored(data_dir, url, "shop", cid)
    finally:
        service.stop()
    history = collection_history(data_dir, "shop", cid)
    assert len(collection_docs(data_dir, "shop", cid)) == len(table_rows(url))
    for key, changes in history.items():
        # One version per committed change after the snapshot's: never a version twice, never one skipped
        # after the first seen (which is the row as the snapshot found it, or a later change).
        expected = writers.history.get(key, [])
        snapshot_rev = [("u", 0)] if int(key) <= 100_000 else []
        full = snapshot_rev + expected
        assert any(changes == full[i:] for i in range(len(full))) or (
            changes == [] and full and full[-1] == ("d",)
        ), key


def test_schema_changes_a_second_mirror_a_dropped_table_and_a_slot_dropped_by_hand(own_server, tmp_path):
    url = own_server.create_database("app")
    make_table(url, rows=10)
    data_dir = new_data_dir(tmp_path / "data", "shop", "copy")
    cid = mirrors.create_mirror(data_dir, KS, source=url, table="public.orders")["id"]
    second = mirrors.create_mirror(data_dir, "copy.pg.orders", source=url, table="public.orders")
    assert second["mirror"]["slot"] != mirrors.mirror_of(data_dir, KS).slot
    service = Service(data_dir, tmp_path / "service.log")
    service.start()
    try:
        wait_until_mirrored(data_dir, url, "shop", cid)
        wait_until_mirrored(data_dir, url, "copy", second["id"])
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE orders ADD COLUMN tags text[]")
            conn.execute("UPDATE orders SET tags = ARRAY['a', 'b'], rev = 1 WHERE id = 1")
            conn.execute("ALTER TABLE orders DROP COLUMN note")
            conn.execute("UPDATE orders SET rev = 2 WHERE id = 2")
        wait_until_mirrored(data_dir, url, "shop", cid)
        docs = collection_docs(data_dir, "shop", cid)
        assert docs["1"]["tags"] == ["a", "b"] and docs["1"]["note"] == "n1"
        assert "note" not in docs["2"] and docs["2"]["tags"] is None
        wait_until_mirrored(data_dir, url, "copy", second["id"])
        # A slot dropped by hand: the mirror says it needs a new snapshot, and resync takes one.
        slot = second["mirror"]["slot"]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            )
            wait_for(lambda: _slot(url, slot) is None or not _slot(url, slot)[1], "the slot is released")
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute("UPDATE orders SET rev = 3 WHERE id = 3")
        failed = wait_for(
            lambda: (s := follower_status(data_dir, "copy.pg.orders")).get("state") == "failed" and s,
            "the second mirror stops for want of its slot",
        )
        assert "cannot resume without a new snapshot" in failed["error"]
        assert "eventing collection resync copy.pg.orders" in failed["error"]
        mirrors.resync_mirror(data_dir, "copy.pg.orders")
        wait_until_mirrored(data_dir, url, "copy", second["id"])
        # The table dropped: the mirror stops with one line naming it; what it mirrored stays.
        before = collection_docs(data_dir, "shop", cid)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE orders")
        failed = wait_for(
            lambda: (s := follower_status(data_dir, KS)).get("state") == "failed" and s,
            "the mirror stops when its table is dropped",
        )
        assert "table public.orders was dropped" in failed["error"]
        assert collection_docs(data_dir, "shop", cid) == before
        # A restart finds the table gone too: the same line, for good (no "check --table", no retries).
        service.stop()
        service = Service(data_dir, tmp_path / "service-again.log")
        service.start()
        again = wait_for(
            lambda: (
                (s := follower_status(data_dir, KS)).get("pid") != failed.get("pid")
                and s.get("state") == "failed"
                and s
            ),
            "the mirror stops again after a restart",
        )
        assert "table public.orders was dropped" in again["error"] and again["permanent"] is True
        shown = {m["keyspace"]: m for m in mirrors.mirror_health(data_dir, query_source=False)}
        assert shown[KS]["state"] == "failed"  # for good: shown so however old the report
        assert collection_docs(data_dir, "shop", cid) == before
    finally:
        service.stop()
    result = mirrors.drop_mirror(data_dir, "copy.pg.orders")
    assert result["mirror"]["slot_kept"] == []
    with psycopg.connect(url) as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()[0]
            == 0
        )
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_publication WHERE pubname = %s", (second["mirror"]["publication"],)
            ).fetchone()[0]
            == 0
        )


def test_bad_sources_are_refused_with_one_line_and_nothing_created(own_server, tmp_path):
    from eventing.errors import EventingError, MirrorWriteError
    from eventing.storage.keyspace import open_keyspace

    url = own_server.create_database("app")
    make_table(url, rows=3)
    data_dir = new_data_dir(tmp_path / "data", "shop")
    port = own_server.port
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE nokey (a int, b text)")
        conn.execute("CREATE ROLE reader LOGIN PASSWORD 'secret-pw'")
        conn.execute("GRANT SELECT ON orders TO reader")
        conn.execute("CREATE ROLE norights LOGIN REPLICATION PASSWORD 'secret-pw'")
        conn.execute("CREATE ROLE locked LOGIN PASSWORD 'right-pw'")
    hba = own_server.data / "pg_hba.conf"
    hba.write_text("host all locked 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    own_server.sql("SELECT pg_reload_conf()")
    cases = {
        "public.missing": (url, "table public.missing does not exist"),
        "public.nokey": (url, "has no primary key"),
        "public.orders": (
            f"postgresql://reader:secret-pw@127.0.0.1:{port}/app",
            "has no REPLICATION attribute",
        ),
    }
    for table, (source, words) in cases.items():
        with pytest.raises(EventingError, match=words) as caught:
            mirrors.create_mirror(data_dir, KS, source=source, table=table)
        assert "secret-pw" not in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(EventingError, match="GRANT SELECT ON") as caught:
        mirrors.create_mirror(
            data_dir,
            KS,
            source=f"postgresql://norights:secret-pw@127.0.0.1:{port}/app",
            table="public.orders",
        )
    with pytest.raises(EventingError, match="refused the password") as caught:
        mirrors.create_mirror(
            data_dir, KS, source=f"postgresql://locked:wrong-pw@127.0.0.1:{port}/app", table="public.orders"
        )
    assert "wrong-pw" not in str(caught.value)
    with pytest.raises(EventingError, match="is unreachable"):
        mirrors.create_mirror(
            data_dir, KS, source="postgresql://postgres@127.0.0.1:1/app", table="public.orders"
        )
    replica = ThrowawayPostgres(settings={"wal_level": "replica"})
    replica.start()
    try:
        other = replica.create_database("app")
        make_table(other, rows=1)
        with pytest.raises(EventingError, match="wal_level = replica.*wal_level = logical"):
            mirrors.create_mirror(data_dir, KS, source=other, table="public.orders")
    finally:
        replica.stop()
    # Nothing was created halfway: no collection, definition, slot or publication.
    state = open_state(data_dir)
    with state.open_bucket("shop") as bucket:
        assert bucket.collections() == {}
    state.close()
    assert mirrors.list_mirrors(data_dir) == []
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone()[0] == 0
    # A mirror with a password keeps it out of every view; its collection refuses writes, reads work.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER ROLE locked WITH REPLICATION SUPERUSER")
    mirrors.create_mirror(
        data_dir, KS, source=f"postgresql://locked:right-pw@127.0.0.1:{port}/app", table="public.orders"
    )
    assert "right-pw" not in repr(mirrors.list_mirrors(data_dir))
    assert "right-pw" not in repr(mirrors.mirror_health(data_dir))
    with open_keyspace(data_dir, KS) as coll:
        assert coll.get("1") is None
        with pytest.raises(
            MirrorWriteError, match="mirrors table public.orders .*change the rows in PostgreSQL"
        ):
            coll.upsert("1", {"x": 1})
        with pytest.raises(MirrorWriteError):
            coll.delete("1")
    with open_store(data_dir) as store:
        assert (
            "right-pw" in defs.require(store, KS).source
        )  # kept for the follower, in the metadata store only
