"""What only the PostgreSQL metadata store does, against a real server (tests/conftest.py's pg_server):
concurrent writers on their own connections (the contract suite, test_metadata_contract.py, covers what
every backend does), faults that end a transaction half way (a statement timeout, a connection dropped
before or after COMMIT), refusals that must be one line (a newer schema, a wrong password, a missing
database, a server that does not answer), and the schema it shares with the SQLite store."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

import psycopg
import pytest

from metadata import DlqRow, NotFoundError, SqliteMetadataStore, StoreCorruptError, StoreError, open_store
from metadata.errors import StoreUnavailableError
from metadata.postgres import PostgresDatabase, PostgresMetadataStore, parse_postgres_url
from metadata.postgres.schema import OWN_COLUMNS
from metadata.sql.tables import TABLES

VBS = list(range(256))


def _dlq(vb: int, seqno: int) -> DlqRow:
    return DlqRow("fn", vb, seqno, "k", "error", "boom", "tb", 1, 1.0, 1.0, b"\x00mutation\xff")


def _store(url: str) -> PostgresMetadataStore:
    """A store on a pool of its own, as in another process."""
    return PostgresMetadataStore(PostgresDatabase(parse_postgres_url(url)))


def _conn(url: str) -> psycopg.Connection:
    """A plain connection to the store's schema, as an operator's psql session would be."""
    target = parse_postgres_url(url)
    conn = psycopg.connect(
        target.url.replace("application_name=eventing", "application_name=operator"), autocommit=True
    )
    if target.schema:
        conn.execute(f'SET search_path TO "{target.schema}"')
    return conn


def _run_all(workers: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(workers))

    def run(work: Callable[[], None]) -> None:
        barrier.wait()
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


@pytest.fixture
def stores(pg_schema_url):
    opened: list[PostgresMetadataStore] = []

    def make() -> PostgresMetadataStore:
        opened.append(_store(pg_schema_url))
        return opened[-1]

    yield make
    for s in opened:
        s.db.close()


# -- concurrency: every writer on its own connection ---------------------------------------------------------


def test_workers_claiming_the_same_vbuckets_at_once_each_get_a_higher_epoch_and_only_the_last_commits(stores):
    first = stores()
    first.init_checkpoints("fn", dict.fromkeys(range(1024), 0), "uuid")
    workers = [stores() for _ in range(4)]
    claimed: dict[int, dict[int, int]] = {}

    def claim(i: int) -> Callable[[], None]:
        def work() -> None:
            for _ in range(5):
                claimed.setdefault(i, {})
                claimed[i] = {vb: cp.epoch for vb, cp in workers[i].claim("fn", VBS, f"n/w{i}").items()}

        return work

    assert _run_all([claim(i) for i in range(4)]) == []
    final = {vb: cp.epoch for vb, cp in first.checkpoints("fn").items() if vb in VBS}
    assert set(final.values()) == {20}  # 4 workers x 5 claims: every claim raised every epoch by one
    winners = [i for i, epochs in claimed.items() if epochs == final]
    assert len(winners) == 1  # exactly one worker's last claim is the current one
    for i, epochs in claimed.items():
        fenced = workers[i].commit("fn", epochs, dict.fromkeys(VBS, 7), [_dlq(0, 3)], {"success": 1})
        assert fenced == (set() if i in winners else set(VBS))
    # Counters count work done, fenced or not (as on every backend); the zombies' checkpoints are counted.
    assert first.counters("fn") == {"success": 4, "fenced_checkpoint_writes": 3 * len(VBS)}
    assert [(r.vb, r.seqno) for r in first.dlq_rows("fn")] == [(0, 3)]


def test_commits_of_different_vbuckets_run_side_by_side_and_lose_no_count(stores):
    first = stores()
    first.init_checkpoints("fn", dict.fromkeys(range(1024), 0), "uuid")
    workers = [stores() for _ in range(4)]
    owned = [list(range(i * 256, (i + 1) * 256)) for i in range(4)]
    epochs = [
        {vb: cp.epoch for vb, cp in w.claim("fn", owned[i], f"n/w{i}").items()} for i, w in enumerate(workers)
    ]

    def commits(i: int) -> Callable[[], None]:
        def work() -> None:
            for n in range(1, 31):
                assert (
                    workers[i].commit(
                        "fn",
                        epochs[i],
                        dict.fromkeys(owned[i], n),
                        counters={"success": 2, "dcp_mutation": 3, f"w{i}": 1},
                    )
                    == set()
                )

        return work

    assert _run_all([commits(i) for i in range(4)]) == []
    assert {cp.seqno for cp in first.checkpoints("fn").values()} == {30}
    assert first.counters("fn") == {
        "success": 240,
        "dcp_mutation": 360,
        "w0": 30,
        "w1": 30,
        "w2": 30,
        "w3": 30,
    }
    assert first.checkpoint_regressions("fn") == []
    # Row locks are taken in vBucket order and counters in name order: no transaction was chosen as a
    # deadlock victim and run again.
    assert not any(w.db.retried for w in workers)


def test_counters_added_from_many_threads_in_any_name_order_are_exact(stores):
    workers = [stores() for _ in range(8)]
    names = ["a", "b", "c", "d", "e"]

    def add(i: int) -> Callable[[], None]:
        order = names[i % 5 :] + names[: i % 5]  # each thread names the counters in another order

        def work() -> None:
            for _ in range(40):
                workers[i].add_counters("fn", {n: 1 for n in (order if i % 2 else reversed(order))})

        return work

    assert _run_all([add(i) for i in range(8)]) == []
    assert workers[0].counters("fn") == dict.fromkeys(names, 320)
    assert not any(w.db.retried for w in workers)


def test_more_writers_than_pooled_connections_wait_for_one_and_open_no_more(pg_schema_url):
    """Six threads, a pool of two, every transaction held up by a row lock for a while: the others wait
    for a pooled connection (longer than the pool's first second) instead of opening their own or
    counting the server as away."""
    watcher = _conn(pg_schema_url)
    # Connections this test opens: pools of earlier tests of this process may still be open on the database.
    (began,) = watcher.execute("SELECT clock_timestamp()").fetchone()
    db = PostgresDatabase(parse_postgres_url(pg_schema_url), pool_size=2)
    store = PostgresMetadataStore(db)
    store.add_counters("fn", {"n": 0.5})
    holder = _conn(pg_schema_url)
    holder.execute("BEGIN")
    holder.execute("SELECT * FROM counters WHERE function='fn' AND name='n' FOR UPDATE")
    seen: list[int] = []
    writers = [threading.Thread(target=store.add_counters, args=("fn", {"n": 1})) for _ in range(6)]
    for t in writers:
        t.start()
    deadline = time.monotonic() + 1.5  # past POOL_WAIT_S: the waiting threads decided to keep waiting
    while time.monotonic() < deadline:
        seen.append(
            watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name='eventing' AND "
                "datname=current_database() AND backend_start >= %s",
                (began,),
            ).fetchone()[0]
        )
        time.sleep(0.05)
    holder.execute("COMMIT")
    for t in writers:
        t.join(30)
    assert store.counters("fn") == {"n": 6.5}
    assert max(seen) == 2 and not db.retried and db.failed_attempts == 0
    db.close()


def test_racing_takers_of_many_leases_get_each_one_exactly_once(stores):
    takers = [stores() for _ in range(6)]
    won: dict[str, list[str]] = {}
    lock = threading.Lock()

    def take(i: int) -> Callable[[], None]:
        def work() -> None:
            for n in range(15):
                if takers[i].acquire_lease(f"lease-{n}", f"svc-{i}", 60) is not None:
                    with lock:
                        won.setdefault(f"lease-{n}", []).append(f"svc-{i}")

        return work

    assert _run_all([take(i) for i in range(6)]) == []
    assert sorted(won) == sorted(f"lease-{n}" for n in range(15))
    assert all(len(holders) == 1 for holders in won.values())
    assert all(takers[0].lease(name).holder == holders[0] for name, holders in won.items())


def test_racing_takers_of_an_expired_lease_take_it_once_with_the_next_term(stores):
    takers = [stores() for _ in range(6)]
    takers[0].acquire_lease("leader", "old", 0.01)
    time.sleep(0.05)
    got: list[object] = []
    assert (
        _run_all(
            [lambda i=i: got.append(takers[i].acquire_lease("leader", f"svc-{i}", 60)) for i in range(6)]
        )
        == []
    )
    winners = [lease for lease in got if lease is not None]
    assert len(winners) == 1 and winners[0].term == 2 and takers[0].lease("leader") == winners[0]


def test_racing_creators_of_a_function_make_it_once(stores):
    makers = [stores() for _ in range(4)]
    assert (
        _run_all([lambda i=i: makers[i].put_function("fn", {"by": i}, f"src {i}") and None for i in range(4)])
        == []
    )
    (record,) = makers[0].list_functions()
    assert record.name == "fn" and record.generation == 0 and record.source.startswith("src ")


# -- faults in the middle of a transaction -------------------------------------------------------------------


def _claimed(store: PostgresMetadataStore) -> dict[int, int]:
    store.init_checkpoints("fn", {0: 0, 1: 0}, "uuid")
    return {vb: cp.epoch for vb, cp in store.claim("fn", [0, 1], "n/w0").items()}


def _backend_of(url: str, watcher: psycopg.Connection, *, waiting: bool, timeout_s: float = 10) -> int:
    """The pid of the store's server process (application_name eventing), once it waits on a lock."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = watcher.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name='eventing' AND "
            "datname=current_database() AND wait_event_type='Lock'"
            if waiting
            else "SELECT pid FROM pg_stat_activity WHERE application_name='eventing' AND "
            "datname=current_database()"
        ).fetchall()
        if rows:
            return int(rows[0][0])
        time.sleep(0.01)
    raise AssertionError("the store's transaction never waited on the lock")


