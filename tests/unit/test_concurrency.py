"""The function setting `concurrency` on the in-process runtime: several calls at once for different
documents, each document's mutations in seqno order, binding effects exactly once (also when a worker is
abandoned after flushing and before its checkpoint), timeouts of pool calls dead-lettered while the others
complete, curl, timers and log() from concurrent calls, and concurrency 1 keeping its one-call path. Also the
writes and checkpoints a batch leaves to be written beside the next one's calls: reads and cas reads of them,
a failing flush, a crash before the checkpoint, a release, and vBuckets they find fenced."""

from __future__ import annotations

import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE
from eventing.errors import ConfigError
from eventing.execution.bindings import ConcurrentEffectBuffer, EffectBuffer
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import open_bucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source, read_call_log
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers import worker as worker_module
from eventing.workers.executor import InProcessExecutor
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata import sqlite_io
from metadata.errors import StoreError
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

# The ledger handler (history per document, one effect per mutation) with random short waits, and the
# number of calls in flight at once, so a test sees both the order and the overlap.
ORDERED = """
import os
import random
import threading
import time

_lock = threading.Lock()
_flight = {"now": 0, "max": 0}


def on_update(doc, meta):
    with _lock:
        _flight["now"] += 1
        _flight["max"] = max(_flight["max"], _flight["now"])
    try:
        time.sleep(random.random() * 0.004)
        ledger[f"e|{FUNCTION}|{meta.id}|{meta.seq}"] = {"fn": FUNCTION, "key": meta.id, "seq": meta.seq, "vb": meta.vb, "op": "update", "rev": doc.get("rev")}
        history = ledger.get(f"h|{FUNCTION}|{meta.id}") or {"seqs": []}
        time.sleep(random.random() * 0.002)  # between the read and the write of the history
        history["seqs"].append(meta.seq)
        ledger[f"h|{FUNCTION}|{meta.id}"] = history
        ledger["flight"] = {"max": _flight["max"]}
        with open(CALL_LOG, "a") as f:
            f.write(f"{meta.id} {meta.seq} {os.getpid()}\\n")
    finally:
        with _lock:
            _flight["now"] -= 1


def on_delete(meta, options):
    ledger[f"e|{FUNCTION}|{meta.id}|{meta.seq}"] = {"fn": FUNCTION, "key": meta.id, "seq": meta.seq, "vb": meta.vb, "op": "delete", "rev": None}
    history = ledger.get(f"h|{FUNCTION}|{meta.id}") or {"seqs": []}
    history["seqs"].append(meta.seq)
    ledger[f"h|{FUNCTION}|{meta.id}"] = history
    with open(CALL_LOG, "a") as f:
        f.write(f"{meta.id} {meta.seq} {os.getpid()}\\n")
"""  # noqa: E501


def run(data_dir: str) -> None:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors


def worker(data_dir: str, name: str, wid: str = "n/w0") -> WorkerCore:
    store = open_store(data_dir)
    generation = store.get_function(name).generation
    store.close()
    return WorkerCore(WorkerSpec(data_dir, name, generation, wid, tuple(range(NUM_VBUCKETS))))


def test_concurrent_calls_keep_each_documents_order_and_apply_effects_exactly_once(data_dir, tmp_path):
    source = load_source(data_dir, 200, 2000, seed=5, delete_ratio=0.1)
    calls = tmp_path / "calls"
    defn = ledger_definition(
        "fn_c", "src", "ledger", workers=2, call_log=str(calls), concurrency=8, batch_size=400
    )
    deploy_function(data_dir, defn, ORDERED)
    run(data_dir)
    ledger = open_bucket(data_dir, "ledger")
    report = check_ledger(source, ledger)
    assert report.ok, report.summary()
    assert report.handled == 2000
    seen = read_call_log(calls)
    assert sum(len(v) for v in seen.values()) == 2000  # no fault: one call per mutation
    assert all(seqs == sorted(set(seqs)) for seqs in seen.values())  # each document in seqno order
    assert 1 < ledger.get("flight")["max"] <= 8  # calls overlapped, never more than the setting
    counters = open_store(data_dir).counters("fn_c")
    assert counters["mutations_seen"] == 2000
    assert counters["on_update_success"] + counters["on_delete_success"] == 2000


