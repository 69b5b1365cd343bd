"""Memory benchmark: RSS of the service and its Ray worker processes over runs of growing length.

For each --mutations count (default 1M, 3M and 10M, over --documents keys), loads a fresh bucket with the
bench workload (scripts/bench.py's generator and trivial handler), then runs `eventing run
--until-caught-up`'s service with W Ray workers in this process, and samples every --interval seconds the
resident set (VmRSS from /proc) of:

- service: this process (the driver: service, supervisors, the metadata store),
- workers: the Ray actor processes running the function's workers (proctitle ``ray::WorkerHost``),
- ray: Ray's own processes started for the run (gcs, raylet, dashboard, idle workers), reported apart.

Each run prints RSS at 10%, 50% and 100% of the mutations handled and the peak; the last line is JSON with
every run's samples. RSS that stays flat from 1M to 10M means nothing in the service or the workers grows
with the number of mutations (only with the number of documents, vBuckets and workers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.control import lifecycle  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.storage import loadgen  # noqa: E402
from eventing.storage.bucket import LocalBucket  # noqa: E402
from eventing.storage.writes import chunked  # noqa: E402
from eventing.testing.workloads import TRIVIAL_HANDLER  # noqa: E402
from eventing.workers.executor import RayExecutor  # noqa: E402

HANDLER = TRIVIAL_HANDLER


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(name))
    return tree


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sample() -> dict[str, float]:
    """RSS (MB) of this process, of its descendant Ray actor processes of the function's workers, and of
    the other descendants (Ray itself)."""
    tree = _children()
    me = os.getpid()
    out = {"service": _rss_mb(me), "workers": 0.0, "ray": 0.0, "worker_processes": 0}
    stack = list(tree.get(me, []))
    while stack:
        pid = stack.pop()
        stack.extend(tree.get(pid, []))
        rss = _rss_mb(pid)
        if _cmdline(pid).startswith("ray::WorkerHost"):
            out["workers"] += rss
            out["worker_processes"] += 1
        else:
            out["ray"] += rss
    return {k: round(v, 1) for k, v in out.items()}


def run_once(data_dir: str, mutations: int, documents: int, workers: int, interval: float) -> dict:
    bucket = LocalBucket.create(data_dir, "bench")
    t = time.perf_counter()
    for chunk in chunked(loadgen.generate(documents, mutations, seed=7), 20_000):
        bucket.load_rows([(w.key, w.op, w.doc, w.expiry) for w in chunk])
    bucket.close()
    load_s = time.perf_counter() - t
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_mem",
            "source_bucket": "bench",
            "worker_count": workers,
            "batch_size": 2000,
            "checkpoint_interval": "1s",
        }
    )
    lifecycle.save_function(data_dir, defn, HANDLER)
    lifecycle.deploy(data_dir, "fn_mem")
    executor = RayExecutor()
    service = EventingService(data_dir, executor, until_caught_up=True)
    samples: list[dict] = []
    done = threading.Event()
    start = time.perf_counter()

    def sampler() -> None:
        while not done.wait(interval):
            sup = service.supervisors.get("fn_mem")
            s = sample()
            s["handled"] = sup.handled if sup is not None else 0
            s["t"] = round(time.perf_counter() - start, 1)
            samples.append(s)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        summary = service.run()
    finally:
        done.set()
        thread.join()
    handled = summary.functions["fn_mem"].handled
    run_s = time.perf_counter() - start
    if not samples:
        raise SystemExit(
            f"error: the run of {mutations:,} mutations ended within one sampling interval "
            f"({interval:g}s), so there is nothing to report; give more mutations or a smaller --interval"
        )

    def at(fraction: float) -> dict:
        want = fraction * handled
        return next((s for s in samples if s["handled"] >= want and s["workers"] > 0), samples[-1])

    return {
        "mutations": mutations,
        "handled": handled,
        "load_s": round(load_s, 1),
        "run_s": round(run_s, 1),
        "at_10pct": at(0.1),
        "at_50pct": at(0.5),
        "at_end": at(1.0),
        "peak": {k: max(s[k] for s in samples) for k in ("service", "workers", "ray")},
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mutations", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000])
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between RSS samples")
    parser.add_argument("--work-dir", default=None, help="default: a fresh temporary directory")
    args = parser.parse_args(argv)

    import ray

    work = args.work_dir or tempfile.mkdtemp(prefix="eventing-memory-")
    runs = []
    for n in args.mutations:
        data_dir = os.path.join(work, f"m{n}")
        shutil.rmtree(data_dir, ignore_errors=True)
        result = run_once(data_dir, n, args.documents, args.workers, args.interval)
        ray.shutdown()  # each run gets fresh worker processes, as a new `eventing run` would
        shutil.rmtree(data_dir, ignore_errors=True)
        a, b, c = result["at_10pct"], result["at_50pct"], result["at_end"]
        print(
            f"{n:,} mutations ({result['handled']:,} handled, load {result['load_s']}s, run "
            f"{result['run_s']}s): service RSS {a['service']:.0f} / {b['service']:.0f} / {c['service']:.0f} "
            f"MB, workers ({c['worker_processes']}) {a['workers']:.0f} / {b['workers']:.0f} / "
            f"{c['workers']:.0f} MB at 10% / 50% / 100%; peak service {result['peak']['service']:.0f}, "
            f"workers {result['peak']['workers']:.0f}, Ray itself {result['peak']['ray']:.0f} MB",
            flush=True,
        )
        runs.append(result)
    curve = [
        {
            "mutations": r["mutations"],
            "service_mb": r["at_end"]["service"],
            "workers_mb": r["at_end"]["workers"],
            "peak_service_mb": r["peak"]["service"],
            "peak_workers_mb": r["peak"]["workers"],
        }
        for r in runs
    ]
    print(json.dumps({"documents": args.documents, "workers": args.workers, "curve": curve, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
