"""What a new user runs into: failed runs that must not look clean, handler logs, honest stats, and one
clear line (no traceback, no hang) for each kind of bad input."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eventing.cli import main
from eventing.control import lifecycle
from eventing.control.failover import LEADER_LEASE
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.errors import EventingError
from eventing.execution.app_log import log_path
from eventing.storage.bucket import LocalBucket
from eventing.testing import wait_for
from eventing.workers.executor import InProcessExecutor, check_ray_address
from metadata.factory import open_store

ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dd(data_dir):
    return ["--data-dir", data_dir]


def write_function(tmp_path: Path, handler: str, **definition) -> Path:
    (tmp_path / "h.py").write_text(handler)
    spec = {"name": "fn", "source_bucket": "src", "handler": "h.py", "worker_count": 1, **definition}
    path = tmp_path / "fn.json"
    path.write_text(json.dumps(spec))
    return path


def load(capsys, dd, n: int = 20) -> None:
    assert run_cli(capsys, "bucket", "create", "src", "--exist-ok", *dd)[0] == 0
    assert run_cli(capsys, "bucket", "load", "src", "--documents", str(n), "--mutations", str(n), *dd)[0] == 0


# -- a run in which every mutation fails ---------------------------------------------------------------


def test_a_run_that_dead_letters_mutations_says_how_many_and_why_and_exits_3(capsys, dd, tmp_path):
    load(capsys, dd)
    fn = write_function(tmp_path, "def on_update(doc, meta):\n    raise ValueError('no')\n", retries=0)
    assert run_cli(capsys, "deploy", str(fn), *dd)[0] == 0
    code, out, err = run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)
    assert code == 3, out + err
    assert "20 went to the dead-letter queue in this run (error 20); see `eventing dlq list fn`" in out
    # A second run dead-letters nothing new: a clean exit.
    code, out, _ = run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)
    assert code == 0 and "dead-letter" not in out
    code, out, _ = run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", "--json", *dd)
    assert json.loads(out)["exit"] == 0


def test_a_handler_whose_entry_points_cannot_take_their_arguments_is_refused_at_deploy(capsys, dd, tmp_path):
    load(capsys, dd)
    cases = {
        "def on_update(doc):\n    pass\n": "on_update(doc) cannot be called as on_update(doc, meta)",
        "def on_delete(meta):\n    pass\n": "on_delete(meta) cannot be called as on_delete(meta, options)",
        "on_update = 5\n": "on_update is a int, not a function",
        "def on_update(doc, meta, xattrs, extra):\n    pass\n": "on_update(doc, meta, xattrs, extra) cannot "
        "be called",
    }
    for handler, message in cases.items():
        code, _, err = run_cli(capsys, "deploy", str(write_function(tmp_path, handler)), *dd)
        assert code == 2 and message in err and "Traceback" not in err, err
    fine = "def on_update(doc, meta, extra=None):\n    pass\ndef on_delete(*args):\n    pass\n"
    assert run_cli(capsys, "deploy", str(write_function(tmp_path, fine)), *dd)[0] == 0
    from eventing.execution.static_check import check_handler_source

    check_handler_source(
        "fn", "def on_update(doc, meta, xattrs):\n    pass\n"
    )  # Couchbase 7.6's third argument


@pytest.mark.parametrize(
    ("bindings", "constants", "message"),
    [
        (["class=dst:rw"], {}, "binding alias 'class' of function 'fn' is a Python keyword"),
        (["log=dst:rw"], {}, "binding alias 'log' of function 'fn' would hide the handler API's log()"),
        (["on_update=dst:r"], {}, "would hide the handler API's on_update(doc, meta) entry point"),
        ([], {"log": 1}, "constant 'log' of function 'fn' would hide the handler API's log()"),
        ([], {"lambda": 1}, "constant 'lambda' of function 'fn' is a Python keyword"),
        (
            ["dst=dst:rw"],
            {"dst": 1},
            "constant 'dst' of function 'fn' has the same name as the binding alias 'dst'; rename the "
            "constant or",
        ),
        (["dst=dst:rw", "dst=src:r"], {}, "binds the alias 'dst' to two buckets"),
    ],
)
def test_aliases_that_would_break_the_handler_are_refused(capsys, dd, tmp_path, bindings, constants, message):
    load(capsys, dd)
    run_cli(capsys, "bucket", "create", "dst", *dd)
    fn = write_function(
        tmp_path, "def on_update(doc, meta):\n    pass\n", bindings=bindings, constants=constants
    )
    code, _, err = run_cli(capsys, "deploy", str(fn), *dd)
    assert code == 2 and message in err, err


# -- handler log ------------------------------------------------------------------------------------


def test_handler_log_lines_reach_the_function_log_file_named_in_the_run_summary(
    capsys, dd, data_dir, tmp_path
):
    load(capsys, dd, 5)
    handler = "def on_update(doc, meta):\n    log('saw', meta.id, {'n': 1}, 'two\\nlines')\n"
    assert run_cli(capsys, "deploy", str(write_function(tmp_path, handler)), *dd)[0] == 0
    code, out, _ = run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)
    assert code == 0
    path = log_path(data_dir, "fn")
    assert f"handler log: {path}" in out
    lines = path.read_text().splitlines()
    assert len(lines) == 5
    source = LocalBucket.open(data_dir, "src")
    for line in lines:
        stamp, level, function, where, key, text = line.split(" ", 5)
        assert stamp.endswith("Z") and level == "[INFO]" and function == "fn"
        vb, seqno = map(int, where.split(":"))
        meta = source.get_meta(key)
        assert (vb, seqno) == (meta["vb"], meta["seqno"])
        assert text == f"saw {key} {{'n': 1}} two\\nlines"
    stats = json.loads(run_cli(capsys, "stats", "fn", "--json", *dd)[1])
    assert stats["handler_log"] == str(path)


# -- stats ------------------------------------------------------------------------------------------


def test_a_window_only_function_reports_window_rows_not_handler_successes(capsys, dd, tmp_path, monkeypatch):
    from eventing.testing.windows import python_aggregator
    from eventing.windows.runtime import host

    monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)
    run_cli(capsys, "bucket", "create", "customers", *dd)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(
                {
                    "key": f"k{i}",
                    "doc": {"ts": 1_767_225_600_000 + i, "country": "KR", "amount": "lots" if i == 0 else i},
                }
            )
            for i in range(10)
        )
        + "\n"
    )
    assert run_cli(capsys, "bucket", "load", "customers", "--file", str(rows), *dd)[0] == 0
    assert run_cli(capsys, "deploy", str(ROOT / "functions" / "fn_sales_per_minute.json"), *dd)[0] == 0
    assert run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)[0] == 0
    stats = json.loads(run_cli(capsys, "stats", "fn_sales_per_minute", "--json", *dd)[1])
    assert stats["on_update_success"] == 0
    assert stats["window"]["rows_written"] == 10 and stats["window"]["values_not_numeric"] == 1
    code, out, _ = run_cli(capsys, "stats", "fn_sales_per_minute", *dd)
    assert "values_not_numeric=1" in out


def test_status_after_a_killed_service_does_not_count_its_leases_as_live(capsys, dd, data_dir, tmp_path):
    load(capsys, dd)
    assert (
        run_cli(
            capsys, "deploy", str(write_function(tmp_path, "def on_update(doc, meta):\n    pass\n")), *dd
        )[0]
        == 0
    )
    store = open_store(data_dir)
    store.claim("fn", list(range(1024)), "local/w0")
    # The service was killed with kill -9: a fresh heartbeat, a process that no longer exists.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.heartbeat(f"{socket.gethostname()}:{dead.pid}:abcdef", "{}")
    store.set_gauges("fn", {"throughput_mps": 40539.0})
    store.close()
    code, out, _ = run_cli(capsys, "status", *dd)
    assert "eventing service: not running" in out
    assert "0/1024 vBuckets owned by live workers; 1024 still leased by a service that stopped" in out
    stats = json.loads(run_cli(capsys, "stats", "fn", "--json", *dd)[1])
    assert stats["throughput_mps"] == 0.0
    vbmap = json.loads(run_cli(capsys, "vbmap", "fn", "--json", *dd)[1])
    assert not any(w["live"] for w in vbmap["workers"])


def test_a_run_right_after_kill_9_of_the_service_starts_or_says_when_the_lease_expires(
    capsys, dd, data_dir, tmp_path
):
    """A service killed with kill -9 and not yet reaped by its parent (a zombie) is dead: a new run starts at
    once. One on another host cannot be checked: the refusal says when its lease expires."""
    load(capsys, dd)
    assert (
        run_cli(
            capsys, "deploy", str(write_function(tmp_path, "def on_update(doc, meta):\n    pass\n")), *dd
        )[0]
        == 0
    )
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; not reaped until wait() below
    wait_for(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z")
    store = open_store(data_dir)
    store.heartbeat(f"{socket.gethostname()}:{zombie.pid}:abcdef", "{}")
    store.acquire_lease(LEADER_LEASE, f"{socket.gethostname()}:{zombie.pid}:abcdef", 30.0)
    try:
        code, out, err = run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)
        assert code == 0, err
        store.heartbeat("elsewhere:4242:abcdef", "{}")
        store.acquire_lease(
            LEADER_LEASE,
            "elsewhere:4242:abcdef",
            30.0,
            take_from=f"{socket.gethostname()}:{zombie.pid}:abcdef",
        )
        code, out, err = run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)
        assert code != 0
        assert "another eventing service (elsewhere:4242:abcdef) is running" in err
        assert "if that service was killed, its lease expires in at most 30 s" in err
        assert "Traceback" not in err
    finally:
        store.close()
        zombie.wait()


def test_the_run_summary_counts_what_was_handled_across_a_pause_and_resume(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(300):
        source.upsert(f"k{i}", {"i": i})
    defn = FunctionDefinition.from_dict(
        {"name": "fn", "source_bucket": "src", "worker_count": 1, "checkpoint_interval": "50ms"}
    )
    lifecycle.save_function(data_dir, defn, "def on_update(doc, meta):\n    pass\n")
    lifecycle.deploy(data_dir, "fn")
    service = EventingService(data_dir, InProcessExecutor())
    runner = threading.Thread(target=service.run)
    runner.start()
    try:
        wait_for(
            lambda: service.summary.functions.get("fn") and service.summary.functions["fn"].handled == 300
        )
        lifecycle.pause(data_dir, "fn", wait_s=30)
        assert service.summary.functions["fn"].rate_mps == 0.0
        assert open_store(data_dir).counters("fn")["throughput_mps"] == 0.0
        for i in range(300, 500):
            source.upsert(f"k{i}", {"i": i})
        lifecycle.resume(data_dir, "fn")
        wait_for(lambda: service.summary.functions["fn"].handled == 500)
    finally:
        service.stop()
        runner.join(30)
    assert service.summary.functions["fn"].handled == 500


def test_progress_counts_dead_letters_while_running_and_across_a_pause_and_resume(data_dir):
    """The progress the CLI prints and the summary read one source: dead letters show while the function
    runs (not only once it stops), and keep counting after a pause and resume."""
    source = LocalBucket.create(data_dir, "src")
    for i in range(20):
        source.upsert(f"k{i}", {"bad": i % 4 == 0})
    defn = FunctionDefinition.from_dict(
        {"name": "fn", "source_bucket": "src", "worker_count": 1, "checkpoint_interval": "50ms"}
    )
    handler = "def on_update(doc, meta):\n    if doc['bad']:\n        raise ValueError(meta.id)\n"
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, "fn")
    service = EventingService(data_dir, InProcessExecutor())
    runner = threading.Thread(target=service.run)
    runner.start()
    try:
        wait_for(
            lambda: (
                service.summary.functions.get("fn")
                and service.summary.functions["fn"].dead_letters == {"error": 5}
            )
        )
        assert service.summary.functions["fn"].state == "running"
        lifecycle.pause(data_dir, "fn", wait_s=30)
        for i in range(20, 40):
            source.upsert(f"k{i}", {"bad": i % 4 == 0})
        lifecycle.resume(data_dir, "fn")
        wait_for(lambda: service.summary.functions["fn"].dead_letters == {"error": 10})
    finally:
        service.stop()
        runner.join(30)
    assert service.summary.functions["fn"].dead_letters == {"error": 10}


# -- one line for each kind of bad input -------------------------------------------------------------


def test_bucket_load_of_a_missing_file_is_one_line(capsys, dd, tmp_path):
    run_cli(capsys, "bucket", "create", "src", *dd)
    code, _, err = run_cli(capsys, "bucket", "load", "src", "--file", str(tmp_path / "nonexist.jsonl"), *dd)
    assert (
        code == 2
        and err.strip()
        == f"error: file {tmp_path / 'nonexist.jsonl'} does not exist; give a JSON "
        "lines file with --file (or - for stdin)"
    )


def test_a_boolean_worker_count_is_refused_and_does_not_block_other_functions(capsys, dd, data_dir, tmp_path):
    load(capsys, dd)
    code, _, err = run_cli(
        capsys,
        "deploy",
        str(write_function(tmp_path, "def on_update(d, m):\n    pass\n", worker_count=True)),
        *dd,
    )
    assert code == 2 and "worker_count of function 'fn' is true, a boolean; give a number >= 1" in err
    # One stored before this check existed fails alone; the other function still runs.
    good = write_function(tmp_path, "def on_update(d, m):\n    pass\n")
    assert run_cli(capsys, "deploy", str(good), *dd)[0] == 0
    other = json.loads(good.read_text()) | {"name": "fn2"}
    (tmp_path / "fn2.json").write_text(json.dumps(other))
    assert run_cli(capsys, "deploy", str(tmp_path / "fn2.json"), *dd)[0] == 0
    store = open_store(data_dir)
    record = store.get_function("fn")
    store._tx(
        lambda db: db.execute(  # as an older build stored it
            "UPDATE functions SET definition=? WHERE name='fn'",
            (json.dumps(record.definition | {"worker_count": True}),),
        )
    )
    store.close()
    code, out, err = run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)
    assert code == 1 and "Traceback" not in out + err
    assert "failed error: worker_count of function 'fn' is true, a boolean; give a number >= 1" in out
    assert "fn2: 20 mutations handled" in out


def test_a_handler_file_that_is_not_utf8_is_one_line(capsys, dd, tmp_path):
    load(capsys, dd)
    fn = write_function(tmp_path, "")
    (tmp_path / "h.py").write_bytes(b"# caf\xe9\ndef on_update(doc, meta):\n    pass\n")
    code, _, err = run_cli(capsys, "deploy", str(fn), *dd)
    assert code == 2 and "is not UTF-8 text (byte 0xe9 at offset 5); save it as UTF-8" in err


def test_an_unreachable_ray_address_fails_in_seconds_with_one_line():
    start = time.monotonic()
    with pytest.raises(EventingError, match=r"no Ray cluster answers at 127.0.0.1:1 \(Connection refused\)"):
        check_ray_address("127.0.0.1:1")
    assert time.monotonic() - start < 5
    check_ray_address("auto")  # left to Ray


# -- smaller things ---------------------------------------------------------------------------------


def test_json_everywhere_it_is_accepted_and_errors_as_json(capsys, dd):
    run_cli(capsys, "bucket", "create", "src", *dd)
    code, out, _ = run_cli(capsys, "bucket", "expire", "src", "--json", *dd)
    assert code == 0 and json.loads(out) == {"bucket": "src", "expired": 0}
    code, out, err = run_cli(capsys, "bucket", "get", "src", "nope", "--json", *dd)
    assert code == 2 and out == ""
    assert json.loads(err) == {"error": "document 'nope' does not exist in bucket 'src'", "exit": 2}


def test_windows_json_honours_the_limit(capsys, dd, tmp_path, monkeypatch):
    from eventing.testing.windows import python_aggregator
    from eventing.windows.runtime import host

    monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)
    run_cli(capsys, "bucket", "create", "customers", *dd)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(
                {"key": f"k{i}", "doc": {"ts": 1_767_225_600_000 + i * 60_000, "country": "KR", "amount": 1}}
            )
            for i in range(4)
        )
    )
    run_cli(capsys, "bucket", "load", "customers", "--file", str(rows), *dd)
    run_cli(capsys, "deploy", str(ROOT / "functions" / "fn_sales_per_minute.json"), *dd)
    assert (
        run_cli(capsys, "run", "--until-caught-up", "--close-windows", "--executor", "in-process", *dd)[0]
        == 0
    )
    report = json.loads(run_cli(capsys, "windows", "fn_sales_per_minute", "--json", "--limit", "2", *dd)[1])
    assert len(report["results"]) == 2 and report["results_total"] == 4


def test_upsert_refuses_a_negative_expiry(capsys, dd):
    run_cli(capsys, "bucket", "create", "src", *dd)
    code, _, err = run_cli(capsys, "bucket", "upsert", "src", "k", "{}", "--expiry", "-5", *dd)
    assert code == 2 and "--expiry is -5" in err


def test_upsert_reads_an_expiry_up_to_30_days_as_seconds_from_now_as_couchbase_does(capsys, dd):
    """docs/handler-api.md's rule (memcached's): up to 30 days an expiry is relative, above it a Unix time."""
    run_cli(capsys, "bucket", "create", "src", *dd)

    def expiry_of(given: str) -> int:
        assert run_cli(capsys, "bucket", "upsert", "src", "k", '{"a":1}', "--expiry", given, *dd)[0] == 0
        return json.loads(run_cli(capsys, "bucket", "get", "src", "k", "--json", *dd)[1])["meta"]["expiry"]

    before = int(time.time())
    assert before + 5 <= expiry_of("5") <= int(time.time()) + 5  # not 1970
    month = 30 * 24 * 3600
    assert before + month <= expiry_of(str(month)) <= int(time.time()) + month
    assert expiry_of(str(month + 1)) == month + 1  # above 30 days: a Unix time
    assert expiry_of("4102444800") == 4102444800 and expiry_of("0") == 0
    code, _, err = run_cli(capsys, "bucket", "upsert", "src", "k", "{}", "--expiry", str(2**32), *dd)
    assert code == 2 and "up to 4294967295" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == "eventing 0.1.0"


def test_deploy_while_paused_says_how_to_update_the_definition(capsys, dd, data_dir, tmp_path):
    load(capsys, dd)
    fn = write_function(tmp_path, "def on_update(doc, meta):\n    pass\n")
    assert run_cli(capsys, "deploy", str(fn), *dd)[0] == 0
    lifecycle.pause(data_dir, "fn", wait_s=5)
    code, _, err = run_cli(capsys, "deploy", str(fn), *dd)
    assert code == 2 and f"eventing create {fn}" in err and "eventing resume fn" in err, err


def test_verify_names_the_missing_ledger(capsys, dd, tmp_path):
    load(capsys, dd)
    run_cli(capsys, "bucket", "create", "dst", *dd)
    fn = write_function(
        tmp_path, "def on_update(doc, meta):\n    dst[meta.id] = doc\n", bindings=["dst=dst:rw"]
    )
    assert run_cli(capsys, "deploy", str(fn), *dd)[0] == 0
    assert run_cli(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)[0] == 0
    code, _, err = run_cli(capsys, "verify", "fn", *dd)
    assert code == 2 and "function 'fn' has no ledger: bucket 'dst' (its only read-write binding)" in err


def test_ctrl_c_during_bucket_load_says_how_many_rows_were_committed(capsys, dd, monkeypatch):
    run_cli(capsys, "bucket", "create", "src", *dd)
    calls = {"n": 0}
    original = LocalBucket.load_rows

    def load_rows(self, rows, **kwargs):  # bucket load commits one transaction per 20,000 rows
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, rows, **kwargs)

    monkeypatch.setattr(LocalBucket, "load_rows", load_rows)
    code, _, err = run_cli(capsys, "bucket", "load", "src", "--documents", "100", "--mutations", "50000", *dd)
    assert code == 130
    assert "interrupted: 40,000 mutations committed to 'src' before Ctrl-C" in err


def test_debug_mutation_script_finds_the_project_without_an_active_venv(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "debug_mutation.py"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0 and "Debug one mutation" in done.stdout


def test_run_prints_periodic_progress_lines_when_not_on_a_terminal(capsys, dd, tmp_path):
    load(capsys, dd, 200)
    handler = "import time\ndef on_update(doc, meta):\n    time.sleep(0.002)\n"
    assert run_cli(capsys, "deploy", str(write_function(tmp_path, handler, batch_size=10)), *dd)[0] == 0
    code, _, err = run_cli(
        capsys, "run", "--until-caught-up", "--executor", "in-process", "--progress-every", "0.05", *dd
    )
    assert code == 0
    assert "progress: fn: " in err and " handled, backlog " in err


def test_ctrl_c_of_run_exits_130_as_bucket_load_does(capsys, dd, tmp_path, monkeypatch):
    load(capsys, dd)
    assert (
        run_cli(capsys, "deploy", str(write_function(tmp_path, "def on_update(d, m):\n    pass\n")), *dd)[0]
        == 0
    )

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(EventingService, "run", interrupted)
    code, _, err = run_cli(capsys, "run", "--executor", "in-process", *dd)
    assert code == 130 and "interrupted: stopped after a checkpoint" in err


def test_the_jvm_incubator_warning_is_dropped_and_other_stderr_lines_pass(monkeypatch):
    import io

    from eventing.windows.spark import spark_session

    class Err:
        buffer = io.BytesIO()

    monkeypatch.setattr(sys, "stderr", Err)
    jvm = io.BytesIO(b"WARNING: Using incubator modules: jdk.incubator.vector\nERROR real trouble\n")
    spark_session._forward_stderr(jvm)
    assert Err.buffer.getvalue() == b"ERROR real trouble\n"


def test_spark_connect_without_its_client_packages_names_them_and_the_install(monkeypatch):
    from eventing.errors import ConfigError
    from eventing.windows.spark import spark_session

    monkeypatch.setitem(sys.modules, "grpc", None)  # an import of it fails, as when it is not installed
    with pytest.raises(ConfigError) as failure:
        spark_session._connect("sc://127.0.0.1:15002")
    message = str(failure.value)
    assert "missing: grpc" in message and "pip install 'eventing[spark-connect]'" in message
