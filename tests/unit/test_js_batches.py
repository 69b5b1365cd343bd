"""JavaScript OnUpdate over a run of mutations in one V8 call (eventing.execution.javascript, "Batches"):
per-mutation outcomes inside one batch (writes kept under each mutation's own seqno, a throw or a timeout in
the middle dead-letters only that mutation), a batch that stops at its time slice, and V8 contexts used
from a thread other than the one that created them."""

from __future__ import annotations

import threading

import pytest

from eventing.api import Eventing
from eventing.core.mutation import OP_DELETE, OP_EXPIRE
from eventing.execution.context import CallContext
from eventing.ops import dlq as dlq_ops
from eventing.storage.values import Write
from eventing.testing import wait_for
from sharding.vbucket import vbucket_of

pytest.importorskip("STPyV8")

from eventing.execution.javascript import load_js_handler  # noqa: E402
from eventing.handler import Meta  # noqa: E402

DST = [{"alias": "dst", "bucket": "dst", "access": "rw"}]


def versions(data_dir: str, source: str, count: int, **settings) -> Eventing:
    """A JavaScript function over `count` versions {"v": 0..count-1} of key "k" (one vBucket: one batch)."""
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    for v in range(count):
        app.upsert("src", "k", {"v": v})
    app.deploy(
        {
            "name": "fn_js",
            "source_bucket": "src",
            "language": "javascript",
            "bindings": DST,
            "retries": 0,
            **settings,
        },
        source,
    )
    return app


def source_seqnos(app: Eventing) -> list[int]:
    vb = vbucket_of("k")
    return [row[1] for row in app.bucket("src").read_vb_rows(vb, 0, 1000)]


def test_a_throw_in_the_middle_of_a_batch_dead_letters_only_that_mutation(data_dir):
    source = """
function OnUpdate(doc, meta) {
    dst['before::' + doc.v] = {seq: meta.seq};
    if (doc.v === 4) { throw new RangeError('v is 4'); }
    dst['after::' + doc.v] = {seq: meta.seq};
}
"""
    app = versions(data_dir, source, 10)
    summary = app.run(until_caught_up=True)
    assert not summary.errors and summary.functions["fn_js"].handled == 10
    seqnos = source_seqnos(app)
    rows = dlq_ops.list_rows(app.data_dir, "fn_js")
    assert [(r.seqno, r.reason, r.error) for r in rows] == [(seqnos[4], "error", "RangeError: v is 4")]
    assert "at OnUpdate (fn_js.js:4" in rows[0].traceback
    dst = app.bucket("dst")
    for v in range(10):
        expected = None if v == 4 else {"seq": seqnos[v]}
        assert dst.get(f"before::{v}") == expected and dst.get(f"after::{v}") == expected
    stats = app.stats("fn_js")
    assert stats.on_update_success == 9 and stats.on_update_failure == 1


def test_each_write_of_a_batch_is_kept_under_its_own_seqno(data_dir):
    """Only the first five of ten mutations write: the effect mark stops at the fifth's seqno (a write kept
    under the batch's first or last seqno would put it elsewhere), and a rerun applies nothing twice."""
    source = """
function OnUpdate(doc, meta) {
    if (doc.v < 5) { couchbase.increment(dst, {id: 'count'}); }
}
"""
    app = versions(data_dir, source, 10)
    app.run(until_caught_up=True)
    seqnos = source_seqnos(app)
    marks = app.bucket("dst").effect_marks("fn_js")
    assert marks[vbucket_of("k")][1] == seqnos[4]
    assert app.get("dst", "count") == {"count": 5}


def test_deletions_run_in_the_batch_in_log_order_with_their_own_outcomes(data_dir):
    """Deletions among the updates run OnDelete inside the same batch, in log order (each write under its
    own seqno), counted as on_delete; one that throws is dead-lettered alone, the batch goes on after it."""
    source = """
function OnUpdate(doc, meta) { dst['seen::' + meta.seq] = {op: 'update', v: doc.v}; }
function OnDelete(meta, options) {
    if (meta.seq % 7 === 0) { throw new Error('delete at ' + meta.seq); }
    dst['seen::' + meta.seq] = {op: 'delete', id: meta.id, expired: options.expired};
}
"""
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    src = app.bucket("src")
    for v in range(30):
        app.upsert("src", "k", {"v": v})
        if v % 3 == 2:  # a deletion, or (every third) an expiry
            src.write([Write("k", OP_EXPIRE if v % 9 == 8 else OP_DELETE)])
    app.deploy(
        {"name": "fn_js", "source_bucket": "src", "language": "javascript", "bindings": DST, "retries": 0},
        source,
    )
    summary = app.run(until_caught_up=True)
    assert not summary.errors
    rows = app.bucket("src").read_vb_rows(vbucket_of("k"), 0, 1000)
    dst = app.bucket("dst")
    thrown = [r[1] for r in rows if r[3] != 0 and r[1] % 7 == 0]
    for r in rows:
        seen = dst.get(f"seen::{r[1]}")
        if r[3] == 0:
            assert seen == {"op": "update", "v": seen["v"]}
        elif r[1] in thrown:
            assert seen is None
        else:
            assert seen == {"op": "delete", "id": "k", "expired": r[3] == OP_EXPIRE}
    letters = dlq_ops.list_rows(app.data_dir, "fn_js")
    assert [(r.seqno, r.reason) for r in letters] == [(s, "error") for s in thrown] and thrown
    stats = app.stats("fn_js")
    assert (stats.on_update_success, stats.on_delete_success, stats.on_delete_failure) == (
        30,
        10 - len(thrown),
        len(thrown),
    )
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)


