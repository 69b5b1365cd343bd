"""Advanced bucket accessors (Couchbase's couchbase.* API) and the cas rule under held writes: checked
when the handler calls, checked again atomically when the batch is applied; a conflict there drops the
call's writes to that bucket and dead-letters it as `cas_mismatch`, and no update is ever lost, with
concurrent writers to the same keys from several vBuckets."""

from __future__ import annotations

import threading
import time

from eventing.core.definition import FunctionDefinition
from eventing.ops import dlq as dlq_ops
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS, split_even

ACCESSORS = """
def on_update(doc, meta):
    out = {}
    r = dst.get_result("missing")
    out["get_missing"] = [r.success, r.error]
    out["insert"] = dst.insert("c", {"v": 1}).success
    out["insert_again"] = dst.insert("c", {"v": 2}).error
    r = dst.get_result("c")
    out["pending_cas"] = r.meta.cas > 0
    out["replace_wrong"] = dst.replace("c", {"v": 3}, cas=r.meta.cas + 1).error
    out["replace_ok"] = dst.replace("c", {"v": 3}, cas=r.meta.cas).success
    out["replace_missing"] = dst.replace("nope", {"v": 1}).error
    out["incr"] = [dst.increment("n").value, dst.increment("n", 5).value, dst.decrement("n", 2).value]
    out["upsert_expiry"] = dst.upsert("e", {"v": 1}, expiry=3600).success
    out["expiry_seen"] = dst.get_result("e").meta.expiry > 0
    out["mutate"] = dst.mutate_in("c", [("upsert", "a.b", 1), ("array_append", "list", 7), ("insert", "v", 0)]).error
    out["mutate_ok"] = dst.mutate_in("c", [("upsert", "a.b", 1), ("array_append", "list", 7), ("remove", "v")]).success
    out["lookup"] = dst.lookup_in("c", [("get", "a.b"), ("exists", "v"), ("get", "list")]).value
    out["delete_missing"] = dst.delete("nope").error
    out["touch"] = dst.touch("c", 60).success
    errors = {}
    for name, attempt in {
        "cas_type": lambda: dst.replace("c", {}, cas="abc"),
        "counter": lambda: dst.increment("c"),
        "spec": lambda: dst.mutate_in("c", [("frobnicate", "x", 1)]),
        "expiry": lambda: dst.upsert("x", {}, expiry="soon"),
    }.items():
        try:
            attempt()
        except Exception as exc:
            errors[name] = type(exc).__name__ + ": " + str(exc)
    out["errors"] = errors
    dst["report"] = out
"""  # noqa: E501


def defn(name: str = "fn_acc", workers: int = 1) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            "checkpoint_interval": "1h",
            "worker_count": workers,
        }
    )


def worker(data_dir: str, vbuckets, wid: str = "n/w0", name: str = "fn_acc") -> WorkerCore:
    store = open_store(data_dir)
    generation = store.get_function(name).generation
    store.close()
    return WorkerCore(WorkerSpec(data_dir, name, generation, wid, tuple(vbuckets)))


def test_accessors_return_couchbase_outcomes_and_reject_bad_input(data_dir):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, defn(), ACCESSORS)
    source.upsert("go", {"n": 1})
    w = worker(data_dir, range(NUM_VBUCKETS))
    w.step()
    w.commit()
    dst = LocalBucket.open(data_dir, "dst")
    out = dst.get("report")
    assert out["get_missing"] == [False, "key_not_found"]
    assert (out["insert"], out["insert_again"]) == (True, "key_exists")
    assert out["pending_cas"] and out["replace_wrong"] == "cas_mismatch" and out["replace_ok"]
    assert out["replace_missing"] == "key_not_found" and out["delete_missing"] == "key_not_found"
    assert out["incr"] == [1, 6, 4]
    assert out["upsert_expiry"] and out["expiry_seen"]
    assert out["mutate"] == "path_exists" and out["mutate_ok"]
    assert out["lookup"] == [1, False, [7]]
    assert out["touch"]
    assert dst.get("c") == {"a": {"b": 1}, "list": [7]} and dst.get("n") == {"count": 4}
    assert dst.get_meta("c")["expiry"] > time.time()
    errors = out["errors"]
    assert "cas 'abc' is not a cas" in errors["cas_type"]
    assert "not a counter" in errors["counter"]
    assert "sub-document spec" in errors["spec"] and "not a time" in errors["expiry"]
    assert all(e.startswith("BindingError: ") for e in errors.values())
    counters = open_store(data_dir).counters("fn_acc")
    assert counters["bkt_ops_cas_mismatch_count"] == 1 and counters["bkt_ops_key_not_found_count"] == 3


CAS_UPDATE = """
def on_update(doc, meta):
    r = acct.get_result(doc["acct"])
    if not r.success:
        created = acct.insert(doc["acct"], {"n": 1, "seen": [meta.id + "@" + str(meta.seq)]})
        if not created.success:  # another worker's insert landed between the read and this call
            raise RuntimeError("insert raced another insert: " + created.error)
        return
    body = r.doc
    result = acct.replace(doc["acct"], {"n": body["n"] + 1, "seen": body["seen"] + [meta.id + "@" + str(meta.seq)]}, cas=r.meta.cas)
    if not result.success:
        raise RuntimeError("cas check failed at call time: " + result.error)
    acct.increment("counter|" + doc["acct"])
"""  # noqa: E501


