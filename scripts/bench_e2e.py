"""End to end as a user runs it: `eventing run --until-caught-up` from the command to its exit, against a
plain Python loop run as its own command (interpreter start, imports, read, decode, handler call), on the
same loaded bucket and the same trivial handler as scripts/bench.py.

Each run copies a fresh data directory (same bucket, function just deployed) and times, alternating:
  plain   `python -c <the plain loop>`;
  own     `eventing run --until-caught-up --json`: the run starts a Ray instance of its own;
  joined  the same after `eventing ray start` (started once, outside the timing, as a database server is).
Prints every run, the medians and the ratios plain_s / eventing_s (above 1: eventing finished first), and
each eventing run's start-up figures (Ray, workers up, first handler call). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from eventing.control import lifecycle  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.testing.workloads import TRIVIAL_HANDLER, load_bench_bucket  # noqa: E402

HANDLER = TRIVIAL_HANDLER

# The plain loop as its own program: what a user would write with the bucket's API (as scripts/bench.py).
PLAIN = """
import sys
import msgpack
from eventing.handler import Meta
from eventing.storage.bucket import LocalBucket
namespace = {}
exec(sys.argv[2], namespace)
on_update, on_delete = namespace["on_update"], namespace["on_delete"]
bucket = LocalBucket.open(sys.argv[1], "bench")
keyspace = {"bucket_name": bucket.name}
n = 0
for batch in bucket.scan_log(10_000):
    for m in batch:
        meta = Meta(m.key, m.cas, m.vb, m.seqno, m.expiry, m.flags, "json", keyspace)
        if m.op == 0:
            on_update(msgpack.unpackb(m.doc, raw=False), meta)
        else:
            on_delete(meta, None)
        n += 1
print(n)
"""


def eventing_cli() -> list[str]:
    return [sys.executable, "-m", "eventing"]


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"error: {' '.join(command[:4])} exited {done.returncode}: {done.stderr.strip()[-500:]}"
        )
    return elapsed, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mutations", type=int, default=1_000_000)
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    work = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    ray_dir = work / "ray-home"  # the `eventing ray start` instance's data directory (its state file)
    try:
        seed = work / "seed"
        bucket = load_bench_bucket(seed, "bench", args.documents, args.mutations)
        defn = FunctionDefinition.from_dict(
            {
                "name": "fn_bench",
                "source_bucket": "bench",
                "worker_count": args.workers,
                "batch_size": 2000,
                "checkpoint_interval": "1s",
            }
        )
        times: dict[str, list[float]] = {"plain": [], "own": [], "joined": []}
        startups: dict[str, list[dict]] = {"own": [], "joined": []}

        def fresh(i: int, kind: str) -> Path:
            data_dir = work / f"{kind}-{i}"
            bucket.copy_to(data_dir)
            if kind != "plain":
                lifecycle.save_function(str(data_dir), defn, HANDLER)
                lifecycle.deploy(str(data_dir), "fn_bench")
            return data_dir

        for i in range(args.runs):
            for kind in ("plain", "own", "joined") if i % 2 == 0 else ("joined", "own", "plain"):
                data_dir = fresh(i, kind)
                if kind == "plain":
                    elapsed, out = timed([sys.executable, "-c", PLAIN, str(data_dir), HANDLER], env)
                    assert int(out.strip()) == args.mutations, out
                else:
                    if kind == "joined":
                        # The instance belongs to one data directory: point this run's state file at it.
                        if not (ray_dir / "ray-instance.json").exists():
                            ray_dir.mkdir(exist_ok=True)
                            timed([*eventing_cli(), "--data-dir", str(ray_dir), "ray", "start"], env)
                        shutil.copy(ray_dir / "ray-instance.json", data_dir / "ray-instance.json")
                    elapsed, out = timed(
                        [*eventing_cli(), "--data-dir", str(data_dir), "run", "--until-caught-up", "--json"],
                        env,
                    )
                    result = json.loads(out)
                    handled = result["functions"]["fn_bench"]["handled"]
                    assert handled == args.mutations, result
                    startups[kind].append(result["startup"])
                    s = result["startup"]
                    print(
                        f"  {kind}: Ray {s['ray_s']:.2f}s, workers up {s['workers_ready_s']:.2f}s, "
                        f"first handler call {s['first_handler_call_s']:.2f}s after the command started"
                    )
                times[kind].append(elapsed)
                print(
                    f"run {i + 1} {kind:>6}: {args.mutations:,} mutations, command to exit {elapsed:.2f}s "
                    f"({args.mutations / elapsed:,.0f}/s)",
                    flush=True,
                )
                shutil.rmtree(data_dir, ignore_errors=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratios = {k: med["plain"] / med[k] for k in ("own", "joined")}
        print(
            f"median command to exit: plain {med['plain']:.2f}s, eventing (own Ray) {med['own']:.2f}s, "
            f"eventing (joined `eventing ray start`) {med['joined']:.2f}s"
        )
        print(f"ratio plain/eventing: own Ray {ratios['own']:.2f}, joined {ratios['joined']:.2f}")
        print(
            json.dumps(
                {
                    "mutations": args.mutations,
                    "workers": args.workers,
                    "plain_s": round(med["plain"], 3),
                    "own_ray_s": round(med["own"], 3),
                    "joined_s": round(med["joined"], 3),
                    "ratio_own": round(ratios["own"], 3),
                    "ratio_joined": round(ratios["joined"], 3),
                    "runs": {k: [round(x, 3) for x in v] for k, v in times.items()},
                    "first_handler_call_s": {
                        k: [s["first_handler_call_s"] for s in v] for k, v in startups.items()
                    },
                }
            )
        )
        return 0
    finally:
        if (ray_dir / "ray-instance.json").exists():
            subprocess.run(
                [*eventing_cli(), "--data-dir", str(ray_dir), "ray", "stop"], env=env, capture_output=True
            )
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
