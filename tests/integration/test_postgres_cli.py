"""The command line on a PostgreSQL store, as a new user runs it: `eventing` subprocesses in an empty working
directory, the store named by $EVENTING_STORE (and once by --store), and nothing read from or written to a
data directory (none appears in the working directory, nor where $EVENTING_DATA_DIR points).

One session for the module: buckets made and loaded, seven functions deployed (a windowed function on Spark,
a timer function, a sandboxed one, a JavaScript one, the ledger function, one that dead-letters, one that
logs) and one `eventing run --until-caught-up --close-windows` on a Ray instance of its own; then each test
checks one part of what a user does next: the windows' results, the timers fired once, the sandboxed and
JavaScript functions' writes, `verify` / `rewind`, `dlq` list and replay, the debugger, `log`, `backup`."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventing.core.mutation import OP_UPDATE, decode_document
from eventing.storage.postgres.state import PostgresState
from eventing.testing import LEDGER_HANDLER
from eventing.testing.commands import Commands
from eventing.testing.postgres import ThrowawayPostgres
from functions import FUNCTIONS_DIR

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CUSTOMERS, CUSTOMER_MUTATIONS = 200, 1200

TIMER_HANDLER = """
import time

def on_update(doc, meta):
    if doc.get("country") == "JP":
        create_timer(remind, time.time(), meta.id, {"id": meta.id, "rev": doc.get("rev")})

def remind(context):
    reminders[context["id"]] = {"rev": context["rev"]}
"""

SANDBOXED_HANDLER = """
def on_update(doc, meta):
    copies[meta.id] = {"name": doc.get("name"), "seq": meta.seq}
