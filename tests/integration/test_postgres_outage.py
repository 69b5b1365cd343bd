"""The PostgreSQL store's server going away under a running deployment, as a user runs it: `eventing run` (a
subprocess on Ray) and `eventing serve` (a subprocess answering Data API writes) on one store while

- the server is killed (kill -9 of the postmaster and its processes) and started again;
- the server ends eventing's connections in the middle of their transactions (pg_terminate_backend), again
  and again;
- the primary, with a synchronous standby, is killed and the standby promoted (a two-host URL with
  target_session_attrs=read-write).

What must hold, by counting: both commands wait and carry on; a write that cannot wait longer is answered 503
with Retry-After, never 500; every write that got a 2xx is there afterwards; and the function's ledger is
exact (`eventing verify`: every mutation handled once, none applied twice, each document in seqno order).
The module's servers are its own, started once; every process is ended by its pid."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from eventing.kv.protocol import ETMPFAIL
from eventing.ops.verify import verify_function
from eventing.storage.postgres.state import PostgresState
from eventing.testing import ledger_definition, load_source, wait_for
from eventing.testing.commands import Commands, DataApiWriters, EventingProcess, KvClient
from eventing.testing.postgres import ThrowawayPostgres, free_port
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration

USER = ("app", "app-s3cret-pw")
SERVE_WAIT_S = 2.0
# The server stays away longer than the leader lease (5 s): the running service's lease expires meanwhile.
AWAY_S = 6.0  # how long `eventing serve` waits for the server before answering 503


@pytest.fixture(scope="module")
def server():
    pg = ThrowawayPostgres()
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def empty_cwd(tmp_path) -> Path:
    """The commands' working directory: empty, and checked empty at the end (nothing lands in a data dir)."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    yield folder
    assert list(folder.iterdir()) == []


def deploy_ledger(cmd: Commands, tmp_path: Path, name: str, source: str, **settings) -> None:
    """The ledger function (functions/fn_ledger.py) saved and deployed by the CLI, as a user does."""
    from eventing.testing import LEDGER_HANDLER

    defn = ledger_definition(name, source, "ledger", **settings).to_dict()
    folder = tmp_path / "functions"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(LEDGER_HANDLER)
    (folder / f"{name}.json").write_text(json.dumps({**defn, "handler": f"{name}.py"}))
    cmd.ok("bucket", "create", "ledger", "--exist-ok")
    cmd.ok("deploy", str(folder / f"{name}.json"))


def caught_up(state: PostgresState, function: str, source: str) -> bool:
    checkpoints = state.metadata.checkpoints(function)
    with state.open_bucket(source) as bucket:
        highs = bucket.high_seqnos()
    return len(checkpoints) == NUM_VBUCKETS and all(
        checkpoints[vb].seqno == highs[vb] for vb in range(NUM_VBUCKETS)
    )


def progress(state: PostgresState, function: str) -> int:
    return sum(cp.seqno for cp in state.metadata.checkpoints(function).values())


def assert_ledger_exact(cmd: Commands, state: PostgresState, function: str, source: str) -> None:
    report = verify_function(state, function)
    assert report.ok and report.past_checkpoint == 0, report.summary()
    with state.open_bucket(source) as src:
        assert report.handled == sum(src.high_seqnos()), report.summary()
    done = cmd("verify", function)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ALL MUTATIONS ACCOUNTED FOR" in done.stdout


def assert_acked_are_there(state: PostgresState, keyspace: str, acked: dict[str, dict]) -> None:
    with state.open_bucket(keyspace) as bucket:
        missing = [key for key, value in acked.items() if bucket.get(key) != value]
    assert missing == [], f"{len(missing)} acknowledged writes are not there: {missing[:5]}"


def run_and_serve(
    cmd: Commands, ray_address: str, port: int, kv_port: int = 0, serve_wait_s: float = SERVE_WAIT_S
) -> tuple[EventingProcess, EventingProcess]:
    run = cmd.start("run", "--ray-address", ray_address, "--quiet", name="run")
    serve = cmd.start(
        "serve",
        "--port",
        str(port),
        "--kv-port",
        str(kv_port),
        name="serve",
        env={"EVENTING_STORE_WAIT_S": f"{serve_wait_s:g}"},
    )
    serve.wait_port(port)
    if kv_port:
        serve.wait_port(kv_port)
    return run, serve


