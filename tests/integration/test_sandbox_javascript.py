"""JavaScript functions sandboxed: V8 lives within the sandbox's memory limit, with a pool of threads
(`concurrency` 2, an isolate each), and `curl` reaches the function's URL binding (a real HTTP server)
through the sandbox's TCP rule. A call that takes more ArrayBuffer memory than js_heap_limit_mb is
stopped and dead-lettered with the reason, in the sandbox as outside it, and the worker goes on."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.api import Eventing
from eventing.control.service import EventingService
from eventing.ops import dlq as dlq_ops
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers.executor import InProcessExecutor
from eventing.workers.sandbox.landlock import sandbox_unavailable

pytest.importorskip("STPyV8")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        payload = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def _function(data_dir: str, source: str, docs: int, **settings) -> Eventing:
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    for i in range(docs):
        app.upsert("src", f"k{i}", {"v": i})
    app.deploy(
        {
            "name": "fn_js",
            "source_bucket": "src",
            "language": "javascript",
            "isolation": "sandbox",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            **settings,
        },
        source,
    )
    return app


@pytest.mark.timeout(
    120
)  # a process that dies at start (V8 past the memory limit) would be restarted forever
def test_a_sandboxed_javascript_pool_curls_its_url_binding(data_dir):
    source = """
function OnUpdate(doc, meta) {
    var r = curl('GET', api, {path: '/' + meta.id});
    dst[meta.id] = {status: r.status, path: r.body.path, v: doc.v};
}
"""
    with serve_http(_Echo) as server:
        _function(data_dir, source, 20, concurrency=2, url_bindings=[{"alias": "api", "url": url_of(server)}])
        summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert summary.functions["fn_js"].handled == 20, summary
    app = Eventing(data_dir, executor="in-process")
    for i in range(20):
        assert app.get("dst", f"k{i}") == {"status": 200, "path": f"/k{i}", "v": i}


def test_a_sandboxed_javascript_call_past_its_memory_is_dead_lettered_and_the_process_goes_on(data_dir):
    """One call asks for a 3 GiB ArrayBuffer (beyond the sandbox's memory limit: V8 throws), another fills
    typed arrays past js_heap_limit_mb (the watchdog stops it): two dead letters with their reasons, and the
    same sandboxed process handles the other documents."""
    source = """
var pid = null;
function OnUpdate(doc, meta) {
    if (doc.hog === 'one') { var big = new ArrayBuffer(3 * 1024 * 1024 * 1024); big = null; }
    if (doc.hog === 'many') {
        var a = []; for (var i = 0; i < 64; i++) { var b = new Uint8Array(8 * 1024 * 1024); b.fill(1); a.push(b); }
    }
    dst[meta.id] = {v: doc.v};
}
"""  # noqa: E501
    app = _function(data_dir, source, 10, js_heap_limit_mb=64, execution_timeout="20s")
    app.upsert("src", "hog_one", {"hog": "one"})
    app.upsert("src", "hog_many", {"hog": "many"})
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors, summary.errors
    rows = {r.key: r for r in dlq_ops.list_rows(data_dir, "fn_js")}
    assert sorted(rows) == ["hog_many", "hog_one"], rows
    assert "RangeError: Array buffer allocation failed" in rows["hog_one"].error, rows["hog_one"].error
    assert "passed js_heap_limit_mb (64 MiB)" in rows["hog_many"].error, rows["hog_many"].error
    for i in range(10):
        assert app.get("dst", f"k{i}") == {"v": i}