# The loop's host calls run Python: the worker's SIGALRM may raise HandlerTimeout in a weakref callback one
# of them runs, where Python prints it and drops it; the guard raises it again (hang_guard.TIMEOUT_REPEAT_S).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_timeout_in_the_middle_of_a_batch_stops_only_that_mutation(data_dir):
    source = """
function OnUpdate(doc, meta) {
    if (doc.v === 2) { while (true) { try { dst['x']; } catch (e) {} } }
    couchbase.increment(dst, {id: 'count'});
    dst['v::' + doc.v] = {ok: true};
}
"""
    app = versions(data_dir, source, 6, execution_timeout="300ms")
    summary = app.run(until_caught_up=True)
    assert not summary.errors
    rows = dlq_ops.list_rows(app.data_dir, "fn_js")
    assert [(r.seqno, r.reason) for r in rows] == [(source_seqnos(app)[2], "timeout")]
    assert app.get("dst", "count") == {"count": 5}
    assert [v for v in range(6) if app.get("dst", f"v::{v}") is not None] == [0, 1, 3, 4, 5]


def test_a_batch_longer_than_execution_timeout_stops_at_its_slice_and_goes_on(data_dir):
    """30 mutations of 15 ms each: 450 ms in all, past execution_timeout (200 ms); none is stopped, since
    a batch starts no mutation after its slice (20 ms here) and the rest run in the next batch."""
    source = """
var calls = 0;
function OnUpdate(doc, meta) {
    var start = Date.now();
    while (Date.now() - start < 15) {}
    couchbase.increment(dst, {id: 'count'});
}
"""
    app = versions(data_dir, source, 30, execution_timeout="200ms")
    summary = app.run(until_caught_up=True)
    assert not summary.errors and summary.functions["fn_js"].handled == 30
    assert dlq_ops.list_rows(app.data_dir, "fn_js") == []
    assert app.get("dst", "count") == {"count": 30}


# -- threads ------------------------------------------------------------------------------------------------


def test_a_handler_is_called_from_another_thread_with_a_context_of_that_thread():
    """A context created in one thread and called from another: each thread gets its own context (global
    variables per thread, as per worker), and the first thread's goes on where it was."""
    module = load_js_handler(
        "fn_threads",
        "var n = 0; var out = []; function OnUpdate(doc, meta) { n += 1; log(meta.id, n); }",
        {"log": lambda text: lines.append(text)},
        context=CallContext(5.0),
    )
    lines: list[str] = []
    on_update = module.__dict__["on_update"]
    meta = Meta("a", 1, 0, 1, 0, 0, "json", {"bucket_name": "src"})
    on_update({}, meta)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            on_update({}, meta)
            on_update({}, meta)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and errors == []
    on_update({}, meta)
    assert lines == ['"a" 1', '"a" 1', '"a" 2', '"a" 2']  # log() writes each argument as JSON, as Couchbase
    module.__dict__["__js_handler__"].close()


def test_a_javascript_function_runs_in_the_background_service_thread(data_dir):
    """Eventing.run(until_caught_up=False) runs the service (and in-process workers) in a thread of its
    own."""
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    app.deploy(
        {"name": "fn_js", "source_bucket": "src", "language": "javascript", "bindings": DST},
        "function OnUpdate(doc, meta) { dst[meta.id] = {v: doc.v * 2}; }",
    )
    app.upsert("src", "a", {"v": 1})
    running = app.run(until_caught_up=False)
    try:
        wait_for(lambda: app.get("dst", "a") == {"v": 2}, "the service thread handled 'a'", timeout=60)
        for v in range(20):
            app.upsert("src", "b", {"v": v})
        wait_for(
            lambda: app.get("dst", "b") == {"v": 38},
            "the service thread handled every version of 'b'",
            timeout=60,
        )
    finally:
        running.stop()
    summary = running.wait(timeout=60)
    assert not summary.errors
    assert app.stats("fn_js").on_update_success == 21