def test_a_worker_abandoned_after_flushing_replays_without_applying_anything_twice(data_dir, tmp_path):
    source = load_source(data_dir, 100, 1500, seed=9)
    calls = tmp_path / "calls"
    defn = ledger_definition(
        "fn_c",
        "src",
        "ledger",
        workers=1,
        call_log=str(calls),
        concurrency=6,
        batch_size=200,
        checkpoint_interval="1h",
    )
    deploy_function(data_dir, defn, ORDERED)
    first = worker(data_dir, "fn_c")
    for _ in range(3):
        first.step(200)  # effects flushed after each batch; no checkpoint (interval 1h): a crash here
    checkpoints = open_store(data_dir).checkpoints("fn_c")
    assert sum(first.positions.values()) and not any(checkpoints[vb].seqno for vb in range(NUM_VBUCKETS))
    first.calls.close()  # the process "dies": nothing more of it runs or commits
    run(data_dir)
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok, report.summary()
    assert report.handled == 1500
    replayed = sum(len(v) for v in read_call_log(calls).values()) - 1500
    assert replayed == 600  # the three batches ran again ...
    assert (
        open_store(data_dir).counters("fn_c")["effects_duplicate"] >= 600
    )  # ... and their effects were skipped


HANGS = """
import time

_hanging = set()  # the hung calls running now


def on_update(doc, meta):
    if meta.id.startswith("hang"):
        _hanging.add(meta.id)
        try:
            while True:  # never returns: interrupted by the timeout
                time.sleep(0.01)
        finally:
            _hanging.discard(meta.id)
    time.sleep(0.02)
    dst[meta.id] = {"seq": meta.seq, "during_hang": bool(_hanging)}
"""


def test_pool_calls_past_execution_timeout_are_dead_lettered_while_the_others_complete(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(3):
        source.upsert(f"hang{i}", {"i": i})
    for i in range(60):
        source.upsert(f"ok{i}", {"i": i})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_h",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            "execution_timeout": "500ms",
            "concurrency": 8,
        }
    )
    deploy_function(data_dir, defn, HANGS)
    run(data_dir)
    dst = open_bucket(data_dir, "dst")
    assert sorted(dst.keys()) == sorted(f"ok{i}" for i in range(60))
    # The other calls went on while the hung ones ran (one at a time, none would have seen a hung call).
    assert sum(dst.get(f"ok{i}")["during_hang"] for i in range(60)) > 0
    store = open_store(data_dir)
    letters = store.find_dlq_rows("fn_h")
    assert sorted((row.key, row.reason) for row in letters) == [(f"hang{i}", "timeout") for i in range(3)]
    counters = store.counters("fn_h")
    assert counters["on_update_timeout"] == 3 and counters["on_update_success"] == 60


# A call whose timeout lands in a __del__ (Python prints it as unraisable and drops it), then waits.
LOSES_ITS_TIMEOUT = """
import time


class Slow:
    def __del__(self):
        ends = time.monotonic() + 0.6
        while time.monotonic() < ends:
            pass


def on_update(doc, meta):
    if meta.id == "slow":
        Slow()  # dropped at once: its __del__ runs in the call, past execution_timeout
        ends = time.monotonic() + 5
        while time.monotonic() < ends:
            time.sleep(0.01)
    dst[meta.id] = doc
"""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_pool_calls_timeout_that_python_dropped_is_raised_again(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for key in ("a", "slow", "b"):
        source.upsert(key, {"k": key})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_h",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            "execution_timeout": "300ms",
            "concurrency": 2,
        }
    )
    deploy_function(data_dir, defn, LOSES_ITS_TIMEOUT)
    started = time.monotonic()
    run(data_dir)
    assert sorted(open_bucket(data_dir, "dst").keys()) == ["a", "b"]
    assert [(row.key, row.reason) for row in open_store(data_dir).find_dlq_rows("fn_h")] == [
        ("slow", "timeout")
    ]
    assert time.monotonic() - started < 4


class Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def do_GET(self) -> None:
        time.sleep(0.005)
        with Recorder.lock:
            Recorder.seen.append((self.path, self.headers.get("X-Seq", "")))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    Recorder.seen = []
    with serve_http(Recorder) as httpd:
        yield url_of(httpd)


CALLS_OUT = """
import time


def on_update(doc, meta):
    r = curl("GET", api, {"path": "/doc/" + meta.id, "headers": {"X-Seq": str(meta.seq)}})
    ref = create_timer(later, time.time(), None, {"id": meta.id, "seq": meta.seq})
    log("handled", meta.id, meta.seq)
    dst["seen|" + meta.id] = {"status": r.status, "ok": r.body["ok"], "ref": ref, "seq": meta.seq}


def later(context):
    dst["fired|" + context["id"]] = {"seq": context["seq"]}
"""


def test_curl_timers_and_log_from_concurrent_calls_name_their_own_mutation(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    for i in range(40):
        source.upsert(f"k{i}", {"i": i})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_io",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            "url_bindings": [{"alias": "api", "url": server}],
            "concurrency": 8,
            "checkpoint_interval": "100ms",
        }
    )
    deploy_function(data_dir, defn, CALLS_OUT)
    w = worker(data_dir, "fn_io")
    for _ in range(3):  # handle, commit (timers durable), fire
        w.step()
        w.commit()
    dst = open_bucket(data_dir, "dst")
    seen = {k[len("seen|") :]: dst.get(k) for k in dst.keys() if k.startswith("seen|")}
    assert len(seen) == 40 and all(v["status"] == 200 and v["ok"] is True for v in seen.values())
    # Each curl went out once, from the call of its own document (its path and header agree).
    assert sorted(Recorder.seen) == sorted((f"/doc/k{i}", str(seen[f"k{i}"]["seq"])) for i in range(40))
    # The timers' default references name each call's own mutation, and each fired once.
    refs = [v["ref"] for v in seen.values()]
    assert len(set(refs)) == 40
    assert all(f":{v['seq']}:" in v["ref"] for v in seen.values())
    assert {k: dst.get(k)["seq"] for k in dst.keys() if k.startswith("fired|")} == {
        f"fired|{key}": v["seq"] for key, v in seen.items()
    }
    # Each log line carries the vBucket:seqno and key of the call that wrote it.
    with open(f"{data_dir}/logs/fn_io.log") as f:
        lines = [line for line in f.read().splitlines() if " handled " in line]
    assert len(lines) == 40
    for line in lines:
        where, key, _, text_key, text_seq = line.split(" fn_io ", 1)[1].split(" ")
        assert (key, where.split(":")[1]) == (text_key, text_seq)
    w.close()


def test_concurrency_one_keeps_the_one_call_path_and_bad_values_are_refused():
    plain = FunctionDefinition.from_dict({"name": "f", "source_bucket": "s"})
    assert plain.concurrency == 1 and plain.to_dict()["concurrency"] == 1
    assert (
        FunctionDefinition.from_dict({"name": "f", "source_bucket": "s", "concurrency": 16}).concurrency == 16
    )
    for bad in (0, 65, True, "4", 2.5):
        with pytest.raises(
            ConfigError, match="concurrency of function 'f' is .*; give an integer from 1 to 64"
        ):
            FunctionDefinition.from_dict({"name": "f", "source_bucket": "s", "concurrency": bad})
    js = {"name": "f", "source_bucket": "s", "concurrency": 4, "language": "javascript"}
    assert FunctionDefinition.from_dict(js).concurrency == 4
    with pytest.raises(ConfigError, match="previous_version does not take"):
        FunctionDefinition.from_dict(
            {"name": "f", "source_bucket": "s", "concurrency": 4, "previous_version": True}
        )


def test_only_a_function_with_concurrency_gets_the_pool_and_per_thread_buffers(data_dir):
    LocalBucket.create(data_dir, "src")
    for name, concurrency in (("fn_one", 1), ("fn_many", 4)):
        deploy_function(data_dir, ledger_definition(name, "src", f"ledger_{name}", concurrency=concurrency))
    one, many = worker(data_dir, "fn_one"), worker(data_dir, "fn_many", "n/w1")
    assert one.calls is None and type(one.rw_bindings[0].buf) is EffectBuffer
    # One run loop; the dispatcher is chosen when the worker is built: its own serial path, or the pool's.
    assert one.handler.take_run == one.handler.handle_serial and one._dispatch == one.reader.process
    assert many.calls is not None and type(many.rw_bindings[0].buf) is ConcurrentEffectBuffer
    assert many.handler.take_run == many.calls.take_run and many._dispatch == many.calls.process
    one.close()
    many.close()


