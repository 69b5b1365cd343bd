"""JavaScript handlers on real Ray worker actors: two workers handle every mutation once and in order through
a bucket binding (V8 batches inside each worker process), and an endless loop is stopped by execution_timeout
inside V8 on a Ray worker: a dead letter, and the worker process goes on."""

from __future__ import annotations

import pytest

from eventing.api import Eventing
from eventing.control.service import EventingService
from eventing.core import counters as counter_names
from eventing.ops import dlq as dlq_ops
from metadata.factory import open_store
from sharding.vbucket import vbucket_of

pytest.importorskip("STPyV8")

pytestmark = pytest.mark.integration

DST = [{"alias": "dst", "bucket": "dst", "access": "rw"}]


def js_function(data_dir: str, source: str, docs, **settings) -> Eventing:
    app = Eventing(data_dir, executor="in-process")  # setup only: the runs below use the Ray executor
    app.create_bucket("src")
    app.create_bucket("dst")
    for key, doc in docs:
        app.upsert("src", key, doc)
    app.deploy(
        {"name": "fn_js", "source_bucket": "src", "language": "javascript", "bindings": DST, **settings},
        source,
    )
    return app


def counters(data_dir: str) -> dict[str, float]:
    with open_store(data_dir, create=False) as store:
        return store.counters("fn_js")


def vbuckets(ranges: str) -> set[int]:
    """ "0-255,300" as the set of vBuckets it names."""
    out: set[int] = set()
    for part in filter(None, ranges.split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def test_two_ray_workers_handle_every_mutation_once_in_order(data_dir, ray_executor):
    source = """
function OnUpdate(doc, meta) {
    var seen = dst['seen::' + meta.id] || {versions: []};
    seen.versions.push(doc.v);
    dst['seen::' + meta.id] = seen;
    couchbase.increment(dst, {id: 'calls::' + (meta.vb % 2)});
}
"""
    keys, rounds = 40, 25
    docs = [(f"k{k}", {"v": v}) for v in range(rounds) for k in range(keys)]
    app = js_function(data_dir, source, docs, worker_count=2)
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors and summary.functions["fn_js"].handled == keys * rounds
    for k in range(keys):
        assert app.get("dst", f"seen::k{k}") == {"versions": list(range(rounds))}
    calls = [(app.get("dst", f"calls::{p}") or {"count": 0})["count"] for p in (0, 1)]
    assert sum(calls) == keys * rounds
    assert dlq_ops.list_rows(data_dir, "fn_js") == []
    owners = app.vbucket_map("fn_js").workers
    assert len(owners) == 2
    key_vbs = {vbucket_of(f"k{k}") for k in range(keys)}
    assert all(key_vbs & vbuckets(w.ranges) for w in owners)  # both workers had keys to handle
    again = EventingService(data_dir, ray_executor, until_caught_up=True).run()  # nothing left: nothing twice
    assert again.functions["fn_js"].handled == 0
    assert sum((app.get("dst", f"calls::{p}") or {"count": 0})["count"] for p in (0, 1)) == keys * rounds


def test_an_endless_loop_on_a_ray_worker_is_stopped_by_execution_timeout(data_dir, ray_executor):
    source = """
function OnUpdate(doc, meta) {
    if (doc.spin) { while (true) {} }
    dst[meta.id] = {v: doc.v};
}
"""
    # One key: every version is in one vBucket, so one worker meets the loop and then the versions after it.
    docs = [("k", {"v": 0}), ("k", {"v": 1, "spin": True}), ("k", {"v": 2}), ("other", {"v": 3})]
    app = js_function(data_dir, source, docs, worker_count=2, execution_timeout="500ms")
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors and summary.functions["fn_js"].handled == 4
    rows = dlq_ops.list_rows(data_dir, "fn_js")
    assert [(r.key, r.reason) for r in rows] == [("k", "timeout")]
    assert "execution_timeout" in rows[0].error and "recycled" not in rows[0].error
    assert app.get("dst", "k") == {"v": 2} and app.get("dst", "other") == {"v": 3}
    assert counters(data_dir).get(counter_names.WORKERS_RECYCLED, 0) == 0  # the worker process lived on
