"""The debugger against a live service on Ray: debug sessions in other processes, one of them interrupted
with Ctrl-C mid-handler, while the stream keeps flowing; afterwards every mutation was handled exactly
once, each document in seqno order (nothing lost, nothing reordered, nothing applied twice)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket
from eventing.storage.writes import chunked
from eventing.testing import LEDGER_HANDLER, BackgroundLoop, check_ledger, ledger_definition, wait_for
from metadata.factory import open_store
from sharding import NUM_VBUCKETS, vbucket_of

pytestmark = pytest.mark.integration

# The ledger handler; in a process with EVENTING_TEST_DEBUG_SLEEP set (the debugger's, never a worker's)
# it logs and then sleeps that long first, so the test can interrupt it mid-handler.
SLEEPY_LEDGER = (
    LEDGER_HANDLER
    + """
_ledger_update = on_update

def on_update(doc, meta):
    import os, time
    pause = os.environ.get("EVENTING_TEST_DEBUG_SLEEP")
    if pause:
        log("sleeping in the debugger")
        time.sleep(float(pause))
    _ledger_update(doc, meta)
"""
)


def key_in_vb(vb: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(1_000_000) if vbucket_of(f"{prefix}{i}") == vb)


def checkpoint_total(data_dir: str, function: str) -> int:
    return sum(cp.seqno for cp in open_store(data_dir).checkpoints(function).values())


def caught_up(data_dir: str, function: str, source: LocalBucket) -> bool:
    cps = open_store(data_dir).checkpoints(function)
    return bool(cps) and [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()


class Producer(BackgroundLoop):
    """Writes a mutation every few milliseconds, so the stream has work while a debug session runs."""

    interval_s = 0.005

    def __init__(self, data_dir: str):
        super().__init__()
        self.bucket = LocalBucket.open(data_dir, "src")
        self.written = 0

    def tick(self) -> None:
        self.written += 1
        self.bucket.upsert(f"live::{self.written % 97}", {"rev": self.written})


def read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)


def test_debugging_a_live_function_never_takes_a_mutation_out_of_the_stream(data_dir, ray_executor):
    source = LocalBucket.create(data_dir, "src")
    for chunk in chunked(loadgen.generate(300, 2000, seed=7), 5000):
        source.write(chunk)
    defn = ledger_definition("fn_live", "src", "ledger", workers=2, sleep_ms=2, batch_size=50)
    LocalBucket.create(data_dir, "ledger")
    lifecycle.save_function(data_dir, defn, SLEEPY_LEDGER)
    lifecycle.deploy(data_dir, "fn_live")
    service = EventingService(data_dir, ray_executor)
    thread = threading.Thread(target=service.run)
    thread.start()
    cli = [sys.executable, "-m", "eventing", "--data-dir", data_dir]
    try:
        wait_for(lambda: checkpoint_total(data_dir, "fn_live") > 0, "the service makes progress")
        # Both workers live (each owning its half): on a loaded machine the second starts later.
        wait_for(
            lambda: all(
                cp.leased and cp.owner for cp in open_store(data_dir).checkpoints("fn_live").values()
            ),
            "both workers own their vBuckets",
        )

        # A JSON trace of the next mutation of a vBucket, taken in another process while workers run.
        vb = 511  # the last vBucket of worker 0: its backlog is reached last
        source.upsert(key_in_vb(vb, "debug::"), {"rev": 1})
        done = subprocess.run(
            [*cli, "debug", "fn_live", "--vb", str(vb), "--trace", "--json", "--wait", "20"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["mutation"]["vb"] == vb and report["outcome"] == "ok"
        assert report["consumed"] is False and report["applied"] is False
        assert report["checkpoint"]["leased"] and report["checkpoint"]["owner"] == "local/w0"  # owned, live
        assert [e["event"] for e in report["events"]][-1] == "write" and len(report["writes"]) == 2

        # A session interrupted with Ctrl-C mid-handler, while the stream keeps flowing.
        vb = 1023
        source.upsert(key_in_vb(vb, "sleepy::"), {"rev": 1})
        env = {**os.environ, "EVENTING_TEST_DEBUG_SLEEP": "30", "PYTHONUNBUFFERED": "1"}
        with Producer(data_dir) as producer:
            session = subprocess.Popen(
                [*cli, "debug", "fn_live", "--vb", str(vb), "--trace", "--wait", "20"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            lines: queue.Queue[str] = queue.Queue()
            threading.Thread(target=read_lines, args=(session.stdout, lines), daemon=True).start()
            seen: list[str] = []
            deadline = time.monotonic() + 30
            while (
                not any("sleeping in the debugger" in line for line in seen) and time.monotonic() < deadline
            ):
                try:
                    seen.append(lines.get(timeout=0.2))
                except queue.Empty:
                    assert session.poll() is None, session.stderr.read() if session.stderr else ""
            assert any("sleeping in the debugger" in line for line in seen), seen
            flowing_from = checkpoint_total(data_dir, "fn_live")
            wait_for(
                lambda: checkpoint_total(data_dir, "fn_live") > flowing_from + 20,
                "the stream flows meanwhile",
            )
            session.send_signal(signal.SIGINT)
            _, err = session.communicate(timeout=30)
            assert producer.written > 0
        assert session.returncode == 130, err
        assert "was not consumed" in err and f"vBucket {vb}" in err and "Traceback" not in err
        assert any(
            "pulled a copy of vBucket 1023" in line and "owner local/w1, live" in line for line in seen
        ), seen

        wait_for(lambda: caught_up(data_dir, "fn_live", source), "the function catches up")
    finally:
        service.stop()
        thread.join(timeout=60)

    ledger = LocalBucket.open(data_dir, "ledger")
    result = check_ledger(source, ledger, function="fn_live")
    total = sum(source.high_seqnos())
    assert result.ok and result.handled == total, result.summary()
    assert open_store(data_dir).dlq_rows("fn_live") == []