LAST_WRITER = """
import time


def on_update(doc, meta):
    if doc["slow"]:
        time.sleep(0.3)  # returns after the later mutation's call
    dst["last"] = {"seq": meta.seq, "key": meta.id}
"""


def test_writes_of_one_vbucket_reach_the_bucket_in_seqno_order_whatever_order_the_calls_end(data_dir):
    from sharding import vbucket_of

    first = "a0"
    second = next(f"b{i}" for i in range(10_000) if vbucket_of(f"b{i}") == vbucket_of(first))
    source = LocalBucket.create(data_dir, "src")
    source.upsert(first, {"slow": True})  # the lower seqno, whose call ends last
    source.upsert(second, {"slow": False})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_w",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            "concurrency": 4,
        }
    )
    deploy_function(data_dir, defn, LAST_WRITER)
    run(data_dir)
    dst = open_bucket(data_dir, "dst")
    assert dst.get("last")["key"] == second  # as one call at a time would leave it: the log's order


FLAKY = """
def on_update(doc, meta):
    if meta.id == "bad" and not dst.get("fixed"):
        raise RuntimeError("not yet")
    log("writing", meta.id)
    dst["out|" + meta.id] = {"seq": meta.seq}
"""


def test_the_debugger_and_dlq_replay_run_a_function_with_concurrency(data_dir):
    from eventing.ops import dlq as dlq_ops
    from eventing.ops.debugger import DebugSession

    source = LocalBucket.create(data_dir, "src")
    for key in ("a", "bad", "c"):
        source.upsert(key, {"k": key})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_d",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            "concurrency": 4,
        }
    )
    deploy_function(data_dir, defn, FLAKY)
    session = DebugSession(data_dir, "fn_d", key="c")
    outcome = session.run()
    assert outcome.status == "ok"
    assert [w.write.key for w in session.writes] == ["out|c"]  # held for the trace, not applied
    assert [e["line"] for e in session.events if e["event"] == "log"][-1].endswith("writing c")
    run(data_dir)
    store = open_store(data_dir)
    assert [(row.key, row.reason) for row in store.find_dlq_rows("fn_d")] == [("bad", "error")]
    LocalBucket.open(data_dir, "dst").upsert("fixed", {"yes": True})
    report = dlq_ops.replay(data_dir, "fn_d", dlq_ops.DlqSelector(key="bad"))
    assert (report.replayed, report.failed) == (1, 0)
    dst = open_bucket(data_dir, "dst")
    assert sorted(k for k in dst.keys() if k.startswith("out|")) == ["out|a", "out|bad", "out|c"]


def test_the_example_of_the_concurrency_section_of_the_functions_doc_runs(capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "functions.md").read_text()
    section = text[text.index("## Concurrency") : text.index("## Commands")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(code, "docs/functions.md", "exec"), {"__name__": "doc_example"})
    assert capsys.readouterr().out.startswith("200 orders priced in ")


ECHO = """
import time


def on_update(doc, meta):
    time.sleep(0.002)
    if meta.id.startswith("copy|"):
        seen[f"{meta.id}|{meta.seq}"] = {"from": doc.get("by")}
        return
    src["copy|" + meta.id] = {"by": FUNCTION}  # comes back to this function: the recursion guard skips it
"""