class BackendTerminator:
    """Ends every connection of eventing's (application_name 'eventing') on the server, `rounds` times, every
    `every_s` seconds, from a connection of its own: transactions die between their statements, before their
    COMMIT, or while it is on its way."""

    def __init__(self, server: ThrowawayPostgres, database: str, rounds: int, every_s: float = 0.15):
        self.server, self.database, self.rounds, self.every_s = server, database, rounds, every_s
        self.ended = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(
            self.server.url(self.database) + "?application_name=terminator", autocommit=True
        ) as conn:
            for _ in range(self.rounds):
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                    "application_name = 'eventing' AND pid <> pg_backend_pid()"
                ).fetchall()
                self.ended += sum(1 for (ok,) in rows if ok)
                time.sleep(self.every_s)
        self.done.set()

    def __enter__(self) -> BackendTerminator:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(60)


def stop_both(run, serve, *closing) -> None:
    """End the run, then the serve, whatever became of the other: a run that does not stop never leaves its
    serve running; then both must have stopped cleanly."""
    try:
        run_exit = run.stop()
    finally:
        for close in closing:
            close()
        serve_exit = serve.stop(sig=signal.SIGINT)
    assert run_exit == 0, run.describe()
    assert serve_exit in (0, 130), serve.describe()


def test_run_and_serve_carry_on_through_a_server_restart_and_connections_ended_mid_transaction(
    server, ray_session, tmp_path, empty_cwd
):
    """The server killed and started again, then eventing's connections ended again and again: the running
    function and the Data API carry on, nothing acknowledged is lost, no effect is applied twice."""
    url = server.create_database("restart")
    cmd = Commands(empty_cwd, {"EVENTING_STORE": url}, logs=str(tmp_path / "logs"))
    cmd.ok("bucket", "create", "src")
    deploy_ledger(cmd, tmp_path, "fn_outage", "src", workers=2, sleep_ms=1)
    cmd.ok("user", "add", USER[0], "--role", "admin", "--password-stdin", input=USER[1] + "\n")
    state = PostgresState(url)
    load_source(state, 200, 2000)
    port, kv_port = free_port(), free_port()
    run, serve = run_and_serve(cmd, ray_session.get_runtime_context().gcs_address, port, kv_port)
    kv = KvClient(kv_port, *USER, "src")
    try:
        assert kv.set("kv-before", {"kv": 1})[0] == 0
        wait_for(lambda: progress(state, "fn_outage") > 300, "the function to make progress")
        with DataApiWriters(port, "src", threads=2, user=USER) as load:
            wait_for(lambda: load.written > 100, "Data API writes to be acknowledged")
            server.kill()
            killed_at = time.monotonic()
            # Writes now wait, then (after SERVE_WAIT_S) are answered 503 with Retry-After; the KV port
            # answers a temporary failure, which Couchbase's SDKs retry.
            wait_for(
                lambda: load.unavailable and time.monotonic() - killed_at > AWAY_S,
                "Data API writes to be refused while the server is away",
            )
            kv_status, kv_body = kv.set("kv-during", {"kv": 2})
            written_while_away = load.written
            server.start()
            wait_for(
                lambda: load.written > written_while_away + 100, "Data API writes to be acknowledged again"
            )
            assert kv.set("kv-after", {"kv": 3})[0] == 0
            # Then every connection of eventing's ended, 20 times in 3 s: transactions are retried whole (a
            # write still failing after the serve's 2 s wait is a 503, as any other).
            acked_before = load.written
            with BackendTerminator(server, "restart", rounds=20) as terminator:
                terminator.done.wait(60)
            wait_for(lambda: load.written > acked_before + 100, "Data API writes to go on")
        assert terminator.ended >= 20, (
            terminator.ended
        )  # eventing's connections were there to end, every round
        assert kv_status == ETMPFAIL, (hex(kv_status), kv_body)
        assert b"PostgreSQL at 127.0.0.1" in kv_body
        assert run.alive(), run.describe()
        assert serve.alive(), serve.describe()
        wait_for(lambda: caught_up(state, "fn_outage", "src"), "the function to catch up", timeout=120)
    finally:
        stop_both(run, serve, kv.close)
    assert load.errors == [] and set(load.statuses) <= {200, 201, 503}, (load.statuses, load.errors[:5])
    assert all(h.get("retry-after", "").isdigit() for h in load.unavailable), load.unavailable[:3]
    assert_acked_are_there(state, "src", {**load.acked, "kv-before": {"kv": 1}, "kv-after": {"kv": 3}})
    assert_ledger_exact(cmd, state, "fn_outage", "src")
    state.close()


