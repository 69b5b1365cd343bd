"""Cluster benchmark: the scripts/bench.py workload handled (a) embedded (a local Ray instance, workers open
the files) and (b) on a two-node Ray cluster with every worker on a node that cannot see the data
directory (it reads the source and writes checkpoints through the data service); then an I/O-bound handler
(sleeps 1 ms a mutation, like an HTTP call) with 4 and then 16 workers spread over the two nodes.

Prints both rates and ratio = cluster/embedded, the I/O-bound throughputs and their ratio to the ideal
(workers x 1,000/s); the last line is JSON. The second node is hidden with `unshare --mount` and a tmpfs
over the data directory, so this needs root (as CI has). Every process it starts is ended by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from eventing.cli.app import main as cli  # noqa: E402
from eventing.control import lifecycle  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.storage import loadgen  # noqa: E402
from eventing.storage.bucket import LocalBucket  # noqa: E402
from eventing.storage.writes import chunked  # noqa: E402
from eventing.testing.cluster import LocalRayCluster  # noqa: E402
from eventing.testing.workloads import TRIVIAL_HANDLER, load_bench_bucket  # noqa: E402
from eventing.workers.executor import RayExecutor, init_ray  # noqa: E402

HANDLER = TRIVIAL_HANDLER

IO_WORKERS = (4, 16)
IO_HANDLER = """
import time

def on_update(doc, meta):
    time.sleep(0.001)
"""


def _sleeper(count: int) -> None:
    for _ in range(count):
        time.sleep(0.001)


def plain_sleepers(processes: int, count: int) -> float:
    """The machine's own ceiling for the I/O-bound handler: ``processes`` plain processes sleeping 1 ms
    ``count`` times in all (no Ray, no eventing); mutations a second."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start = time.perf_counter()
    workers = [context.Process(target=_sleeper, args=(count // processes,)) for _ in range(processes)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return count / (time.perf_counter() - start)


def timed_run(data_dir: str, executor, function: str) -> tuple[int, float]:
    """Handled mutations and seconds from every worker up to the final checkpoint (as scripts/bench.py)."""
    marks: dict[str, float] = {}

    def on_progress(summary) -> None:
        sup = service.supervisors.get(function)
        if sup is not None and sup.ready and "ready" not in marks:
            marks["ready"] = time.perf_counter()
            marks["handled"] = sup.handled

    service = EventingService(
        data_dir, executor, until_caught_up=True, functions=[function], on_progress=on_progress
    )
    start = time.perf_counter()
    summary = service.run()
    end = time.perf_counter()
    if summary.errors:
        raise SystemExit(f"error: {summary.errors}")
    handled = summary.functions[function].handled
    return handled - int(marks.get("handled", 0)), end - marks.get("ready", start)


def deploy(data_dir: str, name: str, source: str, handler: str, workers: int, batch_size: int) -> None:
    defn = FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": source,
            "worker_count": workers,
            "batch_size": batch_size,
            "checkpoint_interval": "1s",
        }
    )
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, name)


