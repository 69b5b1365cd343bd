"""Prometheus metrics, read from the metadata store at each scrape (so every service and command that
writes counters shows up, whichever process it runs in), rendered by the standard client library.

Per function (label `function`): mutations seen, handler successes, failures and timeouts (label
`handler`), dead letters by reason, backlog (high seqno minus checkpoint, summed over vBuckets), handler
latency (histogram; see eventing.core.counters.LATENCY_BOUNDS_US for how it is measured), the age of
the oldest checkpoint still behind its vBucket's high seqno, workers recycled, fenced writes (label
`kind`: effect or checkpoint), vBuckets owned by live workers, throughput; for windowed functions the
watermark delay (wall clock minus watermark, Azure Stream Analytics' metric), open windows, windows
emitted and late rows, and with arrival-time policies Azure's out-of-order, late input and early input
events and the rows adjusted. Cluster-wide: rebalance progress (0..1), live services, nodes by state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from eventing.control.lifecycle import SERVICE_STALE_S
from eventing.core import counters as names
from eventing.errors import EventingError
from eventing.storage.state import State, StateLike, as_state
from metadata import FunctionState

CONTENT_TYPE = CONTENT_TYPE_LATEST
HANDLERS = ("on_update", "on_delete")


def render(state: StateLike) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EventingCollector(as_state(state)))
    return generate_latest(registry)


class EventingCollector:
    def __init__(self, state: State):
        self.state = state

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fam = _Families()
        if not self.state.exists():
            yield from fam.all()
            return
        store = self.state.metadata
        self._cluster(store, fam)
        for record in store.list_functions():
            self._function(store, record, fam)
        self._mirrors(fam)
        yield from fam.all()

    def _mirrors(self, fam: _Families) -> None:
        """Each mirror's lag and retained WAL as its follower last reported them (no call to the source)."""
        from eventing.ops.mirrors import mirror_health

        for row in mirror_health(self.state, query_source=False):
            labels = [row["keyspace"]]
            for family, value in (
                (fam.mirror_lag_bytes, row["lag_bytes"]),
                (fam.mirror_lag_s, row["lag_s"]),
                (fam.mirror_retained, row["retained_bytes"]),
            ):
                if value is not None:
                    family.add_metric(labels, float(value))

    def _cluster(self, store: Any, fam: _Families) -> None:
        from eventing.control.nodes import Topology
        from eventing.ops.nodes import rebalance_progress

        topology = Topology(store)
        progress = rebalance_progress(topology)
        request = progress["request"]
        fam.rebalance_progress.add_metric([], progress["progress"])
        fam.rebalance_running.add_metric(
            [], 1.0 if request and request["status"] in ("requested", "running") else 0.0
        )
        fam.services.add_metric([], len(store.live_services(SERVICE_STALE_S)))
        by_state: dict[str, int] = {}
        for node in store.nodes():
            by_state[node["state"]] = by_state.get(node["state"], 0) + 1
        for state, count in sorted(by_state.items()):
            fam.nodes.add_metric([state], count)

    def _function(self, store: Any, record: Any, fam: _Families) -> None:
        name = record.name
        c = store.counters(name)
        for state in FunctionState:
            fam.state.add_metric([name, state.value], 1.0 if record.state is state else 0.0)
        fam.seen.add_metric([name], c.get(names.MUTATIONS_SEEN, 0))
        for handler in HANDLERS:
            fam.success.add_metric([name, handler], c.get(names.handler_outcome(handler, "success"), 0))  # type: ignore[arg-type]
            fam.failure.add_metric([name, handler], c.get(names.handler_outcome(handler, "failure"), 0))  # type: ignore[arg-type]
            fam.timeout.add_metric([name, handler], c.get(names.handler_outcome(handler, "timeout"), 0))  # type: ignore[arg-type]
        for key, value in sorted(c.items()):
            if key.startswith("dlq_"):
                fam.dead_letters.add_metric([name, key[4:]], value)
        fam.recycled.add_metric([name], c.get(names.WORKERS_RECYCLED, 0))
        fam.fenced.add_metric([name, "effect"], c.get(names.EFFECTS_FENCED, 0))
        fam.fenced.add_metric([name, "checkpoint"], c.get(names.FENCED_CHECKPOINT_WRITES, 0))
        fam.throughput.add_metric([name], c.get("throughput_mps", 0.0))
        fam.retries.add_metric([name], c.get(names.RETRIES, 0))
        fam.curl_throttled.add_metric([name], c.get(names.CURL_THROTTLED, 0))
        fam.curl_throttled_seconds.add_metric([name], c.get(names.CURL_THROTTLED_MS, 0) / 1000)
        cumulative = 0.0
        buckets = []
        for bound in names.LATENCY_BOUNDS_US:
            cumulative += c.get(f"latency_le_{bound}us", 0)
            buckets.append((repr(bound / 1e6), cumulative))
        buckets.append(("+Inf", c.get(names.LATENCY_COUNT, 0)))
        fam.latency.add_metric([name], buckets, c.get(names.LATENCY_SUM_US, 0) / 1e6)

        cps = store.checkpoints(name)
        backlog, oldest, owned = 0, 0.0, 0
        if cps:
            try:
                source = self.state.open_bucket(record.definition["source_bucket"])
                highs = source.high_seqnos()
                source.close()
            except EventingError:
                highs = None
            now = time.time()
            for vb, cp in cps.items():
                owned += cp.leased
                behind = max(0, highs[vb] - cp.seqno) if highs is not None else 0
                backlog += behind
                if behind:
                    oldest = max(oldest, now - cp.updated_at)
        fam.backlog.add_metric([name], backlog)
        fam.checkpoint_age.add_metric([name], round(oldest, 3))
        fam.owned.add_metric([name], owned)

        if record.definition.get("window") is not None:
            from eventing.ops.windows import window_status

            try:
                w = window_status(self.state, name)
            except EventingError:
                return
            policies = w.get("arrival_policies")
            # With arrival-time policies, Azure's watermark delay: wall clock minus the greatest watermark.
            watermark = w["watermark_ms"] if policies is None else policies["watermark_ms"]
            if watermark is not None:
                fam.watermark_delay.add_metric([name], max(0.0, time.time() - watermark / 1000))
            if policies is not None:
                fam.out_of_order_events.add_metric([name], policies["out_of_order_events"])
                fam.late_input_events.add_metric([name], policies["late_input_events"])
                fam.early_input_events.add_metric([name], policies["early_input_events"])
                fam.adjusted_rows.add_metric([name], policies["rows_adjusted"])
            fam.open_windows.add_metric([name], w["open_windows"])
            fam.late_rows.add_metric([name], w["late_rows"])
            fam.windows_emitted.add_metric([name], w["windows_emitted"])


