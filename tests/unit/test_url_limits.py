"""`rate_limit` and `max_in_flight` of URL bindings: the limit shared by threads and processes of this
machine (token bucket and slots in flocked files), a slot freed when its holder is killed, backpressure that
waits instead of timing out or dead-lettering (counted in stats and /metrics), and a 429's Retry-After
pausing the binding's requests. Against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.execution.limits import BindingLimit
from eventing.http.metrics import render
from eventing.ops.stats import function_stats
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Takes `count` tokens of a binding limit in a process of its own, printing the monotonic time of each.
TAKER = """
import sys, time
from pathlib import Path
from eventing.execution.limits import BindingLimit
limit = BindingLimit(Path(sys.argv[1]), "shared", float(sys.argv[2]), 3, None)
for _ in range(int(sys.argv[3])):
    limit.acquire()
    print(time.monotonic(), flush=True)
"""

# Holds slot 0 of a max_in_flight 1 limit until killed.
HOLDER = """
import sys, time
from pathlib import Path
from eventing.execution.limits import BindingLimit
limit = BindingLimit(Path(sys.argv[1]), "held", None, 1, 1)
limit.acquire()
print("holding", flush=True)
time.sleep(600)
"""


def most_in_one_second(times: list[float]) -> int:
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= 1.0:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_processes_and_threads_of_a_machine_share_one_rate(tmp_path):
    rate = 40.0
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TAKER, str(tmp_path), str(rate), "25"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    here = BindingLimit(tmp_path, "shared", rate, 3, None)
    times: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(10):
            here.acquire()
            with lock:
                times.append(time.monotonic())

    threads = [threading.Thread(target=take) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        out, _ = p.communicate(timeout=60)
        times += [float(line) for line in out.split()]
    assert len(times) == 80
    assert most_in_one_second(times) <= rate + 3  # the rate plus the burst, across processes and threads
    assert max(times) - min(times) >= (80 - 3) / rate - 0.05  # no more than the rate allowed overall


def test_a_new_limit_starts_with_its_burst_then_keeps_the_rate(tmp_path):
    limit = BindingLimit(tmp_path, "fresh", per_second=1.0, burst=3, max_in_flight=None)
    try:
        assert [limit._take_token() for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst at once
        assert 0.9 < limit._take_token() <= 1.0  # then one a second
    finally:
        limit.close()


def test_a_slot_held_by_a_killed_process_is_free_again(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        limit = BindingLimit(tmp_path, "held", None, 1, 1)
        got: list = []
        taker = threading.Thread(target=lambda: got.append(limit.acquire()), daemon=True)
        taker.start()
        taker.join(0.3)
        assert not got  # the one slot is held
        os.kill(holder.pid, signal.SIGKILL)
        taker.join(10)
        assert got and got[0][1] == 0
        limit.release(got[0][1])
    finally:
        holder.kill()
        holder.wait()


class Counting(BaseHTTPRequestHandler):
    """Sleeps 30 ms per request and records the requests in flight at once and each start (monotonic)."""

    now = peak = 0
    starts: list[float] = []
    first_busy = True
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with Counting.lock:
            Counting.now += 1
            Counting.peak = max(Counting.peak, Counting.now)
            Counting.starts.append(time.monotonic())
            busy = self.path == "/busy" and Counting.first_busy
            Counting.first_busy = Counting.first_busy and not busy
        time.sleep(0.03)
        with Counting.lock:
            Counting.now -= 1
        self.send_response(429 if busy else 200)
        if busy:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def counting(tmp_path, monkeypatch):
    monkeypatch.setenv("EVENTING_LIMITS_DIR", str(tmp_path / "limits"))  # this test's, not the machine's
    Counting.now = Counting.peak = 0
    Counting.starts, Counting.first_busy = [], True
    with serve_http(Counting) as httpd:
        yield url_of(httpd)


HANDLER = """
def on_update(doc, meta):
    r = curl("POST", api, {"path": doc.get("path", "/x")})
    out[meta.id] = {"status": r.status}
