"""Mistakes and faults around a PostgreSQL store, met through the command line: each is one line (`error:
...`, exit 2) naming the server and the way out, within seconds, with no traceback and no password anywhere:
an unreachable server, a wrong password, a missing database, a user without privileges, a store written by a
newer version, a statement timeout, the server's disk full (a small tmpfs under a tablespace: nothing half
written, everything back once there is room). A password given in --store is not in what `ps` shows of a
running `eventing run`, nor in its output, `eventing status`, exports or errors.

One server for the module (its own, with users that log in by password); every process ended by its pid."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from eventing.storage.postgres.state import PostgresState
from eventing.testing import wait_for
from eventing.testing.commands import Commands
from eventing.testing.postgres import ThrowawayPostgres, free_port
from eventing.workers.ray_instance import cmdline, descendants

pytestmark = pytest.mark.integration

PASSWORD = "Pw-9f3e1c7a"  # the password of every user of this module's server: must never be shown


@pytest.fixture(scope="module")
def server():
    pg = ThrowawayPostgres()
    pg.start()
    try:
        pg.add_user("app", PASSWORD, superuser=True)
        pg.add_user("limited", PASSWORD)
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def cmd(tmp_path) -> Commands:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return Commands(cwd, {"EVENTING_STORE_WAIT_S": "3"})


def url(
    server: ThrowawayPostgres,
    database: str,
    *,
    user: str = "app",
    password: str = PASSWORD,
    port: int | None = None,
    query: str = "",
) -> str:
    return f"postgresql://{user}:{password}@127.0.0.1:{port or server.port}/{database}{query}"


def one_line_error(done: subprocess.CompletedProcess, *expected: str, retried: bool = False) -> str:
    """The command failed with exit 2 and one line on stderr holding every `expected` text, no password;
    `retried`: after one line saying what it retries and for how long."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().split("\n")
    if retried:
        assert len(lines) == 2 and lines[0].startswith("WARNING ") and "retrying for up to" in lines[0], lines
    line = lines[-1]
    assert len(lines) == 1 + retried and line.startswith("error: ") and "Traceback" not in done.stderr, (
        done.stderr
    )
    assert PASSWORD not in done.stdout + done.stderr
    for text in expected:
        assert text in line, line
    return line


def timed(
    cmd: Commands, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = cmd(*args, env=env, timeout=60)
    return done, time.monotonic() - started


def test_an_unreachable_server_is_named_with_its_host_and_port_within_seconds(server, cmd):
    port = free_port()  # nothing listens there
    done, took = timed(cmd, "--store", url(server, "db", port=port), "list")
    one_line_error(
        done, f"PostgreSQL at 127.0.0.1:{port} is unreachable", "start the server or fix the host and port"
    )
    assert took < 12, took


def test_a_wrong_password_a_missing_database_and_an_unknown_user_are_each_one_line(server, cmd):
    done, took = timed(cmd, "--store", url(server, "postgres", password="not-" + PASSWORD), "list")
    one_line_error(
        done, f"PostgreSQL at 127.0.0.1:{server.port} refused the password", "$PGPASSWORD or ~/.pgpass"
    )
    assert "not-" + PASSWORD not in done.stderr and took < 5
    done, took = timed(cmd, "--store", url(server, "nowhere"), "bucket", "create", "b")
    one_line_error(done, 'database "nowhere" does not exist', "create it first")
    assert took < 5
    done, _ = timed(cmd, "--store", url(server, "postgres", user="nobody"), "list")
    one_line_error(done, "refused", "check the user in --store")


def test_a_user_without_privileges_is_told_which_grant_it_needs_and_nothing_is_made(server, cmd):
    server.create_database("locked")  # owned by postgres: PostgreSQL 15 gives others no CREATE on public
    done, took = timed(cmd, "--store", url(server, "locked", user="limited"), "bucket", "create", "b")
    line = one_line_error(
        done, "permission denied for schema public", "GRANT CREATE, USAGE ON SCHEMA public TO limited"
    )
    assert "LINE 1" not in line and "CREATE TABLE" not in line and took < 5
    assert server.sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", "locked") == "0"
    server.sql("GRANT CREATE, USAGE ON SCHEMA public TO limited", "locked")  # the fix the line names
    assert cmd("--store", url(server, "locked", user="limited"), "bucket", "create", "b").returncode == 0


def test_a_store_written_by_a_newer_version_is_refused(server, cmd):
    store = url(server, server.create_database("newer").rpartition("/")[2])
    assert cmd("--store", store, "bucket", "create", "b").returncode == 0
    assert (
        cmd(
            "--store",
            store,
            "user",
            "add",
            "ann",
            "--role",
            "admin",
            "--password-stdin",
            input="ann-password-1\n",
        ).returncode
        == 0
    )  # the metadata store's tables too
    server.sql("UPDATE eventing_schema SET version = version + 1", "newer")  # every part: buckets, metadata
    for args in (("list",), ("bucket", "list"), ("bucket", "create", "c")):
        done, _ = timed(cmd, "--store", store, *args)
        one_line_error(done, "written by a newer version of eventing", "upgrade eventing")
    server.sql("UPDATE eventing_schema SET version = version - 1", "newer")
    assert json.loads(cmd.ok("--store", store, "bucket", "list", "--json")) is not None


def test_a_statement_timeout_is_named_as_such(server, cmd):
    store = url(server, server.create_database("slow").rpartition("/")[2])
    assert cmd("--store", store, "bucket", "create", "b").returncode == 0
    locker = threading.Thread(
        target=server.sql,
        args=(
            "BEGIN; LOCK TABLE bucket_registry IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(8); COMMIT;",
            "slow",
        ),
        daemon=True,
    )
    locker.start()
    wait_for(
        lambda: (
            server.sql(
                "SELECT count(*) FROM pg_locks WHERE mode = 'AccessExclusiveLock' AND "
                "relation = 'bucket_registry'::regclass",
                "slow",
            )
            == "1"
        ),
        "the table to be locked",
    )
    done, took = timed(cmd, "--store", store + "?options=-c%20statement_timeout%3D300", "bucket", "list")
    line = one_line_error(
        done, "statement_timeout", "canceling statement due to statement timeout", retried=True
    )
    assert "unreachable" not in line and took < 8
    locker.join(30)


@pytest.fixture
def small_tablespace(server):
    """A tablespace on a 24 MB tmpfs: the server's disk, as the store's tables see it, fills up."""
    if os.geteuid() != 0:
        pytest.fail("the disk-full test mounts a tmpfs: run it as root, as CI does")
    folder = server.folder / "small"  # where the server's user may go
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(folder)], check=True)
    try:
        import pwd

        entry = pwd.getpwnam("postgres")
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        server.sql(f"CREATE TABLESPACE small LOCATION '{folder}'")
        server.sql("CREATE DATABASE full_disk TABLESPACE small")
        yield folder
    finally:
        server.sql("DROP DATABASE IF EXISTS full_disk WITH (FORCE)")
        server.sql("DROP TABLESPACE IF EXISTS small")
        subprocess.run(["umount", str(folder)], check=False)


