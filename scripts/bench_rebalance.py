"""Rebalance benchmark: throughput before, during and after a live 1 -> 2 -> 3 -> 2 node rebalance.

A function with W workers runs on a local Ray instance over a steady stream of new mutations (a writer
thread); at each step a node joins or leaves and `eventing rebalance` hands the moving vBuckets over live.
Prints per step: vBucket moves against the minimum, time from rebalance start to done, the longest time
any vBucket had no owner, and mutations/s handled in the 3 s before, during, and the 3 s after. Ends with a
ledger check (every mutation handled once, in order) and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.cli import main as cli  # noqa: E402
from eventing.control import lifecycle  # noqa: E402
from eventing.control.nodes import Topology  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.storage.bucket import LocalBucket  # noqa: E402
from eventing.testing import LEDGER_HANDLER, check_ledger, ledger_definition  # noqa: E402
from eventing.workers.executor import RayExecutor  # noqa: E402
from metadata.factory import open_store  # noqa: E402
from sharding.rebalance import minimum_moves  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=2000, help="mutations/s written during the run")
    parser.add_argument("--window", type=float, default=3.0, help="seconds measured before and after")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="eventing-rebalance-", ignore_cleanup_errors=True) as data_dir:
        return measure(args, data_dir)


def measure(args: argparse.Namespace, data_dir: str) -> int:
    source = LocalBucket.create(data_dir, "src")
    LocalBucket.create(data_dir, "ledger")
    lifecycle.save_function(
        data_dir, ledger_definition("fn_rb", "src", "ledger", workers=args.workers), LEDGER_HANDLER
    )
    lifecycle.deploy(data_dir, "fn_rb")
    service = EventingService(data_dir, RayExecutor())
    runner = threading.Thread(target=service.run, daemon=True)
    runner.start()
    while "fn_rb" not in service.supervisors or not service.supervisors["fn_rb"].ready:
        time.sleep(0.1)

    stop = threading.Event()

    def write() -> None:
        i = 0
        writer_bucket = LocalBucket.open(data_dir, "src")
        while not stop.is_set():
            writer_bucket.upsert(f"doc::{i % 2000}", {"rev": i})
            i += 1
            time.sleep(1 / args.rate)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()

    def handled() -> int:
        sup = service.supervisors.get("fn_rb")
        return sup.handled if sup else 0

    def rate_over(seconds: float) -> float:
        h0, t0 = handled(), time.monotonic()
        time.sleep(seconds)
        return (handled() - h0) / (time.monotonic() - t0)

    steps = [["node", "add", "n2"], ["node", "add", "n3"], ["node", "remove", "n3"]]
    results = []
    rate_over(args.window)  # warm up
    for step in steps:
        before = rate_over(args.window)
        assert cli(["--data-dir", data_dir, "--json", *step]) == 0
        topology = Topology(open_store(data_dir))
        plan = topology.plan()
        minimum = minimum_moves(plan.before, list(plan.nodes))
        h0, t0 = handled(), time.monotonic()
        assert cli(["--data-dir", data_dir, "rebalance", "--json"]) == 0
        during = (handled() - h0) / (time.monotonic() - t0)
        after = rate_over(args.window)
        request = topology.request() or {}
        results.append(
            {
                "step": " ".join(step),
                "moves": plan.move_count,
                "minimum_moves": minimum,
                "seconds": request.get("seconds"),
                "longest_unowned_ms": request.get("longest_unowned_ms"),
                "mps_before": round(before),
                "mps_during": round(during),
                "mps_after": round(after),
            }
        )
    stop.set()
    writer.join()
    time.sleep(2)
    service.stop()
    runner.join()
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"))
    print()
    for r in results:
        print(
            f"{r['step']:<18} moves {r['moves']} (minimum {r['minimum_moves']}), done in "
            f"{r['seconds']:.2f}s, longest unowned {r['longest_unowned_ms']:.0f} ms, mutations/s before "
            f"{r['mps_before']:,} during {r['mps_during']:,} after {r['mps_after']:,}"
        )
    print(f"ledger: {report.summary()}")
    print(json.dumps({"steps": results, "ledger_ok": report.ok}))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
