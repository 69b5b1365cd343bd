"""JavaScript handlers on V8 through the in-process executor: Couchbase's documented examples that need no
SQL++ (each with the example's input and output documents), bucket maps and couchbase.* accessors, timers,
curl against a local HTTP server, execution_timeout and the heap limit enforced inside V8, a throw dead-
lettered with its JavaScript stack, refusals at deploy, per-document order and exactly-once effects."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from eventing.api import Eventing
from eventing.errors import EventingError, HandlerLoadError
from eventing.ops import dlq as dlq_ops
from eventing.testing.http_peer import serve_http, url_of

pytest.importorskip("STPyV8")

DST = [{"alias": "dst", "bucket": "dst", "access": "rw"}]


def app_with(data_dir: str, source: str, *, bindings=DST, docs=(), **settings) -> Eventing:
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    for b in bindings:
        app.create_bucket(b["bucket"])
    for key, doc in docs:
        app.upsert("src", key, doc)
    definition = {
        "name": "fn_js",
        "source_bucket": "src",
        "language": "javascript",
        "bindings": list(bindings),
        **settings,
    }
    app.deploy(definition, source)
    return app


def run(app: Eventing) -> None:
    summary = app.run(until_caught_up=True)
    assert not summary.errors, summary.errors


def letters(app: Eventing) -> list:
    return dlq_ops.list_rows(app.data_dir, "fn_js")


# -- Couchbase's documented examples --------------------------------------------------------------------


def test_data_enrichment_example_adds_the_numeric_ip_fields(data_dir):
    """Follows Couchbase's 'Data Enrichment' example: the documented input document gets ip_num_start and
    ip_num_end, computed from its IP strings, written back under the same key."""
    source = """
