"""Function statistics and vBucket maps, as the CLI, the demo and the HTTP API show them."""

from __future__ import annotations

from typing import Any

from eventing.core import counters as counter_names
from eventing.runtime.lifecycle import SERVICE_STALE_S
from eventing.storage.bucket import LocalBucket
from eventing.storage.metadata import open_metadata
from metadata import FunctionRecord
from sharding import NUM_VBUCKETS, format_ranges, worker_plan


def vbucket_map(data_dir: str, name: str) -> dict[str, Any]:
    store = open_metadata(data_dir, create=False)
    try:  # closed here: the HTTP API calls this on every poll, from a thread pool
        record = store.get_function(name)
        cps = store.checkpoints(name)
    finally:
        store.close()
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


def function_stats(data_dir: str, name: str) -> dict[str, Any]:
    store = open_metadata(data_dir, create=False)
    try:
        record = store.get_function(name)
        counters = store.counters(name)
        cps = store.checkpoints(name)
    finally:
        store.close()
    lag = None
    if cps:
        source = LocalBucket.open(data_dir, record.definition["source_bucket"])
        try:
            highs = source.high_seqnos()
        finally:
            source.close()
        lag = sum(max(0, highs[vb] - cp.seqno) for vb, cp in cps.items())
    out: dict[str, Any] = {"function": name, "state": record.state.value}
    out.update({k: int(counters.get(k, 0)) for k in counter_names.STATS_KEYS})
    out["dlq"] = {k[4:]: int(v) for k, v in counters.items() if k.startswith("dlq_")}
    out["checkpoint_lag"] = lag
    out["throughput_mps"] = counters.get("throughput_mps", 0.0)
    if counters.get("last_run_seconds"):
        out["last_run"] = {
            "handled": int(counters.get("last_run_handled", 0)),
            "seconds": round(counters["last_run_seconds"], 2),
            "mutations_per_s": round(counters.get("last_run_handled", 0) / counters["last_run_seconds"]),
        }
    return out


def function_view(record: FunctionRecord) -> dict[str, Any]:
    d = record.definition
    return {
        "name": record.name,
        "state": record.state.value,
        "source_bucket": d["source_bucket"],
        "workers": d.get("worker_count", 1),
        "boundary": d.get("boundary", "everything"),
        "bindings": [f"{b['alias']}={b['bucket']}:{b['access']}" for b in d.get("bindings", [])],
        "generation": record.generation,
        "windowed": d.get("window") is not None,
    }


def function_status(data_dir: str, name: str | None = None) -> dict[str, Any]:
    """States of one function (or all), how many vBuckets live workers own, and the live services."""
    store = open_metadata(data_dir, create=False)
    try:
        records = [store.get_function(name)] if name else store.list_functions()
        services = store.live_services(SERVICE_STALE_S)
        views = []
        for r in records:
            view = function_view(r)
            view["vbuckets_leased"] = sum(1 for c in store.checkpoints(r.name).values() if c.leased)
            view["service_running"] = bool(services)
            views.append(view)
    finally:
        store.close()
    return {"services": services, "functions": views}


def checkpoint_table(data_dir: str, name: str) -> dict[str, Any]:
    """Per vBucket: checkpoint seqno, the source's high seqno, backlog, owner, epoch, lease (the vBucket
    map picture and the checkpoint table of the console). Empty while the function is not deployed."""
    store = open_metadata(data_dir, create=False)
    try:
        record = store.get_function(name)
        cps = store.checkpoints(name)
    finally:
        store.close()
    rows: list[dict[str, Any]] = []
    if cps:
        source = LocalBucket.open(data_dir, record.definition["source_bucket"])
        try:
            highs = source.high_seqnos()
        finally:
            source.close()
        for vb in range(NUM_VBUCKETS):
            cp = cps.get(vb)
            if cp is None:
                continue
            rows.append({
                "vb": vb, "seqno": cp.seqno, "high_seqno": highs[vb], "backlog": max(0, highs[vb] - cp.seqno),
                "owner": cp.owner, "epoch": cp.epoch, "leased": cp.leased, "updated_at": cp.updated_at,
            })
    return {"function": name, "state": record.state.value, "vbuckets": rows}
