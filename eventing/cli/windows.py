"""`eventing windows FN`: a windowed function's results (and a PNG chart)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from eventing.cli.output import ID_COLUMNS, emit_json, table
from eventing.errors import ConfigError


def _describe(spec: dict[str, Any]) -> str:
    if spec["kind"] == "session":
        shape = f"session gap {spec['gap']}" + (
            f" max {spec['max_duration']}" if spec.get("max_duration") else ""
        )
    else:
        shape = f"{spec['kind']} {spec['size']}" + (
            f" every {spec['slide']}" if spec["kind"] == "hopping" else ""
        )
    if spec.get("offset"):
        shape += f" offset {spec['offset']}"
    time_basis = (
        f"event time '{spec['time_field']}'" if spec["boundary"] == "event_time" else "processing time"
    )
    return f"{shape}, {time_basis}"


def cmd_windows(args: argparse.Namespace) -> int:
    from eventing.cli.common import existing_state
    from eventing.ops.windows import window_report, write_chart

    state = existing_state(args)
    if args.adjusted:
        return _adjusted(state, args)
    report = window_report(state, args.function)
    aggregates = report["aggregates"]
    if args.aggregate is not None and args.aggregate not in aggregates:
        raise ConfigError(
            f"function '{args.function}' has no aggregate {args.aggregate!r}; its aggregates are "
            f"{', '.join(aggregates)}"
        )
    if args.limit < 0:
        raise ConfigError(f"--limit is {args.limit}; give a number of result rows >= 1 (0: all)")
    if args.png:
        write_chart(report, args.aggregate or aggregates[0], args.png)
    if args.json:
        if args.limit:
            report["results_total"] = len(report["results"])
            report["results"] = report["results"][-args.limit :]
        emit_json(report)
        return 0
    print(
        f"windows of {report['function']} ({_describe(report['window'])}"
        + (f", grouped by {', '.join(report['group_by'])}" if report["group_by"] else "")
        + f"): {report['windows_emitted']} emitted, {report['open_windows']} open, "
        f"{report['closed_not_emitted']} closed and not yet emitted; late rows {report['late_rows']}, "
        f"documents without a usable event time {report['bad_event_time']}"
    )
    policies = report.get("arrival_policies")
    if report["watermark"] is not None:
        least = "substreams'" if report["watermark_of"] == "substreams" else "vBuckets'"
        print(
            f"closing watermark: {report['watermark']} (the least of the {least} watermarks; windows close "
            "on it)"
        )
    if policies is not None and policies["watermark_ms"] is not None:
        from eventing.core.times import iso_ms

        print(
            f"arrival-time policies' greatest watermark: {iso_ms(policies['watermark_ms'])} (the most "
            "advanced stream; watermark_delay_ms counts from it)"
        )
    if policies is not None:
        print(
            f"arrival-time policies: {policies['out_of_order_events']} out-of-order, "
            f"{policies['late_input_events']} late input and {policies['early_input_events']} early input "
            f"events; {policies['rows_adjusted']} rows adjusted (`eventing windows {args.function} "
            f"--adjusted`), {policies['rows_held']} waiting for earlier arrivals"
        )
    rows = report["results"]
    if args.limit:
        rows = rows[-args.limit :]
    if not rows:
        print(
            "no window results yet; windows are emitted when they close (see `eventing run --close-windows`)"
        )
    else:
        headers = ["window start", "window end", *report["group_by"], *aggregates]
        print(
            table(
                headers,
                [
                    [
                        r["window_start"],
                        r["window_end"],
                        *(r[g] for g in report["group_by"]),
                        *(r[a] for a in aggregates),
                    ]
                    for r in rows
                ],
                plain={*ID_COLUMNS, *report["group_by"]},
            )
        )  # group values are keys (a store id), not counts
    if args.png:
        print(f"chart of {args.aggregate or aggregates[0]} written to {args.png}")
    return 0


def _adjusted(state: Any, args: argparse.Namespace) -> int:
    """The rows the arrival-time policies windowed at another time than their event time."""
    from eventing.core.times import iso_ms
    from eventing.ops.windows import adjusted_rows, window_status

    status = window_status(state, args.function)  # names the fix for an unknown or window-less function
    if "arrival_policies" not in status:
        raise ConfigError(
            f"function '{args.function}' declares no arrival-time policies, so no row is adjusted; see "
            "early_arrival_policy, out_of_order_policy and late_arrival_tolerance in docs/time-semantics.md"
        )
    rows = adjusted_rows(state, args.function)
    if args.limit:
        rows = rows[-args.limit :]
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        print(f"no row of {args.function} was adjusted")
        return 0
    print(
        table(
            ["vb", "seqno", "key", "event time", "arrival", "windowed at", "rules", "substream"],
            [
                [
                    r["vb"],
                    r["seqno"],
                    r["key"],
                    iso_ms(r["event_time_ms"]),
                    iso_ms(r["arrival_ms"]),
                    iso_ms(r["windowed_ms"]),
                    r["rules"],
                    r["substream"] or "-",
                ]
                for r in rows
            ],
        )
    )
    return 0


def register(sub: Any, add: Callable[..., argparse.ArgumentParser]) -> None:
    p = add(
        "windows", cmd_windows, "results of a windowed function: one row per window and group, and a chart"
    )
    p.add_argument("function")
    p.add_argument("--png", metavar="FILE", help="also write a chart of one aggregate over the windows (PNG)")
    p.add_argument("--aggregate", metavar="NAME", help="the aggregate to chart (default: the first one)")
    p.add_argument("--limit", type=int, default=0, help="show only the last N result rows (default: all)")
    p.add_argument(
        "--adjusted",
        action="store_true",
        help="list the rows the arrival-time policies windowed at another time than their event time",
    )
