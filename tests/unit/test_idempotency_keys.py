"""Idempotency keys of handler calls, against a real HTTP server on 127.0.0.1 that records the
Idempotency-Key of every request: meta.idempotency_key and curl's header are the same for every attempt of
a mutation (a retry, a worker abandoned before its checkpoint, `dlq replay`, a rewind, a redeploy from
`everything`), different for different mutations and functions; a call making several requests sends one
key each; a binding renames the header or sends none; a timer's firings have keys of their own, the same
when it fires again."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.ops import dlq as dlq_ops
from eventing.ops.rewind import rewind
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers.executor import InProcessExecutor
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS


class Keys(BaseHTTPRequestHandler):
    """Records (path, the JSON body, every header whose name ends in 'key') of each request."""

    seen: list[dict] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower().endswith("key")}
        with Keys.lock:
            Keys.seen.append({"path": self.path, "body": body, "headers": headers})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    Keys.seen = []
    with serve_http(Keys) as httpd:
        yield url_of(httpd)


# Posts the mutation with its meta.idempotency_key in the body; fails (after the request) for documents
# marked "fail" until the document `fixed` exists, and the retried call's first attempt fails too.
HANDLER = """
def on_update(doc, meta):
    curl("POST", api, {"path": "/charge", "body": {"id": meta.id, "seq": meta.seq, "key": meta.idempotency_key}})
    if doc.get("twice"):
        curl("POST", api, {"path": "/receipt", "body": {"id": meta.id, "seq": meta.seq}})
    if doc.get("fail") and out.get("fixed") is None:
        raise RuntimeError("declined")
    out[meta.id] = {"seq": meta.seq}
"""  # noqa: E501


def definition(url: str, name: str = "fn_pay", **extra) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "url_bindings": [{"alias": "api", "url": url}],
            "checkpoint_interval": "1h",
            **extra,
        }
    )


def run(data_dir: str) -> None:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors


def charges(path: str = "/charge") -> dict[tuple[str, int], list[str]]:
    """(id, seq) -> the Idempotency-Key of each request the server got for it, in order."""
    out: dict[tuple[str, int], list[str]] = defaultdict(list)
    for r in Keys.seen:
        if r["path"] == path:
            out[(r["body"]["id"], r["body"]["seq"])].append(r["headers"].get("idempotency-key"))
    return out


def test_every_attempt_of_a_mutation_sends_the_same_key_and_no_two_mutations_share_one(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, definition(server, retries=1), HANDLER)
    for i in range(30):
        source.upsert(f"d{i}", {"n": i, **({"fail": True} if i % 5 == 0 else {})})
    source.upsert("d1", {"n": 100})  # a second mutation of d1
    run(data_dir)
    first = charges()
    assert len(first) == 31
    # The body's meta.idempotency_key is the header's, and a retry (the failing ones: 2 attempts) repeats it.
    for (key, seq), sent in first.items():
        assert len(set(sent)) == 1 and sent[0]
        assert len(sent) == (2 if int(key[1:]) % 5 == 0 and seq == 1 else 1)
    assert all(r["body"]["key"] == r["headers"]["idempotency-key"] for r in Keys.seen)
    by_key = {sent[0]: where for where, sent in first.items()}
    assert len(by_key) == 31  # never one key for two mutations (d1's two versions included)
    letters = open_store(data_dir).dlq_rows("fn_pay")
    assert len(letters) == 6

    # dlq replay: the fixed handler runs each letter again, with the key of its mutation.
    LocalBucket.open(data_dir, "out").upsert("fixed", {})
    Keys.seen = []
    report = dlq_ops.replay(data_dir, "fn_pay", dlq_ops.DlqSelector(everything=True))
    assert report.replayed == 6
    replayed = charges()
    assert set(replayed) == {(f"d{i}", 1) for i in range(0, 30, 5)}
    assert all(sent == [first[where][0]] for where, sent in replayed.items())

    # A rewind handles everything again: the same keys.
    lifecycle.pause(data_dir, "fn_pay")
    rewind(data_dir, "fn_pay", to_seqno=0)
    lifecycle.resume(data_dir, "fn_pay")
    Keys.seen = []
    run(data_dir)
    again = charges()
    assert {where: sent[0] for where, sent in again.items()} == {
        where: sent[0] for where, sent in first.items() if where in again
    }
    assert (
        len(again) >= 25
    )  # every mutation but the dead-lettered ones the rewound stream leaves to their letters

    # A redeploy from everything: a new deployment, the same mutations, the same keys.
    lifecycle.undeploy(data_dir, "fn_pay")
    lifecycle.deploy(data_dir, "fn_pay", "everything")
    Keys.seen = []
    run(data_dir)
    redeployed = charges()
    assert set(redeployed) == set(first)
    assert {where: sent[0] for where, sent in redeployed.items()} == {
        where: sent[0] for where, sent in first.items()
    }

    # Another function handling the same mutations gets keys of its own.
    Keys.seen = []
    deploy_function(data_dir, definition(server, name="fn_other"), HANDLER)
    run(data_dir)
    other = {sent[0] for sent in charges().values()}
    assert other and not other & set(by_key)


def test_a_worker_abandoned_before_its_checkpoint_sends_the_same_keys_again(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, definition(server), HANDLER)
    for i in range(40):
        source.upsert(f"k{i}", {"n": i})
    generation = open_store(data_dir).get_function("fn_pay").generation
    first = WorkerCore(WorkerSpec(data_dir, "fn_pay", generation, "n/w0", tuple(range(NUM_VBUCKETS))))
    first.step()
    first.flush_effects()  # the effects are applied ... and the process dies before its checkpoint
    before = {where: sent[0] for where, sent in charges().items()}
    assert len(before) == 40
    second = WorkerCore(WorkerSpec(data_dir, "fn_pay", generation, "n/w1", tuple(range(NUM_VBUCKETS))))
    second.step()
    second.commit()
    after = charges()
    assert all(len(sent) == 2 and sent[1] == before[where] for where, sent in after.items())
    assert open_store(data_dir).counters("fn_pay")["effects_duplicate"] == 40  # the writes applied once


def test_a_call_with_several_requests_sends_each_its_own_key_the_same_at_every_attempt(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, definition(server, retries=1), HANDLER)
    source.upsert("a", {"twice": True, "fail": True})
    run(data_dir)
    charge, receipt = charges()[("a", 1)], charges("/receipt")[("a", 1)]
    assert len(charge) == len(receipt) == 2  # two attempts, two requests each
    assert charge[0] == charge[1] and receipt[0] == receipt[1]
    assert receipt[0] == charge[0] + "-2"  # the call's second request: the key with a suffix


def test_a_binding_renames_the_header_or_sends_none_and_a_handlers_own_header_stays(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    handler = """
def on_update(doc, meta):
    curl("POST", renamed, {"path": "/charge", "body": {"id": meta.id, "seq": meta.seq}})
    curl("POST", silent, {"path": "/charge", "body": {"id": meta.id, "seq": meta.seq}})
    curl("POST", own, {"path": "/charge", "body": {"id": meta.id, "seq": meta.seq},
                       "headers": {"Idempotency-Key": "mine-" + meta.id}})
