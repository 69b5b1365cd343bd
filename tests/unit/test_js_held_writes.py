"""A JavaScript call's binding writes cross to the host together (js_prelude, "Held binding writes"): with
the call's next map read, before any other host call that sees bindings, or as what the call returns. What
the handler sees must not change: reads see every write made before them, a write the host refuses still
throws at its assignment, and the debugger's trace lists the writes where they ran."""

from __future__ import annotations

import json

import pytest

from eventing.api import Eventing
from eventing.cli import main
from eventing.execution.javascript import JsHandler
from eventing.ops import dlq as dlq_ops
from eventing.storage.factory import open_bucket

pytest.importorskip("STPyV8")


def app_with(data_dir: str, source: str, docs, **settings) -> Eventing:
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    app.create_bucket("ro")
    for key, doc in docs:
        app.upsert("src", key, doc)
    app.deploy(
        {
            "name": "fn_js",
            "source_bucket": "src",
            "language": "javascript",
            "bindings": [
                {"alias": "dst", "bucket": "dst", "access": "rw"},
                {"alias": "ro", "bucket": "ro", "access": "r"},
            ],
            **settings,
        },
        source,
    )
    return app


class HostCalls:
    """Counts JavaScript's host calls by the name of the host function each made."""

    def __init__(self, monkeypatch):
        self.names: list[str] = []
        real = JsHandler.guarded

        def counted(handler, fn, *args):
            self.names.append(fn.__name__)
            return real(handler, fn, *args)

        monkeypatch.setattr(JsHandler, "guarded", counted)


LEDGER = """
function OnUpdate(doc, meta) {
  dst["e|" + meta.id] = {seq: meta.seq};
  var history = dst["h|" + meta.id] || {seqs: []};
  history.seqs.push(meta.seq);
  dst["h|" + meta.id] = history;
  dst["n|" + meta.id] = {n: doc.n};
}
function OnDelete(meta, options) {
  dst["d|" + meta.id] = {deleted: true};
  dst["d2|" + meta.id] = {deleted: true};
}
"""


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_calls_writes_cross_with_its_next_read_and_when_it_returns(data_dir, monkeypatch, concurrency):
    calls = HostCalls(monkeypatch)
    app = app_with(data_dir, LEDGER, [(f"k{i}", {"n": i}) for i in range(12)], concurrency=concurrency)
    app.upsert("src", "k1", {"n": 100})  # a second version: its history lists both calls
    app.remove("src", "k2")  # OnDelete: a call of its own (__call), two writes
    app.run(until_caught_up=True)
    dst = open_bucket(data_dir, "dst")
    assert dst.get("h|k1")["seqs"] == [1, 2] and dst.get("n|k1") == {"n": 100}
    assert all(dst.get(f"e|k{i}") is not None and dst.get(f"n|k{i}") == {"n": i} for i in range(12) if i != 1)
    assert dst.get("d|k2") == {"deleted": True} and dst.get("d2|k2") == {"deleted": True}
    if concurrency > 1:  # every call alone (__update, __call): three writes and a read in one crossing
        assert calls.names.count("get") == 13 and calls.names.count("set_") == 0
        assert calls.names.count("puts") == 0  # the deletion's two writes came back with its call
    else:  # a run of updates and deletes in one crossing (__batch): its writes cross one by one, as before
        assert calls.names.count("set_") == 3 * 13 + 2