function OnUpdate(doc, meta) {
    log('document', doc);
    doc["ip_num_start"] = get_numip_first_3_octets(doc["ip_start"]);
    doc["ip_num_end"] = get_numip_first_3_octets(doc["ip_end"]);
    dst[meta.id] = doc;
}
function get_numip_first_3_octets(ip) {
    var return_val = 0;
    if (ip) {
        var parts = ip.split('.');
        return_val = (parts[0] * (256 * 256 * 256)) + (parts[1] * (256 * 256)) + (parts[2] * 256) + parseInt(parts[3]);
        return return_val;
    }
}
"""  # noqa: E501
    document = {"country": "AD", "ip_end": "5.62.60.9", "ip_start": "5.62.60.1"}
    app = app_with(data_dir, source, docs=[("ip_info::1", document)])
    run(app)
    assert app.get("dst", "ip_info::1") == {**document, "ip_num_start": 87964673, "ip_num_end": 87964681}
    log_text = (Path(data_dir) / "logs" / "fn_js.log").read_text()
    # Couchbase writes each log() argument as JSON, strings quoted
    assert 'ip_info::1 "document" {"country":"AD","ip_end":"5.62.60.9","ip_start":"5.62.60.1"}' in log_text


def test_cascade_delete_example_removes_the_deleted_users_documents(data_dir):
    """Follows Couchbase's 'Cascade Delete' example: deleting a user document deletes the documents keyed
    by that user in the bound bucket (here kept by the handler itself, as the example's input set)."""
    source = """
function OnUpdate(doc, meta) {
    if (doc.type === 'user') { dst['profile::' + meta.id] = {user: meta.id, name: doc.name}; }
}
function OnDelete(meta, options) {
    log('deleting documents of', meta.id, 'expired:', options.expired);
    delete dst['profile::' + meta.id];
}
"""
    app = app_with(
        data_dir,
        source,
        docs=[("user::1", {"type": "user", "name": "Ada"}), ("user::2", {"type": "user", "name": "Bob"})],
    )
    run(app)
    assert app.get("dst", "profile::user::1") == {"user": "user::1", "name": "Ada"}
    app.remove("src", "user::1")
    run(app)
    assert app.get("dst", "profile::user::1") is None
    assert app.get("dst", "profile::user::2") == {"user": "user::2", "name": "Bob"}


def test_basic_bucket_ops_example_reads_writes_and_deletes_through_the_map(data_dir):
    """Follows Couchbase's 'basicBucketOps' scriptlet: read the document back through the binding, write a
    copy, update it, and delete a scratch document, all with the bucket map operators."""
    source = """
function OnUpdate(doc, meta) {
    var id = meta.id;
    dst[id + '::scratch'] = {tmp: true};
    var copy = dst[id];
    if (copy === undefined) { copy = {}; }
    copy.seen = (copy.seen || 0) + 1;
    copy.value = doc.value;
    dst[id] = copy;
    delete dst[id + '::scratch'];
    if (dst[id + '::scratch'] !== undefined) { throw new Error('delete not visible'); }
}
"""
    app = app_with(data_dir, source, docs=[("doc::1", {"value": 1})])
    run(app)
    app.upsert("src", "doc::1", {"value": 2})
    run(app)
    assert app.get("dst", "doc::1") == {"seen": 2, "value": 2}
    assert app.get("dst", "doc::1::scratch") is None


def test_advanced_accessor_examples_give_couchbase_result_objects(data_dir):
    """Follows Couchbase's advancedGetOp / advancedInsertOp / advancedReplaceOp / advancedIncrementOp /
    advancedMutateInField scriptlets: each result has success, doc, meta (id, cas) or error."""
    source = """
function OnUpdate(doc, meta) {
    var out = {};
    out.missing = couchbase.get(dst, {id: 'nope'});
    out.insert = couchbase.insert(dst, {id: 'adv::1'}, {a: 1});
    out.again = couchbase.insert(dst, {id: 'adv::1'}, {a: 2});
    var got = couchbase.get(dst, {id: 'adv::1'});
    out.get = {success: got.success, doc: got.doc, id: got.meta.id, has_cas: typeof got.meta.cas === 'string'};
    out.replace = couchbase.replace(dst, {id: 'adv::1', cas: got.meta.cas}, {a: 3}).success;
    out.stale = couchbase.replace(dst, {id: 'adv::1', cas: got.meta.cas}, {a: 4}).error;
    out.counter = couchbase.increment(dst, {id: 'adv::count'}).doc;
    out.counter2 = couchbase.decrement(dst, {id: 'adv::count'}).doc;
    out.mutate = couchbase.mutateIn(dst, {id: 'adv::1'}, [couchbase.MutateInSpec.upsert('b.c', 7)]).success;
    out.lookup = couchbase.lookupIn(dst, {id: 'adv::1'}, [couchbase.LookupInSpec.get('b.c')]).doc;
    out.deleted = couchbase.delete(dst, {id: 'adv::1'}).success;
    dst['result'] = out;
}
"""  # noqa: E501
    app = app_with(data_dir, source, docs=[("go", {})])
    run(app)
    out = app.get("dst", "result")
    assert out["missing"]["success"] is False and out["missing"]["error"]["key_not_found"] is True
    assert out["insert"]["success"] is True and out["insert"]["meta"]["id"] == "adv::1"
    assert out["again"]["error"]["key_already_exists"] is True
    assert out["get"] == {"success": True, "doc": {"a": 1}, "id": "adv::1", "has_cas": True}
    assert out["replace"] is True
    assert out["stale"]["cas_mismatch"] is True
    assert out["counter"] == {"count": 1} and out["counter2"] == {"count": 0}
    assert out["mutate"] is True and out["lookup"] == [
        {"value": 7, "success": True}
    ]  # Couchbase's lookupIn doc
    assert out["deleted"] is True and app.get("dst", "adv::1") is None


def test_the_cas_insert_and_upsert_return_is_the_documents_real_cas(data_dir):
    source = """
function OnUpdate(doc, meta) {
    var up = couchbase.upsert(dst, {id: meta.id}, {v: 1});
    var ins = couchbase.insert(dst, {id: meta.id + ':i'}, {v: 2});
    var read = couchbase.get(dst, {id: meta.id});
    var replaced = couchbase.replace(dst, {id: meta.id, cas: up.meta.cas}, {v: 3});
    dst[meta.id + ':cas'] = {upsert: up.meta.cas, insert: ins.meta.cas, read: read.meta.cas,
                             replaced: replaced.meta.cas, replace_ok: replaced.success};
}
"""
    keys = [f"k{i}" for i in range(4)]
    app = app_with(data_dir, source, docs=[(k, {}) for k in keys])
    run(app)
    with app.state.open_bucket("dst") as dst:
        told = []
        for key in keys:
            seen = app.get("dst", key + ":cas")
            assert seen["read"] == seen["upsert"] and seen["replace_ok"] is True
            assert dst.get_doc(key + ":i")[1] == int(seen["insert"])
            assert dst.get_doc(key)[1] == int(seen["replaced"])  # the last write of the key: its cas
            told += [seen["upsert"], seen["insert"], seen["replaced"]]
    assert len(set(told)) == len(told)


def test_builtins_and_constants(data_dir):
    source = """
function OnUpdate(doc, meta) {
    dst['b'] = {crc: crc_64_go_iso('123456789'), crc64: crc64(doc), b64: base64Encode('hi'),
                back: base64Decode(base64Encode('hi')), limit: LIMIT,
                f32: base64Float32ArrayDecode(base64Float32ArrayEncode([1.5, -2]))};
}
"""
    app = app_with(data_dir, source, docs=[("k", {"x": 1})], constants={"LIMIT": 10})
    run(app)
    from eventing.handler import crc64

    assert app.get("dst", "b") == {
        "crc": "b90956c775a41001",
        "crc64": crc64({"x": 1}),
        "b64": "aGk=",
        "back": "hi",
        "limit": 10,
        "f32": [1.5, -2],
    }


# -- failures ----------------------------------------------------------------------------------------------


def test_a_throw_is_a_dead_letter_with_the_javascript_stack_and_no_partial_writes(data_dir):
    source = """
function OnUpdate(doc, meta) {
    dst['partial::' + meta.id] = {};
    check(doc);
    dst[meta.id] = doc;
}
function check(doc) {
    if (doc.bad) { throw new TypeError('bad document ' + doc.n); }
}
"""
    app = app_with(data_dir, source, docs=[("ok", {"n": 1}), ("bad", {"n": 2, "bad": True})])
    run(app)
    rows = letters(app)
    assert [(r.key, r.reason) for r in rows] == [("bad", "error")]
    assert rows[0].error == "TypeError: bad document 2"  # JavaScript's Name: message, as Couchbase shows it
    assert "at check (fn_js.js:8" in rows[0].traceback and "at OnUpdate (fn_js.js:4" in rows[0].traceback
    assert app.get("dst", "partial::bad") is None and app.get("dst", "ok") == {"n": 1}


# The loop's host calls run Python: the worker's SIGALRM may raise HandlerTimeout in a weakref callback one
# of them runs, where Python prints it and drops it; the guard raises it again (hang_guard.TIMEOUT_REPEAT_S).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_endless_loop_is_stopped_at_execution_timeout_and_the_worker_goes_on(data_dir):
    source = """
function OnUpdate(doc, meta) {
    if (doc.spin) { while (true) { try { dst['x']; } catch (e) {} } }
    dst[meta.id] = {ok: true};
}
"""
    docs = [("a", {}), ("spin", {"spin": True}), ("b", {})]
    app = app_with(data_dir, source, docs=docs, execution_timeout="300ms")
    started = time.monotonic()
    run(app)
    assert time.monotonic() - started < 20
    assert [(r.key, r.reason) for r in letters(app)] == [("spin", "timeout")]
    assert app.get("dst", "a") == {"ok": True} and app.get("dst", "b") == {"ok": True}


def test_a_call_past_the_heap_limit_is_stopped(data_dir):
    source = """
function OnUpdate(doc, meta) {
    if (doc.hog) { var a = []; while (true) { a.push({n: a.length, s: 'x' + a.length}); } }
    dst[meta.id] = {ok: true};
}
"""
    app = app_with(
        data_dir,
        source,
        docs=[("hog", {"hog": True}), ("fine", {})],
        js_heap_limit_mb=32,
        execution_timeout="20s",
    )
    run(app)
    rows = letters(app)
    assert [(r.key, r.reason) for r in rows] == [("hog", "error")], [(r.key, r.error) for r in rows]
    assert "js_heap_limit_mb (32 MiB)" in rows[0].error
    assert app.get("dst", "fine") == {"ok": True}


def test_array_buffers_taken_at_once_past_the_heap_limit_fail_the_call(data_dir):
    """A 3 GiB ArrayBuffer taken in microseconds (not touched, so not resident), too fast for the watchdog:
    external memory, which the heap size leaves out, counts toward js_heap_limit_mb when the call returns,
    garbage or not."""
    source = """
function OnUpdate(doc, meta) {
    if (doc.hog) { var a = new ArrayBuffer(3 * 1024 * 1024 * 1024); return; }
    dst[meta.id] = {ok: true};
}
"""
    app = app_with(data_dir, source, docs=[("hog", {"hog": True}), ("fine", {})], js_heap_limit_mb=64)
    run(app)
    rows = letters(app)
    assert [(r.key, r.reason) for r in rows] == [("hog", "error")]
    assert (
        "heap and its ArrayBuffers passed js_heap_limit_mb (64 MiB); the call failed when it returned"
        in rows[0].error
    )
    assert app.get("dst", "hog") is None and app.get("dst", "fine") == {"ok": True}


def test_array_buffers_filled_past_the_heap_limit_stop_the_call_while_it_runs(data_dir):
    """Typed arrays filled one after another (resident memory): the watchdog stops the call at
    js_heap_limit_mb, long before the 512 MiB it would take."""
    source = """
function OnUpdate(doc, meta) {
    if (doc.hog) { var a = []; for (var i = 0; i < 64; i++) { var b = new Uint8Array(8 * 1024 * 1024); b.fill(1); a.push(b); } }
    dst[meta.id] = {ok: true};
}
"""  # noqa: E501
    app = app_with(
        data_dir,
        source,
        docs=[("hog", {"hog": True}), ("fine", {})],
        js_heap_limit_mb=64,
        execution_timeout="20s",
    )
    run(app)
    rows = letters(app)
    assert [(r.key, r.reason) for r in rows] == [("hog", "error")]
    assert "heap and its ArrayBuffers passed js_heap_limit_mb (64 MiB); the call was stopped" in rows[0].error
    assert app.get("dst", "fine") == {"ok": True}


def test_array_buffers_dropped_by_every_call_never_add_up_to_the_heap_limit(data_dir):
    """Calls on pool threads that each fill 24 MiB of typed arrays and drop them: V8 frees dropped
    ArrayBuffers late, so without a collection once a quarter of the limit was dropped, a call started
    with its predecessors' and was stopped at 64 MiB though it took 24."""
    source = """
function OnUpdate(doc, meta) {
    var a = []; for (var i = 0; i < 6; i++) { var b = new Uint8Array(4 * 1024 * 1024); b.fill(1); a.push(b); }
    var t = Date.now(); while (Date.now() - t < 15) {}  // long enough for the watchdog to measure it
    dst[meta.id] = {v: doc.v, n: a.length};
}
"""
    app = app_with(
        data_dir,
        source,
        docs=[(f"k{i}", {"v": i}) for i in range(30)],
        js_heap_limit_mb=64,
        concurrency=4,
        execution_timeout="20s",
    )
    run(app)
    assert letters(app) == []
    assert all(app.get("dst", f"k{i}") == {"v": i, "n": 6} for i in range(30))


def test_a_handler_is_not_charged_with_another_handlers_memory_in_the_same_isolate():
    """Handlers loaded in one thread share its V8 isolate, whose statistics cannot tell their contexts
    apart: each is measured from what the isolate held when its context was made, so one keeping 48 MiB
    does not stop another's calls under a 32 MiB limit."""
    from eventing.execution.javascript import load_js_handler
    from eventing.handler import Meta

    meta = Meta(
        "k",
        1,
        0,
        1,
        0,
        0,
        "json",
        {"bucket_name": "src", "scope_name": "_default", "collection_name": "_default"},
    )
    big = load_js_handler(
        "fn_big",
        "var keep = new Uint8Array(48 * 1024 * 1024); keep.fill(1);\n"
        "function OnUpdate(doc, meta) { keep[doc.v] = 2; }",
        {},
        heap_limit_mb=128,
    )
    small = load_js_handler(
        "fn_small", "var n = 0; function OnUpdate(doc, meta) { n += doc.v; }", {}, heap_limit_mb=32
    )
    for v in range(5):
        big.on_update({"v": v}, meta)
        small.on_update({"v": v}, meta)
    big.__js_handler__.close()
    small.__js_handler__.close()


def test_syntax_errors_and_sql_are_refused_at_deploy_with_the_line(data_dir):
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    definition = {"name": "fn_js", "source_bucket": "src", "language": "javascript", "bindings": DST}
    with pytest.raises(HandlerLoadError, match=r"syntax error at line 3: SyntaxError: Unexpected token"):
        app.deploy(definition, "function OnUpdate(doc, meta) {\n  var a = 1;\n  var b = ;\n}\n")
    with pytest.raises(
        HandlerLoadError, match=r"line 3: SQL\+\+ \(N1QL\(\)\) is not supported; read and write"
    ):
        app.deploy(
            definition,
            "function OnUpdate(doc, meta) {\n  // N1QL( in a comment is fine\n  N1QL('SELECT 1');\n}\n",
        )
    with pytest.raises(HandlerLoadError, match=r"line 2: inline SQL\+\+ is not supported"):
        app.deploy(
            definition, "function OnUpdate(doc, meta) {\n  var rows = SELECT * FROM `src` LIMIT 1;\n}\n"
        )
    with pytest.raises(HandlerLoadError, match=r"line 2: Analytics"):
        app.deploy(definition, "function OnUpdate(doc, meta) {\n  couchbase.analyticsQuery('SELECT 1');\n}\n")
    with pytest.raises(HandlerLoadError, match="defines neither OnUpdate"):
        app.deploy(definition, "function onupdate(doc, meta) {}\n")
    with pytest.raises(EventingError, match="language of function 'fn_js' is 'ruby'"):
        app.deploy({**definition, "language": "ruby"}, "")
    # a string that merely contains the words is fine
    app.deploy(definition, "function OnUpdate(doc, meta) { log('SELECT * FROM x; N1QL( xattrs'); }\n")


# -- timers and curl -----------------------------------------------------------------------------------------


def test_timers_fire_the_named_javascript_function_and_cancel(data_dir):
    """Follows Couchbase's 'simpleTimer' and 'Cancel or Overwrite Timer' examples: a timer per document,
    its context handed to the callback; a later mutation cancels it."""
    source = """
function OnUpdate(doc, meta) {
    if (doc.cancel) { dst['cancelled::' + doc.target] = {found: cancelTimer(Remind, doc.target)}; return; }
    var when = new Date();
    when.setMilliseconds(when.getMilliseconds() + 10);
    createTimer(Remind, when, meta.id, {id: meta.id, email: doc.email});
}
function Remind(context) {
    dst['reminder::' + context.id] = {to: context.email};
}
"""
    app = app_with(
        data_dir,
        source,
        docs=[
            ("order::1", {"email": "a@example.com"}),
            ("order::2", {"email": "b@example.com"}),
            ("x", {"cancel": True, "target": "order::2"}),
        ],
    )
    deadline = time.monotonic() + 30
    while app.get("dst", "reminder::order::1") is None and time.monotonic() < deadline:
        run(app)
    assert app.get("dst", "reminder::order::1") == {"to": "a@example.com"}
    assert app.get("dst", "cancelled::order::2") == {"found": True}
    run(app)
    assert app.get("dst", "reminder::order::2") is None
    stats = app.stats("fn_js")
    assert stats.to_dict()["timers"]["fired"] == 1


def test_curl_reaches_a_url_binding(data_dir):
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            payload = json.dumps({"accepted": body["id"]}).encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    with serve_http(Handler) as server:
        source = """
function OnUpdate(doc, meta) {
    var r = curl('POST', crm, {path: '/orders', body: {id: meta.id, total: doc.total}});
    dst['crm::' + meta.id] = {status: r.status, body: r.body};
}
"""
        url = url_of(server, "/api")
        app = app_with(
            data_dir,
            source,
            docs=[("order::1", {"total": 40})],
            url_bindings=[{"alias": "crm", "url": url, "auth": "bearer", "token": "secret"}],
        )
        run(app)
    assert seen == [{"path": "/api/orders", "body": {"id": "order::1", "total": 40}, "auth": "Bearer secret"}]
    assert app.get("dst", "crm::order::1") == {"status": 201, "body": {"accepted": "order::1"}}


class _Slow(BaseHTTPRequestHandler):
    """Answers every GET after 50 ms on kept connections; counts the requests in flight at once."""

    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    flight = {"now": 0, "max": 0}

    def do_GET(self):  # noqa: N802 - http.server's name
        with _Slow.lock:
            _Slow.flight["now"] += 1
            _Slow.flight["max"] = max(_Slow.flight["max"], _Slow.flight["now"])
        time.sleep(0.05)
        with _Slow.lock:
            _Slow.flight["now"] -= 1
        payload = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_javascript_calls_run_at_once_with_concurrency_in_order_per_document_and_time_out_alone(data_dir):
    source = """
function OnUpdate(doc, meta) {
    if (doc.spin) { while (true) {} }
    var r = curl('GET', api, {path: '/x'});
    if (r.status !== 200) { throw new Error('service answered ' + r.status); }
    var seen = dst['seen::' + meta.id] || {versions: []};
    seen.versions.push(doc.v);
    dst['seen::' + meta.id] = seen;
    couchbase.increment(dst, {id: 'calls'});
}
"""
    _Slow.flight = {"now": 0, "max": 0}
    with serve_http(_Slow) as server:
        app = app_with(
            data_dir,
            source,
            docs=[],
            concurrency=8,
            execution_timeout="1s",
            url_bindings=[{"alias": "api", "url": url_of(server)}],
        )
        for v in range(6):
            for k in range(16):
                app.upsert("src", f"k{k}", {"v": v})
        app.upsert("src", "spin", {"spin": True})
        started = time.monotonic()
        run(app)
        elapsed = time.monotonic() - started
    for k in range(16):
        assert app.get("dst", f"seen::k{k}")["versions"] == list(range(6)), [
            (r.key, r.reason, r.error) for r in letters(app)
        ]
    assert app.get("dst", "calls") == {"count": 96}
    assert [(r.key, r.reason) for r in letters(app)] == [("spin", "timeout")]
    # 96 calls of 50 ms one at a time take 4.8 s; eight at once, 0.6 s (the endless loop is stopped at 1 s).
    assert _Slow.flight["max"] >= 4 and elapsed < 4


# -- order and exactly-once ----------------------------------------------------------------------------------


def test_every_version_in_order_and_each_effect_once(data_dir):
    source = """
function OnUpdate(doc, meta) {
    var seen = dst['seen::' + meta.id] || {versions: []};
    seen.versions.push(doc.v);
    dst['seen::' + meta.id] = seen;
    couchbase.increment(dst, {id: 'calls'});
}
"""
    app = app_with(data_dir, source, docs=[], worker_count=2)
    for v in range(30):
        for k in range(4):
            app.upsert("src", f"k{k}", {"v": v})
    run(app)
    for k in range(4):
        assert app.get("dst", f"seen::k{k}") == {"versions": list(range(30))}
    assert app.get("dst", "calls") == {"count": 120}
    run(app)  # a second run has nothing left to do: no effect applies twice
    assert app.get("dst", "calls") == {"count": 120}
    assert letters(app) == []


def test_dlq_replay_runs_the_fixed_javascript_handler(data_dir):
    source = (
        "function OnUpdate(doc, meta) { if (!dst['fixed']) { throw new Error('not yet'); } dst[meta.id] = "
        "doc; }\n"
    )
    app = app_with(data_dir, source, docs=[("k", {"n": 1})])
    run(app)
    assert [r.key for r in letters(app)] == ["k"]
    app.upsert("dst", "fixed", {})
    report = dlq_ops.replay(app.data_dir, "fn_js", dlq_ops.DlqSelector(everything=True))
    assert (report.replayed, report.failed) == (1, 0)
    assert app.get("dst", "k") == {"n": 1}


def test_couchbase_76_template_namespaced_builtins_and_couchbase_vectors(data_dir):
    """Couchbase 7.6's default template (OnUpdate with xattrs), the helpers on `couchbase`, EventingError,
    and the vectors of Couchbase's own crc_64_go_iso test (tests/functional_tests/hcode/crc_64_go_iso.js)."""
    source = """
function OnUpdate(doc, meta, xattrs) {
    var c = couchbase.crc_64_go_iso;
    var out = {xattrs: xattrs, crc: [c("hello"), c(1), c([1,2,3,4]), c({"my_key":"my_value"}), c(null), c(false),
                                     c(undefined), c(Symbol("hey")), c(new Date("2024-05-10"))]};
    try { c(12345678901234567890123456123456n); out.bigint = 'no error'; } catch (e) { out.bigint = e.name; }
    out.b64 = [couchbase.base64Encode(function () {}), base64Encode(Symbol('s')), base64Encode(undefined)];
    out.nul = base64Decode(base64Encode('\\u0000a\\u0000b')) === '\\u0000a\\u0000b';
    try { couchbase.base64Float32ArrayEncode('abc'); } catch (e) {
        out.notArray = [e instanceof EventingError, e instanceof Error, e.name, e.message];
    }
    try { base64Float64ArrayEncode([1, 'x']); } catch (e) { out.notNumber = e.message; }
    try { base64Float32ArrayDecode('AAA='); } catch (e) { out.badLength = e.message; }
    out.roundTrip = couchbase.base64Float64ArrayDecode(couchbase.base64Float64ArrayEncode([0.1, -3, 1e300]));
    out.crc64 = couchbase.crc64({"x": 1}) === crc64({"x": 1});
    out.helpers = ['log', 'curl', 'createTimer', 'cancelTimer'].map(function (n) { return typeof couchbase[n]; });
    out.errors = [new EventingError('m') instanceof Error, new KVError('k').name, new N1QLError().name];
    couchbase.upsert(dst, {id: 'arr'}, {a: [1, 2]});
    var m = couchbase.mutateIn(dst, {id: 'arr'}, [couchbase.MutateInSpec.arrayPrepend('a', 0),
        couchbase.MutateInSpec.arrayInsert('a[2]', 1.5), couchbase.MutateInSpec.arrayAddUnique('a', 3)]);
    out.dup = couchbase.mutateIn(dst, {id: 'arr'}, [couchbase.MutateInSpec.arrayAddUnique('a', 3)]).error;
    out.mutate = m.success;
    dst['out'] = out;
}
"""  # noqa: E501
    app = app_with(data_dir, source, docs=[("k", {"x": 1})])
    run(app)
    out = app.get("dst", "out")
    assert out["xattrs"] == {}
    assert out["crc"] == [
        "3c3eeee2d8100000",
        "4320000000000000",
        "3b8002901291a293",
        "756fe1c0128e6be0",
        "3eeef9ddb0000000",
        "32cc7ee410300000",
        "fcd0dd899002d36d",
        "fcd0dd899002d36d",
        "508adbb2e62fe363",
    ]
    assert out["bigint"] == "TypeError"
    assert (
        out["b64"] == ["dW5kZWZpbmVk"] * 3
    )  # JSON.stringify gives undefined: "undefined", as Couchbase's C++ reads it
    assert out["nul"] is True
    assert out["notArray"] == [True, True, "EventingError", "Argument must be of type Array"]
    assert out["notNumber"] == "Array elements should be of type Number"
    assert out["badLength"] == "Incorrect base64 string provided"
    assert out["roundTrip"] == [0.1, -3, 1e300] and out["crc64"] is True
    assert out["helpers"] == ["function"] * 4 and out["errors"] == [True, "KVError", "N1QLError"]
    assert out["mutate"] is True and app.get("dst", "arr") == {"a": [0, 1, 1.5, 2, 3]}
    assert out["dup"]["field_exists"] is True
