"""Function statistics and vBucket maps, as the CLI, the demo and the HTTP API show them."""

from __future__ import annotations

import time
from typing import Any

from eventing.core import counters as counter_names
from eventing.runtime.timers import delay_percentile
from eventing.storage.bucket import LocalBucket
from eventing.storage.metadata import open_metadata
from sharding import NUM_VBUCKETS, format_ranges, worker_plan


def vbucket_map(data_dir: str, name: str) -> dict[str, Any]:
    store = open_metadata(data_dir, create=False)
    record = store.get_function(name)
    cps = store.checkpoints(name)
    workers: dict[str, list[int]] = {}
    if cps:
        for vb, cp in cps.items():
            workers.setdefault(cp.owner or "(never owned)", []).append(vb)
        source = "metadata store (last recorded owners)"
    else:
        count = record.definition.get("worker_count", 1)
        for i, vbs in enumerate(worker_plan(range(NUM_VBUCKETS), count)):
            workers[f"local/w{i}"] = vbs
        source = "plan (function not deployed)"
    leased = {cp.owner for cp in cps.values() if cp.leased}
    return {
        "function": name,
        "source": source,
        "workers": [
            {"worker": w, "vbuckets": len(vbs), "ranges": format_ranges(vbs), "live": w in leased}
            for w, vbs in sorted(workers.items())
        ],
    }


def couchbase_stats(counters: dict[str, float]) -> dict[str, int]:
    """The same counts under Couchbase Eventing's statistic names, so dashboards and scripts carry over.
    dcp_mutation / dcp_deletion count the updates and deletions that reached a handler decision (handled,
    failed or timed out), as Couchbase counts what its workers received."""

    def c(name: str) -> int:
        return int(counters.get(name, 0))

    update = {k: c(counter_names.handler_outcome("on_update", k)) for k in ("success", "failure", "timeout")}  # type: ignore[arg-type]
    delete = {k: c(counter_names.handler_outcome("on_delete", k)) for k in ("success", "failure", "timeout")}  # type: ignore[arg-type]
    return {
        "on_update_success": update["success"],
        "on_update_failure": update["failure"],
        "on_delete_success": delete["success"],
        "on_delete_failure": delete["failure"],
        "timeout_count": c(counter_names.dlq("timeout")),  # handler calls and timer callbacks that timed out
        "dcp_mutation": sum(update.values()),
        "dcp_deletion": sum(delete.values()),
        "timer_create_counter": c(counter_names.TIMERS_CREATED),
        "timer_cancel_counter": c(counter_names.TIMERS_CANCELLED),
        "timer_callback_success": c(counter_names.TIMERS_FIRED),
        "timer_callback_failure": c(counter_names.TIMERS_FAILED),
        "timer_msg_counter": c(counter_names.TIMERS_FIRED) + c(counter_names.TIMERS_FAILED),
        "curl_success_count": c("curl_success_count"),
        "curl_timeout_count": c("curl_timeout_count"),
        "curl_non_200_response": c("curl_non_2xx_count"),
        "curl.get": c("curl_get_count"),
        "curl.post": c("curl_post_count"),
        "curl.put": c("curl_put_count"),
        "curl.delete": c("curl_delete_count"),
        "curl.head": c("curl_head_count"),
        "bkt_ops_cas_mismatch_count": c("bkt_ops_cas_mismatch_count"),
        "dlq_count": sum(int(v) for k, v in counters.items() if k.startswith("dlq_")),
    }


def function_stats(data_dir: str, name: str) -> dict[str, Any]:
    store = open_metadata(data_dir, create=False)
    record = store.get_function(name)
    counters = store.counters(name)
    cps = store.checkpoints(name)
    lag = None
    if cps:
        source = LocalBucket.open(data_dir, record.definition["source_bucket"])
        highs = source.high_seqnos()
        lag = sum(max(0, highs[vb] - cp.seqno) for vb, cp in cps.items())
    out: dict[str, Any] = {"function": name, "state": record.state.value}
    out.update({k: int(counters.get(k, 0)) for k in counter_names.STATS_KEYS})
    out["dlq"] = {k[4:]: int(v) for k, v in counters.items() if k.startswith("dlq_")}
    out["checkpoint_lag"] = lag
    backlog = store.timer_backlog(name, int(time.time() * 1000))
    p50, p99 = delay_percentile(counters, 0.5), delay_percentile(counters, 0.99)
    out["timers"] = {
        "created": int(counters.get(counter_names.TIMERS_CREATED, 0)),
        "cancelled": int(counters.get(counter_names.TIMERS_CANCELLED, 0)),
        "fired": int(counters.get(counter_names.TIMERS_FIRED, 0)),
        "failed": int(counters.get(counter_names.TIMERS_FAILED, 0)),
        "pending": backlog["pending"],
        "due_not_fired": backlog["due"],
        # Bounds of the histogram bucket holding the percentile (fire time minus due time).
        "delay_p50_ms_le": p50 if p50 is None or p50 != float("inf") else "over 60000",
        "delay_p99_ms_le": p99 if p99 is None or p99 != float("inf") else "over 60000",
    }
    out["bucket_ops"] = {k: int(v) for k, v in counters.items() if k.startswith("bkt_ops_")}
    out["curl"] = {k: int(v) for k, v in counters.items() if k.startswith("curl_")}
    out["couchbase"] = couchbase_stats(counters)
    out["throughput_mps"] = counters.get("throughput_mps", 0.0)
    if counters.get("last_run_seconds"):
        out["last_run"] = {
            "handled": int(counters.get("last_run_handled", 0)),
            "seconds": round(counters["last_run_seconds"], 2),
            "mutations_per_s": round(counters.get("last_run_handled", 0) / counters["last_run_seconds"]),
        }
    return out
