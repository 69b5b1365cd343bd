"""`eventing run` (the service), and the views of a running function: vbmap, stats."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

from eventing.cli.common import (
    ProgressRenderer,
    check_function_buckets,
    existing_state,
    non_negative_int,
    positive_int,
    process_started_at,
)
from eventing.cli.output import emit_json, progress_enabled, table
from eventing.core import counters as counter_names
from eventing.core.wording import counted
from eventing.errors import EventingError
from eventing.storage.state import State

# Exit statuses of `eventing run` (docs/operations-run.md): scripts can tell a clean run from one that
# dead-lettered mutations without parsing its output.
EXIT_OK = 0  # every mutation handled (or no function to run)
EXIT_FAILED = 1  # a function failed (its error is printed) or a window could not be emitted
EXIT_DEAD_LETTERS = 3  # the run finished, but some mutations went to the dead-letter queue in it
EXIT_INTERRUPTED = 130  # Ctrl-C: stopped after a checkpoint, as `bucket load` does
PROGRESS_EVERY_S = 30.0  # one progress line this often when the output is not a terminal


class LineProgress:
    """One line per function every ``every`` seconds on stderr, for logs and pipes (a terminal gets bars)."""

    def __init__(self, every: float, enabled: bool):
        self.every = every
        self.enabled = enabled
        self.last = time.monotonic()

    def __call__(self, summary: Any) -> None:
        if not self.enabled or time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        for name, p in sorted(summary.functions.items()):
            letters = sum(p.dead_letters.values())
            print(
                f"progress: {name}: {p.handled:,} handled, backlog {p.backlog:,}, {p.rate_mps:,.0f}/s, "
                f"{p.state}" + (f", {letters:,} dead-lettered" if letters else ""),
                file=sys.stderr,
                flush=True,
            )


def cmd_run(args: argparse.Namespace) -> int:
    if not args.json:
        return _run(args, sys.stdout)
    # With --json, standard output holds the one JSON object: what else is printed while the run goes (Ray's
    # lines from its workers and raylets, a handler's print) goes to standard error.
    out, sys.stdout = sys.stdout, sys.stderr
    try:
        return _run(args, out)
    finally:
        sys.stdout = out


def _run(args: argparse.Namespace, out: Any) -> int:
    from eventing.control.failover import failover_timeout_s
    from eventing.control.service import EventingService
    from eventing.windows.runtime.host import WindowOptions
    from eventing.workers.executor import make_executor

    args.ray_address = args.ray_address or os.environ.get("EVENTING_RAY_ADDRESS")
    args.spark_master = args.spark_master or os.environ.get("EVENTING_SPARK_MASTER")
    state = existing_state(args)
    for name in dict.fromkeys(args.function or ()):
        state.metadata.get_function(name)  # an unknown name: `unknown function 'x' (known: ...)`, exit 2
    timeout_s = failover_timeout_s(args.failover_timeout)  # a bad value fails before Ray starts
    if args.spark_master:
        from eventing.windows.spark.spark_session import check_spark_master

        check_spark_master(args.spark_master)  # one line in seconds, not a minute of Spark retrying
    check_function_buckets(state, args.function or None)  # a damaged bucket file: one line, before Ray starts
    began = time.perf_counter()
    executor = make_executor(args.executor, args.ray_address, state, worker_processes=args.worker_processes)
    ray_s = time.perf_counter() - began
    live = not args.json and not args.quiet
    bars = ProgressRenderer(enabled=live and progress_enabled())
    lines = LineProgress(
        args.progress_every, enabled=live and not progress_enabled() and args.progress_every > 0
    )

    def on_progress(summary: Any) -> None:
        bars(summary)
        lines(summary)

    before = _read_counts(state)
    service = EventingService(
        state,
        executor,
        until_caught_up=args.until_caught_up,
        functions=args.function or None,
        on_progress=on_progress,
        windows=WindowOptions(close_windows=args.close_windows, spark_master=args.spark_master),
        standby=args.standby,
        failover_timeout_s=timeout_s,
    )
    if args.standby and not args.json and not args.quiet:
        print(
            f"standby {service.service_id}: waiting for the leader's lease; takes over when it stops",
            file=sys.stderr,
            flush=True,
        )
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: service.stop())
    interrupted = False
    try:
        summary = service.run()
    except KeyboardInterrupt:
        interrupted = True
        service.stop()
        summary = service.summary
    finally:
        signal.signal(signal.SIGTERM, previous)
        bars.close()
        leave = getattr(executor, "shutdown", None)
        if leave is not None:
            leave()
    dead = {name: p.dead_letters for name, p in summary.functions.items() if p.dead_letters}
    read = _what_was_read(state, before, list(summary.functions))
    if interrupted:
        status = EXIT_INTERRUPTED
    elif summary.errors:
        status = EXIT_FAILED
    elif dead:
        status = EXIT_DEAD_LETTERS
    else:
        status = EXIT_OK
    result: dict[str, Any] = {
        "seconds": round(summary.seconds, 2),
        "functions": {
            name: {
                "handled": p.handled,
                "backlog": p.backlog,
                "state": p.state,
                "error": p.error,
                "dead_letters": p.dead_letters,
                "handler_log": p.log_path,
                "of_them": read.get(name, {}),
            }
            for name, p in summary.functions.items()
        },
        "errors": summary.errors,
        "leadership": summary.leadership,
        "failovers": summary.failovers,
        "interrupted": interrupted,
        "exit": status,
        "startup": _startup(executor, ray_s, summary),
    }
    if args.json:
        emit_json(result, out)
    elif not args.quiet:
        if summary.leadership.get("took_over_from"):
            print(
                f"took over from {summary.leadership['took_over_from']} after waiting "
                f"{summary.leadership['waited_s']:.1f}s as a standby"
            )
        for f in summary.failovers:
            print(
                f"failed over node(s) {', '.join(f['nodes'])}: their vBuckets had no live owner for "
                f"{f['unowned_s']:.1f}s (failover timeout {f['timeout_s']:g}s)"
            )
        if not summary.functions:
            print("no deployed functions to run; deploy one with `eventing deploy functions/fn_email.json`")
        for name, p in summary.functions.items():
            rate = p.handled / summary.seconds if summary.seconds else 0
            extra = f" error: {p.error}" if p.error else ""
            print(
                f"{name}: {counted(p.handled, 'mutation')} handled in {summary.seconds:.1f}s "
                f"({rate:,.0f}/s), {p.state}{extra}"
            )
            of_them = _of_them_line(read.get(name, {}))
            if of_them:
                print(f"  {of_them}")
            if p.dead_letters:
                reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(p.dead_letters.items()))
                print(
                    f"  {sum(p.dead_letters.values()):,} went to the dead-letter queue in this run "
                    f"({reasons}); see `eventing dlq list {name}`"
                )
            if p.log_path:
                print(f"  handler log: {p.log_path}")
        startup = result["startup"]
        if startup["first_handler_call_s"] is not None:
            ray = (
                ""
                if args.executor == "in-process"
                else f"Ray {startup['ray_s']:.1f}s"
                + (
                    " (joined the `eventing ray start` instance)"
                    if startup["joined_ray_instance"]
                    else " (own instance; `eventing ray start` keeps one up)"
                    if args.executor == "ray" and not args.ray_address
                    else ""
                )
                + ", "
            )
            print(
                f"start-up: {ray}workers up {startup['workers_ready_s']:.1f}s; first handler call "
                f"{startup['first_handler_call_s']:.1f}s after the command started"
            )
        if interrupted:
            print(
                "interrupted: stopped after a checkpoint; `eventing run` resumes from there", file=sys.stderr
            )
    return status


# What `handled` counts besides handler calls: every mutation of the source its workers moved past.
PASSED_OVER = {
    counter_names.COLLECTION_FILTERED: "of other collections of the source bucket",
    counter_names.FILTERED: "not matching the function's filter",
    counter_names.RECURSION_FILTERED: "written by the function itself",
    counter_names.NO_HANDLER: "with no handler for their operation",
    counter_names.DEAD_LETTERED_SKIPPED: "dead-lettered before",
    counter_names.HUNG_SKIPPED: "whose handler hung before",
}
HANDLER_CALLS = tuple(
    counter_names.handler_outcome(kind, outcome)
    for kind in ("on_update", "on_delete")
    for outcome in ("success", "failure", "timeout")
)


def _read_counts(state: State) -> dict[str, dict[str, float]]:
    """Every function's counters now (the run's figures are what they grow by)."""
    try:
        store = state.metadata
        return {r.name: store.counters(r.name) for r in store.list_functions()}
    except EventingError:
        return {}


def _what_was_read(
    state: State, before: dict[str, dict[str, float]], names: list[str]
) -> dict[str, dict[str, int]]:
    """Per function, what the mutations it handled in this run were: handler calls, and those passed over."""
    after = _read_counts(state)
    out = {}
    for name in names:
        grew = {k: int(v - before.get(name, {}).get(k, 0)) for k, v in after.get(name, {}).items()}
        out[name] = {
            "handler_calls": sum(max(0, grew.get(k, 0)) for k in HANDLER_CALLS),
            # updates that became rows of the function's windows (with a handler, they called it too)
            "window_rows": max(0, grew.get(counter_names.WINDOW_ROWS_WRITTEN, 0)),
            **{k: max(0, grew.get(k, 0)) for k in PASSED_OVER},
        }
    return out


def _of_them_line(of_them: dict[str, int]) -> str | None:
    """What a function's handled mutations were, when some of them called no handler: those that went to its
    windows (a window-only function's updates) and those passed over, by why. None when every one called
    the handler."""
    calls, rows = of_them.get("handler_calls", 0), of_them.get("window_rows", 0)
    passed = {k: n for k, n in of_them.items() if k in PASSED_OVER and n}
    if rows and not calls:  # a window-only function: each update became a row and called nothing
        head = f"{rows:,} of them went to its windows as rows (no handler call)"
    elif passed:
        also = f" ({rows:,} of those also went to its windows as rows)" if rows else ""
        head = f"{calls:,} of them called the handler{also}"
    else:
        return None
    if not passed:
        return head
    words = ", ".join(f"{n:,} {PASSED_OVER[k]}" for k, n in passed.items())
    return f"{head}; the others were passed over: {words}"


def _startup(executor: Any, ray_s: float, summary: Any) -> dict[str, Any]:
    """Where a run's start-up went: Ray, the workers, and the time from the command to its first handler
    call."""
    firsts = [p.first_handled_at for p in summary.functions.values() if p.first_handled_at]
    return {
        "ray_s": round(ray_s, 3),
        "joined_ray_instance": bool(getattr(executor, "joined", None)),
        "workers_ready_s": summary.workers_ready_s,
        "first_handler_call_s": round(min(firsts) - process_started_at(), 3) if firsts else None,
    }


def cmd_vbmap(args: argparse.Namespace) -> int:
    from eventing.ops.stats import vbucket_map

    data = vbucket_map(existing_state(args), args.function)
    if args.json:
        emit_json(data)
    else:
        print(f"vBucket map of {data['function']} (from the {data['source']}):")
        print(
            table(
                ["worker", "vBuckets", "live", "ranges"],
                [
                    [w["worker"], w["vbuckets"], "yes" if w["live"] else "no", w["ranges"]]
                    for w in data["workers"]
                ],
            )
        )
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from eventing.ops.stats import function_stats

    if args.function is None:
        from eventing.cli.stats_all import cmd_stats_all

        return cmd_stats_all(args)
    if args.watch:
        from eventing.cli.watch import stats_line, watch

        state = existing_state(args)
        return watch(
            lambda: function_stats(state, args.function),
            _print_stats,
            stats_line,
            interval_s=args.interval,
            as_json=args.json,
            count=args.count,
        )
    data = function_stats(existing_state(args), args.function)
    if args.json:
        emit_json(data)
    else:
        _print_stats(data)
    return 0


def _print_stats(data: dict[str, Any]) -> None:
    print(f"stats of {data['function']} ({data['state']}):")
    for k, v in data.items():
        if k in ("function", "state"):
            continue
        if k == "last_run":
            _print_last_run(v)
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items()) or "-"
        print(f"  {k:>26}: {v if v is not None else '-'}")


def _print_last_run(run: dict[str, Any]) -> None:
    """The last run's two rates, each with the time it is over."""
    print(
        f"  {'last_run':>26}: handled={run['handled']} in seconds={run['seconds']} (start to stop, start-up "
        f"included): handled_per_s={run['handled_per_s']}"
    )
    print(
        f"  {'':>26}  busy_s={run['busy_s']} (first batch to last): mutations_per_s={run['mutations_per_s']} "
        "(handled / busy_s; throughput_mps once no service runs it)"
    )


def _interval(text: str) -> float:
    from eventing.cli.watch import interval_seconds

    return interval_seconds(text)


def register(sub: Any, add: Any) -> None:
    p = add(
        "run",
        cmd_run,
        "run every deployed function on Ray workers (Ctrl-C stops after a checkpoint); "
        "exit 0: all handled, 1: a function failed, 3: mutations were dead-lettered, 130: interrupted",
    )
    p.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop once the high seqnos seen at start are processed and checkpointed",
    )
    # Defaults read from the environment when the command runs (the parser is built once per process).
    p.add_argument(
        "--ray-address",
        default=None,
        help="join an existing Ray cluster (default $EVENTING_RAY_ADDRESS, else start a local Ray instance)",
    )
    p.add_argument(
        "--executor",
        choices=["ray", "in-process"],
        default="ray",
        help="ray (default) or in-process (one process, for debugging and tests)",
    )
    p.add_argument(
        "--worker-processes",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="Ray: the workers of every function share N worker processes (per Ray node) instead of "
        "one process each; fewer processes, less memory, but a crash or an uninterruptible "
        "handler hang restarts every worker of its process (default $EVENTING_WORKER_PROCESSES, "
        "else 0: one process per worker)",
    )
    p.add_argument("--function", action="append", help="run only this function (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress and no summary")
    p.add_argument(
        "--standby",
        action="store_true",
        help="wait as a standby while another service leads; take over (resuming every function from "
        "its checkpoints) within seconds of its death",
    )
    p.add_argument(
        "--failover-timeout",
        metavar="DURATION",
        default=None,
        help="fail over an eventing node whose Ray node is down this long, e.g. 10s; 0 turns it off "
        "(default: $EVENTING_FAILOVER_TIMEOUT or 10s)",
    )
    p.add_argument(
        "--spark-master",
        default=None,
        help="Spark master for window aggregation, e.g. spark://HOST:7077, or a Spark Connect "
        "server, sc://HOST:15002 (needs `pip install 'eventing[spark-connect]'`) (default "
        "$EVENTING_SPARK_MASTER or local[*])",
    )
    p.add_argument(
        "--close-windows",
        action="store_true",
        help="with --until-caught-up: at the end of the input close every window still open "
        "(default: windows close only by watermark and idle timeouts, and stay open for the next run)",
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=PROGRESS_EVERY_S,
        metavar="SECONDS",
        help="when stderr is not a terminal, print one progress line per function this often "
        f"(default {PROGRESS_EVERY_S:.0f}; 0: never)",
    )
    p = add("vbmap", cmd_vbmap, "which worker owns which vBucket ranges")
    p.add_argument("function")
    p = add(
        "stats",
        cmd_stats,
        "mutations seen, handler successes and failures, checkpoint lag, throughput "
        "(every function, one line each, when no name is given)",
    )
    p.add_argument("function", nargs="?")
    p.add_argument(
        "--watch",
        action="store_true",
        help="refresh until Ctrl-C: redrawn in place on a terminal, one line per refresh otherwise "
        "(with --json one JSON object per line)",
    )
    p.add_argument(
        "--interval", type=_interval, default=2.0, metavar="S", help="seconds between refreshes (default 2)"
    )
    p.add_argument("--count", type=positive_int, metavar="N", help="with --watch: stop after N refreshes")
