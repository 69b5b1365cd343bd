"""A windowed function's results as the CLI, the demo and the HTTP API show them, and its PNG chart."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from eventing.errors import ConfigError
from eventing.storage.state import StateLike, as_state

# What each watermark of a report is (docs/windows.md): a report has the closing one, and a function with
# arrival-time policies also the policies' greatest one, which is not what closes windows.
WATERMARK_IS = {
    "vbuckets": "closing watermark: the least of the active vBuckets' watermarks (each the latest event time "
    "seen there minus out_of_order_tolerance); windows close when it passes their end plus allowed_lateness",
    "substreams": "closing watermark: the least of the substreams' watermarks (each the latest windowed time "
    "of its rows minus out_of_order_tolerance, or the arrival clock minus late_arrival_tolerance); each "
    "substream's windows close on its own",
}
POLICIES_WATERMARK_IS = (
    "the arrival-time policies' greatest watermark over their streams (vBuckets, or substreams): the most "
    "advanced stream, the base of watermark_delay_ms; windows do not close on it"
)


def window_status(state: StateLike, name: str) -> dict[str, Any]:
    """Watermark, open windows and counts of a windowed function, without reading its results (metrics)."""
    state = as_state(state)
    from eventing.core.times import iso_ms
    from eventing.windows.runtime.row_writer import RowLayout

    with state.metadata as store:
        record = store.get_function(name)
        window = record.definition.get("window")
        if window is None:
            raise ConfigError(
                f"function '{name}' declares no window; add a \"window\" object to its definition and deploy "
                "it"
            )
        layout = RowLayout.for_definition(name, window)
        saved = store.window_states().load(name)
        counters = store.counters(name)
    spec = layout.spec
    operator = (saved or {}).get("operator") or {}
    watermark = (operator.get("tracker") or {}).get("watermark_ms")
    basis = "vbuckets"
    if operator.get("substreams") is not None:
        basis = "substreams"
        # Windows close per substream: the watermark that matters is the least substream's (or, grouped
        # without the key, the arrival clock's floor), not the vBuckets'.
        from eventing.windows.semantics.substreams import SubstreamWindowOperator

        try:
            watermark = SubstreamWindowOperator.from_state(spec, operator).watermark_ms
        except (ValueError, KeyError, TypeError):
            pass  # a state this build cannot read: the run that uses it says so
    out = {
        "function": name,
        "state": record.state.value,
        "window": spec.to_dict(),
        "group_by": list(layout.group_by),
        "aggregates": [a.name for a in spec.aggregates],
        # The coordinator's closing watermark: windows close when it passes their end + allowed_lateness.
        "watermark": iso_ms(watermark) if spec.boundary == "event_time" else None,
        "watermark_ms": watermark if spec.boundary == "event_time" else None,
        "watermark_of": basis
        if spec.boundary == "event_time"
        else None,  # the least of: vbuckets, substreams
        "watermark_is": WATERMARK_IS[basis] if spec.boundary == "event_time" else None,
        "open_windows": len(operator.get("open_windows") or [])
        + sum(len(sessions) for _, _, sessions in operator.get("open") or [])
        + len((operator.get("substreams") or {}).get("open") or []),  # (window, substream) pairs
        "closed_not_emitted": len((saved or {}).get("pending") or []),
        "windows_emitted": int(counters.get("windows_emitted", 0)),
        "late_rows": int(counters.get("dlq_late", 0)),
        "bad_event_time": int(counters.get("dlq_bad_event_time", 0)),
        "_layout": layout,
    }
    if spec.uses_arrival_policies:
        out["arrival_policies"] = arrival_metrics(spec, saved, counters)
    return out


def arrival_metrics(spec: Any, state: dict[str, Any] | None, counters: dict[str, Any]) -> dict[str, Any]:
    """Azure Stream Analytics' metrics of a function's arrival-time policies: out-of-order, late input and
    early input events (dropped or adjusted alike), rows adjusted and dropped, rows held for substreams, and
    the watermark delay (wall clock minus the greatest watermark of the policies, ms)."""
    from eventing.core import counters as names

    arrival = (state or {}).get("arrival") or {}
    marks = [int(w) for _, w in arrival.get("watermarks") or []]
    top = max(marks, default=None)
    return {
        "watermark_is": POLICIES_WATERMARK_IS,
        "out_of_order_events": int(counters.get(names.OUT_OF_ORDER_EVENTS, 0)),
        "late_input_events": int(counters.get(names.LATE_INPUT_EVENTS, 0)),
        "early_input_events": int(counters.get(names.EARLY_INPUT_EVENTS, 0)),
        "rows_adjusted": int(counters.get(names.ADJUSTED_ROWS, 0)),
        **{
            f"dropped_{reason}": int(counters.get(names.dlq(reason), 0))
            for reason in ("early", "late_arrival", "out_of_order", "no_substream_key")
        },
        "rows_held": sum(int(rows) for _, rows in (state or {}).get("held") or []),
        "watermark_ms": top,
        "watermark_delay_ms": None if top is None else int(time.time() * 1000) - top,
        "streams": len(marks),
    }


def adjusted_rows(state: StateLike, name: str) -> list[dict[str, Any]]:
    """The rows the arrival-time policies windowed at another time than their event time, oldest first:
    vb, seqno, key, event_time_ms, arrival_ms, windowed_ms, rules (early, late_arrival, out_of_order) and
    substream."""
    from eventing.windows.batches import read_row_file
    from eventing.windows.runtime.paths import ADJUSTED, window_area

    area = window_area(state, name)
    files = [f for f in area.list(ADJUSTED) if f.startswith("f") and f.endswith(".parquet")]
    out: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    for file in sorted(files, key=lambda f: int(f[: -len(".parquet")].split("-")[1])):
        for row in read_row_file(area, f"{ADJUSTED}/{file}", function=name).to_pylist():
            # A coordinator fenced mid-poll may leave a file its successor writes again: the same fates.
            if (row["vb"], row["seqno"]) not in seen:
                seen.add((row["vb"], row["seqno"]))
                out.append(row)
    return out


def window_report(state: StateLike, name: str) -> dict[str, Any]:
    """window_status plus every emitted result row (window start and end as ISO text and epoch ms)."""
    state = as_state(state)
    from eventing.core.times import iso_ms
    from eventing.windows.runtime.emission import make_sink

    report = window_status(state, name)
    layout = report.pop("_layout")
    results = make_sink(state, name, layout).read(name)
    report["results"] = [
        {"window_start": iso_ms(r["window_start_ms"]), "window_end": iso_ms(r["window_end_ms"]), **r}
        for r in results.to_pylist()
    ]
    return report


def write_chart(report: dict[str, Any], aggregate: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[datetime, float]]] = {}
    for r in report["results"]:
        label = " / ".join(str(r[g]) for g in report["group_by"]) or aggregate
        value = r[aggregate]
        if value is not None:
            start = datetime.fromtimestamp(r["window_start_ms"] / 1000, UTC)
            series.setdefault(label, []).append((start, float(value)))
    # Many groups make an unreadable chart: keep the 12 with the largest totals.
    ranked = sorted(series, key=lambda k: -sum(v for _, v in series[k]))
    fig, ax = plt.subplots(figsize=(11, 5))
    for label in ranked[:12]:
        points = sorted(series[label])
        starts: Any = [p[0] for p in points]  # matplotlib plots datetimes on a date axis
        ax.plot(starts, [p[1] for p in points], marker=".", linewidth=1, label=label)
    spec = report["window"]
    ax.set_title(f"{report['function']}: {aggregate} per {spec['kind']} {spec['size']} window")
    ax.set_xlabel("window start (UTC)")
    ax.set_ylabel(aggregate)
    if len(ranked) > 1:
        extra = f" (top 12 of {len(ranked)})" if len(ranked) > 12 else ""
        ax.legend(title=", ".join(report["group_by"]) + extra, fontsize="small", ncols=2)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz=UTC))
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
