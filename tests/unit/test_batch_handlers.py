"""on_batch(batch) on the in-process runtime: the worker's batch in one call, in seqno order per vBucket,
read in bulk or as rows alike; failed items and the later mutations of their documents retried, the others'
writes kept once (the ledger check counts them); dead letters with every attempt's error; a batch that
raises, overruns execution_timeout or writes outside its items; a worker abandoned mid-batch; dlq replay of
an item; curl's keys per item; and the settings on_batch does not take."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.retry import parse_attempts
from eventing.errors import HandlerLoadError
from eventing.ops import dlq as dlq_ops
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import open_bucket
from eventing.testing import (
    BATCH_LEDGER_HANDLER,
    check_ledger,
    deploy_function,
    load_source,
    read_call_log,
)
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers.executor import InProcessExecutor
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS


def ledger_batch(name: str, *, fail_every: int = 0, fail_attempts: int = 0, call_log: str = "", **extra):
    return FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "bindings": [{"alias": "ledger", "bucket": "ledger", "access": "rw"}],
            "constants": {
                "FUNCTION": name,
                "CALL_LOG": call_log,
                "SLEEP_MS": 0,
                "FAIL_EVERY": fail_every,
                "FAIL_ATTEMPTS": fail_attempts,
            },
            "checkpoint_interval": "100ms",
            **extra,
        }
    )


def run(data_dir: str) -> None:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors


def letters(data_dir: str, function: str) -> list:
    return open_store(data_dir).dlq_rows(function)


# Records each call's items as (vb, seq, id, deleted, expired, doc, meta's fields) in a file, and the columns.
RECORDING = """
import json

def on_batch(batch):
    revs, countries, deleted = batch.column("rev", -1), batch.column("country"), batch.deleted  # before docs
    assert batch.keys == [item.id for item in batch[:]]
    assert batch.docs == [item.doc for item in batch[:]]
    assert deleted == [item.deleted for item in batch[:]]
    assert revs == [doc.get("rev", -1) if doc else -1 for doc in batch.docs] == batch.column("rev", -1)
    assert countries == [doc and doc.get("country") for doc in batch.docs] == batch.column("country")
    with open(CALLS, "a") as f:
        f.write(json.dumps([
            [item.meta.vb, item.meta.seq, item.id, item.deleted, item.expired, item.doc, item.meta.cas,
             item.meta.expiration, item.idempotency_key == item.meta.idempotency_key]
            for item in batch
        ]) + "\\n")