def test_a_connection_dropped_before_commit_runs_the_transaction_again_whole(pg_schema_url):
    """The store's transaction locked checkpoints, updated them and added its dead letter, then waited on
    a counter row another session holds; its connection is terminated there. Nothing of it shows, and
    the whole transaction runs again on a new connection: the checkpoint moves, the letter and the
    counter are written once."""
    store = _store(pg_schema_url)
    epochs = _claimed(store)
    holder = _conn(pg_schema_url)
    holder.execute("INSERT INTO counters VALUES('fn', 'success', 0)")
    holder.execute("BEGIN")
    holder.execute("SELECT * FROM counters WHERE function='fn' AND name='success' FOR UPDATE")
    done: list[set[int]] = []
    t = threading.Thread(
        target=lambda: done.append(store.commit("fn", epochs, {0: 5, 1: 6}, [_dlq(0, 4)], {"success": 2}))
    )
    t.start()
    watcher = _conn(pg_schema_url)
    pid = _backend_of(pg_schema_url, watcher, waiting=True)
    assert watcher.execute("SELECT seqno FROM checkpoints WHERE function='fn' ORDER BY vb").fetchall() == [
        (0,),
        (0,),
    ]
    assert watcher.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    holder.execute("COMMIT")
    t.join(30)
    assert done == [set()]
    cps = store.checkpoints("fn")
    assert (cps[0].seqno, cps[1].seqno) == (5, 6)
    assert store.counters("fn") == {"success": 2}
    (letter,) = store.dlq_rows("fn")
    assert letter.attempts == 1 and letter.mutation == b"\x00mutation\xff"
    assert sum(store.db.retried.values()) >= 1  # it was run again, not half applied
    store.db.close()