"""


def limited(url: str, binding: dict, **extra) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": "fn_lim",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "url_bindings": [{"alias": "api", "url": url, **binding}],
            **extra,
        }
    )


def run(data_dir: str) -> None:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors


def test_max_in_flight_holds_every_worker_and_pool_thread_to_the_limit(data_dir, counting):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, limited(counting, {"max_in_flight": 3}, worker_count=2, concurrency=8), HANDLER)
    for i in range(60):
        source.upsert(f"k{i}", {})
    run(data_dir)
    assert Counting.peak == 3  # 2 workers x 8 calls at once would have sent up to 16
    assert len(LocalBucket.open(data_dir, "out").keys()) == 60
    store = open_store(data_dir)
    assert not store.dlq_rows("fn_lim")
    assert store.counters("fn_lim")["curl_throttled_count"] > 0


def test_waiting_for_a_rate_limit_is_not_the_handlers_time(data_dir, counting):
    source = LocalBucket.create(data_dir, "src")
    # 10 requests a second for 20 mutations on 4 calls at once: the last waits ~2 s, past execution_timeout.
    defn = limited(
        counting, {"rate_limit": {"per_second": 10, "burst": 1}}, concurrency=4, execution_timeout="1s"
    )
    deploy_function(data_dir, defn, HANDLER)
    for i in range(20):
        source.upsert(f"k{i}", {})
    run(data_dir)
    assert len(LocalBucket.open(data_dir, "out").keys()) == 20
    store = open_store(data_dir)
    assert not store.dlq_rows("fn_lim")  # backpressure, never a timeout or a dead letter
    assert most_in_one_second(Counting.starts) <= 10 + 1
    stats = function_stats(data_dir, "fn_lim")
    assert stats["curl"]["curl_throttled_count"] >= 15 and stats["curl"]["curl_throttled_ms"] >= 2000
    metrics = render(data_dir).decode()
    assert 'eventing_curl_throttled_total{function="fn_lim"}' in metrics
    throttled = [
        line
        for line in metrics.splitlines()
        if line.startswith('eventing_curl_throttled_total{function="fn_lim"}')
    ]
    assert float(throttled[0].split()[-1]) >= 15


def test_a_429_with_retry_after_pauses_the_bindings_requests(data_dir, counting):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, limited(counting, {"max_in_flight": 1}), HANDLER)
    source.upsert("a-busy", {"path": "/busy"})
    run(data_dir)  # answered 429 with Retry-After: 1, which the handler takes as its answer
    source.upsert("b", {})
    source.upsert("c", {})
    run(data_dir)
    assert LocalBucket.open(data_dir, "out").get("a-busy") == {"status": 429}
    first, *later = Counting.starts
    assert len(later) == 2 and min(later) - first >= 1.0  # no request of the binding started within the pause


def test_a_sandboxs_host_makes_its_limited_requests_and_tells_it_the_wait(counting, tmp_path):
    from eventing.execution.curl import HostCurl
    from eventing.execution.limits import Limits

    host = HostCurl(
        [
            {"alias": "api", "url": counting, "rate_limit": {"per_second": 4, "burst": 1}},
            {"alias": "open", "url": counting},
        ],
        1000,
        5.0,
        Limits("fn_sb", "uuid-1", folder=tmp_path),
    )
    first = host.exchange("api", "POST", counting + "/x", b"{}", {}, 2.0)
    second = host.exchange("api", "POST", counting + "/x", b"{}", {}, 2.0)
    assert first[0] == second[0] == "ok" and first[1] == second[1] == 200
    assert (
        first[4] < 0.05 and 0.1 <= second[4] < 1.0
    )  # the second waited for the rate: the child's call moves by it
    assert (
        host.exchange("open", "POST", counting + "/x", b"{}", {}, 2.0)[0] == "error"
    )  # nothing to do for it
