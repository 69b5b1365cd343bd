"""Cutting a batch of session-window rows into chains: runs of one group's rows, in event-time order, no
two of them further apart than the gap (nor across a max-duration cell), which the session operator judges
and merges whole (Arrow sort + numpy, no per-row Python).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventing.windows.runtime.arrivals import LIFTS
from eventing.windows.semantics import WindowSpec
from eventing.windows.semantics.sessions import Chain
from eventing.windows.semantics.windows import arrow_epoch_ms


@dataclass(frozen=True)
class ChainCut:
    """A batch cut into chains: ``table`` sorted by group and event time (without ``LIFTS``), the chain of
    each of its rows, each chain's first and last event time, and the event-time maxima per vBucket of the
    rows that lift the watermark."""

    table: pa.Table
    chain_of_row: np.ndarray
    first: np.ndarray
    last: np.ndarray
    chains: list[Chain]
    maxima: dict[int, int]


def cut_chains(table: pa.Table, spec: WindowSpec, group_by: list[str]) -> ChainCut:
    keys = [(g, "ascending") for g in group_by] + [("event_time", "ascending")]
    table = table.sort_by(keys) if table.num_rows > 1 else table
    lifting = table
    if LIFTS in table.schema.names:  # judged by the arrival-time policies: early rows do not lift
        lifting = table.filter(table[LIFTS]).drop_columns([LIFTS])
        table = table.drop_columns([LIFTS])
    times = arrow_epoch_ms(table["event_time"]).to_numpy()
    n = len(times)
    breaks = np.zeros(n, dtype=bool)
    breaks[0] = True
    if n > 1:
        breaks[1:] |= (times[1:] - times[:-1]) > spec.gap_ms
        if spec.max_duration_ms is not None:
            cell = (times - spec.offset_ms) // spec.max_duration_ms
            breaks[1:] |= cell[1:] != cell[:-1]
        for g in group_by:
            # Nulls compare as a value of their own (no document string holds NUL).
            col = pc.fill_null(table[g], "\x00").combine_chunks()
            breaks[1:] |= np.asarray(
                pc.not_equal(col[1:], col[:-1]).to_numpy(zero_copy_only=False), dtype=bool
            )
    chain_of_row = np.cumsum(breaks) - 1
    starts = np.flatnonzero(breaks)
    ends = np.append(starts[1:], n) - 1
    first, last = times[starts], times[ends]
    group_values = (
        list(zip(*(table[g].take(pa.array(starts)).to_pylist() for g in group_by), strict=True))
        if group_by
        else [()] * len(starts)
    )
    chains = [
        Chain(tuple(gv), int(f), int(la), int(e - s + 1))
        for gv, f, la, s, e in zip(group_values, first, last, starts, ends, strict=True)
    ]
    maxima = (
        {int(vb): int(t) for vb, t in _max_time_per_vb(lifting).items()}
        if spec.boundary == "event_time" and lifting.num_rows
        else {}
    )
    return ChainCut(table, chain_of_row, first, last, chains, maxima)


def _max_time_per_vb(table: pa.Table) -> dict[int, int]:
    times = arrow_epoch_ms(table["event_time"])
    grouped = pa.table({"vb": table["vb"], "t": times}).group_by("vb").aggregate([("t", "max")])
    return dict(zip(grouped["vb"].to_pylist(), grouped["t_max"].to_pylist(), strict=True))