"""


@pytest.mark.parametrize("own_writes", [False, True], ids=["bulk", "rows"])
def test_on_batch_gets_the_workers_batch_in_seqno_order_per_vbucket(data_dir, tmp_path, own_writes):
    source = load_source(data_dir, 200, 3000, seed=5)
    if own_writes:  # a deployment's own writes in the log: those runs are read as rows (the recursion guard)
        for i in range(0, 200, 3):
            source.upsert(f"customer::{i}", {"own": True}, origin="fn_rec")
    calls = tmp_path / "calls.log"
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_rec",
            "source_bucket": "src",
            "constants": {"CALLS": str(calls)},
            "batch_size": 500,
            "worker_count": 2,
        }
    )
    deploy_function(data_dir, defn, RECORDING)
    run(data_dir)
    batches = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(batches) >= 6 and max(len(b) for b in batches) <= 500 and max(len(b) for b in batches) > 1
    items = [item for batch in batches for item in batch]
    own = 67 if own_writes else 0
    assert len(items) == len({(i[0], i[1]) for i in items}) == source.stats()["mutations"] - own
    for batch in batches:
        last: dict[int, int] = {}
        for vb, seq, *_ in batch:
            assert seq > last.get(vb, 0)
            last[vb] = seq
    rows = (
        {(m.vb, m.seqno): m for m in source.read_vb_all()}
        if hasattr(source, "read_vb_all")
        else {(m.vb, m.seqno): m for vb in range(NUM_VBUCKETS) for m in source.read_vb(vb, 0, 10**6)}
    )
    for vb, seq, key, deleted, expired, doc, cas, expiration, same_key in items:
        m = rows[(vb, seq)]
        assert (key, cas, expiration, deleted, same_key) == (m.key, m.cas, m.expiry, m.op != 0, True)
        assert expired is (m.op == 2)
        if not deleted:
            import msgpack

            assert doc == msgpack.unpackb(m.doc, raw=False)
        else:
            assert doc is None
    counters = open_store(data_dir).counters("fn_rec")
    assert counters["on_update_success"] + counters["on_delete_success"] == len(items)
    assert counters.get("recursion_filtered", 0) == own


def test_failed_items_and_later_mutations_of_their_documents_run_again_and_every_effect_applies_once(
    data_dir, tmp_path
):
    source = load_source(data_dir, 150, 3000, seed=9)
    calls = tmp_path / "calls.log"
    defn = ledger_batch(
        "fn_bl",
        fail_every=4,
        fail_attempts=1,
        call_log=str(calls),
        batch_size=400,
        retry={"max_attempts": 3, "initial_backoff": "1ms"},
    )
    deploy_function(data_dir, defn, BATCH_LEDGER_HANDLER)
    run(data_dir)
    report = check_ledger(source, open_bucket(data_dir, "ledger"), function="fn_bl")
    assert report.ok, report.summary()
    assert report.handled == 3000 and not letters(data_dir, "fn_bl")
    counters = open_store(data_dir).counters("fn_bl")
    assert counters["retries"] > 0
    # Calls are at least once: the later mutations of a failed item's document ran in both attempts.
    per_doc = read_call_log(calls)
    assert sum(len(set(v)) for v in per_doc.values()) == 3000
    assert sum(len(v) for v in per_doc.values()) > 3000


def test_items_failing_every_attempt_are_dead_lettered_with_each_attempts_error(data_dir):
    source = load_source(data_dir, 100, 1500, seed=3)
    defn = ledger_batch(
        "fn_bd", fail_every=5, fail_attempts=99, retry={"max_attempts": 2, "initial_backoff": "1ms"}
    )
    deploy_function(data_dir, defn, BATCH_LEDGER_HANDLER)
    run(data_dir)
    rows = letters(data_dir, "fn_bd")
    assert rows and all(row.reason == "error" and row.attempts == 2 for row in rows)
    assert rows[0].error.startswith("on_batch reported the item failed: rev ") and rows[0].error.endswith(
        " declined"
    )
    assert [a["attempt"] for a in parse_attempts(rows[0].traceback)] == [1, 2]
    # The later mutations of a dead-lettered document were handled (after it, as one call a mutation would).
    report = check_ledger(
        source,
        open_bucket(data_dir, "ledger"),
        function="fn_bd",
        dead_letters={(r.vb, r.seqno) for r in rows},
    )
    assert report.ok, report.summary()
    assert report.handled + report.dead_lettered == 1500 and report.dead_lettered == len(rows)


def test_a_batch_that_raises_fails_its_items_and_a_non_retryable_error_dead_letters_them_at_once(
    data_dir, tmp_path
):
    source = LocalBucket.create(data_dir, "src")
    handler = """
def on_batch(batch):
    with open(CALLS, "a") as f:
        f.write("call\\n")
    if any(doc and doc.get("poison") for doc in batch.docs):
        raise ValueError("poisoned batch")
    for item in batch:
        out[item.id] = item.doc
