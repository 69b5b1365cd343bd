"""Azure Stream Analytics' arrival-time policies applied to the window rows the coordinator reads
(docs/time-semantics.md).

``ArrivalGate.judge`` runs a batch of rows, in arrival order (arrival time, vBucket, seqno), through an
``ArrivalPolicy`` (``eventing.windows.semantics.arrival``) before the window operator sees them:

- dropped rows (``early``, ``late_arrival``, ``out_of_order``, ``no_substream_key``) leave the batch, each
  with the dead-letter text that says why;
- kept rows are windowed at the time the policies give them: the batch's ``event_time`` column becomes
  that time (the document's field is unchanged), and rows the early-arrival rule adjusted are flagged so
  they do not move the watermark (``LIFTS`` column, False for them);
- every adjusted row is recorded (``ADJUSTED_SCHEMA``: its event time, arrival time and windowed time),
  so a user can see which rows were moved and where to;
- the policy's metrics grow by what the batch met (Azure's out-of-order, late input and early input
  events), returned as counter increments.

The policy's state (its watermarks and metrics) is checkpointed with the coordinator's window state, and
arrival times are journalled with the mutations, so a replay judges every row as the first run did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventing.core.counters import ADJUSTED_ROWS, EARLY_INPUT_EVENTS, LATE_INPUT_EVENTS, OUT_OF_ORDER_EVENTS
from eventing.core.durations import format_duration
from eventing.core.times import iso_ms
from eventing.windows.batches import EVENT_TIME, EVENT_TIME_TYPE
from eventing.windows.runtime.row_writer import RowLayout
from eventing.windows.semantics.arrival import DROP_REASONS, EARLY_ARRIVAL_MS, NO_WATERMARK, ArrivalPolicy
from eventing.windows.semantics.windows import arrow_epoch_ms

LIFTS = "#lifts"  # bool column of judged rows: False for rows that must not move the watermark (early)


ADJUSTED_SCHEMA = pa.schema(
    [
        pa.field("vb", pa.int32(), nullable=False),
        pa.field("seqno", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("event_time_ms", pa.int64(), nullable=False),
        pa.field("arrival_ms", pa.int64(), nullable=False),
        pa.field("windowed_ms", pa.int64(), nullable=False),
        pa.field(
            "rules", pa.string(), nullable=False
        ),  # which rules moved it: early, late_arrival, out_of_order
        pa.field("substream", pa.string()),
    ]
)


@dataclass
class Judged:
    """What the policies made of a batch (see the module docstring)."""

    kept: pa.Table
    dropped: dict[str, pa.Table] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    adjusted: pa.Table = field(default_factory=ADJUSTED_SCHEMA.empty_table)
    counters: Counter[str] = field(default_factory=Counter)


def arrival_order(table: pa.Table) -> pa.Table:
    """Rows by arrival time, then vBucket and seqno: the one order every replay judges them in."""
    if table.num_rows < 2:
        return table
    return table.take(
        pc.sort_indices(table, [("arrival_ms", "ascending"), ("vb", "ascending"), ("seqno", "ascending")])
    )


def _span(ms: int) -> str:
    from datetime import timedelta

    return format_duration(timedelta(milliseconds=ms))


class ArrivalGate:
    """Judges batches of rows of one function with its policies; ``policy`` carries the state between them."""

    def __init__(self, layout: RowLayout, policy: ArrivalPolicy | None = None):
        self.layout = layout
        self.spec = layout.spec
        self.policy = policy if policy is not None else ArrivalPolicy.for_spec(layout.spec)
        self.substream_column = layout.substream_column

    def judge(self, table: pa.Table) -> Judged:
        """Judge ``table`` (row batch layout, arrival times known) in arrival order."""
        table = arrival_order(table)
        times = arrow_epoch_ms(table[EVENT_TIME]).to_numpy()
        arrivals = table["arrival_ms"].to_numpy()
        vbs = table["vb"].to_numpy()
        streams = table[self.substream_column].to_pylist() if self.substream_column else None
        fates = self.policy.observe_batch(times, arrivals, partitions=vbs, keys=streams)
        kept = fates.kept
        out = Judged(kept=table)
        for code in np.unique(fates.reason[~kept]).tolist():
            reason = DROP_REASONS[code] or "out_of_order"
            rows = np.flatnonzero(fates.reason == code)
            out.dropped[reason] = table.take(pa.array(rows))
            out.errors[reason] = [
                self._why(
                    reason,
                    int(times[i]),
                    int(arrivals[i]),
                    int(vbs[i]),
                    None if streams is None else streams[i],
                    int(fates.watermark_ms[i]),
                )
                for i in rows.tolist()
            ]
        if not kept.all():
            out.kept = table.filter(pa.array(kept))
        moved = np.flatnonzero(kept & (fates.time_ms != times))
        if len(moved):
            rules = [
                ",".join(
                    r
                    for r, flags in (
                        ("early", fates.early),
                        ("late_arrival", fates.late_arrival),
                        ("out_of_order", fates.out_of_order),
                    )
                    if flags[i]
                )
                for i in moved.tolist()
            ]
            picks = pa.array(moved)
            out.adjusted = pa.Table.from_arrays(
                [
                    table["vb"].take(picks),
                    table["seqno"].take(picks),
                    table["key"].take(picks),
                    pa.array(times[moved]),
                    table["arrival_ms"].take(picks),
                    pa.array(fates.time_ms[moved]),
                    pa.array(rules, pa.string()),
                    pa.array(
                        [streams[i] for i in moved.tolist()] if streams is not None else [None] * len(moved),
                        pa.string(),
                    ),
                ],
                schema=ADJUSTED_SCHEMA,
            )
        windowed = fates.time_ms[kept]
        result = out.kept
        if result.num_rows:
            stamped = pa.array(windowed).cast(pa.timestamp("ms", tz="UTC")).cast(EVENT_TIME_TYPE)
            result = result.set_column(result.schema.get_field_index(EVENT_TIME), EVENT_TIME, stamped)
        out.kept = result.append_column(LIFTS, pa.array(~fates.early[kept]))
        for counter, n in (
            (OUT_OF_ORDER_EVENTS, fates.out_of_order),
            (LATE_INPUT_EVENTS, fates.late_arrival),
            (EARLY_INPUT_EVENTS, fates.early),
        ):
            if n.any():
                out.counters[counter] += int(n.sum())
        if len(moved):
            out.counters[ADJUSTED_ROWS] += len(moved)
        return out

    def _why(self, reason: str, t: int, a: int, vb: int, stream: str | None, watermark: int) -> str:
        """The dead-letter text of a dropped row: the rule, the times, and the setting that decided it."""
        if reason == "no_substream_key":
            return (
                f"document has no substream key field {self.spec.substream_key!r} (substream_key), so it "
                "belongs to no substream; add the field to the document, or remove substream_key from the "
                "window"
            )
        if reason == "early":
            return (
                f"event time {iso_ms(t)} is {_span(t - a)} after its arrival time {iso_ms(a)}, more than the "
                f"early-arrival limit of {_span(EARLY_ARRIVAL_MS)} (early_arrival_policy 'drop'): is the "
                "sender's clock ahead?"
            )
        if reason == "late_arrival":
            return (
                f"event time {iso_ms(t)} is {_span(a - t)} before its arrival time {iso_ms(a)}, more than "
                f"late_arrival_tolerance {_span(self.spec.late_arrival_tolerance_ms or 0)} "
                "(late_arrival_policy 'drop'); raise the tolerance to keep such rows"
            )
        where = f"substream {self.spec.substream_key}={stream!r}" if stream is not None else f"vBucket {vb}"
        mark = iso_ms(None if watermark == NO_WATERMARK else watermark)
        return (
            f"event time {iso_ms(t)} is behind the watermark {mark} of {where} (out_of_order_policy "
            f"'drop', out_of_order_tolerance {_span(self.spec.out_of_order_tolerance_ms)}); raise "
            "out_of_order_tolerance to keep such rows"
        )


def known_arrivals(table: pa.Table, now: int) -> pa.Table:
    """Rows of an older build (arrival 0, unknown) count as arriving ``now``."""
    arrival = table["arrival_ms"]
    if table.num_rows and pc.any(pc.equal(arrival, 0)).as_py():
        arrival = pc.if_else(pc.equal(arrival, 0), now, arrival)
        table = table.set_column(table.schema.get_field_index("arrival_ms"), "arrival_ms", arrival)
    return table


class OncePerPoll:
    """A value computed at its first use in a poll, then kept (the source is asked at most once a poll)."""

    def __init__(self, compute: Callable[[], int | None]):
        self._compute = compute
        self._done = False
        self._value: int | None = None

    def __call__(self) -> int | None:
        if not self._done:
            self._value, self._done = self._compute(), True
        return self._value