def test_a_statement_timeout_runs_the_transaction_again_until_the_lock_is_released(pg_schema_url):
    url = pg_schema_url + "&options=-c%20statement_timeout%3D200"
    store = _store(url)
    epochs = _claimed(store)
    holder = _conn(pg_schema_url)
    holder.execute("BEGIN")
    holder.execute("SELECT * FROM checkpoints WHERE function='fn' AND vb=1 FOR UPDATE")
    done: list[set[int]] = []
    t = threading.Thread(
        target=lambda: done.append(store.commit("fn", epochs, {1: 9}, counters={"success": 1}))
    )
    t.start()
    deadline = time.monotonic() + 10
    while not store.db.retried.get("57014") and time.monotonic() < deadline:
        time.sleep(0.02)
    holder.execute("COMMIT")
    t.join(30)
    assert done == [set()] and store.db.retried["57014"] >= 1
    assert store.checkpoints("fn")[1].seqno == 9 and store.counters("fn") == {"success": 1}
    store.db.close()


def test_a_statement_that_keeps_timing_out_fails_in_one_line_after_the_wait_having_changed_nothing(
    pg_schema_url,
):
    store = _store(pg_schema_url + "&options=-c%20statement_timeout%3D100")
    store.db.wait_s = 1.0
    epochs = _claimed(store)
    holder = _conn(pg_schema_url)
    holder.execute("BEGIN")
    holder.execute("SELECT * FROM checkpoints WHERE function='fn' AND vb=1 FOR UPDATE")
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        store.commit("fn", epochs, {0: 3, 1: 9}, counters={"success": 1})
    holder.execute("ROLLBACK")
    assert time.monotonic() - start < 5
    assert "\n" not in str(caught.value) and "statement timeout" in str(caught.value)
    assert not caught.value.ambiguous
    assert {vb: cp.seqno for vb, cp in store.checkpoints("fn").items()} == {0: 0, 1: 0}
    assert store.counters("fn") == {}
    store.db.close()