"""
    calls = tmp_path / "calls.log"
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_raise",
                "source_bucket": "src",
                "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
                "constants": {"CALLS": str(calls)},
                "retry": {"max_attempts": 5, "non_retryable": ["ValueError"]},
            }
        ),
        handler,
    )
    for i in range(20):
        source.upsert(f"k{i}", {"i": i, "poison": i == 7})
    run(data_dir)
    rows = letters(data_dir, "fn_raise")
    assert len(rows) == 20 and len(calls.read_text().splitlines()) == 1  # one call, no retry
    assert all(
        r.error == "ValueError: poisoned batch (non_retryable: ValueError)" and r.attempts == 1 for r in rows
    )
    assert "Traceback" in rows[0].traceback and "poisoned batch" in rows[0].traceback
    assert LocalBucket.open(data_dir, "out").keys() == []


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "    out['total'] = {'n': len(batch)}\n",
            "BindingError: on_batch wrote through a binding while no item was current",
        ),
        ("    return 'oops'\n", "TypeError: on_batch returned str; return None when every item succeeded"),
        ("    return [len(batch) + 5]\n", "TypeError: on_batch returned"),
    ],
)
def test_writes_outside_items_and_bad_return_values_fail_the_batch_with_one_clear_line(
    data_dir, body, message
):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_bad",
                "source_bucket": "src",
                "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            }
        ),
        "def on_batch(batch):\n" + body,
    )
    source.upsert("a", {})
    source.upsert("b", {})
    run(data_dir)
    rows = letters(data_dir, "fn_bad")
    assert len(rows) == 2 and all(r.error.startswith(message) for r in rows)
    assert LocalBucket.open(data_dir, "out").keys() == []


def test_writes_made_with_an_item_current_belong_to_it(data_dir):
    source = LocalBucket.create(data_dir, "src")
    handler = """
def on_batch(batch):
    results = {key: doc["n"] * 2 for key, doc in zip(batch.keys, batch.docs)}  # one "bulk request"
    failed = []
    for item in batch:
        with item:
            out[item.id] = {"double": results[item.id]}
        if item.doc["n"] == 3:
            failed.append(item)
    return failed
"""
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_with",
                "source_bucket": "src",
                "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            }
        ),
        handler,
    )
    for i in range(6):
        source.upsert(f"k{i}", {"n": i})
    run(data_dir)
    out = LocalBucket.open(data_dir, "out")
    assert {k: out.get(k) for k in out.keys()} == {f"k{i}": {"double": 2 * i} for i in range(6) if i != 3}
    assert [r.key for r in letters(data_dir, "fn_with")] == ["k3"]


def test_a_batch_past_execution_timeout_dead_letters_its_items_as_timeout(data_dir):
    source = LocalBucket.create(data_dir, "src")
    handler = """
import time

def on_batch(batch):
    if any(doc.get("slow") for doc in batch.docs):
        time.sleep(5)
"""
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_slow",
                "source_bucket": "src",
                "execution_timeout": "300ms",
                "retry": {"max_attempts": 3},
            }
        ),
        handler,
    )
    for i in range(5):
        source.upsert(f"k{i}", {"slow": i == 2})
    run(data_dir)
    rows = letters(data_dir, "fn_slow")
    assert len(rows) == 5 and {r.reason for r in rows} == {"timeout"} and {r.attempts for r in rows} == {1}


def test_a_worker_abandoned_mid_batch_applies_each_items_writes_once(data_dir):
    source = load_source(data_dir, 120, 2000, seed=2)
    deploy_function(
        data_dir,
        ledger_batch(
            "fn_ab",
            fail_every=6,
            fail_attempts=1,
            batch_size=300,
            checkpoint_interval="1h",
            retry={"max_attempts": 2, "initial_backoff": "1ms"},
        ),
        BATCH_LEDGER_HANDLER,
    )
    generation = open_store(data_dir).get_function("fn_ab").generation
    first = WorkerCore(WorkerSpec(data_dir, "fn_ab", generation, "n/w0", tuple(range(NUM_VBUCKETS))))
    first.step(budget=300)
    first.step(budget=300)
    first.flush_effects()  # two batches' effects applied ... and the process dies before its checkpoint
    load_source(data_dir, 120, 1000, seed=4)  # more mutations of the same documents, after the replayed ones
    second = WorkerCore(WorkerSpec(data_dir, "fn_ab", generation, "n/w1", tuple(range(NUM_VBUCKETS))))
    while not second.step().caught_up:
        pass
    second.commit()
    report = check_ledger(source, open_bucket(data_dir, "ledger"), function="fn_ab")
    assert report.ok, report.summary()
    assert report.handled == 3000
    assert (
        open_store(data_dir).counters("fn_ab")["effects_duplicate"] > 0
    )  # the replayed items' writes skipped


def test_dlq_replay_runs_on_batch_on_the_letters_item_alone(data_dir):
    source = LocalBucket.create(data_dir, "src")
    handler = """
