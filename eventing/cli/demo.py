"""`eventing demo`: the main job on embedded defaults, end to end, as a new user would first see it."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from eventing.cli.common import ProgressRenderer, writable_state
from eventing.cli.output import emit_json, progress_enabled, table
from eventing.errors import ConfigError, EventingError, LifecycleError
from eventing.storage.state import State, StateLike, as_state
from functions import FUNCTIONS_DIR
from metadata import FunctionRecord, FunctionState

log = logging.getLogger("eventing.demo")

DEMO_BUCKETS = ("customers", "emails", "scores")
HANDLER_FUNCTIONS = ("fn_email", "fn_score")
WINDOW_FUNCTION = "fn_sales_per_minute"  # windowed by event time over the same customers; PySpark merges
DEMO_FUNCTIONS = (*HANDLER_FUNCTIONS, WINDOW_FUNCTION)
WINDOW_ROWS_SHOWN = 6


DEMO_MARKER = "demo.made"  # metadata key: what the last demo made, so that the next one replaces only that


def _made(state: State) -> dict[str, dict[str, str]]:
    """What an earlier demo recorded making here: {"buckets": {name: uuid}, "functions": {name: mark}}."""
    try:
        made = json.loads(state.metadata.get_kv(DEMO_MARKER) or "{}")
    except ValueError:
        return {}
    return made if isinstance(made, dict) else {}


def _record(state: State, made: dict[str, dict[str, str]]) -> None:
    state.metadata.set_kv(DEMO_MARKER, json.dumps(made, sort_keys=True))


def _bucket_mark(state: State, name: str) -> str | None:
    """A bucket's identity (a new one when it is dropped and created again, or flushed)."""
    try:
        with state.open_bucket(name) as bucket:
            return bucket.uuid
    except EventingError:  # damaged: not recognisably the demo's
        return None


def _function_mark(record: FunctionRecord) -> str:
    """A function as the demo deployed it: its deployment's generation and its definition and code (a
    redeploy, or a function of the same name saved anew with other code, is another)."""
    body = json.dumps([record.definition, record.source], sort_keys=True)
    return f"{record.generation}:{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def _check_replaceable(state: State, reset: bool) -> None:
    """Before the demo drops its buckets and functions: refuse (one line) where they exist but an earlier demo
    did not make them (a user's own `customers` or `fn_email`), unless --reset; and refuse, even with
    --reset, to drop a bucket that a deployed or paused function other than the demo's own reads or writes.
    A demo's own bucket is recognised by its identity, a demo's own function by its deployment generation and
    code, both recorded in the metadata store when the demo made them."""
    made = _made(state)
    known = {r.name: r for r in state.metadata.list_functions()}
    buckets = [b for b in DEMO_BUCKETS if state.has_bucket(b)]
    theirs_b = [b for b in buckets if _bucket_mark(state, b) != made.get("buckets", {}).get(b)]
    theirs_f = [
        n
        for n in DEMO_FUNCTIONS
        if n in known and _function_mark(known[n]) != made.get("functions", {}).get(n)
    ]
    ours_f = {n for n in DEMO_FUNCTIONS if n in known and n not in theirs_f}
    for record in known.values():
        if record.name in ours_f or record.state is FunctionState.UNDEPLOYED:
            continue
        d = record.definition
        named = [d.get("source_bucket")] + [
            b.get("bucket") for b in d.get("bindings", []) if isinstance(b, dict)
        ]
        used = sorted({str(n).split(".")[0] for n in named if n} & set(buckets))
        if used:
            raise LifecycleError(
                f"the demo would drop bucket '{used[0]}' in {state.shown}, which function '{record.name}' "
                f"uses and is {record.state.value}; undeploy it first (`eventing undeploy {record.name}`), "
                "or run the demo with another --data-dir"
            )
    if (theirs_b or theirs_f) and not reset:
        named_all = [f"bucket '{b}'" for b in theirs_b] + [f"function '{n}'" for n in theirs_f]
        listed = ", ".join(named_all[:-1]) + " and " + named_all[-1] if len(named_all) > 1 else named_all[0]
        raise ConfigError(
            f"the demo would drop and replace {listed} in {state.shown}, which it has no record of making "
            "(yours, or an older version's); run it with another data directory (`eventing --data-dir "
            "/tmp/eventing-demo demo`), or pass --reset to replace them"
        )


def _reset(state: State) -> None:
    """Start from a clean slate so the demo can be run again: drop its functions and buckets (checked by
    _check_replaceable first)."""
    from eventing.control import lifecycle

    store = state.metadata
    known = {r.name: r for r in store.list_functions()}
    for name in DEMO_FUNCTIONS:
        record = known.get(name)
        if record is None:
            continue
        if record.state in (FunctionState.DEPLOYED, FunctionState.PAUSED):
            store.transition(name, FunctionState.UNDEPLOYING, "undeploy")
        if record.state is not FunctionState.UNDEPLOYED:
            lifecycle.complete_transition(store, name, FunctionState.UNDEPLOYED, "undeploy")
        store.delete_function(name)
    for name in DEMO_BUCKETS:
        if state.has_bucket(name):
            state.drop_bucket(name)
    _record(state, {})


