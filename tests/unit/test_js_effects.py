"""JavaScript handlers and the effects on the outside world: meta.idempotency_key (the one Python gets, in
OnUpdate, OnDelete and a run of updates taken in one crossing), curl's Idempotency-Key header, retry's
non_retryable JavaScript error names, and a rate limit's wait not counted against execution_timeout."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.api import Eventing
from eventing.core.idempotency import key_base, mutation_key
from eventing.ops import dlq as dlq_ops
from eventing.storage.factory import open_bucket
from eventing.testing.http_peer import serve_http, url_of

pytest.importorskip("STPyV8")


def app_with(data_dir: str, source: str, docs, **settings) -> Eventing:
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    for key, doc in docs:
        app.upsert("src", key, doc)
    app.deploy(
        {
            "name": "fn_js",
            "source_bucket": "src",
            "language": "javascript",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            **settings,
        },
        source,
    )
    return app


def expected_key(data_dir: str, key: str) -> str:
    source = open_bucket(data_dir, "src")
    m = next(m for vb in range(1024) for m in source.read_vb(vb, 0, 10**6) if m.key == key)
    return mutation_key(key_base("fn_js", source.uuid), m.vb, m.seqno)


def test_javascript_metas_carry_the_same_idempotency_key_python_would(data_dir):
    source = """
function OnUpdate(doc, meta) {
  dst[meta.id] = {key: meta.idempotency_key, listed: Object.keys(meta).indexOf("idempotency_key") >= 0};
}
function OnDelete(meta, options) {
  dst["deleted|" + meta.id] = {key: meta.idempotency_key};
}
"""
    app = app_with(data_dir, source, [(f"k{i}", {"n": i}) for i in range(30)])  # a run: taken in one crossing
    app.remove("src", "k3")
    app.run(until_caught_up=True)
    dst = open_bucket(data_dir, "dst")
    for i in range(30):
        got = dst.get(f"k{i}")
        assert (
            got["key"] == expected_key(data_dir, f"k{i}") and got["listed"] is False
        )  # a getter, not a field
    deleted = dst.get("deleted|k3")["key"]
    assert deleted.startswith("m") and deleted != dst.get("k3")["key"]


class Keys(BaseHTTPRequestHandler):
    seen: list[dict] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with Keys.lock:
            Keys.seen.append(
                {"body": body, "key": self.headers.get("Idempotency-Key"), "at": time.monotonic()}
            )
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_javascript_curl_sends_the_key_and_non_retryable_error_names_stop_retries(data_dir):
    Keys.seen = []
    source = """
class PaymentDeclined extends Error {
  constructor(message) { super(message); this.name = "PaymentDeclined"; }
}
function OnUpdate(doc, meta) {
  curl("POST", api, {body: {id: meta.id, key: meta.idempotency_key}});
  if (doc.card === "declined") { throw new PaymentDeclined("card declined"); }
  if (doc.card === "flaky") { throw new Error("gateway unreachable"); }
}
"""
    with serve_http(Keys) as httpd:
        app = app_with(
            data_dir,
            source,
            [("a", {"card": "ok"}), ("b", {"card": "declined"}), ("c", {"card": "flaky"})],
            url_bindings=[{"alias": "api", "url": url_of(httpd)}],
            retry={"max_attempts": 3, "initial_backoff": "1ms", "non_retryable": ["PaymentDeclined"]},
        )
        app.run(until_caught_up=True)
    assert all(r["key"] == r["body"]["key"] for r in Keys.seen)
    sent = {k: [r for r in Keys.seen if r["body"]["id"] == k] for k in "abc"}
    assert (len(sent["a"]), len(sent["b"]), len(sent["c"])) == (1, 1, 3)
    assert len({r["key"] for r in sent["c"]}) == 1
    rows = {r.key: r for r in dlq_ops.list_rows(data_dir, "fn_js")}
    assert rows["b"].attempts == 1 and rows["b"].error.endswith("(non_retryable: PaymentDeclined)")
    assert rows["c"].attempts == 3 and "non_retryable" not in rows["c"].error


def test_a_javascript_call_waiting_for_a_rate_limit_is_not_timed_out(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENTING_LIMITS_DIR", str(tmp_path / "limits"))
    Keys.seen = []
    source = """
function OnUpdate(doc, meta) {
  curl("POST", api, {body: {id: meta.id}});
  dst[meta.id] = {sent: true};
}
"""
    with serve_http(Keys) as httpd:
        app = app_with(
            data_dir,
            source,
            [(f"k{i}", {}) for i in range(8)],
            execution_timeout="1s",
            url_bindings=[{"alias": "api", "url": url_of(httpd), "rate_limit": {"per_second": 4}}],
        )
        app.run(until_caught_up=True)
    times = sorted(r["at"] for r in Keys.seen)
    assert len(times) == 8 and times[-1] - times[0] >= (8 - 1) / 4 * 0.95  # ~1.75 s of waiting in all
    assert not dlq_ops.list_rows(data_dir, "fn_js")  # no call timed out waiting
    assert len(open_bucket(data_dir, "dst").keys()) == 8