FIRST, DOCUMENTS = 500, 8_000  # of ~3 KB that do not compress, each kept twice (the document, the log)


def document(i: int) -> str:
    return json.dumps({"key": f"k{i:06d}", "doc": {"i": i, "pad": os.urandom(1500).hex()}}) + "\n"


def test_a_full_disk_is_one_line_with_nothing_half_written_and_everything_back_once_there_is_room(
    server, cmd, small_tablespace
):
    store = url(server, "full_disk")
    assert cmd("--store", store, "bucket", "create", "big").returncode == 0
    first = "".join(document(i) for i in range(FIRST))
    assert (
        cmd("--store", store, "bucket", "load", "big", "--file", "-", input=first, timeout=120).returncode
        == 0
    )
    rest = "".join(
        document(i) for i in range(FIRST, DOCUMENTS)
    )  # one batch, one transaction: over the room left
    done = cmd("--store", store, "bucket", "load", "big", "--file", "-", input=rest, timeout=120)
    one_line_error(
        done,
        "is out of disk space",
        "free space on the server",
        "0 mutations of this load were committed to 'big' before it",
    )
    state = PostgresState(store)
    with state.open_bucket("big") as big:  # the first load whole, nothing of the second
        assert (big.count(), sum(big.high_seqnos())) == (FIRST, FIRST)
        assert sorted(big.keys()) == [f"k{i:06d}" for i in range(FIRST)]
    subprocess.run(["mount", "-o", "remount,size=128m", str(small_tablespace)], check=True)
    assert (
        cmd("--store", store, "bucket", "load", "big", "--file", "-", input=rest, timeout=120).returncode == 0
    )
    with state.open_bucket("big") as big:
        assert big.count() == DOCUMENTS and sum(big.high_seqnos()) == DOCUMENTS
    state.close()


def test_a_password_in_the_store_url_is_not_in_ps_nor_in_any_output(server, cmd, tmp_path):
    database = server.create_database("secret").rpartition("/")[2]
    store = url(server, database)
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "fn_copy.py").write_text("def on_update(doc, meta):\n    dst[meta.id] = doc\n")
    (functions / "fn_copy.json").write_text(
        json.dumps(
            {
                "name": "fn_copy",
                "handler": "fn_copy.py",
                "source_bucket": "src",
                "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            }
        )
    )
    outputs = []
    for args in (
        ("bucket", "create", "src"),
        ("bucket", "create", "dst"),
        ("deploy", str(functions / "fn_copy.json")),
        ("bucket", "load", "src", "--documents", "50", "--mutations", "100"),
    ):
        outputs.append(cmd.ok("--store", store, *args))
    run = cmd.start("--store", store, "run", "--executor", "in-process", name="run")
    try:
        state = PostgresState(store)
        wait_for(lambda: state.metadata.live_services(10), "the service to run")
        shown = [cmdline(run.pid)] + [cmdline(pid) for pid in descendants(run.pid)]
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        outputs.append(cmd.ok("--store", store, "status", "--json"))
        outputs.append(cmd.ok("--store", store, "status"))
        outputs.append(cmd.ok("--store", store, "export", "fn_copy"))
        outputs.append(cmd.ok("--store", store, "stats", "fn_copy", "--json"))
        outputs.append(cmd("--store", store, "bucket", "get", "nosuch", "k").stderr)
        outputs.append(cmd("--store", url(server, "nowhere"), "list").stderr)
    finally:
        assert run.stop() == 0, run.describe()
    outputs.extend(run.output())
    assert f"--store postgresql://app:{'*' * len(PASSWORD)}@127.0.0.1:{server.port}/{database}" in shown[0], (
        shown[0]
    )
    assert not [text for text in shown + [ps] + outputs if PASSWORD in text]
    state.close()