def run_demo(state: State, args: argparse.Namespace) -> int:
    from eventing.api import Eventing
    from eventing.control import lifecycle
    from eventing.ops.windows import write_chart

    args.ray_address = args.ray_address or os.environ.get("EVENTING_RAY_ADDRESS")
    app = Eventing(store=state.location, executor=args.executor, ray_address=args.ray_address)
    say = (lambda *a: None) if args.json else print
    started = time.perf_counter()
    if state.metadata.live_services(lifecycle.SERVICE_STALE_S):
        raise EventingError(
            f"an eventing service is running on {state.shown}; stop it (Ctrl-C) before the demo resets it"
        )
    _check_replaceable(state, args.reset)
    _reset(state)
    # Spark's cold start (~10 s of JVM, and a first job) overlaps loading and deploying instead of stalling
    # the first window.
    warm = threading.Thread(target=_warm_spark, name="spark-warm-up", daemon=True)
    warm.start()
    say(f"1. creating buckets {', '.join(DEMO_BUCKETS)} in {state.shown}")
    made: dict[str, dict[str, str]] = {"buckets": {}, "functions": {}}
    for name in DEMO_BUCKETS:
        with app.create_bucket(name, exist_ok=False) as bucket:
            made["buckets"][name] = bucket.uuid
        _record(state, made)  # at once: a demo stopped half way is still recognised as the demo's
    say(f"2. loading {args.mutations:,} faker mutations over {args.documents:,} customers (seed {args.seed})")
    t0 = time.perf_counter()
    app.load("customers", documents=args.documents, mutations=args.mutations, seed=args.seed)
    source = app.bucket("customers")
    load_s = time.perf_counter() - t0
    say(f"   {args.mutations / load_s:,.0f} mutations/s")
    say(
        f"3. deploying fn_email (4 workers), fn_score (3 workers) and {WINDOW_FUNCTION} (2 workers; 1-minute "
        "event-time windows per country, merged by PySpark)"
    )
    for name in DEMO_FUNCTIONS:
        made["functions"][name] = _function_mark(app.deploy(FUNCTIONS_DIR / f"{name}.json"))
        _record(state, made)
    say(
        "4. processing everything on "
        f"{'a local Ray instance' if args.executor == 'ray' and not args.ray_address else args.executor}"
    )

    renderer = ProgressRenderer(enabled=not args.json and progress_enabled())
    try:
        summary = app.run(until_caught_up=True, on_progress=renderer)
    finally:
        renderer.close()
    if summary.errors:
        for err in summary.errors:
            print(f"error: {err}")
        return 1
    stats = {name: app.stats(name).to_dict() for name in DEMO_FUNCTIONS}
    vbmaps = {name: app.vbucket_map(name).to_dict() for name in HANDLER_FUNCTIONS}
    windows = app.windows(WINDOW_FUNCTION).to_dict()
    chart = str((state.directory or Path()).resolve() / f"{WINDOW_FUNCTION}.png")
    if windows["results"]:
        write_chart(
            windows,
            "sum_amount" if "sum_amount" in windows["aggregates"] else windows["aggregates"][0],
            chart,
        )
    else:
        chart = ""
    emails = app.bucket("emails")
    scores = app.bucket("scores")
    result = {
        "data_dir": state.shown,
        "load_mutations_per_s": round(args.mutations / load_s),
        "run_seconds": round(summary.seconds, 2),
        "functions": {n: {"handled": p.handled, "state": p.state} for n, p in summary.functions.items()},
        "stats": stats,
        "vbmap": vbmaps,
        "buckets": {b.name: b.stats()["documents"] for b in (source, emails, scores)},
        "windows": {k: v for k, v in windows.items() if k != "results"}
        | {"results_shown": _last_windows(windows)[1], "result_rows": len(windows["results"])},
        "chart": chart or None,
        "console": _console_hint(state),
        "demo_seconds": round(time.perf_counter() - started, 1),
    }
    if args.json:
        emit_json(result)
        return 0
    print(f"   done in {summary.seconds:.1f}s")
    print()
    for name in HANDLER_FUNCTIONS:
        s = stats[name]
        print(
            f"== {name}: {s['mutations_seen']:,} mutations seen, on_update ok {s['on_update_success']:,} / "
            f"failed {s['on_update_failure']}, on_delete ok {s['on_delete_success']:,} / failed "
            f"{s['on_delete_failure']}, checkpoint lag {s['checkpoint_lag']}, "
            f"{s.get('last_run', {}).get('mutations_per_s', 0):,} mutations/s"
        )
        for w in vbmaps[name]["workers"]:
            print(f"   {w['worker']}: {w['vbuckets']} vBuckets  {w['ranges']}")
    print()
    print(
        f"customers: {result['buckets']['customers']:,} documents; emails: {result['buckets']['emails']:,} "
        f"drafts; scores: {result['buckets']['scores']:,} scores"
    )
    key = next(iter(emails.keys()), None)
    if key:
        print(f"example: emails[{key!r}] = {emails.get(key)}")
        print(f"         scores[{key!r}] = {scores.get(key)}")
    print()
    _print_windows(windows, stats[WINDOW_FUNCTION])
    if chart:
        print(f"   chart of sum_amount per window and country: {chart}")
    me = program()
    where = _store_option(state)
    print(
        f"\nnext: {me} {where} stats fn_email   |   {me} {where} vbmap fn_score"
        f"   |   {me} {where} windows {WINDOW_FUNCTION}"
    )
    print(f"console: {_console_hint(state)}")
    print(
        f"(demo took {result['demo_seconds']:.0f}s: loading {load_s:.0f}s, processing {summary.seconds:.0f}s)"
    )
    return 0


