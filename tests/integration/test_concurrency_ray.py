"""`concurrency` on a real local Ray instance: a ledger function running 8 calls at once per worker comes
out exact when its worker processes are killed with kill -9 mid-run, and a pool call that cannot be
interrupted has its worker recycled (the mutation dead-lettered as `timeout`, the others handled)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.storage.factory import create_bucket, open_bucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source, read_call_log
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration


def test_killing_workers_of_a_concurrent_function_mid_run_loses_and_repeats_no_effect(
    data_dir, tmp_path, ray_executor
):
    mutations, kills = 6000, 2
    source = load_source(data_dir, 600, mutations, seed=11)
    calls = tmp_path / "calls.log"
    deploy_function(
        data_dir,
        ledger_definition(
            "fn_ck",
            "src",
            "ledger",
            workers=4,
            call_log=str(calls),
            sleep_ms=8,
            batch_size=200,
            concurrency=8,
        ),
    )
    service = EventingService(data_dir, ray_executor, until_caught_up=True)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()))
    thread.start()
    killed, pids = 0, []
    deadline = time.monotonic() + 120
    while killed < kills and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.7)
        sup = service.supervisors.get("fn_ck")
        if sup is None:
            continue
        slot = sup.slots[f"local/w{killed % 4}"]
        if slot.ready and slot.pid and not slot.caught_up and slot.pid not in pids:
            os.kill(slot.pid, signal.SIGKILL)  # kill -9 with calls of the batch in flight on its pool
            pids.append(slot.pid)
            killed += 1
    thread.join(timeout=300)
    assert killed == kills
    assert not result["summary"].errors
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok, report.summary()
    assert report.handled == mutations
    per_doc = read_call_log(calls)
    total_calls = sum(len(v) for v in per_doc.values())
    assert total_calls >= mutations  # at least once: calls after the last checkpoint ran again after a kill
    cps = open_store(data_dir).checkpoints("fn_ck")
    assert [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()
    duplicates = open_store(data_dir).counters("fn_ck").get("effects_duplicate", 0)
    print(
        f"concurrency 8, kill -9 x{kills}: {mutations} mutations, {total_calls} handler calls, "
        f"{duplicates} replayed effects skipped"
    )


def test_a_pool_call_that_cannot_be_interrupted_gets_its_worker_recycled(data_dir, ray_executor):
    source = create_bucket(data_dir, "src")
    for i in range(40):
        source.upsert(f"k{i:02d}", {"i": i})
    create_bucket(data_dir, "out")
    handler = (
        "import time\n"
        "def on_update(doc, meta):\n"
        "    if doc['i'] == 7:\n"
        "        time.sleep(600)  # one blocking C call: the pool's timeout is raised only when it returns\n"
        "    out[meta.id] = doc\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_stuck",
            "source_bucket": "src",
            "execution_timeout": "500ms",
            "checkpoint_interval": "100ms",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "concurrency": 4,
        }
    )
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, "fn_stuck")
    started = time.monotonic()
    summary = EventingService(data_dir, ray_executor, until_caught_up=True).run()
    assert not summary.errors
    assert time.monotonic() - started < 60
    store = open_store(data_dir)
    rows = store.dlq_rows("fn_stuck")
    assert [(r.key, r.reason) for r in rows] == [("k07", "timeout")]
    assert "recycled" in rows[0].error
    assert sorted(open_bucket(data_dir, "out").keys()) == [f"k{i:02d}" for i in range(40) if i != 7]
    counters = store.counters("fn_stuck")
    assert counters["workers_recycled"] == 1 and counters["hung_skipped"] == 1
