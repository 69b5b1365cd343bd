"""Effects on the outside world on a real local Ray instance, against a real HTTP server on 127.0.0.1:
idempotency keys through kill -9 of workers mid-batch, a `dlq replay` and a rewind (every mutation's key
seen, repeats with the same key, no key shared by two mutations); 4 workers x concurrency 16 held to a URL
binding's rate_limit with nothing dead-lettered; and an on_batch handler reporting partial failures while its
workers are killed, closed by the ledger check."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.http.metrics import render
from eventing.ops import dlq as dlq_ops
from eventing.ops.rewind import rewind
from eventing.ops.stats import function_stats
from eventing.storage.factory import open_bucket
from eventing.testing import BATCH_LEDGER_HANDLER, check_ledger, deploy_function, load_source
from eventing.testing.http_peer import serve_http, url_of
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration


class Recorder(BaseHTTPRequestHandler):
    """Records each request's JSON body, Idempotency-Key and arrival (monotonic); answers 200 after
    `delay_s`."""

    seen: list[dict] = []
    lock = threading.Lock()
    delay_s = 0.0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with Recorder.lock:
            Recorder.seen.append(
                {"body": body, "key": self.headers.get("Idempotency-Key"), "at": time.monotonic()}
            )
        if Recorder.delay_s:
            time.sleep(Recorder.delay_s)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def recorder():
    Recorder.seen, Recorder.delay_s = [], 0.0
    with serve_http(Recorder) as httpd:
        yield url_of(httpd)


def run_killing(data_dir: str, executor, name: str, kills: int, workers: int = 4) -> None:
    """Run the function until caught up, killing a worker process with kill -9 `kills` times mid-batch."""
    service = EventingService(data_dir, executor, until_caught_up=True)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()))
    thread.start()
    killed, pids = 0, []
    deadline = time.monotonic() + 120
    while killed < kills and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.5)
        sup = service.supervisors.get(name)
        if sup is None:
            continue
        slot = sup.slots[f"local/w{killed % workers}"]
        if slot.ready and slot.pid and not slot.caught_up and slot.pid not in pids:
            os.kill(slot.pid, signal.SIGKILL)  # kill -9 mid-batch
            pids.append(slot.pid)
            killed += 1
    thread.join(timeout=300)
    assert killed == kills
    assert not result["summary"].errors


PAYING = """
import time

def on_update(doc, meta):
    time.sleep(0.002)
    curl("POST", api, {"path": "/charge", "body": {"id": meta.id, "seq": meta.seq}})
    if doc.get("rev", 0) % 9 == 0 and out.get("fixed") is None:
        raise RuntimeError("card declined")  # after the request: the server saw it
    out[meta.id] = {"seq": meta.seq}

def on_delete(meta, options):
    curl("POST", api, {"path": "/charge", "body": {"id": meta.id, "seq": meta.seq}})
"""


def test_idempotency_keys_hold_through_kill_9_mid_batch_dlq_replay_and_rewind(
    data_dir, recorder, ray_executor
):
    mutations = 3000
    source = load_source(data_dir, 300, mutations, seed=13)
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_pay",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "url_bindings": [{"alias": "api", "url": recorder}],
            "worker_count": 4,
            "batch_size": 50,
            "checkpoint_interval": "200ms",
        }
    )
    deploy_function(data_dir, defn, PAYING)
    run_killing(data_dir, ray_executor, "fn_pay", kills=2)
    letters = open_store(data_dir).dlq_rows("fn_pay")
    assert letters

    open_bucket(data_dir, "out").upsert("fixed", {})
    report = dlq_ops.replay(data_dir, "fn_pay", dlq_ops.DlqSelector(everything=True))
    assert report.replayed == len(letters)

    lifecycle.pause(data_dir, "fn_pay")
    rewind(data_dir, "fn_pay", to_seqno=0)
    lifecycle.resume(data_dir, "fn_pay")
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors

    keys_of: dict[tuple[str, int], set[str]] = defaultdict(set)
    mutations_of: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for r in Recorder.seen:
        where = (r["body"]["id"], r["body"]["seq"])
        assert r["key"], "every request carries its call's key"
        keys_of[where].add(r["key"])
        mutations_of[r["key"]].add(where)
    every = {(m.key, m.seqno) for vb in range(NUM_VBUCKETS) for m in source.read_vb(vb, 0, 10**6)}
    assert set(keys_of) == every  # every mutation's key was seen
    assert all(len(keys) == 1 for keys in keys_of.values())  # every repeat carried the same key
    assert all(len(where) == 1 for where in mutations_of.values())  # no key shared by two mutations
    assert len(Recorder.seen) > mutations + len(letters)  # repeats: the kills, the replay and the rewind


# The rate-limited server runs in a process of its own, so the arrival times it records are not delayed by
# the test process's threads (the service's driver runs here): one JSON line (monotonic time) per request.
ARRIVALS_SERVER = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

out = open(sys.argv[1], "a", buffering=1)

class Arrivals(BaseHTTPRequestHandler):
    def do_POST(self):
        at = time.monotonic()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out.write(json.dumps({"at": at, "body": json.loads(body)}) + "\\n")
        time.sleep(0.01)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

class Server(ThreadingHTTPServer):
    request_queue_size = 128

httpd = Server(("127.0.0.1", 0), Arrivals)
print(httpd.server_address[1], flush=True)
httpd.serve_forever(poll_interval=0.05)
"""