def test_a_primary_killed_and_its_synchronous_standby_promoted_loses_no_acknowledged_write(
    ray_session, tmp_path, empty_cwd
):
    primary = ThrowawayPostgres()
    primary.start()
    try:
        primary.create_database("failover")
        standby = primary.add_standby(synchronous=True)
        url = (
            f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/failover"
            "?target_session_attrs=read-write"
        )
        cmd = Commands(empty_cwd, {"EVENTING_STORE": url}, logs=str(tmp_path / "logs"))
        cmd.ok("bucket", "create", "src")
        deploy_ledger(cmd, tmp_path, "fn_failover", "src", workers=2, sleep_ms=1)
        state = PostgresState(url)
        load_source(state, 200, 2000)
        port = free_port()
        run, serve = run_and_serve(cmd, ray_session.get_runtime_context().gcs_address, port, serve_wait_s=60)
        try:
            wait_for(lambda: progress(state, "fn_failover") > 300, "the function to make progress")
            with DataApiWriters(port, "src", threads=2) as load:
                wait_for(lambda: load.written > 100, "Data API writes to be acknowledged")
                primary.kill()
                killed_at = load.written
                standby.promote()
                wait_for(lambda: load.written > killed_at + 100, "Data API writes on the new primary")
            assert run.alive(), run.describe()
            assert serve.alive(), serve.describe()
            wait_for(
                lambda: caught_up(state, "fn_failover", "src"),
                "the function to catch up on the new primary",
                timeout=120,
            )
        finally:
            stop_both(run, serve)
        assert load.errors == [] and set(load.statuses) <= {200, 201}, (load.statuses, load.errors[:5])
        assert_acked_are_there(state, "src", load.acked)
        assert_ledger_exact(cmd, state, "fn_failover", "src")
        state.close()
    finally:
        primary.stop()


@pytest.mark.soak
def test_soak_the_server_killed_again_and_again_under_run_and_serve(server, ray_session, tmp_path, empty_cwd):
    url = server.create_database("restarts")
    cmd = Commands(empty_cwd, {"EVENTING_STORE": url}, logs=str(tmp_path / "logs"))
    cmd.ok("bucket", "create", "src")
    deploy_ledger(cmd, tmp_path, "fn_restarts", "src", workers=4, sleep_ms=1)
    state = PostgresState(url)
    load_source(state, 1000, 20_000)
    port = free_port()
    run, serve = run_and_serve(cmd, ray_session.get_runtime_context().gcs_address, port)
    try:
        with DataApiWriters(port, "src", threads=4) as load:
            for round_ in range(8):
                mark = load.written
                wait_for(lambda mark=mark: load.written > mark + 200, f"writes before restart {round_ + 1}")
                server.kill()
                killed_at = time.monotonic()
                away_s = 1 + round_ % 3 * AWAY_S / 2  # 1 s, 4 s, 7 s: within and beyond the serve's wait
                wait_for(
                    lambda killed_at=killed_at, away_s=away_s: time.monotonic() - killed_at > away_s,
                    "the server to stay away",
                )
                server.start()
        assert run.alive(), run.describe()
        assert serve.alive(), serve.describe()
        wait_for(lambda: caught_up(state, "fn_restarts", "src"), "the function to catch up", timeout=300)
    finally:
        stop_both(run, serve)
    assert load.errors == [] and set(load.statuses) <= {200, 201, 503}, (load.statuses, load.errors[:5])
    assert all(h.get("retry-after", "").isdigit() for h in load.unavailable)
    assert_acked_are_there(state, "src", load.acked)
    assert_ledger_exact(cmd, state, "fn_restarts", "src")
    state.close()
