"""A windowed function's results as the CLI, the demo and the HTTP API show them, and its PNG chart."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from eventing.errors import ConfigError


def window_status(data_dir: str, name: str) -> dict[str, Any]:
    """Watermark, open windows and counts of a windowed function, without reading its results (metrics)."""
    from eventing.storage.metadata import open_metadata
    from eventing.windows.runtime.coordinator import iso_ms
    from eventing.windows.runtime.row_writer import RowLayout

    store = open_metadata(data_dir, create=False)
    try:
        record = store.get_function(name)
        window = record.definition.get("window")
        if window is None:
            raise ConfigError(
                f"function '{name}' declares no window; add a \"window\" object to its definition and deploy it"
            )
        layout = RowLayout.for_definition(name, window)
        state = store.window_states().load(name)
        counters = store.counters(name)
    finally:
        store.close()
    spec = layout.spec
    operator = (state or {}).get("operator") or {}
    watermark = (operator.get("tracker") or {}).get("watermark_ms")
    return {
        "function": name,
        "state": record.state.value,
        "window": spec.to_dict(),
        "group_by": list(layout.group_by),
        "aggregates": [a.name for a in spec.aggregates],
        "watermark": iso_ms(watermark) if spec.boundary == "event_time" else None,
        "watermark_ms": watermark if spec.boundary == "event_time" else None,
        "open_windows": len(operator.get("open_windows") or [])
        + sum(len(sessions) for _, _, sessions in operator.get("open") or []),
        "closed_not_emitted": len((state or {}).get("pending") or []),
        "windows_emitted": int(counters.get("windows_emitted", 0)),
        "late_rows": int(counters.get("dlq_late", 0)),
        "bad_event_time": int(counters.get("dlq_bad_event_time", 0)),
        "_layout": layout,
    }


def window_report(data_dir: str, name: str) -> dict[str, Any]:
    """window_status plus every emitted result row (window start and end as ISO text and epoch ms)."""
    from eventing.windows.runtime.coordinator import iso_ms, make_sink
    from eventing.windows.runtime.paths import WindowPaths

    report = window_status(data_dir, name)
    layout = report.pop("_layout")
    results = make_sink(WindowPaths.of(data_dir, name), layout).read(name)
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