def test_reads_and_other_host_calls_see_the_writes_held_before_them(data_dir, monkeypatch):
    calls = HostCalls(monkeypatch)
    source = """
function OnUpdate(doc, meta) {
  dst["a"] = {v: 1};
  var seen = {has: "a" in dst, read: dst["a"].v};
  dst["b"] = {v: 2};
  seen.get = couchbase.get(dst, {id: "b"}).doc.v;
  dst["c"] = {v: 3};
  delete dst["c"];
  seen.deleted = dst["c"] === undefined;
  dst["d"] = {v: 4};
  delete dst["d"];
  dst["d"] = {v: 5};
  dst["seen"] = seen;
}
"""
    app = app_with(data_dir, source, [("k", {})], concurrency=2)
    app.run(until_caught_up=True)
    dst = open_bucket(data_dir, "dst")
    assert dst.get("seen") == {"has": True, "read": 1, "get": 2, "deleted": True}
    assert (dst.get("a"), dst.get("b"), dst.get("c"), dst.get("d")) == ({"v": 1}, {"v": 2}, None, {"v": 5})
    # held writes crossed with the reads, and alone (puts) before couchbase.get and the deletes
    assert calls.names.count("set_") == 0 and calls.names.count("puts") == 3


def test_a_write_the_host_refuses_still_throws_at_its_assignment(data_dir):
    source = """
function attempt(name, write) {
  try { write(); dst["ok|" + name] = {}; } catch (e) { dst["caught|" + name] = {message: e.message}; }
}
function OnUpdate(doc, meta) {
  var deep = {};
  for (var i = 0; i < 950; i++) { deep = {d: deep}; }
  attempt("long", function () { dst["k".repeat(251)] = {}; });
  attempt("marked", function () { dst["\\u0001k"] = {}; });
  attempt("deep", function () { dst["deep"] = deep; });
  attempt("big", function () { dst["big"] = {n: 73786976294838210000}; });
  attempt("readonly", function () { ro["x"] = {}; });
  attempt("unicode", function () { dst["ключ"] = {v: 1}; });
  attempt("most", function () { dst["k".repeat(250)] = {v: 2}; });
}
"""
    app = app_with(data_dir, source, [("k", {})], concurrency=2)
    app.run(until_caught_up=True)
    assert not dlq_ops.list_rows(data_dir, "fn_js")
    dst = open_bucket(data_dir, "dst")
    for name, words in [
        ("long", "bytes"),
        ("marked", "reserved"),
        ("deep", "levels deep"),
        ("big", "ut of range"),
        ("readonly", "read-only"),
    ]:
        caught = dst.get(f"caught|{name}")
        assert caught is not None and words in caught["message"], (name, caught)
        assert dst.get(f"ok|{name}") is None
    assert dst.get("ключ") == {"v": 1} and dst.get("k" * 250) == {"v": 2}
    assert dst.get("ok|unicode") == {} and dst.get("ok|most") == {}


def test_a_failed_call_makes_none_of_its_held_writes(data_dir):
    source = """
function OnUpdate(doc, meta) {
  dst["before|" + meta.id] = {};
  if (doc.fail) { throw new Error("no"); }
  dst["after|" + meta.id] = {};
}
"""
    app = app_with(data_dir, source, [("good", {}), ("bad", {"fail": True})], concurrency=2)
    app.run(until_caught_up=True)
    dst = open_bucket(data_dir, "dst")
    assert dst.get("before|good") == {} and dst.get("after|good") == {}
    assert dst.get("before|bad") is None and dst.get("after|bad") is None
    assert [r.key for r in dlq_ops.list_rows(data_dir, "fn_js")] == ["bad"]


def test_the_debugger_traces_a_javascript_handlers_writes_where_they_ran(data_dir, capsys):
    source = """
function OnUpdate(doc, meta) {
  log("first");
  dst[meta.id] = {rev: doc.rev};
  log("second");
  dst[meta.id + "|2"] = {rev: doc.rev};
}
"""
    app_with(data_dir, source, [("alpha", {"rev": 1})])
    code = main(["debug", "fn_js", "--key", "alpha", "--trace", "--data-dir", data_dir, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    events = [(e["event"], e.get("key") or e.get("line")) for e in json.loads(out)["events"]]
    assert [e for e in events if e[0] in ("log", "write")] == [
        ("log", '"first"'),
        ("write", "alpha"),
        ("log", '"second"'),
        ("write", "alpha|2"),
    ]
