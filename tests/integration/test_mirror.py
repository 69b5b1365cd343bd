"""Mirrors of PostgreSQL tables (eventing.storage.mirror) end to end, against throwaway PostgreSQL servers
the tests start: every row's history reaches the collection whole, once and in commit order, and a ledger
function handles each change exactly once, across kill -9 of the follower and of the service and a restart
of PostgreSQL; the snapshot under concurrent writers; schema changes, a dropped table, a second mirror of
a table, a slot dropped by hand."""

from __future__ import annotations

import os
import signal
import threading

import psycopg
import pytest

from eventing.control import lifecycle
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
        return conn.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn, active FROM pg_replication_slots "
                            "WHERE slot_name = %s", (slot,)).fetchone()


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
    defn = ledger_definition("fn_orders", "shop", "ledger", workers=2, source_scope="pg", source_collection="orders")
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
        writers.go.clear()  # PostgreSQL restarts between two transactions of the writers (kill -9 of the server)
        own_server.kill()
        own_server.start()
        writers.go.set()
        writers.join()
        wait_until_mirrored(data_dir, url, "shop", cid)
        owed = sum(len(h) for h in collection_history(data_dir, "shop", cid).values())
        wait_for(lambda: _verified(data_dir, owed), "the ledger function accounts for every change of the collection",
                 timeout=180, every=0.5)
        # The slot is told (within its status interval) once the changes are applied: it keeps no WAL for them.
        mark = _applied_mark(data_dir, cid)
        wait_for(lambda: _slot(url, created["mirror"]["slot"])[0] >= mark, "the slot confirms what was applied")
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
    report = verify_function(data_dir, "fn_orders")
    return report.ok and report.source_mutations == owed and report.handled == owed