def test_four_workers_of_concurrency_16_stay_within_a_shared_rate_limit(data_dir, tmp_path, ray_executor):
    rate, burst, mutations = 50, 5, 400
    load_source(data_dir, 400, mutations, seed=3)
    arrivals = tmp_path / "arrivals.jsonl"
    server = subprocess.Popen(
        [sys.executable, "-c", ARRIVALS_SERVER, str(arrivals)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        handler = """
def on_update(doc, meta):
    curl("POST", api, {"path": "/send", "body": {"id": meta.id, "seq": meta.seq}})
    out[meta.id] = {"sent": meta.seq}

def on_delete(meta, options):
    curl("POST", api, {"path": "/send", "body": {"id": meta.id, "seq": meta.seq}})
"""
        deploy_function(
            data_dir,
            FunctionDefinition.from_dict(
                {
                    "name": "fn_rate",
                    "source_bucket": "src",
                    "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
                    "url_bindings": [
                        {"alias": "api", "url": url, "rate_limit": {"per_second": rate, "burst": burst}}
                    ],
                    "worker_count": 4,
                    "concurrency": 16,
                    "execution_timeout": "5s",
                }
            ),
            handler,
        )
        started = time.monotonic()
        summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
        assert not summary.errors
    finally:
        server.kill()
        server.wait()
    times = sorted(json.loads(line)["at"] for line in arrivals.read_text().splitlines())
    assert len(times) == mutations
    most = max(sum(1 for t in times[i:] if t - start < 1.0) for i, start in enumerate(times))
    assert most <= rate + burst, f"{most} requests within one second"
    assert times[-1] - started >= (mutations - burst) / rate * 0.95  # the limit held over the whole run
    assert not open_store(data_dir).dlq_rows("fn_rate")  # backpressure, never a dead letter
    stats = function_stats(data_dir, "fn_rate")
    assert stats["curl"]["curl_throttled_count"] > mutations / 2
    metrics = [
        line
        for line in render(data_dir).decode().splitlines()
        if line.startswith('eventing_curl_throttled_total{function="fn_rate"}')
    ]
    assert metrics and float(metrics[0].split()[-1]) == stats["curl"]["curl_throttled_count"]
    print(
        f"rate_limit {rate}/s burst {burst}, 4 workers x concurrency 16: {mutations} requests, at most "
        f"{most} in one second, {stats['curl']['curl_throttled_count']} waited"
    )


def test_an_on_batch_handler_with_partial_failures_under_kill_9_comes_out_exact(data_dir, ray_executor):
    mutations = 12000
    source = load_source(data_dir, 600, mutations, seed=21)
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_batch",
            "source_bucket": "src",
            "bindings": [{"alias": "ledger", "bucket": "ledger", "access": "rw"}],
            "constants": {
                "FUNCTION": "fn_batch",
                "CALL_LOG": "",
                "SLEEP_MS": 60,
                "FAIL_EVERY": 4,
                "FAIL_ATTEMPTS": 1,
            },
            "worker_count": 4,
            "batch_size": 100,
            "checkpoint_interval": "100ms",
            "retry": {"max_attempts": 3, "initial_backoff": "5ms"},
        }
    )
    deploy_function(data_dir, defn, BATCH_LEDGER_HANDLER)
    run_killing(data_dir, ray_executor, "fn_batch", kills=3)
    report = check_ledger(source, open_bucket(data_dir, "ledger"), function="fn_batch")
    assert report.ok, report.summary()
    assert report.handled == mutations and not open_store(data_dir).dlq_rows("fn_batch")
    counters = open_store(data_dir).counters("fn_batch")
    assert counters["retries"] > 0  # items reported failed ran again, with the later ones of their documents
    cps = open_store(data_dir).checkpoints("fn_batch")
    assert [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()
    print(
        f"on_batch, kill -9 x3: {mutations} mutations exact, {int(counters['retries'])} items retried, "
        f"{int(counters.get('effects_duplicate', 0))} replayed effects skipped"
    )