def on_batch(batch):
    failed = []
    for item in batch:
        if item.doc.get("declined") and out.get("fixed") is None:
            failed.append((item, "declined"))
        else:
            out[item.id] = {"paid": True, "key": item.idempotency_key}
    return failed
"""
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_rp",
                "source_bucket": "src",
                "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            }
        ),
        handler,
    )
    for i in range(8):
        source.upsert(f"k{i}", {"declined": i in (2, 5)})
    run(data_dir)
    assert sorted(r.key for r in letters(data_dir, "fn_rp")) == ["k2", "k5"]
    out = LocalBucket.open(data_dir, "out")
    out.upsert("fixed", {})
    report = dlq_ops.replay(data_dir, "fn_rp", dlq_ops.DlqSelector(everything=True))
    assert report.replayed == 2 and report.writes_applied == 2
    assert out.get("k2")["paid"] is True
    keys = {out.get(f"k{i}")["key"] for i in range(8)}
    assert len(keys) == 8  # the replayed items carry their own mutation's key, like the others


class Keys(BaseHTTPRequestHandler):
    seen: list[dict] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with Keys.lock:
            Keys.seen.append({"body": body, "key": self.headers.get("Idempotency-Key")})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_curl_sends_each_items_key_and_the_batchs_own_outside_items(data_dir):
    Keys.seen = []
    source = LocalBucket.create(data_dir, "src")
    handler = """
def on_batch(batch):
    curl("POST", api, {"body": {"bulk": batch.keys}})
    for item in batch:
        curl("POST", api, {"body": {"item": item.id, "key": item.idempotency_key}})
"""
    with serve_http(Keys) as httpd:
        deploy_function(
            data_dir,
            FunctionDefinition.from_dict(
                {
                    "name": "fn_ck",
                    "source_bucket": "src",
                    "url_bindings": [{"alias": "api", "url": url_of(httpd)}],
                }
            ),
            handler,
        )
        for i in range(10):
            source.upsert(f"k{i}", {})
        run(data_dir)
    items = [r for r in Keys.seen if "item" in r["body"]]
    bulk = [r for r in Keys.seen if "bulk" in r["body"]]
    assert len(items) == 10 and all(r["key"] == r["body"]["key"] for r in items)
    assert bulk and all(r["key"].startswith("b") for r in bulk)
    assert not {r["key"] for r in bulk} & {r["key"] for r in items}


@pytest.mark.parametrize(
    "handler, extra, message",
    [
        (
            "def on_batch(batch):\n    pass\n\ndef on_update(doc, meta):\n    pass\n",
            {},
            "defines on_batch(batch) and on_update",
        ),
        ("def on_batch(batch):\n    pass\n", {"concurrency": 4}, "which concurrency 4 does not take"),
        (
            "def on_batch(batch):\n    pass\n",
            {"previous_version": True},
            "which previous_version does not take",
        ),
        ("def on_batch(a, b):\n    pass\n", {}, "on_batch(a, b) cannot be called as on_batch(batch)"),
    ],
)
def test_on_batch_alongside_on_update_or_with_settings_it_cannot_take_is_refused_at_save(
    data_dir, handler, extra, message
):
    LocalBucket.create(data_dir, "src")
    defn = FunctionDefinition.from_dict({"name": "fn_no", "source_bucket": "src", **extra})
    with pytest.raises(HandlerLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lifecycle.save_function(data_dir, defn, handler)
        lifecycle.deploy(data_dir, "fn_no")


def test_on_batch_counts_each_item_like_a_call(data_dir):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict({"name": "fn_count", "source_bucket": "src"}),
        "def on_batch(batch):\n    return [i for i in range(len(batch)) if batch.docs[i] and "
        "batch.docs[i]['bad']]\n",
    )
    for i in range(10):
        source.upsert(f"k{i}", {"bad": i < 3})
    source.delete("k9")
    run(data_dir)
    counters = defaultdict(int, open_store(data_dir).counters("fn_count"))
    assert (counters["on_update_success"], counters["on_update_failure"], counters["on_delete_success"]) == (
        7,
        3,
        1,
    )
    assert counters["mutations_seen"] == 11 and counters["dlq_error"] == 3


XATTRS_BATCH = """
def on_batch(batch):
    for item in batch:
        out[item.id + "@" + str(item.meta.seq)] = {"xattrs": item.xattrs, "deleted": item.deleted}
