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
RETRIES = "retries"
EFFECTS_APPLIED = "effects_applied"
EFFECTS_DUPLICATE = "effects_duplicate"  # skipped: already applied before a crash or replay
EFFECTS_FENCED = "effects_fenced"  # rejected: written by a stale owner
FENCED_CHECKPOINT_WRITES = "fenced_checkpoint_writes"
WORKERS_RECYCLED = "workers_recycled"
WINDOW_ROWS_WRITTEN = "window_rows_written"
TIMERS_CREATED = "timers_created"  # creates made durable (an overwrite counts again)
TIMERS_CANCELLED = "timers_cancelled"
TIMERS_FIRED = "timers_fired"  # callbacks that returned
TIMERS_FAILED = "timers_failed"  # callbacks dead-lettered (timer_error or timeout)
WINDOW_VALUES_NOT_NUMERIC = "window_values_not_numeric"


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
    RETRIES,
    EFFECTS_APPLIED,
    EFFECTS_DUPLICATE,
    EFFECTS_FENCED,
    FENCED_CHECKPOINT_WRITES,
)