def test_mutations_written_by_bindings_go_through_the_recursion_guard_in_order(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(30):
        source.upsert(f"k{i}", {"i": i})
    LocalBucket.create(data_dir, "seen")
    for name, concurrency in (("fn_a", 4), ("fn_b", 1)):
        defn = FunctionDefinition.from_dict(
            {
                "name": name,
                "source_bucket": "src",
                "concurrency": concurrency,
                "constants": {"FUNCTION": name},
                "bindings": [
                    {"alias": "src", "bucket": "src", "access": "rw"},
                    {"alias": "seen", "bucket": "seen", "access": "rw"},
                ],
            }
        )
        deploy_function(data_dir, defn, ECHO)
    run(data_dir)
    run(data_dir)  # the copies each function wrote reach the other one
    seen = open_bucket(data_dir, "seen")
    # Each function skipped its own copies and handled the other's: fn_a (concurrent) got fn_b's 30.
    froms = sorted(seen.get(k)["from"] for k in seen.keys())
    assert froms == ["fn_a"] * 30 + ["fn_b"] * 30
    counters = open_store(data_dir).counters("fn_a")
    assert counters["recursion_filtered"] == 30
    assert counters["on_update_success"] == 30 + 30  # its sources and fn_b's copies (skips are not calls)


def test_concurrency_is_a_setting_of_the_rest_api_like_the_others(data_dir):
    import asyncio

    import httpx

    from eventing.control import lifecycle
    from eventing.http.app import build_app
    from eventing.http.auth import ServerConfig

    LocalBucket.create(data_dir, "src")
    lifecycle.save_function(
        data_dir,
        FunctionDefinition.from_dict({"name": "fn_r", "source_bucket": "src"}),
        "def on_update(doc, meta):\n    pass\n",
    )
    app = build_app(ServerConfig(data_dir))

    def request(method: str, path: str, **kwargs) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(call())

    bad = request("POST", "/api/v1/functions/fn_r/settings", json={"concurrency": 100})
    assert bad.status_code == 400 and "give an integer from 1 to 64" in bad.text
    assert request("POST", "/api/v1/functions/fn_r/settings", json={"concurrency": 16}).status_code == 200
    assert request("GET", "/api/v1/functions/fn_r").json()["concurrency"] == 16
    assert open_store(data_dir).get_function("fn_r").definition["concurrency"] == 16


@pytest.fixture
def early_set_aside(monkeypatch):
    """Writes set aside after every batch (EFFECT_FLUSH_MIN 8,000 is more than these tests keep), so each
    batch's flush runs while the next batch's calls do, and a step that takes every batch there is."""
    monkeypatch.setattr(worker_module, "EFFECT_FLUSH_MIN", 50)
    monkeypatch.setattr(worker_module, "STEP_SLICE_S", 60.0)


def _spy_set_aside_flushes(core: WorkerCore, fail_at: int = 0) -> list[int]:
    """Counts the writes each flush of set-aside writes applies while calls of the next batch run; the
    flush number `fail_at` fails inside its transaction, as a failing disk would."""
    applied: list[int] = []
    tried = [0]
    real = core.flush_set_aside

    def fail(path) -> None:
        if str(path) == str(core.rw_bindings[0].bucket.path):
            raise sqlite3.OperationalError("disk I/O error")

    def spy() -> None:
        waiting = sum(len(g.writes) for b in core.rw_bindings for g in b.buf.set_aside)
        if not waiting:
            real()
            return
        tried[0] += 1
        _set_write_fault(fail if tried[0] == fail_at else None)
        try:
            time.sleep(
                0.02
            )  # a slow disk: the calls read the set-aside writes before their transaction begins
            real()
        finally:
            _set_write_fault(None)
        applied.append(waiting)

    core.flush_set_aside = spy
    return applied


def _step_to_the_end(core: WorkerCore) -> None:
    """Steps until caught up, commits, and ends the pool's threads."""
    while not core.step().caught_up:
        pass
    core.commit()
    core.calls.close()


def _set_write_fault(fault) -> None:  # metadata.sqlite_io calls it inside every transaction
    sqlite_io.write_fault = fault


def test_a_batchs_writes_are_flushed_while_the_next_batch_runs_and_read_as_before(
    data_dir, tmp_path, early_set_aside
):
    source = load_source(data_dir, 60, 1500, seed=13)  # 25 mutations per document: each read spans batches
    defn = ledger_definition(
        "fn_c",
        "src",
        "ledger",
        workers=1,
        call_log=str(tmp_path / "calls"),
        concurrency=6,
        batch_size=150,
        checkpoint_interval="1h",
    )
    deploy_function(data_dir, defn, ORDERED)
    core = worker(data_dir, "fn_c")
    applied = _spy_set_aside_flushes(core)
    _step_to_the_end(core)
    assert len(applied) >= 3 and sum(applied) > 1000  # most writes were applied beside the next batch's calls
    ledger = open_bucket(data_dir, "ledger")
    report = check_ledger(source, ledger)
    assert report.ok, report.summary()
    assert report.handled == 1500
    assert _histories(ledger, "fn_c") == _seqnos(source)  # each history read saw the writes being flushed


def _seqnos(source) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for vb in range(NUM_VBUCKETS):
        for m in source.read_vb(vb, 0, 10**9):
            out.setdefault(m.key, []).append(m.seqno)
    return out


def _histories(ledger, name: str) -> dict[str, list[int]]:
    prefix = f"h|{name}|"
    return {k[len(prefix) :]: ledger.get(k)["seqs"] for k in ledger.keys(prefix)}


def test_a_flush_failing_beside_the_next_batch_rewinds_and_nothing_is_lost_or_applied_twice(
    data_dir, tmp_path, early_set_aside
):
    source = load_source(data_dir, 60, 1500, seed=17)
    calls = tmp_path / "calls"
    defn = ledger_definition(
        "fn_c",
        "src",
        "ledger",
        workers=1,
        call_log=str(calls),
        concurrency=6,
        batch_size=150,
        checkpoint_interval="1h",
    )
    deploy_function(data_dir, defn, ORDERED)
    core = worker(data_dir, "fn_c")
    applied = _spy_set_aside_flushes(core, fail_at=2)
    with pytest.raises(StoreError, match="disk I/O error"):
        core.step()
    assert len(applied) == 1 and not any(core.positions.values())  # back to the last checkpoint
    _step_to_the_end(core)
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok, report.summary()
    assert report.handled == 1500
    assert sum(len(v) for v in read_call_log(calls).values()) > 1500  # calls ran again after the rewind ...
    assert (
        open_store(data_dir).counters("fn_c")["effects_duplicate"] >= applied[0]
    )  # ... the flushed writes did not


def test_a_step_that_ends_behind_leaves_its_checkpoint_to_the_next_batch_and_a_crash_between_loses_nothing(
    data_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(worker_module, "STEP_SLICE_S", 0.0)  # one batch per step: each ends behind
    source = load_source(data_dir, 100, 1500, seed=21)
    calls = tmp_path / "calls"
    defn = ledger_definition(
        "fn_c",
        "src",
        "ledger",
        workers=1,
        call_log=str(calls),
        concurrency=6,
        batch_size=200,
        checkpoint_interval="1ms",
    )
    deploy_function(data_dir, defn, ORDERED)
    store = open_store(data_dir)

    def checkpointed() -> dict[int, int]:
        return {vb: cp.seqno for vb, cp in store.checkpoints("fn_c").items() if cp.seqno}

    core = worker(data_dir, "fn_c")
    assert core.step().backlog  # the first batch: its writes and checkpoint are left to the next
    first = {vb: seqno for vb, seqno in core.positions.items() if seqno}
    assert checkpointed() == {} and not open_bucket(data_dir, "ledger").keys("e|")
    assert core.step().backlog  # the second batch's calls ran beside them
    assert checkpointed() == first
    assert len(open_bucket(data_dir, "ledger").keys("e|")) == 200
    core.calls.close()  # the process dies with the second batch's writes and checkpoint not written
    run(data_dir)
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok, report.summary()
    assert report.handled == 1500
    assert sum(len(v) for v in read_call_log(calls).values()) - 1500 == 200  # the second batch ran again
    counters = open_store(data_dir).counters("fn_c")
    # Counters go with checkpoints: the dead process's last batch counts once, as the run that handled it
    # again; its effects had not applied, so none was a duplicate.
    assert counters["mutations_seen"] == 1500 and counters.get("effects_duplicate", 0) == 0
    assert counters["effects_applied"] == sum(open_bucket(data_dir, "ledger").logged_writes("").values())


def test_a_checkpoint_left_by_a_step_is_written_before_the_vbuckets_are_released(
    data_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(worker_module, "STEP_SLICE_S", 0.0)
    source = load_source(data_dir, 100, 1500, seed=23)
    defn = ledger_definition(
        "fn_c",
        "src",
        "ledger",
        workers=1,
        call_log=str(tmp_path / "calls"),
        concurrency=6,
        batch_size=200,
        checkpoint_interval="1ms",
    )
    deploy_function(data_dir, defn, ORDERED)
    core = worker(data_dir, "fn_c")
    core.step()
    core.step()
    final = core.stop()  # as a rebalance or an undeploy does
    core.calls.close()
    assert sum(final.values()) == 400
    assert sum(cp.seqno for cp in open_store(data_dir).checkpoints("fn_c").values()) == 400
    assert len(open_bucket(data_dir, "ledger").keys("e|")) == 400
    run(data_dir)
    assert check_ledger(source, open_bucket(data_dir, "ledger")).ok


CAS_COUNTS = """
def on_update(doc, meta):
    key = f"n|{meta.id}"
    seen = ledger.get_result(key)
    if seen.success:
        got = ledger.replace(key, {"n": seen.doc["n"] + 1}, cas=seen.meta.cas)
    else:
        got = ledger.insert(key, {"n": 1})
    if not got.success:
        raise RuntimeError(f"{key}: {got.error}")
"""


def test_a_cas_read_of_a_write_being_flushed_beside_the_call_holds_at_apply(data_dir, early_set_aside):
    """Each document counts its mutations with a read and a cas-conditioned replace; its previous write is
    often being flushed beside the call. The read waits for that write's real cas: no cas_mismatch."""
    source = load_source(data_dir, 40, 1200, seed=29)
    defn = ledger_definition(
        "fn_c", "src", "ledger", workers=1, concurrency=6, batch_size=120, checkpoint_interval="1h"
    )
    deploy_function(data_dir, defn, CAS_COUNTS)
    core = worker(data_dir, "fn_c")
    applied = _spy_set_aside_flushes(core)
    _step_to_the_end(core)
    assert len(applied) >= 3
    store = open_store(data_dir)
    assert store.dlq_rows("fn_c") == []
    ledger = open_bucket(data_dir, "ledger")
    updates: dict[str, int] = {}
    for vb in range(NUM_VBUCKETS):
        for m in source.read_vb(vb, 0, 10**9):
            updates[m.key] = updates.get(m.key, 0) + (m.op == OP_UPDATE)
    assert {key: (ledger.get(f"n|{key}") or {"n": 0})["n"] for key in updates} == updates


def test_vbuckets_found_fenced_by_writes_beside_the_calls_are_dropped_after_the_batch(
    data_dir, tmp_path, early_set_aside, monkeypatch
):
    monkeypatch.setattr(worker_module, "STEP_SLICE_S", 0.0)  # one batch per step: each ends behind
    load_source(data_dir, 200, 3000, seed=31)
    defn = ledger_definition(
        "fn_c",
        "src",
        "ledger",
        workers=1,
        call_log=str(tmp_path / "calls"),
        concurrency=6,
        batch_size=300,
        checkpoint_interval="1h",
    )
    deploy_function(data_dir, defn, ORDERED)
    old = worker(data_dir, "fn_c")
    assert old.step().backlog  # the first batch's writes are set aside, to be written beside the next
    generation = open_store(data_dir).get_function("fn_c").generation
    newer = WorkerCore(WorkerSpec(data_dir, "fn_c", generation, "n/w1", tuple(range(512))))  # takes half over
    report = old.step()  # its writes beside this batch find that half fenced
    old.calls.close()
    newer.close()
    assert report.fenced and set(report.fenced) <= set(range(512))
    assert not set(report.fenced) & set(old.epochs)  # forgotten: no more calls for them


def test_the_next_batchs_rows_are_read_while_the_calls_of_this_one_run(data_dir, tmp_path, early_set_aside):
    source = load_source(data_dir, 60, 600, seed=23)  # 10 mutations per document: its runs span batches
    defn = ledger_definition(
        "fn_c",
        "src",
        "ledger",
        workers=1,
        call_log=str(tmp_path / "calls"),
        concurrency=6,
        batch_size=150,
        checkpoint_interval="1h",
    )
    deploy_function(data_dir, defn, ORDERED)
    core = worker(data_dir, "fn_c")
    pool = core.calls
    rows_read = {"ahead": 0, "between batches": 0}
    read_ahead, read_source = pool._read_ahead, pool._read_source
    reading_ahead = [False]

    def spy_source(vb: int, position: int, limit: int) -> list[tuple]:
        rows = read_source(vb, position, limit)
        rows_read["ahead" if reading_ahead[0] else "between batches"] += len(rows)
        return rows

    def spy_ahead() -> None:
        reading_ahead[0] = True
        try:
            read_ahead()
        finally:
            reading_ahead[0] = False

    pool._read_source, pool._read_ahead = spy_source, spy_ahead
    _step_to_the_end(core)
    # The first batch's rows are read before any call; the others' beside the calls of the batch before.
    assert rows_read["between batches"] == 150
    assert rows_read["ahead"] == 600 - 150
    ledger = open_bucket(data_dir, "ledger")
    report = check_ledger(source, ledger)
    assert report.ok, report.summary()
    assert report.handled == 600
    assert _histories(ledger, "fn_c") == _seqnos(source)


@pytest.mark.parametrize("ahead_rows, limit", [(5, 3), (5, 5), (5, 9), (0, 4), (3, 1)])
def test_rows_read_ahead_are_what_the_source_would_answer(data_dir, ahead_rows, limit):
    source = load_source(data_dir, 20, 600, seed=29)
    deploy_function(data_dir, ledger_definition("fn_c", "src", "ledger", workers=1, concurrency=4), ORDERED)
    pool = worker(data_dir, "fn_c").calls
    vb = max(range(NUM_VBUCKETS), key=lambda v: len(source.read_vb_rows(v, 0, 100)))
    position = source.read_vb_rows(vb, 0, 2)[-1][1]  # rows read ahead follow this position
    pool._ahead = {vb: (position, source.read_vb_rows(vb, position, ahead_rows))}
    assert pool.read_rows(vb, position, limit) == source.read_vb_rows(vb, position, limit)
    rest = pool._ahead.get(vb)
    if rest is not None:  # what was left over follows the rows taken, and is taken as they would be read
        follows = source.read_vb_rows(vb, position, limit)[-1][1]
        assert rest[0] == follows and pool.read_rows(vb, follows, 2) == source.read_vb_rows(vb, follows, 2)
    # Rows read ahead after another position are not used: a rewound position reads from the source.
    pool._ahead = {vb: (position + 1, [("not", "these")])}
    assert pool.read_rows(vb, position, limit) == source.read_vb_rows(vb, position, limit)
    pool.close()


def test_a_read_ahead_that_fails_leaves_the_batch_whole_and_the_next_reads_its_rows(
    data_dir, tmp_path, early_set_aside
):
    source = load_source(data_dir, 60, 600, seed=31)
    defn = ledger_definition(
        "fn_c",
        "src",
        "ledger",
        workers=1,
        call_log=str(tmp_path / "calls"),
        concurrency=6,
        batch_size=150,
        checkpoint_interval="1h",
    )
    deploy_function(data_dir, defn, ORDERED)
    core = worker(data_dir, "fn_c")
    pool = core.calls
    read_ahead = pool._read_ahead
    failed = [0]

    def failing() -> None:  # a disk that fails the read ahead of every other batch
        failed[0] += 1
        if failed[0] % 2:
            raise StoreError("cannot read bucket 'src': disk I/O error")
        read_ahead()

    pool._read_ahead = failing
    core.step()  # every batch's calls end before its step returns, whatever the read ahead did
    assert pool._queue.empty() and pool._done.empty()
    core.stop()  # its checkpoint covers what the step handled, with the effects
    handled = {vb: seqno for vb, seqno in open_store(data_dir).checkpoints("fn_c").items()}
    ledger = open_bucket(data_dir, "ledger")
    assert (
        sum(len(v) for v in _histories(ledger, "fn_c").values())
        == sum(cp.seqno for cp in handled.values())
        > 0
    )
    run(data_dir)
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok, report.summary()
    assert report.handled == 600 and failed[0] >= 2