"""


def test_batch_items_carry_their_mutations_user_xattrs(data_dir):
    from eventing.core import xattrs as X
    from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
    from eventing.storage.values import Write

    source = load_source(data_dir, 40, 200)  # plain vBuckets: read in bulk
    source.write([Write("t1", OP_UPDATE, encode_document({}), xattrs=X.encode({"a": 1, "_sys": 2}))])
    source.write([Write("t1", OP_UPDATE, encode_document({"n": 2}))])  # keeps them
    source.write([Write("t1", OP_UPDATE, encode_document({"n": 3}), xattrs=X.encode({"b": 2}))])
    source.write([Write("t1", OP_DELETE)])
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_bx",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy_function(data_dir, defn, XATTRS_BATCH)
    run(data_dir)
    out = open_bucket(data_dir, "out")
    seen = {key: doc for key, doc, _ in out.scan()}
    assert len(seen) == 204
    tagged = sorted(
        (int(key[3:]), doc["xattrs"], doc["deleted"]) for key, doc in seen.items() if key.startswith("t1@")
    )
    assert [row[1:] for row in tagged] == [
        ({"a": 1}, False),
        ({"a": 1}, False),
        ({"b": 2}, False),
        ({}, True),
    ]
    assert all(doc["xattrs"] == {} for key, doc in seen.items() if not key.startswith("t1@"))


UNDECODABLE = """
def on_batch(batch):
    values = batch.docs if WHOLE else batch.column("rev")
    for item, value in zip(batch, values):
        out[item.id + "@" + str(item.meta.seq)] = {"got": value}
"""


@pytest.mark.parametrize("whole", [True, False], ids=["docs", "column"])
def test_a_document_that_cannot_be_decoded_is_dead_lettered_when_its_batch_reads_it_whole(data_dir, whole):
    from eventing.core.mutation import OP_UPDATE, encode_document
    from eventing.storage.values import Write

    source = load_source(data_dir, 40, 200)  # plain vBuckets: read in bulk
    bad = b"\x82\xa3rev\x07\xa4name\xa1\xff"  # {"rev": 7, "name": <a byte that is not UTF-8>}
    source.write([Write("t1", OP_UPDATE, bad)])
    source.write([Write("t1", OP_UPDATE, encode_document({"rev": 8}))])
    name = f"fn_undecodable_{whole}"
    defn = FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "constants": {"WHOLE": whole},
        }
    )
    deploy_function(data_dir, defn, UNDECODABLE)
    run(data_dir)
    seen = {key: doc["got"] for key, doc, _ in open_bucket(data_dir, "out").scan()}
    got = sorted((int(key[3:]), value) for key, value in seen.items() if key.startswith("t1@"))
    if (
        whole
    ):  # its item is dead-lettered, nothing it wrote kept; the next mutation of the document is handled
        assert [value for _, value in got] == [{"rev": 8}]
        (letter,) = letters(data_dir, name)
        assert (letter.key, letter.reason) == ("t1", "undecodable")
        assert "utf-8" in letter.error.lower()
    else:  # the field it asked for decodes: both mutations handled
        assert [value for _, value in got] == [7, 8]
        assert letters(data_dir, name) == []
    assert len(seen) == 200 + len(got)