"""


def functions_folder(root: Path) -> Path:
    """Definitions and handlers as a user keeps them: a folder of their own, outside the working directory."""
    folder = root / "functions"
    folder.mkdir()
    for name in ("fn_sales_per_minute.json", "fn_sales_per_minute.py", "fn_email.json", "fn_email.py"):
        shutil.copy(FUNCTIONS_DIR / name, folder / name)
    for name in (
        "fn_total.json",
        "fn_total.py",
        "fn_total_fixed.json",
        "fn_total_fixed.py",
        "fn_js_orders.json",
        "fn_js_orders.js",
    ):
        shutil.copy(EXAMPLES / name, folder / name)
    definitions = {
        "fn_ledger": (
            {
                "source_bucket": "customers",
                "bindings": [{"alias": "ledger", "bucket": "ledger", "access": "rw"}],
                "constants": {"FUNCTION": "fn_ledger", "CALL_LOG": "", "SLEEP_MS": 0},
                "worker_count": 2,
                "checkpoint_interval": "100ms",
            },
            LEDGER_HANDLER,
        ),
        "fn_remind": (
            {
                "source_bucket": "customers",
                "bindings": [{"alias": "reminders", "bucket": "reminders", "access": "rw"}],
            },
            TIMER_HANDLER,
        ),
        "fn_boxed": (
            {
                "source_bucket": "customers",
                "isolation": "sandbox",
                "bindings": [{"alias": "copies", "bucket": "copies", "access": "rw"}],
            },
            SANDBOXED_HANDLER,
        ),
    }
    for name, (definition, handler) in definitions.items():
        (folder / f"{name}.py").write_text(handler)
        (folder / f"{name}.json").write_text(
            json.dumps({"name": name, "handler": f"{name}.py", **definition})
        )
    return folder


@dataclass
class Session:
    cmd: Commands
    url: str
    cwd: Path
    never: Path  # $EVENTING_DATA_DIR: must never be made
    functions: Path
    created: str  # what `bucket create customers` said
    run_exit: int
    run_output: str

    def state(self) -> PostgresState:
        return PostgresState(self.url)

    def json(self, *args: str) -> object:
        return json.loads(self.cmd.ok(*args, "--json"))


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("pg-cli")
    server = ThrowawayPostgres()
    server.start()
    try:
        url = server.create_database("newuser")
        cwd, never = root / "cwd", root / "never"
        cwd.mkdir()
        cmd = Commands(cwd, {"EVENTING_STORE": url, "EVENTING_DATA_DIR": str(never)}, logs=str(root / "logs"))
        folder = functions_folder(root)
        created = [
            cmd.ok("bucket", "create", bucket)
            for bucket in (
                "customers",
                "orders",
                "js_orders",
                "emails",
                "ledger",
                "reminders",
                "copies",
                "totals",
                "js_summaries",
            )
        ]
        cmd.ok(
            "bucket",
            "load",
            "customers",
            "--documents",
            str(CUSTOMERS),
            "--mutations",
            str(CUSTOMER_MUTATIONS),
            "--seed",
            "5",
        )
        cmd.ok("bucket", "load", "orders", "--file", str(EXAMPLES / "orders.jsonl"))
        cmd.ok("bucket", "load", "js_orders", "--file", str(EXAMPLES / "orders.jsonl"))
        for name in (
            "fn_sales_per_minute",
            "fn_email",
            "fn_total",
            "fn_js_orders",
            "fn_ledger",
            "fn_remind",
            "fn_boxed",
        ):
            cmd.ok("deploy", str(folder / f"{name}.json"))
        # Every function's workers in two shared processes: seven functions' worth of processes would cost
        # more start-up than their work here (the other modules run a process per worker).
        run = cmd("run", "--until-caught-up", "--close-windows", "--worker-processes", "2", timeout=600)
        yield Session(cmd, url, cwd, never, folder, created[0], run.returncode, run.stdout + run.stderr)
    finally:
        server.stop()


def update_mutations(state: PostgresState, bucket: str) -> list:
    with state.open_bucket(bucket) as source:
        return [m for batch in source.scan_log() for m in batch if m.op == OP_UPDATE]


def test_one_run_on_ray_handles_every_function_and_says_what_it_dead_lettered(session):
    assert session.created == f"bucket 'customers' ready ({session.url})\n"  # where it is: the server
    # exit 3: mutations were dead-lettered (fn_total's order without a price), everything else handled
    assert session.run_exit == 3, session.run_output
    listed = {f["name"]: f["state"] for f in session.json("list")}
    assert listed == dict.fromkeys(
        ("fn_boxed", "fn_email", "fn_js_orders", "fn_ledger", "fn_remind", "fn_sales_per_minute", "fn_total"),
        "deployed",
    )
    state = session.state()
    with state.open_bucket("emails") as emails, state.open_bucket("customers") as customers:
        assert emails.count() == customers.count()
    status = session.json("status")
    assert status["services"] == [] and not any(f["running"] for f in status["functions"])  # the run ended


def test_windows_on_spark_count_every_customer_update_once(session):
    result = session.json("windows", "fn_sales_per_minute")
    assert (result["open_windows"], result["closed_not_emitted"], result["late_rows"]) == (0, 0, 0), result
    rows = result["results"]
    updates = update_mutations(session.state(), "customers")
    assert sum(row["count"] for row in rows) == len(
        updates
    )  # every window closed (--close-windows), each row once
    total = sum(row["sum_amount"] for row in rows)
    assert total == pytest.approx(sum(decode_document(m.doc)["amount"] for m in updates), rel=1e-9)


def test_timers_fire_for_every_reference_and_none_is_left_pending(session):
    state = session.state()
    japanese = {
        m.key for m in update_mutations(state, "customers") if decode_document(m.doc)["country"] == "JP"
    }
    with state.open_bucket("reminders") as reminders:
        assert set(reminders.keys()) == japanese
    stats = session.json("stats", "fn_remind")
    timers = stats["timers"]
    assert timers["fired"] >= len(japanese) and timers["pending"] == 0 and timers["failed"] == 0


def test_sandboxed_and_javascript_functions_write_through_their_bindings(session):
    state = session.state()
    updated = {m.key for m in update_mutations(state, "customers")}
    with state.open_bucket("copies") as copies:
        assert set(copies.keys()) == updated
    orders = [
        json.loads(line) for line in (EXAMPLES / "orders.jsonl").read_text().splitlines() if line.strip()
    ]
    with state.open_bucket("js_summaries") as summaries:
        with_total = {o["key"] for o in orders if "total" in o["doc"]}
        assert {k for k in summaries.keys() if k.startswith("summary::")} == {
            f"summary::{k}" for k in with_total
        }
    lines = session.json("log", "fn_js_orders", "--lines", "100")["lines"]
    assert any("has no total; skipped" in line for line in lines), lines


def test_verify_then_rewind_to_the_start_handles_everything_again_without_applying_an_effect_twice(session):
    out = session.cmd.ok("verify", "fn_ledger")
    assert out.startswith(f"ALL MUTATIONS ACCOUNTED FOR ({CUSTOMER_MUTATIONS} of {CUSTOMER_MUTATIONS})"), out
    with session.state().open_bucket("ledger") as ledger:
        before = sum(ledger.high_seqnos())
    session.cmd.ok("pause", "fn_ledger")
    out = session.cmd.ok("rewind", "fn_ledger", "--to-seqno", "0")
    assert f"{CUSTOMER_MUTATIONS:,} mutations will be handled again" in out, out
    session.cmd.ok("resume", "fn_ledger")
    session.cmd.ok("run", "--until-caught-up", "--executor", "in-process", "--function", "fn_ledger")
    assert session.cmd.ok("verify", "fn_ledger").startswith("ALL MUTATIONS ACCOUNTED FOR")
    with session.state().open_bucket("ledger") as ledger:
        assert (
            sum(ledger.high_seqnos()) == before
        )  # every effect of the rewound range was skipped by its mark
    stats = session.json("stats", "fn_ledger")
    assert stats["on_update_success"] + stats["on_delete_success"] == 2 * CUSTOMER_MUTATIONS, stats


def test_dead_letters_are_listed_and_replayed_with_the_fixed_handler(session):
    rows = session.json("dlq", "list", "fn_total")
    assert [r["key"] for r in rows] == ["order::2"]
    session.cmd.ok("pause", "fn_total")
    session.cmd.ok("create", str(session.functions / "fn_total_fixed.json"))
    out = session.cmd.ok("dlq", "replay", "fn_total", "--all")
    assert out.startswith("replayed 1 of 1 dead letter of 'fn_total'"), out
    session.cmd.ok("resume", "fn_total")
    assert json.loads(session.cmd.ok("bucket", "get", "totals", "order::2")) == {"total": 0}
    assert session.json("dlq", "list", "fn_total") == []


def test_the_debugger_traces_the_next_mutation_without_consuming_it(session):
    session.cmd.ok(
        "bucket",
        "upsert",
        "customers",
        "debug::1",
        '{"name": "Ada", "email": "ada@example.com", '
        '"country": "FR", "amount": 1.5, "rev": 1, "ts": 1767225600000}',
    )
    out = session.cmd.ok("debug", "fn_email", "--key", "debug::1", "--trace")
    assert "calling on_update" in out and "write   dst['debug::1']" in out, out
    assert "not applied" in out and "the mutation was not consumed" in out
    with session.state().open_bucket("emails") as emails:
        assert emails.get("debug::1") is None  # traced, not applied
    session.cmd.ok("run", "--until-caught-up", "--executor", "in-process", "--function", "fn_email")
    with session.state().open_bucket("emails") as emails:
        assert emails.get("debug::1")["to"] == "ada@example.com"  # its worker handled it in place


def test_backup_of_a_postgresql_store_says_in_one_line_what_to_use(session):
    done = session.cmd("backup")
    assert done.returncode == 2 and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "is a PostgreSQL store: back it up with the server's own tools (pg_dump" in line
    assert "eventing store copy" in line


def test_a_store_given_by_flag_works_the_same_from_any_folder(session, tmp_path):
    elsewhere = Commands(tmp_path, {"EVENTING_DATA_DIR": str(session.never)})
    listed = json.loads(elsewhere.ok("--store", session.url, "list", "--json"))
    assert len(listed) == 7
    assert list(tmp_path.iterdir()) == []


def test_nothing_was_written_to_a_data_directory(session):
    """Last: after every command above, the working directory is as empty as it started, and the data
    directory $EVENTING_DATA_DIR names was never made."""
    assert sorted(p.name for p in session.cwd.iterdir()) == []
    assert not session.never.exists()