class CommitAnswerDropper:
    """A TCP proxy in front of the server that, once armed, drops the connection carrying the server's
    answer to a COMMIT (its CommandComplete message, "COMMIT"): the server committed, the client never
    hears of it."""

    TAG = b"C\x00\x00\x00\x0bCOMMIT\x00"

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if answers and self.armed.is_set() and self.TAG in data:
                    self.armed.clear()
                    self.dropped.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()


def test_connections_the_server_ended_are_taken_out_of_the_pool_at_the_first_loss(pg_schema_url):
    """A server that ends every connection (a restart, a failover, an operator's pg_terminate_backend) leaves
    the pool's idle connections dead. The first transaction to find one has the pool check them all at
    once: it runs again on a live connection, not once on each dead one, backing off between them."""
    name = f"ended{uuid.uuid4().hex[:8]}"
    db = PostgresDatabase(parse_postgres_url(pg_schema_url.replace("?", f"?application_name={name}&")))
    errors = _run_all([lambda: db.read("SELECT pg_sleep(0.2)")] * 6)  # six pooled connections, idle after
    assert errors == []
    operator = _conn(pg_schema_url)
    ended = operator.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s", (name,)
    ).fetchone()[0]
    assert ended >= 6
    before = db.failed_attempts
    assert db.read("SELECT 42") == [(42,)]
    assert db.failed_attempts - before <= 2, db.failed_attempts - before  # not one per dead connection
    db.close()
    operator.close()


def test_a_commit_whose_answer_was_lost_is_found_committed_and_not_run_again(pg_schema_url):
    parts = urlsplit(pg_schema_url)
    proxy = CommitAnswerDropper(parts.hostname or "127.0.0.1", parts.port or 5432)
    store = _store(pg_schema_url.replace(f":{parts.port}/", f":{proxy.port}/"))
    try:
        epochs = _claimed(store)
        proxy.armed.set()
        assert store.commit("fn", epochs, {0: 5}, [_dlq(0, 2)], {"success": 3}) == set()
        assert proxy.dropped.is_set()
        assert store.db.resolved == {"committed": 1} and not store.db.retried
        assert store.checkpoints("fn")[0].seqno == 5
        assert store.counters("fn") == {"success": 3}  # once: the transaction was not run again
        assert store.dlq_rows("fn")[0].attempts == 1
    finally:
        store.db.close()
        proxy.close()


def test_old_commit_tokens_are_pruned_and_fresh_ones_kept(pg_schema_url, monkeypatch):
    from metadata.postgres import commits

    store = _store(pg_schema_url)
    conn = _conn(pg_schema_url)
    old = [commits.new_token(time.time() - 3600) for _ in range(5)]
    conn.cursor().executemany("INSERT INTO eventing_commits VALUES(%s)", [(t,) for t in old])
    monkeypatch.setattr(commits, "PRUNE_EVERY", 1)
    store.set_kv("k", "v")
    left = {r[0] for r in conn.execute("SELECT token FROM eventing_commits")}
    assert not left & set(old) and left  # the old ones went; this transaction's own token stays
    store.db.close()


