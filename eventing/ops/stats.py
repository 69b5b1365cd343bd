"""Function statistics and vBucket maps, as the CLI, the demo and the HTTP API show them."""

from __future__ import annotations

import time
from typing import Any

from eventing.control.leadership import running_services
from eventing.core import counters as counter_names
from eventing.core.definition import FunctionDefinition
from eventing.execution.timers import delay_percentile
from eventing.storage.state import StateLike, as_state
from eventing.workers.sandbox.default import granted_writes, isolation_of
from metadata import FunctionRecord
from sharding import NUM_VBUCKETS, format_ranges, worker_plan


def vbucket_map(state: StateLike, name: str) -> dict[str, Any]:
    state = as_state(state)
    store = state.metadata
    try:  # closed here: the HTTP API calls this on every poll, from a thread pool
        record = store.get_function(name)
        cps = store.checkpoints(name)
        services = running_services(store)
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
    # A lease outlives a service killed with kill -9: it counts as live only while a service runs.
    leased = {cp.owner for cp in cps.values() if cp.leased} if services else set()
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


def couchbase_full_stats(state: StateLike, name: str) -> dict[str, Any]:
    """One function's counters in Couchbase's `/api/v1/stats?type=full` groups and names."""
    state = as_state(state)
    with state.metadata as store:
        store.get_function(name)
        counters = store.counters(name)
    cb = couchbase_stats(counters)

    def c(key: str) -> int:
        return int(counters.get(key, 0))

    return {
        "function_name": name,
        "event_processing_stats": {
            "dcp_mutation": cb["dcp_mutation"],
            "dcp_deletion": cb["dcp_deletion"],
            "timer_msg_counter": cb["timer_msg_counter"],
            "dlq_count": cb["dlq_count"],
            "processed_events": cb["dcp_mutation"] + cb["dcp_deletion"] + cb["timer_msg_counter"],
        },
        "execution_stats": {
            k: cb[k]
            for k in (
                "on_update_success",
                "on_update_failure",
                "on_delete_success",
                "on_delete_failure",
                "timer_create_counter",
                "timer_cancel_counter",
                "timer_callback_success",
                "timer_callback_failure",
            )
        }
        | {
            "curl": {
                "get": cb["curl.get"],
                "post": cb["curl.post"],
                "put": cb["curl.put"],
                "delete": cb["curl.delete"],
                "head": cb["curl.head"],
            },
            "curl_success_count": cb["curl_success_count"],
        },
        "failure_stats": {
            "timeout_count": cb["timeout_count"],
            "curl_timeout_count": cb["curl_timeout_count"],
            "curl_non_200_response": cb["curl_non_200_response"],
            "curl_failure_count": c("curl_failure_count"),
            "bkt_ops_cas_mismatch_count": cb["bkt_ops_cas_mismatch_count"],
            "timer_callback_failure": cb["timer_callback_failure"],
            "dlq_count": cb["dlq_count"],
        },
    }