def _warm_spark() -> None:
    from pyspark.sql import functions as F

    from eventing.windows.spark.spark_session import get_spark

    try:
        # The session and a first tiny aggregation: a cold JVM's first job costs another ~5 s (MEASURED.md).
        get_spark().range(100).groupBy((F.col("id") % 3).alias("k")).count().collect()
    except Exception as exc:  # noqa: BLE001 - the window coordinator reports a Spark failure itself
        log.warning("Spark warm-up failed: %s", exc)


def _store_option(state: StateLike) -> str:
    state = as_state(state)
    return f"--data-dir {state.shown}" if state.directory is not None else f"--store '{state.shown}'"


def _console_hint(state: StateLike) -> str:
    return f"{program()} serve {_store_option(state)}   then open http://127.0.0.1:8096/"


def program() -> str:
    """This command as a shell runs it again: `eventing` where that is the one on PATH, else its path as
    typed (scripts/demo.sh runs `.venv/bin/eventing`, which no PATH holds), or `python -m eventing`."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "eventing"
    if os.path.basename(argv0) == "__main__.py":  # python -m eventing
        return f"{_typed(sys.executable)} -m eventing"
    on_path = shutil.which("eventing")
    if on_path and os.path.exists(argv0) and os.path.samefile(on_path, argv0):
        return "eventing"
    if os.path.basename(argv0) == "eventing" and os.path.exists(argv0):
        return _typed(argv0)
    return "eventing"


def _typed(path: str) -> str:
    """A path as short as it runs from here: relative below the working directory, else absolute."""
    relative = os.path.relpath(path)
    if relative.startswith(".."):
        return os.path.abspath(path)
    return relative if os.sep in relative else f".{os.sep}{relative}"


def _last_windows(report: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A few closed windows in a row for one group (the last result's): the most recent ones."""
    results = report["results"]
    if not results:
        return {}, []
    group = {g: results[-1][g] for g in report["group_by"]}
    return group, [r for r in results if all(r[g] == v for g, v in group.items())][-WINDOW_ROWS_SHOWN:]


def _print_windows(report: dict[str, Any], stats: dict[str, Any]) -> None:
    results = report["results"]
    print(
        f"== {WINDOW_FUNCTION}: {stats['mutations_seen']:,} mutations seen; {report['windows_emitted']:,} "
        f"windows emitted ({len(results):,} rows, one per window and country), {report['open_windows']} "
        f"still open; late rows {report['late_rows']}"
    )
    print(
        f"   watermark: {report['watermark']} (per vBucket the latest event time seen minus the "
        f"{report['window']['out_of_order_tolerance']} out-of-order tolerance; the least over active "
        "vBuckets; windows ending at or before it are closed)"
    )
    if not results:
        print("   no window has closed yet")
        return
    aggregates = report["aggregates"]
    group, shown = _last_windows(report)
    rows = [
        [
            r["window_start"],
            r["window_end"],
            *(r[g] for g in report["group_by"]),
            *(round(r[a], 2) if isinstance(r[a], float) else r[a] for a in aggregates),
        ]
        for r in shown
    ]
    if group:
        print(
            f"   the last {len(shown)} closed windows of "
            + ", ".join(f"{g} {v}" for g, v in group.items())
            + " (every group: the chart, or `eventing windows`):"
        )
    text = table(["window start", "window end", *report["group_by"], *aggregates], rows)
    print("   " + text.replace("\n", "\n   "))


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(writable_state(args), args)


def register(sub: Any, add: Any) -> None:
    p = add(
        "demo",
        cmd_demo,
        "the main job on embedded defaults: load customers, deploy fn_email, fn_score and "
        "the windowed fn_sales_per_minute, process everything on a local Ray instance with PySpark merging "
        "the windows, print stats, vBucket maps, closed windows with the watermark, a chart, and the console",
    )
    p.add_argument("--documents", type=int, default=20_000)
    p.add_argument("--mutations", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--ray-address", default=None, help="join an existing Ray cluster (default $EVENTING_RAY_ADDRESS)"
    )
    p.add_argument("--executor", choices=["ray", "in-process"], default="ray")
    p.add_argument(
        "--reset",
        action="store_true",
        help=f"drop and replace the buckets {', '.join(DEMO_BUCKETS)} and the functions "
        f"{', '.join(DEMO_FUNCTIONS)} even where no earlier demo made them (without it the demo replaces "
        "only its own; never a bucket that another deployed or paused function uses)",
    )