class _Families:
    def __init__(self) -> None:
        f = ["function"]
        self.state = GaugeMetricFamily(
            "eventing_function_state", "1 for the function's current state", labels=[*f, "state"]
        )
        self.seen = CounterMetricFamily("eventing_mutations_seen", "mutations read from the source", labels=f)
        self.success = CounterMetricFamily(
            "eventing_handler_success", "handler calls that returned", labels=[*f, "handler"]
        )
        self.failure = CounterMetricFamily(
            "eventing_handler_failure", "handler calls that raised on every attempt", labels=[*f, "handler"]
        )
        self.timeout = CounterMetricFamily(
            "eventing_handler_timeout", "handler calls past execution_timeout", labels=[*f, "handler"]
        )
        self.dead_letters = CounterMetricFamily(
            "eventing_dead_letters", "rows written to the dead-letter queue", labels=[*f, "reason"]
        )
        self.backlog = GaugeMetricFamily(
            "eventing_backlog_mutations",
            "source high seqnos minus checkpoints, summed over vBuckets",
            labels=f,
        )
        self.checkpoint_age = GaugeMetricFamily(
            "eventing_checkpoint_age_seconds",
            "age of the oldest checkpoint of a vBucket that has a backlog (0 when caught up)",
            labels=f,
        )
        self.latency = HistogramMetricFamily(
            "eventing_handler_latency_seconds",
            "time per mutation in the worker (read, decode, handler); each batch counted at its mean",
            labels=f,
        )
        self.recycled = CounterMetricFamily(
            "eventing_workers_recycled", "worker processes ended after a hung handler", labels=f
        )
        self.fenced = CounterMetricFamily(
            "eventing_fenced_writes", "writes of a stale owner rejected by epoch", labels=[*f, "kind"]
        )
        self.owned = GaugeMetricFamily("eventing_vbuckets_owned", "vBuckets held by live workers", labels=f)
        self.retries = CounterMetricFamily(
            "eventing_handler_retries",
            "handler attempts made again after a failure (the retry policy)",
            labels=f,
        )
        self.curl_throttled = CounterMetricFamily(
            "eventing_curl_throttled",
            "curl requests that waited for their URL binding's rate_limit, max_in_flight "
            "or a server's Retry-After (backpressure)",
            labels=f,
        )
        self.curl_throttled_seconds = CounterMetricFamily(
            "eventing_curl_throttled_seconds",
            "time curl requests waited for their URL bindings' limits",
            labels=f,
        )
        self.throughput = GaugeMetricFamily(
            "eventing_throughput_mutations_per_second",
            "mutations handled per second, as the service last measured",
            labels=f,
        )
        self.mirror_lag_bytes = GaugeMetricFamily(
            "eventing_mirror_lag_bytes", "WAL a mirror has yet to apply", labels=["mirror"]
        )
        self.mirror_lag_s = GaugeMetricFamily(
            "eventing_mirror_lag_seconds",
            "age of the oldest source commit a mirror has not applied",
            labels=["mirror"],
        )
        self.mirror_retained = GaugeMetricFamily(
            "eventing_mirror_retained_wal_bytes",
            "WAL the mirror's slot holds back on the source",
            labels=["mirror"],
        )
        self.watermark_delay = GaugeMetricFamily(
            "eventing_watermark_delay_seconds", "wall clock minus the function's watermark", labels=f
        )
        self.open_windows = GaugeMetricFamily("eventing_open_windows", "windows not yet closed", labels=f)
        self.late_rows = CounterMetricFamily(
            "eventing_late_rows", "rows for already closed windows (to the DLQ)", labels=f
        )
        self.windows_emitted = CounterMetricFamily(
            "eventing_windows_emitted", "window results emitted", labels=f
        )
        self.out_of_order_events = CounterMetricFamily(
            "eventing_window_out_of_order_events",
            "rows behind their watermark (arrival-time policies: dropped or adjusted)",
            labels=f,
        )
        self.late_input_events = CounterMetricFamily(
            "eventing_window_late_input_events",
            "rows arriving later than late_arrival_tolerance after their event time (dropped or adjusted)",
            labels=f,
        )
        self.early_input_events = CounterMetricFamily(
            "eventing_window_early_input_events",
            "rows whose event time is over 5 minutes after their arrival (dropped or adjusted)",
            labels=f,
        )
        self.adjusted_rows = CounterMetricFamily(
            "eventing_window_rows_adjusted", "rows windowed at another time than their event time", labels=f
        )
        self.rebalance_progress = GaugeMetricFamily(
            "eventing_rebalance_progress_ratio",
            "share of the last rebalance's moving vBuckets now on their target node (1 when done)",
        )
        self.rebalance_running = GaugeMetricFamily(
            "eventing_rebalance_running", "1 while a rebalance is under way"
        )
        self.services = GaugeMetricFamily(
            "eventing_services_live", "eventing services with a recent heartbeat"
        )
        self.nodes = GaugeMetricFamily("eventing_nodes", "eventing nodes by state", labels=["state"])

    def all(self) -> Iterator[Metric]:
        yield from vars(self).values()