"""
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_hdr",
                "source_bucket": "src",
                "url_bindings": [
                    {"alias": "renamed", "url": server, "idempotency_header": "X-Request-Key"},
                    {"alias": "silent", "url": server, "idempotency_header": False},
                    {"alias": "own", "url": server},
                ],
            }
        ),
        handler,
    )
    source.upsert("a", {})
    run(data_dir)
    renamed, silent, own = (r["headers"] for r in Keys.seen)
    assert set(renamed) == {"x-request-key"} and len(renamed["x-request-key"]) == 33
    assert silent == {}
    assert own == {"idempotency-key": "mine-a"}


def test_timer_firings_have_keys_of_their_own_the_same_when_fired_again(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    handler = """
import time

def on_update(doc, meta):
    create_timer(remind, time.time(), meta.id, {"id": meta.id})

def remind(context):
    curl("POST", api, {"path": "/remind", "body": {"id": context["id"], "seq": 0}})
    out["reminded|" + context["id"]] = {}
"""
    deploy_function(data_dir, definition(server, name="fn_tm"), handler)
    for i in range(10):
        source.upsert(f"t{i}", {})
    generation = open_store(data_dir).get_function("fn_tm").generation
    first = WorkerCore(WorkerSpec(data_dir, "fn_tm", generation, "n/w0", tuple(range(NUM_VBUCKETS))))
    first.step()
    first.commit()  # the timers are durable
    assert first.fire_timers() == 10
    first.flush_effects()  # ... and the process dies before recording the firings
    second = WorkerCore(WorkerSpec(data_dir, "fn_tm", generation, "n/w1", tuple(range(NUM_VBUCKETS))))
    for _ in range(3):
        second.step()
        second.commit()
    fired = charges("/remind")
    assert len(fired) == 10
    assert all(len(sent) == 2 and sent[0] == sent[1] and sent[0].startswith("t") for sent in fired.values())
    assert len({sent[0] for sent in fired.values()}) == 10
    assert LocalBucket.open(data_dir, "out").logged_writes("reminded|") == {
        f"reminded|t{i}": 1 for i in range(10)
    }
