"""Delivery modes on a write-heavy function: fn_email (one document written per mutation) run with
``delivery: exactly_once`` and ``delivery: at_least_once`` over the same mutations, in one run.

Loads N mutations over D customers once, then runs each mode --runs times, alternating (fresh copy of the
data directory each run, so every run writes the same effects), on W Ray workers (or the in-process
executor with --executor inprocess). Reports each run's mutations/s once the workers were up, the medians
and their ratio, and checks both modes left the same `emails` bucket. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from eventing.control import lifecycle  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import load_definition_file  # noqa: E402
from eventing.storage import loadgen  # noqa: E402
from eventing.storage.bucket import LocalBucket  # noqa: E402
from eventing.storage.writes import chunked  # noqa: E402
from eventing.workers.executor import InProcessExecutor, RayExecutor, init_ray  # noqa: E402

FUNCTIONS = Path(__file__).resolve().parent.parent / "functions"
MODES = ("exactly_once", "at_least_once")


def run_once(data_dir: str, mode: str, workers: int, executor_name: str) -> tuple[float, int, dict]:
    defn, source = load_definition_file(FUNCTIONS / "fn_email.json")
    raw = defn.to_dict()
    raw.update(delivery=mode, worker_count=workers, handler=str(FUNCTIONS / "fn_email.py"))
    from eventing.core.definition import FunctionDefinition

    LocalBucket.create(data_dir, "emails", exist_ok=True)
    lifecycle.save_function(data_dir, FunctionDefinition.from_dict(raw), source)
    lifecycle.deploy(data_dir, "fn_email")
    marks: dict[str, float] = {}

    def on_progress(_summary) -> None:
        sup = service.supervisors.get("fn_email")
        if sup is not None and sup.ready and "ready" not in marks:
            marks["ready"] = time.perf_counter()
            marks["handled"] = sup.handled

    executor = RayExecutor() if executor_name == "ray" else InProcessExecutor()
    service = EventingService(data_dir, executor, until_caught_up=True, on_progress=on_progress)
    start = time.perf_counter()
    summary = service.run()
    end = time.perf_counter()
    if summary.errors:
        raise SystemExit(f"error: run failed: {summary.errors}")
    handled = summary.functions["fn_email"].handled
    ready = marks.get("ready", start)
    emails = LocalBucket.open(data_dir, "emails")
    contents = {k: emails.get(k) for k in emails.keys()}
    return (handled - marks.get("handled", 0)) / (end - ready), handled, contents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mutations", type=int, default=300_000)
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode, alternating (default 3)")
    parser.add_argument("--executor", choices=("ray", "inprocess"), default="ray")
    args = parser.parse_args(argv)
    if args.mutations <= 0 or args.runs <= 0:
        parser.error("--mutations and --runs must be positive")
    work = Path(tempfile.mkdtemp(prefix="bench-delivery-"))
    try:
        seed_dir = work / "seed"
        bucket = LocalBucket.create(seed_dir, "customers")
        for chunk in chunked(loadgen.generate(args.documents, args.mutations, seed=7), 50_000):
            bucket.write(chunk)
        if args.executor == "ray":
            init_ray(num_cpus=os.cpu_count() or 2)
        rates: dict[str, list[float]] = {m: [] for m in MODES}
        finals: dict[str, dict] = {}
        for i in range(args.runs):
            for mode in MODES if i % 2 == 0 else tuple(reversed(MODES)):
                data_dir = work / f"{mode}-{i}"
                bucket.copy_to(data_dir)
                rate, handled, contents = run_once(str(data_dir), mode, args.workers, args.executor)
                rates[mode].append(rate)
                finals[mode] = contents
                print(
                    f"{mode:>13}: run {i + 1}: {handled:,} mutations, {rate:,.0f} mutations/s once workers "
                    "were up"
                )
                shutil.rmtree(data_dir, ignore_errors=True)
        if finals["exactly_once"] != finals["at_least_once"]:
            print("error: the two modes left different emails buckets", file=sys.stderr)
            return 1
        medians = {m: statistics.median(r) for m, r in rates.items()}
        ratio = medians["at_least_once"] / medians["exactly_once"]
        print(
            f"median: exactly_once {medians['exactly_once']:,.0f}/s, at_least_once "
            f"{medians['at_least_once']:,.0f}/s; at_least_once/exactly_once {ratio:.2f}; same emails bucket "
            f"({len(finals['exactly_once']):,} drafts)"
        )
        print(
            json.dumps(
                {
                    "mutations": args.mutations,
                    "workers": args.workers,
                    "executor": args.executor,
                    "exactly_once_mps": round(medians["exactly_once"]),
                    "at_least_once_mps": round(medians["at_least_once"]),
                    "ratio": round(ratio, 3),
                    "runs": {m: [round(r) for r in v] for m, v in rates.items()},
                }
            )
        )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
