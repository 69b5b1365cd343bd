"""Timer benchmark: N durable timers due evenly over a span, fired by a W-worker function on Ray.

Counts through a ledger (one write per firing, every write kept in the bucket's log): every timer must
fire exactly once, also when workers are killed with SIGKILL during the span (--kills). Prints the firing
delay (fire time minus due time) p50/p99/max; the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.testing import timer_bench  # noqa: E402
from eventing.workers.executor import RayExecutor  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timers", type=int, default=100_000)
    parser.add_argument("--span", type=float, default=60.0, help="seconds over which the timers fall due")
    parser.add_argument("--lead", type=float, default=25.0, help="seconds from deploy to the first due time")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=0, help="workers to SIGKILL, evenly during the span")
    parser.add_argument(
        "--data-dir", default=None, help="default: a fresh temporary directory, removed at the end"
    )
    args = parser.parse_args(argv)
    if args.data_dir:
        return measure(args, args.data_dir)
    with tempfile.TemporaryDirectory(prefix="eventing-bench-timers-", ignore_cleanup_errors=True) as data_dir:
        return measure(args, data_dir)


def measure(args: argparse.Namespace, data_dir: str) -> int:
    timer_bench.prepare(data_dir)
    executor = RayExecutor()
    last = [-1]

    def progress(count: int) -> None:
        if count // 10_000 != last[0] // 10_000:
            print(f"  fired {count:,}/{args.timers:,}", flush=True)
        last[0] = count

    result = timer_bench.run(
        data_dir,
        executor,
        args.timers,
        span_s=args.span,
        lead_s=args.lead,
        workers=args.workers,
        kills=args.kills,
        progress=progress,
    )
    import ray

    ray.shutdown()
    print(
        f"{args.timers:,} timers over {args.span:.0f}s on {args.workers} workers, {result.kills} worker(s) "
        f"killed: fired {result.fired_keys:,}, missing {result.missing}, fired twice {result.fired_twice}"
    )
    print(
        f"firing delay p50 {result.delay_p50_s * 1000:.0f} ms, p99 {result.delay_p99_s * 1000:.0f} ms, "
        f"max {result.delay_max_s * 1000:.0f} ms"
    )
    print(json.dumps(result.to_dict()))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