# -- refusals in one line ------------------------------------------------------------------------------------


def test_a_store_written_by_a_newer_version_is_refused_in_one_line(pg_schema_url):
    _store(pg_schema_url).db.close()
    _conn(pg_schema_url).execute("UPDATE eventing_schema SET version=99 WHERE component='metadata'")
    with pytest.raises(StoreError) as caught:
        _store(pg_schema_url)
    message = str(caught.value)
    assert "newer version of eventing" in message and "metadata schema 99" in message and "\n" not in message


@pytest.fixture
def password_user(pg_server):
    """A login role that must give its password (scram) on 127.0.0.1, where others are trusted."""
    name = f"pw_{uuid.uuid4().hex[:8]}"
    pg_server.sql(f"CREATE ROLE {name} LOGIN PASSWORD 'right-secret'")
    hba = pg_server.data / "pg_hba.conf"
    rules = hba.read_text()
    hba.write_text(f"host all {name} 127.0.0.1/32 scram-sha-256\n" + rules)
    pg_server.sql("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while True:  # the reload is asynchronous: wait until the rule applies
        try:
            psycopg.connect(pg_server.url("postgres", user=name), connect_timeout=5).close()
        except psycopg.OperationalError:
            break
        assert time.monotonic() < deadline, "pg_hba.conf was not reloaded"
        time.sleep(0.05)
    yield name
    hba.write_text(rules)
    pg_server.sql("SELECT pg_reload_conf()")
    pg_server.sql(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    pg_server.sql(f"REVOKE ALL ON DATABASE postgres FROM {name}")


def test_a_wrong_password_is_one_line_within_seconds_without_the_password(pg_server, password_user):
    url = f"postgresql://{password_user}:wrong-secret-123@127.0.0.1:{pg_server.port}/postgres"
    start = time.monotonic()
    with pytest.raises(StoreError) as caught:
        PostgresMetadataStore(url)
    message = str(caught.value)
    assert time.monotonic() - start < 5
    assert "refused the password" in message and "\n" not in message
    assert "wrong-secret-123" not in message and f"127.0.0.1:{pg_server.port}" in message
    right = f"postgresql://{password_user}:right-secret@127.0.0.1:{pg_server.port}/postgres?schema={password_user}"
    with pytest.raises(StoreError) as caught:  # it may not create its schema in that database
        PostgresMetadataStore(right)
    assert "grant the store's user the privilege" in str(caught.value) and "\n" not in str(caught.value)
    assert "right-secret" not in str(caught.value) and time.monotonic() - start < 10
    pg_server.sql(f"GRANT CREATE ON DATABASE postgres TO {password_user}")
    store = PostgresMetadataStore(right)
    store.set_kv("k", "v")
    assert store.get_kv("k") == "v"
    store.close()


def test_a_missing_database_is_one_line_naming_it_and_the_fix(pg_server):
    start = time.monotonic()
    with pytest.raises(StoreError) as caught:
        PostgresMetadataStore(pg_server.url("no_such_db") + "?password=s3cret-xyz")
    message = str(caught.value)
    assert time.monotonic() - start < 5
    assert 'database "no_such_db" does not exist' in message and "create it first" in message
    assert "\n" not in message and "s3cret-xyz" not in message


def test_a_server_that_does_not_answer_is_one_line_within_seconds_naming_host_and_port(monkeypatch):
    from metadata.postgres import connection

    monkeypatch.setattr(connection, "FIRST_CONTACT_S", 1.0)  # the default (6 s) keeps a restarting server
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(StoreError) as caught:
        PostgresMetadataStore(f"postgresql://eventing:pa55word@127.0.0.1:{port}/db")
    message = str(caught.value)
    assert time.monotonic() - start < 4
    assert f"127.0.0.1:{port} is unreachable" in message and "\n" not in message and "pa55word" not in message


# -- the store's own behaviour -------------------------------------------------------------------------------


def test_both_sql_schemas_hold_the_shared_tables_with_their_columns_in_order(tmp_path, pg_schema_url):
    """The shared statements read `SELECT *` into the model's values and insert by position."""
    sqlite_store = SqliteMetadataStore(tmp_path / "metadata.sqlite3")
    sqlite_store.window_states()  # creates its table
    db = sqlite3.connect(tmp_path / "metadata.sqlite3")
    for table, columns in TABLES.items():
        assert tuple(r[1] for r in db.execute(f"PRAGMA table_info({table})")) == columns, table
    sqlite_store.close()
    store = _store(pg_schema_url)
    conn = _conn(pg_schema_url)
    for table, columns in TABLES.items():
        found = tuple(
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema=current_schema() AND "
                "table_name=%s ORDER BY ordinal_position",
                (table,),
            )
        )
        assert found == (*columns, *OWN_COLUMNS.get(table, ())), table
    store.db.close()


def test_a_checkpoint_moved_back_behind_commits_back_is_recorded_and_a_rewind_is_not(pg_schema_url):
    store = _store(pg_schema_url)
    store.put_function("fn", {}, "")
    epochs = _claimed(store)
    store.commit("fn", epochs, {0: 10, 1: 10})
    _conn(pg_schema_url).execute("UPDATE checkpoints SET seqno=seqno-4 WHERE function='fn' AND vb=0")
    (applied,) = store.checkpoint_regressions("fn")
    assert (applied["vb"], applied["from_seqno"], applied["to_seqno"], applied["how"]) == (
        0,
        10,
        6,
        "applied",
    )
    assert applied["at"] == pytest.approx(time.time(), abs=60)
    for state in ("deploying", "deployed", "pausing", "paused"):
        store.transition("fn", __import__("metadata").FunctionState(state), "move")
    store.rewind_checkpoints("fn", {1: 3})
    assert [r["how"] for r in store.checkpoint_rewinds("fn")] == ["rewind"]
    assert len(store.checkpoint_regressions("fn")) == 1
    store.db.close()


def test_the_integrity_check_names_a_missing_table_and_a_dropped_trigger(pg_schema_url):
    store = _store(pg_schema_url)
    store.verify_integrity()
    conn = _conn(pg_schema_url)
    conn.execute("DROP TRIGGER checkpoint_moved_backwards ON checkpoints")
    with pytest.raises(StoreCorruptError, match="trigger checkpoint_moved_backwards"):
        store.verify_integrity()
    conn.execute("DROP TABLE timer_seqs")
    with pytest.raises(StoreCorruptError, match="table timer_seqs is missing"):
        store.verify_integrity()
    store.db.close()


def test_a_backup_names_postgresqls_tools_and_writes_nothing(pg_schema_url, tmp_path):
    store = _store(pg_schema_url)
    with pytest.raises(StoreError, match="pg_dump -Fc -n .* -f .*b.sqlite3.*eventing store copy"):
        store.backup(tmp_path / "b.sqlite3")
    assert not (tmp_path / "b.sqlite3").exists()
    store.db.close()


def test_the_factory_opens_the_postgresql_store_for_a_postgresql_location(pg_schema_url, monkeypatch):
    monkeypatch.setenv("EVENTING_METADATA_URL", "")
    with pytest.raises(NotFoundError, match="no metadata store at .* yet"):
        open_store(pg_schema_url, create=False)
    with open_store(pg_schema_url) as store:
        assert isinstance(store, PostgresMetadataStore)
        store.put_function("fn", {"a": 1}, "src")
    with open_store(pg_schema_url, create=False) as store:
        assert store.get_function("fn").definition == {"a": 1}


def test_a_server_older_than_the_store_needs_is_refused_in_one_line(pg_schema_url, monkeypatch):
    from metadata.postgres import store as pg_store

    monkeypatch.setattr(pg_store, "MIN_SERVER_VERSION", 990000)  # this server (15) is then too old
    with pytest.raises(StoreError) as caught:
        PostgresMetadataStore(pg_schema_url)
    assert "needs 99 or later" in str(caught.value) and "runs PostgreSQL 1" in str(caught.value)
    assert "\n" not in str(caught.value)