def function_stats(state: StateLike, name: str) -> dict[str, Any]:
    state = as_state(state)
    with state.metadata as store:
        record = store.get_function(name)
        counters = store.counters(name)
        cps = store.checkpoints(name)
        services = running_services(store)
        backlog = store.timer_backlog(name, int(time.time() * 1000))
        window_state = (
            store.window_states().load(name) if record.definition.get("window") is not None else None
        )
    lag = None
    if cps:
        with state.open_bucket(record.definition["source_bucket"]) as source:
            highs = source.high_seqnos()
        lag = sum(max(0, highs[vb] - cp.seqno) for vb, cp in cps.items())
    out: dict[str, Any] = {"function": name, "state": record.state.value}
    out.update({k: int(counters.get(k, 0)) for k in counter_names.STATS_KEYS})
    out["dlq"] = {k[4:]: int(v) for k, v in counters.items() if k.startswith("dlq_")}
    out["checkpoint_lag"] = lag
    # The service writes the gauge while the function runs (0 when it stops), and the rate of each start
    # while it was handling when it stops (last_run_mps). A deployed function that no service runs (its run
    # caught up, or was stopped) shows its last run's rate; a paused or undeployed one handles nothing, 0.
    running = record.state.value == "deployed" and bool(services)
    last_run_mps = counters.get("last_run_mps")
    if running:
        out["throughput_mps"], out["throughput_of"] = counters.get("throughput_mps", 0.0), "live"
    elif record.state.value == "deployed" and last_run_mps is not None:
        out["throughput_mps"], out["throughput_of"] = round(float(last_run_mps), 1), "last run"
    else:
        out["throughput_mps"], out["throughput_of"] = 0.0, None
    if record.definition.get("window") is not None:
        out["window"] = {
            "rows_written": int(counters.get(counter_names.WINDOW_ROWS_WRITTEN, 0)),
            "rows_accepted": int(counters.get(counter_names.WINDOW_ROWS_ACCEPTED, 0)),
            "rows_late": int(counters.get(counter_names.dlq("late"), 0)),
            "values_not_numeric": int(counters.get(counter_names.WINDOW_VALUES_NOT_NUMERIC, 0)),
            "windows_closed": int(counters.get(counter_names.WINDOWS_CLOSED, 0)),
            "windows_emitted": int(counters.get(counter_names.WINDOWS_EMITTED, 0)),
        }
        policies = _arrival_policies(record.definition["window"], window_state, counters)
        if policies is not None:
            out["arrival_policies"] = policies
    out["handler_log"] = state.app_logs.where(name)
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
    if counters.get("last_run_seconds"):
        out["last_run"] = last_run_view(counters)
    return out


def last_run_view(counters: dict[str, float]) -> dict[str, Any]:
    """The function's last start, from its start to its stop: `seconds` (start-up included) and
    `handled_per_s` over them; `busy_s`, the time it was handling (its first batch to its last), and
    `mutations_per_s` over that, the figure `throughput_mps` shows once no service runs the function."""
    handled = int(counters.get("last_run_handled", 0))
    seconds = float(counters["last_run_seconds"])
    mps = float(counters.get("last_run_mps", handled / seconds))
    # Runs recorded before the busy time was kept: it follows from the rate (handled / busy).
    busy = counters.get("last_run_busy_seconds", handled / mps if mps else 0.0)
    return {
        "handled": handled,
        "seconds": round(seconds, 2),
        "handled_per_s": round(handled / seconds, 1),
        "busy_s": round(float(busy), 3),
        "mutations_per_s": round(mps, 1),
    }


def _arrival_policies(window: dict[str, Any], state: Any, counters: dict[str, Any]) -> dict[str, Any] | None:
    """Azure's metrics of the window's arrival-time policies (None when it declares none)."""
    from eventing.ops.windows import arrival_metrics
    from eventing.windows.semantics import WindowConfigError, WindowSpec

    try:
        spec = WindowSpec.from_dict(window)
    except WindowConfigError:
        return None  # deploy refuses such a window: nothing of it ran
    return arrival_metrics(spec, state, counters) if spec.uses_arrival_policies else None


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


NO_SERVICE_HINT = "no service is running this function; start one with `eventing run`"