def place(data_dir: str, nodes: dict[str, str]) -> None:
    """Move every vBucket onto exactly these eventing nodes (name -> Ray node id); no service runs."""
    from eventing.control.nodes import Topology
    from metadata.factory import open_store

    topology = Topology(open_store(data_dir))
    current = {n["name"] for n in topology.nodes()}
    quiet = ["--json"]
    for name, node_id in nodes.items():
        if name not in current:
            cli(["--data-dir", data_dir, *quiet, "node", "add", name, "--ray-node-id", node_id])
    for name in current - set(nodes):
        cli(["--data-dir", data_dir, *quiet, "node", "remove", name])
    cli(["--data-dir", data_dir, *quiet, "rebalance"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mutations", type=int, default=1_000_000)
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--skip-io", action="store_true", help="only the bench.py workload")
    parser.add_argument(
        "--io-seconds",
        type=float,
        default=5.0,
        help="ideal seconds of each I/O-bound run (mutations = workers x 1,000 x this)",
    )
    args = parser.parse_args(argv)
    if not LocalRayCluster.can_hide():
        print(
            "error: a node hidden from the data directory needs root and `unshare`; run as root",
            file=sys.stderr,
        )
        return 2

    root = tempfile.mkdtemp(prefix="eventing-bench-cluster-")
    data_dir = os.path.join(root, "data")
    os.makedirs(data_dir)
    load_bench_bucket(data_dir, "bench", args.documents, args.mutations)
    for total in IO_WORKERS:
        io_bucket = LocalBucket.create(data_dir, f"io{total}")
        count = int(total * 1000 * args.io_seconds)
        for chunk in chunked(loadgen.generate(2_000, count, seed=8, delete_ratio=0.0), 50_000):
            io_bucket.write(chunk)
    print(
        f"loaded {args.mutations:,} mutations, and {args.io_seconds:.0f} ideal seconds for each I/O-bound run"
    )
    figures: dict[str, object] = {"mutations": args.mutations, "workers": args.workers}

    # (a) embedded: a local Ray instance, workers open the files.
    deploy(data_dir, "fn_embedded", "bench", HANDLER, args.workers, args.batch_size)
    n, seconds = timed_run(data_dir, RayExecutor(), "fn_embedded")
    embedded = n / seconds
    print(f"(a) embedded, {args.workers} workers: {n:,} mutations in {seconds:.2f}s = {embedded:,.0f}/s")
    import ray

    ray.shutdown()

    cluster = LocalRayCluster()
    try:
        cluster.start()
        hidden = cluster.add_node("n2", hidden=[data_dir], num_cpus=2)
        init_ray(cluster.address)
        head_id = cluster.nodes[0].node_id

        # (b) every worker on the hidden node, through the data service.
        place(data_dir, {"n2": hidden.node_id})
        deploy(data_dir, "fn_cluster", "bench", HANDLER, args.workers, args.batch_size)
        executor = RayExecutor(cluster.address)
        n, seconds = timed_run(data_dir, executor, "fn_cluster")
        remote = n / seconds
        print(
            f"(b) cluster, {args.workers} workers on the hidden node: {n:,} mutations in {seconds:.2f}s = "
            f"{remote:,.0f}/s"
        )
        ratio = remote / embedded
        print(f"ratio cluster/embedded: {ratio:.2f}")
        figures.update(embedded_mps=round(embedded), cluster_mps=round(remote), ratio=round(ratio, 3))

        # I/O-bound: 1 ms a mutation, workers spread over both nodes (worker_count is per eventing node).
        place(data_dir, {"head": head_id, "n2": hidden.node_id})
        for total in () if args.skip_io else IO_WORKERS:
            name = f"fn_io_{total}"
            deploy(data_dir, name, f"io{total}", IO_HANDLER, total // 2, 200)
            n, seconds = timed_run(data_dir, executor, name)
            rate, ideal = n / seconds, total * 1000.0
            plain = plain_sleepers(total, n)
            print(
                f"I/O-bound, {total} workers over 2 nodes: {n:,} mutations in {seconds:.2f}s = {rate:,.0f}/s "
                f"({rate / ideal:.2f} of the ideal {ideal:,.0f}/s; {total} plain processes sleeping 1 ms "
                f"do {plain:,.0f}/s here now, eventing/plain {rate / plain:.2f})"
            )
            figures[f"io_{total}_mps"] = round(rate)
            figures[f"io_{total}_of_ideal"] = round(rate / ideal, 3)
            figures[f"io_{total}_plain_mps"] = round(plain)
            figures[f"io_{total}_of_plain"] = round(rate / plain, 3)
        if not args.skip_io:
            figures["io_scaling_4_to_16"] = round(figures["io_16_mps"] / figures["io_4_mps"], 2)  # type: ignore[operator]
    finally:
        ray.shutdown()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
