"""Dead letters of the window coordinator: the error text of a late row, and the DLQ rows of rows it drops
(late, or dropped by an arrival-time policy), each carrying the original mutation from the source bucket.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgpack
import pyarrow as pa

from eventing.core.mutation import OP_UPDATE, Mutation, pack_mutation
from eventing.core.times import iso_ms
from eventing.windows.semantics import WindowOperator, WindowSpec, windows_for
from eventing.windows.semantics.sessions import SessionOperator
from eventing.windows.semantics.windows import arrow_epoch_ms
from metadata import DlqRow

log = logging.getLogger("eventing.windows")


def late_errors(
    late: pa.Table, spec: WindowSpec, operator: WindowOperator | SessionOperator, cutoff_ms: int | None
) -> list[str]:
    """The error text of each late row: which window closed before it came, and the watermark then."""
    times = arrow_epoch_ms(late["event_time"]).to_pylist()
    errors = []
    # Shared by every late row of this poll (formatting costs ~5 us a row, and a catch-up can make many).
    tail = (
        f"closed when the watermark passed its end + allowed lateness {spec.allowed_lateness_ms} ms); rows "
        f"before {iso_ms(cutoff_ms)} were late, the watermark was {iso_ms(operator.watermark_ms)}"
    )
    labels: dict[int, str] = {}
    slide, offset = spec.slide_ms, spec.offset_ms
    sessions = spec.is_session
    if isinstance(operator, SessionOperator):
        tail = (
            f"its session (gap {spec.gap_ms} ms) would end at or before the close frontier "
            f"{iso_ms(operator.close_frontier_ms)}, or it came within the gap of a session already emitted"
        )
    for t_ms in times:
        if sessions:
            error = f"event time {iso_ms(t_ms)} arrived too late for a session: " + tail
        else:
            last_start = t_ms - (t_ms - offset) % slide
            label = labels.get(last_start)
            if label is None:
                label = labels[last_start] = windows_for(t_ms, spec)[-1].label
            error = (
                f"event time {iso_ms(t_ms)} arrived after every window holding it had closed (the last, "
                f"{label}, " + tail
            )
        errors.append(error)
    return errors


def dead_letters(
    function: str,
    generation: int,
    rows: pa.Table,
    reason: str,
    errors: list[str],
    now: int,
    source: Callable[[], Any] | None,
) -> list[DlqRow]:
    """DLQ rows of ``reason`` for ``rows``, each with its error text, carrying the original mutation from
    the source bucket (``source`` opens it; None: not known) when it is there (else a document holding the
    row's event time)."""
    keys = rows.select(["vb", "seqno", "key"]).to_pylist()
    times = arrow_epoch_ms(rows["event_time"]).to_pylist()
    originals = _originals(function, source, keys)
    at = now / 1000
    out = []
    for r, t_ms, error in zip(keys, times, errors, strict=True):
        original = originals.get((r["vb"], r["seqno"]))
        if original is None:
            doc = msgpack.packb({"event_time_ms": t_ms}, use_bin_type=True)
            original = Mutation(r["vb"], r["seqno"], r["key"], OP_UPDATE, 0, doc, None, 0, 0)
        out.append(
            DlqRow(
                function,
                r["vb"],
                r["seqno"],
                r["key"],
                reason,
                error,
                "",
                0,
                at,
                at,
                pack_mutation(original),
                generation=generation,
            )
        )
    return out


def _originals(
    function: str, source: Callable[[], Any] | None, rows: list[dict[str, Any]]
) -> dict[tuple[int, int], Mutation]:
    originals: dict[tuple[int, int], Mutation] = {}
    if source is None or not rows:
        return originals
    try:
        bucket = source()
        by_vb: dict[int, list[int]] = {}
        for r in rows:
            by_vb.setdefault(r["vb"], []).append(r["seqno"])
        for vb, seqnos in by_vb.items():
            lo, hi = min(seqnos), max(seqnos)
            for m in bucket.read_vb(vb, lo - 1, hi - lo + 1):
                originals[(m.vb, m.seqno)] = m
    except Exception as exc:  # noqa: BLE001 - the row itself is still kept
        log.warning(
            "function %s: cannot read dead-lettered rows' mutations from the source (%s)", function, exc
        )
    return originals