def function_status(state: StateLike, name: str | None = None) -> dict[str, Any]:
    """States of one function (or all), how many vBuckets live workers own, the live services and which
    of them leads (the others are standbys)."""
    state = as_state(state)
    with state.metadata as store:
        records = [store.get_function(name)] if name else store.list_functions()
        services = running_services(store)
        views = []
        for r in records:
            view = function_view(r)
            leased = sum(1 for c in store.checkpoints(r.name).values() if c.leased)
            # A lease held by a service that is gone (kill -9) is not a live worker: the next run takes it
            # over.
            view["vbuckets_leased"] = leased if services else 0
            view["vbuckets_leased_by_stopped_service"] = 0 if services else leased
            view["service_running"] = bool(services)
            # Deployed is the function's state; whether anything runs it is a separate fact, said outright.
            view["running"] = bool(services) and r.state.value == "deployed"
            if r.state.value == "deployed" and not services:
                view["hint"] = NO_SERVICE_HINT
            # How its handler runs: "none" is unconfined (the worker's access to every bucket and the store).
            defn = FunctionDefinition.from_dict(r.definition)
            view["isolation"] = isolation_of(defn, r.deployed_by)
            if view["isolation"] == "sandbox":  # folders an admin opened to its writes (sandbox_writable)
                view["sandbox_writable"] = list(granted_writes(defn, r.deployed_by))
            views.append(view)
        leader = leader_view(store, services)
    standbys = [sid for sid in services if leader is None or sid != leader["id"]]
    return {"services": services, "leader": leader, "standbys": standbys, "functions": views}


def leader_view(store: Any, services: list[str]) -> dict[str, Any] | None:
    """The service holding the leader lease, if the lease is current."""
    from eventing.control.failover import LEADER_LEASE

    lease = store.lease(LEADER_LEASE)
    if lease is None or lease.expired(time.time()):
        return None
    return {
        "id": lease.holder,
        "term": lease.term,
        "since": lease.acquired_at,
        "expires_in_s": round(lease.expires_at - time.time(), 2),
        "heartbeat": lease.holder in services,
    }


def checkpoint_view(
    state: StateLike, name: str, *, vb: int | None = None, backlog_only: bool = False
) -> dict[str, Any]:
    """Per vBucket of a deployed or paused function: its checkpoint, the source's high seqno, the backlog
    between them, the owner and epoch of the last claim, whether the owner still holds its lease, and when
    the record last changed (a commit or a claim). `vb` keeps one vBucket; `backlog_only` those with a
    backlog. Totals cover every vBucket whatever the filter."""
    state = as_state(state)
    from eventing.errors import ConfigError, LifecycleError

    if vb is not None and not 0 <= vb < NUM_VBUCKETS:
        raise ConfigError(f"vBucket {vb} does not exist; vBuckets are numbered 0..{NUM_VBUCKETS - 1}")
    with state.metadata as store:
        record = store.get_function(name)
        cps = store.checkpoints(name)
        starts = store.checkpoint_starts(name)
    if not cps:
        raise LifecycleError(
            f"function '{name}' has no checkpoints (it is {record.state.value}); deploy it first"
        )
    with state.open_bucket(record.definition["source_bucket"]) as source:
        highs = source.high_seqnos()
        source_uuid = source.uuid
    rows = []
    for n, cp in sorted(cps.items()):
        backlog = max(0, highs[n] - cp.seqno)
        rows.append(
            {
                "vb": n,
                "checkpoint": cp.seqno,
                "high_seqno": highs[n],
                "backlog": backlog,
                "owner": cp.owner,
                "epoch": cp.epoch,
                "leased": cp.leased,
                "updated_at": cp.updated_at,
                "start": starts.get(n),
            }
        )
    shown = [r for r in rows if (vb is None or r["vb"] == vb) and (not backlog_only or r["backlog"])]
    return {
        "function": name,
        "state": record.state.value,
        "source_bucket": record.definition["source_bucket"],
        # A recreated or flushed source has a new identity: these checkpoints will not resume on it.
        "source_identity_matches": all(cp.bucket_uuid == source_uuid for cp in cps.values()),
        "vbuckets": len(rows),
        "backlog": sum(r["backlog"] for r in rows),
        "vbuckets_with_backlog": sum(1 for r in rows if r["backlog"]),
        "leased": sum(1 for r in rows if r["leased"]),
        "owners": sorted({r["owner"] for r in rows if r["owner"]}),
        "rows": shown,
    }
