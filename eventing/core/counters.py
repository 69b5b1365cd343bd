"""Names of the per-function counters workers, coordinators and the service add to the metadata store.

One place names them, so the stats views, the HTTP metrics and the code that counts agree.
"""

from __future__ import annotations

from typing import Literal

HandlerKind = Literal["on_update", "on_delete", "timer"]
Outcome = Literal["success", "failure", "timeout"]

MUTATIONS_SEEN = "mutations_seen"
NO_HANDLER = "no_handler"  # no handler for the operation (e.g. a delete without on_delete)
RECURSION_FILTERED = "recursion_filtered"  # the function's own write to its source
HUNG_SKIPPED = "hung_skipped"  # a mutation whose handler hung and recycled the worker earlier
# a mutation of another collection of the source bucket than the function's source keyspace (passed over)
COLLECTION_FILTERED = "collection_filtered"
FILTERED = "filtered"  # a mutation the function's `filter` does not match (checkpointed, no handler call)
# a mutation of a rewound range that this deployment dead-lettered: its letter's replay handles it
DEAD_LETTERED_SKIPPED = "dead_lettered_skipped"
RETRIES = "retries"
# curl requests that waited for their URL binding's rate_limit, max_in_flight or a Retry-After, and how long
CURL_THROTTLED = "curl_throttled_count"
CURL_THROTTLED_MS = "curl_throttled_ms"
EFFECTS_APPLIED = "effects_applied"
EFFECTS_DUPLICATE = "effects_duplicate"  # skipped: already applied before a crash or replay
EFFECTS_FENCED = "effects_fenced"  # rejected: written by a stale owner
FENCED_CHECKPOINT_WRITES = "fenced_checkpoint_writes"
WORKERS_RECYCLED = "workers_recycled"
WINDOW_ROWS_WRITTEN = (
    "window_rows_written"  # rows workers wrote for the window (a window-only function's updates)
)
WINDOW_ROWS_ACCEPTED = "window_rows_accepted"  # rows the coordinator windowed (not late, not replayed)
WINDOW_VALUES_NOT_NUMERIC = (
    "window_values_not_numeric"  # aggregated field values that were not numbers (skipped)
)
# Azure Stream Analytics' metrics of the arrival-time policies (rows dropped or adjusted alike).
OUT_OF_ORDER_EVENTS = "window_out_of_order_events"
LATE_INPUT_EVENTS = "window_late_input_events"
EARLY_INPUT_EVENTS = "window_early_input_events"
ADJUSTED_ROWS = "window_rows_adjusted"  # rows windowed at another time than their event time
WINDOWS_CLOSED = "windows_closed"
WINDOWS_EMITTED = "windows_emitted"
TIMERS_CREATED = "timers_created"  # creates made durable (an overwrite counts again)
TIMERS_CANCELLED = "timers_cancelled"
TIMERS_FIRED = "timers_fired"  # callbacks that returned
TIMERS_FAILED = "timers_failed"  # callbacks dead-lettered (timer_error or timeout)

# Handler latency histogram. A worker reads the clock once per batch, not per mutation, and counts each
# batch's mutations in the bucket of the batch's mean time per mutation (read, decode, handler), so the
# hot loop costs what it did. Upper bounds in microseconds; sums in microseconds.
LATENCY_BOUNDS_US: tuple[int, ...] = (
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    1_000_000,
    5_000_000,
)
LATENCY_COUNT = "latency_count"
LATENCY_SUM_US = "latency_sum_us"


def latency_bucket(mean_us: float) -> str:
    """The counter of the first bound >= mean_us (`latency_le_100us`), `latency_le_inf` above them all."""
    for bound in LATENCY_BOUNDS_US:
        if mean_us <= bound:
            return f"latency_le_{bound}us"
    return "latency_le_inf"


def handler_outcome(kind: HandlerKind, outcome: Outcome) -> str:
    """`on_update_success`, `on_delete_timeout`, ... (Couchbase's statistic names)."""
    return f"{kind}_{outcome}"


def dlq(reason: str) -> str:
    """Dead letters by reason: `dlq_error`, `dlq_timeout`, `dlq_late`, ..."""
    return f"dlq_{reason}"


# What `eventing stats` shows for every function, in this order (dead letters are listed by reason).
STATS_KEYS: tuple[str, ...] = (
    MUTATIONS_SEEN,
    handler_outcome("on_update", "success"),
    handler_outcome("on_update", "failure"),
    handler_outcome("on_update", "timeout"),
    handler_outcome("on_delete", "success"),
    handler_outcome("on_delete", "failure"),
    handler_outcome("on_delete", "timeout"),
    RECURSION_FILTERED,
    FILTERED,
    RETRIES,
    EFFECTS_APPLIED,
    EFFECTS_DUPLICATE,
    EFFECTS_FENCED,
    FENCED_CHECKPOINT_WRITES,
)
