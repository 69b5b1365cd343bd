"""`eventing windows FN`: a windowed function's results (and a PNG chart), plus the window options of `run`.

Registers `windows` and adds `--spark-master` and `--close-windows` to `eventing run` (they reach the
service's window coordinators through EVENTING_SPARK_MASTER and EVENTING_CLOSE_WINDOWS).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from eventing.cli.output import emit_json, table
from eventing.errors import ConfigError


def _window_report(data_dir: str, name: str) -> dict[str, Any]:
    from eventing.storage.metadata import open_metadata
    from eventing.windows.runtime.coordinator import iso_ms, make_sink
    from eventing.windows.runtime.paths import WindowPaths
    from eventing.windows.runtime.row_writer import RowLayout
    from metadata.window_state import window_state_store

    store = open_metadata(data_dir, create=False)
    try:
        record = store.get_function(name)
        window = record.definition.get("window")
        if window is None:
            raise ConfigError(
                f"function '{name}' declares no window; add a \"window\" object to its definition and deploy it"
            )
        layout = RowLayout.for_definition(name, window)
        state = window_state_store(store).load(name)
        counters = store.counters(name)
    finally:
        store.close()
    results = make_sink(WindowPaths.of(data_dir, name), layout).read(name)
    spec = layout.spec
    operator = (state or {}).get("operator") or {}
    watermark = (operator.get("tracker") or {}).get("watermark_ms")
    rows = []
    for r in results.to_pylist():
        row = {
            "window_start": iso_ms(r["window_start_ms"]),
            "window_end": iso_ms(r["window_end_ms"]),
            **r,
        }
        rows.append(row)
    return {
        "function": name,
        "state": record.state.value,
        "window": spec.to_dict(),
        "group_by": list(layout.group_by),
        "aggregates": [a.name for a in spec.aggregates],
        "watermark": iso_ms(watermark) if spec.boundary == "event_time" else None,
        "open_windows": len(operator.get("open_windows") or []),
        "closed_not_emitted": len((state or {}).get("pending") or []),
        "windows_emitted": int(counters.get("windows_emitted", 0)),
        "late_rows": int(counters.get("dlq_late", 0)),
        "bad_event_time": int(counters.get("dlq_bad_event_time", 0)),
        "results": rows,
    }


def _describe(spec: dict[str, Any]) -> str:
    shape = f"{spec['kind']} {spec['size']}" + (f" every {spec['slide']}" if spec["kind"] == "hopping" else "")
    time_basis = f"event time '{spec['time_field']}'" if spec["boundary"] == "event_time" else "processing time"
    return f"{shape}, {time_basis}"


def cmd_windows(args: argparse.Namespace) -> int:
    from eventing.cli.app import existing_data_dir

    report = _window_report(existing_data_dir(args), args.function)
    aggregates = report["aggregates"]
    if args.aggregate is not None and args.aggregate not in aggregates:
        raise ConfigError(
            f"function '{args.function}' has no aggregate {args.aggregate!r}; its aggregates are {', '.join(aggregates)}"
        )
    if args.png:
        _chart(report, args.aggregate or aggregates[0], args.png)
    if args.json:
        emit_json(report)
        return 0
    print(
        f"windows of {report['function']} ({_describe(report['window'])}"
        + (f", grouped by {', '.join(report['group_by'])}" if report["group_by"] else "")
        + f"): {report['windows_emitted']} emitted, {report['open_windows']} open, "
        f"{report['closed_not_emitted']} closed and not yet emitted; late rows {report['late_rows']}, "
        f"documents without a usable event time {report['bad_event_time']}"
    )
    if report["watermark"] is not None:
        print(f"watermark: {report['watermark']}")
    rows = report["results"]
    if args.limit:
        rows = rows[-args.limit :]
    if not rows:
        print("no window results yet; windows are emitted when they close (see `eventing run --close-windows`)")
    else:
        headers = ["window start", "window end", *report["group_by"], *aggregates]
        print(table(headers, [[r["window_start"], r["window_end"], *(r[g] for g in report["group_by"]),
                               *(r[a] for a in aggregates)] for r in rows]))
    if args.png:
        print(f"chart of {args.aggregate or aggregates[0]} written to {args.png}")
    return 0


def _chart(report: dict[str, Any], aggregate: str, path: str) -> None:
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


def _with_window_options(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run_with_window_options(args: argparse.Namespace) -> int:
        from eventing.windows.runtime.host import CLOSE_WINDOWS_ENV
        from eventing.windows.spark.spark_session import MASTER_ENV, check_spark_master

        if getattr(args, "spark_master", None):
            check_spark_master(args.spark_master)
            os.environ[MASTER_ENV] = args.spark_master
        if getattr(args, "close_windows", False):
            os.environ[CLOSE_WINDOWS_ENV] = "1"
        return run(args)

    return run_with_window_options


def register(sub: Any, add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add("windows", cmd_windows, "results of a windowed function: one row per window and group, and a chart")
    p.add_argument("function")
    p.add_argument("--png", metavar="FILE", help="also write a chart of one aggregate over the windows (PNG)")
    p.add_argument("--aggregate", metavar="NAME", help="the aggregate to chart (default: the first one)")
    p.add_argument("--limit", type=int, default=0, help="show only the last N result rows (default: all)")
    run = sub.choices.get("run")
    if run is None:
        return
    run.add_argument("--spark-master", default=None,
                     help="Spark master for window aggregation (default $EVENTING_SPARK_MASTER or local[*])")
    run.add_argument("--close-windows", action="store_true",
                     help="with --until-caught-up: at the end of the input close every window still open "
                     "(default: windows close only by watermark and idle timeouts, and stay open for the next run)")
    run.set_defaults(func=_with_window_options(run.get_default("func")))