def cas_setup(data_dir: str, workers: int, updates: int, accounts: int) -> LocalBucket:
    source = LocalBucket.create(data_dir, "src")
    d = FunctionDefinition.from_dict(
        {
            "name": "fn_cas",
            "source_bucket": "src",
            "bindings": [{"alias": "acct", "bucket": "acct", "access": "rw"}],
            "checkpoint_interval": "1h",
            "worker_count": workers,
            "batch_size": 7,
        }
    )
    deploy_function(data_dir, d, CAS_UPDATE)
    for i in range(updates):
        source.upsert(f"u{i}", {"acct": f"a{i % accounts}"})
    return source


def test_a_write_whose_document_changed_after_the_read_is_dead_lettered_and_replay_applies_it(data_dir):
    cas_setup(data_dir, 1, 1, 1)
    acct = LocalBucket.open(data_dir, "acct")
    acct.upsert("a0", {"n": 10, "seen": ["client"]})
    w = worker(data_dir, range(NUM_VBUCKETS), name="fn_cas")
    highs = w.source.high_seqnos()
    w.reader.process(
        [vb for vb in w.epochs if highs[vb]], {vb: highs[vb] for vb in w.epochs}, 100
    )  # read + held write
    acct.upsert("a0", {"n": 50, "seen": ["client", "client"]})  # another writer, between read and flush
    w.flush_effects()
    w.commit()
    assert acct.get("a0") == {"n": 50, "seen": ["client", "client"]}  # the held replace was not applied
    assert acct.get("counter|a0") is None  # nor the call's other writes to that bucket
    store = open_store(data_dir)
    (row,) = store.dlq_rows("fn_cas")
    assert row.reason == "cas_mismatch" and row.key == "u0"
    report = dlq_ops.replay(data_dir, "fn_cas", dlq_ops.DlqSelector(reason="cas_mismatch"))
    assert report.replayed == 1
    assert acct.get("a0")["n"] == 51 and acct.get("counter|a0") == {"count": 1}


def test_concurrent_cas_writers_from_several_vbuckets_lose_no_update(data_dir):
    updates, accounts, workers = 400, 3, 4
    cas_setup(data_dir, workers, updates, accounts)
    plans = split_even(list(range(NUM_VBUCKETS)), workers)
    cores = [worker(data_dir, vbs, wid=f"n/w{i}", name="fn_cas") for i, vbs in enumerate(plans)]
    errors: list[BaseException] = []

    def drive(core: WorkerCore) -> None:
        try:
            for _ in range(500):
                report = core.step(budget=7)
                if report.caught_up:
                    break
            core.commit()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(c,)) for c in cores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = open_store(data_dir)
    acct = LocalBucket.open(data_dir, "acct")
    conflicts = store.find_dlq_rows("fn_cas", reason="cas_mismatch")
    call_failures = store.find_dlq_rows("fn_cas", reason="error")  # inserts that raced another insert
    applied = sum(acct.get(f"a{i}")["n"] for i in range(accounts))
    # Every update either applied (counted in n exactly once) or is a dead letter; none was lost.
    assert conflicts, "the writers never raced; the test proves nothing"
    assert applied + len(conflicts) + len(call_failures) == updates
    for i in range(accounts):
        doc = acct.get(f"a{i}")
        assert doc["n"] == len(doc["seen"]) == len(set(doc["seen"]))
    # Counters never conflict: every applied call's increment is in the count.
    counted = sum((acct.get(f"counter|a{i}") or {"count": 0})["count"] for i in range(accounts))
    assert counted == applied - accounts  # the first update of each account inserts instead
    report = dlq_ops.replay(data_dir, "fn_cas", dlq_ops.DlqSelector(everything=True))
    assert report.failed == 0
    assert sum(acct.get(f"a{i}")["n"] for i in range(accounts)) == updates


CAS_SEEN = """
def on_update(doc, meta):
    up = dst.upsert(meta.id, {"v": 1})
    ins = dst.insert(meta.id + ":i", {"v": 2})
    dst[meta.id + ":plain"] = {"v": 3}
    seen = [dst.get_result(meta.id).meta.cas, dst.get_result(meta.id + ":plain").meta.cas]
    dst[meta.id + ":cas"] = {"upsert": up.meta.cas, "insert": ins.meta.cas, "read": seen[0], "plain": seen[1]}
"""


def test_the_cas_a_handler_gets_for_its_write_is_the_documents_cas_once_applied(data_dir):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, defn(), CAS_SEEN)
    keys = [f"k{i}" for i in range(5)]
    for key in keys:
        source.upsert(key, {"n": 1})
    w = worker(data_dir, range(NUM_VBUCKETS))
    w.step()
    w.commit()
    dst = LocalBucket.open(data_dir, "dst")
    told = []
    for key in keys:
        seen = dst.get(key + ":cas")
        assert seen["read"] == seen["upsert"]  # a read of the pending write: the same cas
        assert dst.get_doc(key)[1] == seen["upsert"]
        assert dst.get_doc(key + ":i")[1] == seen["insert"]
        assert dst.get_doc(key + ":plain")[1] == seen["plain"]
        told += [seen["upsert"], seen["insert"], seen["plain"]]
    assert len(set(told)) == len(told)  # one cas a write, never the same for two documents
