"""Throughput benchmark: eventing on Ray against a plain in-process Python loop over the same bucket.

Loads N mutations over D documents into a fresh local bucket, then in the same run times
(a) a single-process loop that reads the bucket's log, decodes each document and calls the handler, and
(b) `eventing run --until-caught-up` of one function with W workers on a local Ray instance.
Prints both rates and their ratio; the last line is JSON with plain_mps, eventing_mps and ratio.
With --runs N both are timed N times, alternating, on the same loaded bucket (a Ray instance, a fresh
function and output bucket each run): every run is printed, and the JSON holds the medians and each run's
figures (this machine's figures move by 10-20% from run to run).

Workloads (--workload):
  trivial  (W1, default 1M mutations) a handler that only keeps a dict: the framework's own cost;
  writing  (W3, default 300k mutations) functions/fn_email.py, one document written per mutation through
           its `dst` binding. The plain loop makes the same reads and calls and applies the same writes
           with LocalBucket.write, one transaction per 10,000 mutations; both must leave equal buckets.
           The output bucket has as many partitions as the function has workers (--partitions), as
           docs/handler-api.md recommends for a bucket its workers write: each worker writes a file of its
           own. The plain loop writes the same partitioned bucket (as fast as a one-file bucket: one writer).

--batch (W1): each run times W1 three times on the same loaded bucket: with the per-call handler, with a
trivial batch handler (`on_batch`) keeping the same dict from the batch's columns (`batch.column("rev")`:
the one field it keeps, the rest of each document never decoded), and with the same batch handler reading
whole documents (`batch.docs`, each decoded as on_update gets it); prints the rates and ratios, the last line
JSON with `batch_vs_per_call` and `batch_docs_vs_per_call` (the medians of the runs' ratios).

--filter-ratio R (W1): the documents get a field `segment`, "vip" in a fraction R of them, and W1 runs twice
per run in the same process, without a filter and with `{"field": "segment", "eq": "vip"}` (deletes, ~5%,
pass too: a filter on document fields does not filter deletes); prints both rates and filtered/unfiltered.

--cpu (W1, W3): each eventing run also prints the CPU its processes used per mutation, from /proc, over the
timed window: the workers' processes (for a sandboxed function, its hosts), the sandboxed children and Ray's
own processes; the JSON's runs carry them as `cpu_us` (and `sandbox_cpu_us`).

--store postgresql://... (W1): the same W1 also on a PostgreSQL store, in the same run: the bucket is loaded
into the data directory and into the store, and each run times the plain loop (over the data directory's
bucket), eventing on the data directory and eventing on the store (these two in alternating order, run to
run). The function, its checkpoints and the source bucket are all the store's. `--store postgresql` starts a
throwaway server for the run (fsync on, on this machine's cores; eventing.testing.bench_store); a URL of a
server of your own gets a schema of its own, dropped at the end. The last line's JSON adds `store_mps`,
`store_ratio` (store/plain) and `store_vs_sqlite` (store / data directory, eventing's rates), and the CPU
the server used per mutation (`store_server_us`, a throwaway server only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import msgpack  # noqa: E402
import ray  # noqa: E402

from eventing.control import lifecycle  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.core.mutation import OP_DELETE, OP_UPDATE, decode_document, encode_document  # noqa: E402
from eventing.handler import Meta  # noqa: E402
from eventing.storage import loadgen  # noqa: E402
from eventing.storage.bucket import LocalBucket  # noqa: E402
from eventing.storage.factory import create_bucket, open_bucket  # noqa: E402
from eventing.storage.values import Write  # noqa: E402
from eventing.testing.workloads import (  # noqa: E402
    TRIVIAL_BATCH_DOCS_HANDLER,
    TRIVIAL_BATCH_HANDLER,
    TRIVIAL_HANDLER,
    load_bench_bucket,
)
from eventing.workers.executor import RayExecutor  # noqa: E402

FUNCTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "functions")

HANDLER = TRIVIAL_HANDLER


class PlainBinding:
    """The writing plain loop's `dst`: reads see its pending writes, then the bucket; writes are encoded
    and checked as a binding does, and applied with LocalBucket.write by the loop."""

    def __init__(self, bucket: LocalBucket):
        self.bucket = bucket
        self.pending: dict[str, bytes | None] = {}
        self.writes: list[Write] = []

    def __contains__(self, key: str) -> bool:
        raw = self.pending[key] if key in self.pending else self.bucket.get_raw(key)
        return raw is not None and decode_document(raw) is not None

    def __setitem__(self, key: str, doc: dict) -> None:
        data = encode_document(doc)
        self.writes.append(Write(key, OP_UPDATE, data))
        self.pending[key] = data

    def __delitem__(self, key: str) -> None:
        self.writes.append(Write(key, OP_DELETE))
        self.pending[key] = None

    def flush(self) -> None:
        self.bucket.write(self.writes, origin="fn_bench")
        self.writes, self.pending = [], {}


def plain_loop(bucket: LocalBucket, source: str, out: LocalBucket | None) -> tuple[int, float]:
    """The baseline: one process, read the log in batches, decode, call the same handler (and for the
    writing workload apply its writes once per batch)."""
    binding = PlainBinding(out) if out is not None else None
    namespace: dict = {"log": lambda *parts: None, "dst": binding}
    exec(source, namespace)
    on_update, on_delete = namespace["on_update"], namespace["on_delete"]
    keyspace = {"bucket_name": bucket.name}
    n = 0
    start = time.perf_counter()
    for batch in bucket.scan_log(10_000):
        for m in batch:
            meta = Meta(m.key, m.cas, m.vb, m.seqno, m.expiry, m.flags, "json", keyspace)
            if m.op == 0:
                on_update(msgpack.unpackb(m.doc, raw=False), meta)
            else:
                on_delete(meta, None)
            n += 1
        if binding is not None:
            binding.flush()
    return n, time.perf_counter() - start


def bucket_contents(bucket: LocalBucket) -> dict[str, dict | None]:
    return {key: bucket.get(key) for key in bucket.keys()}


class ProcessCpu:
    """--cpu: the CPU of this process's descendants (Ray's processes, the workers, sandboxed children),
    read from /proc/<pid>/stat every 20 ms on a thread (the tree looked at again every 0.2 s); `window`
    gives each kind's CPU seconds between two time.perf_counter() times: "workers" (the Ray actors serving a
    function's workers: for a sandboxed function, the hosts), "sandboxed children", "Ray" (the rest)."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self) -> None:
        import threading

        self.samples: dict[int, tuple[str, list[tuple[float, float]]]] = {}
        threading.Thread(target=self._poll, name="bench-cpu", daemon=True).start()

    @staticmethod
    def _stat(pid: int) -> tuple[int, float]:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / ProcessCpu.TICK

    @staticmethod
    def _kind(pid: int) -> str | None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
        if not cmdline:
            return None  # ended (a zombie): it keeps the kind it had
        if "eventing.workers.sandbox.child" in cmdline:
            return "sandboxed children"
        return "workers" if "ray::WorkerHost" in cmdline else "Ray"

    def _poll(self) -> None:
        me, looked = os.getpid(), 0.0
        known: set[int] = set()
        while True:
            now = time.perf_counter()
            if now - looked >= 0.2:
                looked, parents = now, {}
                for name in os.listdir("/proc"):
                    if name.isdigit():
                        try:
                            parents[int(name)] = self._stat(int(name))[0]
                        except (OSError, ValueError, IndexError):
                            pass
                for pid in parents:
                    up, depth = parents[pid], 0
                    while up and up != me and depth < 16:
                        up, depth = parents.get(up, 0), depth + 1
                    if up == me:
                        known.add(pid)
                        kind = self._kind(pid)
                        if kind is not None and (pid not in self.samples or kind != "Ray"):
                            self.samples[pid] = (kind, self.samples.get(pid, (kind, []))[1])
            for pid in list(known):
                try:
                    cpu = self._stat(pid)[1]
                except (OSError, ValueError, IndexError):
                    known.discard(pid)
                    continue
                if pid in self.samples:
                    self.samples[pid][1].append((now, cpu))
            time.sleep(0.02)

    def window(self, start: float, end: float) -> dict[str, float]:
        def at(series: list[tuple[float, float]], t: float) -> float:
            value = series[0][1]
            for when, cpu in series:
                if when > t:
                    break
                value = cpu
            return value

        spent = {"workers": 0.0, "sandboxed children": 0.0, "Ray": 0.0}
        for kind, series in list(self.samples.values()):
            if series and series[-1][0] >= start and series[0][0] <= end:
                spent[kind] += at(series, end) - at(series, start)
        return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workload",
        choices=("trivial", "writing"),
        default="trivial",
        help="trivial: W1, a dict-only handler (default); writing: W3, fn_email writing one document a "
        "mutation",
    )
    parser.add_argument(
        "--mutations", type=int, default=None, help="default: 1,000,000 (trivial), 300,000 (writing)"
    )
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="partitions of the writing workload's output bucket, for both loops (default: --workers)",
    )
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument(
        "--data-dir", default=None, help="default: a fresh temporary directory, removed at the end"
    )
    parser.add_argument(
        "--filter-ratio",
        type=float,
        default=None,
        help="W1 with and without a filter passing this fraction of the updates (e.g. 0.1)",
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="W1 with an on_batch handler (reading the field it keeps as a column, and reading whole "
        "documents) against the per-call one, in the same run (JSON: batch_vs_per_call, "
        "batch_docs_vs_per_call)",
    )
    parser.add_argument(
        "--isolation",
        choices=("none", "sandbox", "both"),
        default="none",
        help="the function's isolation; both: each run times eventing unsandboxed, then sandboxed",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="time the plain loop and eventing this many times, alternating (default 1)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="also print the CPU per mutation of the workers' processes (for a sandboxed function: its "
        "hosts and its children) and of Ray's own, in each eventing run (from /proc; JSON: cpu_us)",
    )
    parser.add_argument(
        "--store",
        default=None,
        metavar="postgresql[://...]",
        help="W1 also on this PostgreSQL store in the same run: a URL, or `postgresql` for a "
        "throwaway server started for the run (fsync on)",
    )
    args = parser.parse_args(argv)
    if args.store is not None:
        from eventing.testing.bench_store import check_option

        why = check_option(args.store)
        if why is None and (
            args.workload != "trivial" or args.filter_ratio is not None or args.isolation != "none"
        ):
            why = "--store times W1 only (no --workload writing, --filter-ratio or --isolation)"
        if why:
            parser.error(why)
    if args.cpu and (args.store is not None or args.batch or args.filter_ratio is not None):
        parser.error("--cpu measures W1 and W3 runs only (no --store, --batch or --filter-ratio)")
    writing = args.workload == "writing"
    if args.mutations is None:
        args.mutations = 300_000 if writing else 1_000_000
    if args.partitions is None:
        args.partitions = args.workers
    handler = open(os.path.join(FUNCTIONS, "fn_email.py")).read() if writing else HANDLER

    # Folders this run makes go when it ends (a loaded 1M bucket is ~150 MB); a --data-dir given stays.
    with contextlib.ExitStack() as temps:
        return measure(args, handler, writing, temps)


def measure(args: argparse.Namespace, handler: str, writing: bool, temps: contextlib.ExitStack) -> int:
    def temp_dir(prefix: str) -> str:
        return temps.enter_context(tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True))

    data_dir = args.data_dir or temp_dir("eventing-bench-")
    if args.filter_ratio is not None:
        return measure_filter(args, handler, data_dir)
    if args.store is not None:
        from eventing.testing.bench_store import BenchStore

        return measure_store(args, handler, data_dir, temps.enter_context(BenchStore(args.store)))
    if args.batch:
        return measure_batch(args, data_dir)
    t0 = time.perf_counter()
    bucket = load_bench_bucket(data_dir, "bench", args.documents, args.mutations)
    load_s = time.perf_counter() - t0
    print(
        f"load: {args.mutations:,} mutations over {args.documents:,} documents in {load_s:.1f}s "
        f"({args.mutations / load_s:,.0f}/s)"
        + (f"; output bucket of {args.partitions} partitions" if writing else "")
    )

    runs: list[dict] = []
    cpu = ProcessCpu() if args.cpu else None
    for run in range(1, args.runs + 1):
        label = f"run {run}/{args.runs}: " if args.runs > 1 else ""
        plain_out = (
            create_bucket(temp_dir("eventing-bench-plain-"), "emails", partitions=args.partitions)
            if writing
            else None
        )
        n_plain, plain_s = plain_loop(bucket, handler, plain_out)
        plain_mps = n_plain / plain_s
        print(f"{label}plain loop: {n_plain:,} mutations in {plain_s:.2f}s = {plain_mps:,.0f} mutations/s")
        row: dict = {"plain_mps": round(plain_mps)}
        isolations = ("none", "sandbox") if args.isolation == "both" else (args.isolation,)
        for isolation in isolations:  # alternating within each run: the machine's load hits both alike
            t1 = time.perf_counter()
            executor = RayExecutor()
            print(f"  ray.init {time.perf_counter() - t1:.1f}s")
            figures = eventing_run(
                data_dir, executor, args, handler, run, n_plain, plain_out, isolation=isolation
            )
            # Each run starts and ends a Ray instance of its own, as a single run does, so every plain loop
            # runs with no Ray on the machine.
            ray.shutdown()
            if figures is None:
                return 1
            eventing_mps = figures["eventing_mps"]
            print(
                f"{label}eventing ({args.workers} Ray workers, isolation {isolation}): "
                f"{figures['handled']:,} mutations in {figures['run_s']:.2f}s = {eventing_mps:,.0f} "
                f"mutations/s once workers were up (workers up in {figures['up_s']:.1f}s)"
            )
            ratio = eventing_mps / plain_mps
            print(f"{label}ratio eventing/plain ({isolation}): {ratio:.2f}")
            prefix = "sandbox_" if isolation == "sandbox" and len(isolations) > 1 else ""
            row.update({f"{prefix}eventing_mps": round(eventing_mps), f"{prefix}ratio": round(ratio, 3)})
            if cpu is not None:
                spent = cpu.window(*figures["window"])
                per = {kind: round(s * 1e6 / figures["timed"], 2) for kind, s in spent.items() if s > 0}
                print(
                    f"{label}CPU a mutation ({isolation}): "
                    + ", ".join(f"{kind} {us:.2f} us" for kind, us in per.items())
                )
                row[f"{prefix}cpu_us"] = per
        if len(isolations) > 1:
            row["sandbox_cost"] = round(1 - row["sandbox_eventing_mps"] / row["eventing_mps"], 3)
            print(f"{label}sandboxed/unsandboxed: {row['sandbox_eventing_mps'] / row['eventing_mps']:.2f}")
        runs.append(row)
    keys = [k for k in runs[0] if k != "sandbox_cost" and not isinstance(runs[0][k], dict)]
    summary = {key: statistics.median(r[key] for r in runs) for key in keys}
    if args.runs > 1:
        ratios = ", ".join(f"{r['ratio']:.2f}" for r in runs)
        print(f"ratios: {ratios}; median {summary['ratio']:.2f}")
    print(
        json.dumps(
            {
                "workload": args.workload,
                "plain_mps": round(summary["plain_mps"]),
                "eventing_mps": round(summary["eventing_mps"]),
                "ratio": round(summary["ratio"], 3),
                "isolation": args.isolation,
                **(
                    {
                        "sandbox_eventing_mps": round(summary["sandbox_eventing_mps"]),
                        "sandbox_cost_median": statistics.median(r["sandbox_cost"] for r in runs),
                    }
                    if args.isolation == "both"
                    else {}
                ),
                "load_mps": round(args.mutations / load_s),
                "mutations": args.mutations,
                "workers": args.workers,
                **({"partitions": args.partitions} if writing else {}),
                **({"runs": runs} if args.runs > 1 else {}),
            }
        )
    )
    return 0


def measure_store(args: argparse.Namespace, handler: str, data_dir: str, store) -> int:  # noqa: ANN001
    """W1 on the data directory and on a PostgreSQL store in the same run (see --store)."""
    from eventing.storage.state import open_state

    location = store.location("w1")
    print(f"store: {store.describe()}")
    t0 = time.perf_counter()
    bucket = load_bench_bucket(data_dir, "bench", args.documents, args.mutations)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    state = open_state(location)
    load_bench_bucket(state, "bench", args.documents, args.mutations)
    store_load_s = time.perf_counter() - t0
    # What autovacuum would do some time after a load (seconds of the server's CPU after 1M rows), done
    # now so that it does not land in a timed run.
    state.db.run(lambda conn: conn.execute("VACUUM (ANALYZE)"))  # type: ignore[attr-defined]
    state.close()
    print(
        f"load: {args.mutations:,} mutations over {args.documents:,} documents: data directory {load_s:.1f}s "
        f"({args.mutations / load_s:,.0f}/s), store {store_load_s:.1f}s "
        f"({args.mutations / store_load_s:,.0f}/s)"
    )
    runs: list[dict] = []
    for run in range(1, args.runs + 1):
        label = f"run {run}/{args.runs}: " if args.runs > 1 else ""
        n_plain, plain_s = plain_loop(bucket, handler, None)
        plain_mps = n_plain / plain_s
        print(f"{label}plain loop: {n_plain:,} mutations in {plain_s:.2f}s = {plain_mps:,.0f} mutations/s")
        row: dict = {"plain_mps": round(plain_mps)}
        # Alternating which goes first, run to run: the machine's load hits both alike.
        order = [("sqlite", data_dir), ("store", location)]
        for kind, where in order if run % 2 else order[::-1]:
            executor = RayExecutor()
            server_before = store.server_cpu_s()
            figures = eventing_run(where, executor, args, handler, run, n_plain, None)
            server_s = store.server_cpu_s() - server_before
            ray.shutdown()
            if figures is None:
                return 1
            mps = figures["eventing_mps"]
            prefix = "" if kind == "sqlite" else "store_"
            row[f"{prefix}eventing_mps" if kind == "sqlite" else "store_mps"] = round(mps)
            row[f"{prefix}ratio"] = round(mps / plain_mps, 3)
            extra = ""
            if kind == "store" and store.server is not None:
                row["store_server_us"] = round(server_s / figures["handled"] * 1e6, 2)
                extra = f"; the server's CPU {server_s:.1f}s ({row['store_server_us']} us a mutation)"
            print(
                f"{label}eventing on {'the data directory' if kind == 'sqlite' else 'the store'} "
                f"({args.workers} Ray workers): {figures['handled']:,} mutations in {figures['run_s']:.2f}s "
                f"= {mps:,.0f} mutations/s once workers were up (workers up in {figures['up_s']:.1f}s){extra}"
            )
        row["store_vs_sqlite"] = round(row["store_mps"] / row["eventing_mps"], 3)
        print(
            f"{label}ratio eventing/plain: data directory {row['ratio']:.2f}, store "
            f"{row['store_ratio']:.2f}; store/data directory {row['store_vs_sqlite']:.2f}"
        )
        runs.append(row)
    summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    if args.runs > 1:
        print(
            "store/data directory: "
            + ", ".join(f"{r['store_vs_sqlite']:.2f}" for r in runs)
            + f"; median {summary['store_vs_sqlite']:.2f}"
        )
    print(
        json.dumps(
            {
                "workload": args.workload,
                "plain_mps": round(summary["plain_mps"]),
                "eventing_mps": round(summary["eventing_mps"]),
                "ratio": round(summary["ratio"], 3),
                "store_mps": round(summary["store_mps"]),
                "store_ratio": round(summary["store_ratio"], 3),
                "store_vs_sqlite": round(summary["store_vs_sqlite"], 3),
                **({"store_server_us": summary["store_server_us"]} if "store_server_us" in summary else {}),
                "store": "throwaway" if store.server is not None else "url",
                "load_mps": round(args.mutations / load_s),
                "store_load_mps": round(args.mutations / store_load_s),
                "mutations": args.mutations,
                "workers": args.workers,
                **({"runs": runs} if args.runs > 1 else {}),
            }
        )
    )
    return 0


FILTER = {"field": "segment", "eq": "vip"}


def load_segmented(data_dir: str, documents: int, mutations: int, ratio: float) -> tuple[LocalBucket, int]:
    """W1's bucket with a field `segment` in every document: "vip" in a fraction `ratio` of them (the same
    seed, the same choice), "std" in the others. Returns the bucket and how many mutations FILTER passes."""
    import random

    bucket = create_bucket(data_dir, "bench")
    rng = random.Random(11)
    # Deletes pass whatever the filter says of documents: the updates get "vip" less often to make up.
    deletes = sum(w.op != OP_UPDATE for w in loadgen.generate(documents, mutations, seed=7))
    ratio = max(0.0, (ratio * mutations - deletes) / max(1, mutations - deletes))
    passing, part = 0, []
    for w in loadgen.generate(documents, mutations, seed=7):
        if w.op == OP_UPDATE:
            doc = decode_document(w.doc)
            doc["segment"] = "vip" if rng.random() < ratio else "std"
            passing += doc["segment"] == "vip"
            w = Write(w.key, OP_UPDATE, encode_document(doc))
        else:
            passing += 1  # a delete has no document: a filter on document fields lets it through
        part.append(w)
        if len(part) == 50_000:
            bucket.write(part)
            part = []
    if part:
        bucket.write(part)
    return bucket, passing


def measure_filter(args: argparse.Namespace, handler: str, data_dir: str) -> int:
    t0 = time.perf_counter()
    _, passing = load_segmented(data_dir, args.documents, args.mutations, args.filter_ratio)
    load_s = time.perf_counter() - t0
    print(
        f"load: {args.mutations:,} mutations over {args.documents:,} documents in {load_s:.1f}s; "
        f"filter {json.dumps(FILTER)} passes {passing:,} ({passing / args.mutations:.1%})"
    )
    runs: list[dict] = []
    for run in range(1, args.runs + 1):
        label = f"run {run}/{args.runs}: " if args.runs > 1 else ""
        figures = {}
        for kind, flt in (("unfiltered", None), ("filtered", FILTER)):
            executor = RayExecutor()
            got = eventing_run(
                data_dir, executor, args, handler, run, args.mutations, None, flt=flt, name=f"fn_{kind}_{run}"
            )
            ray.shutdown()
            if got is None:
                return 1
            figures[kind] = got["eventing_mps"]
            print(
                f"{label}{kind}: {got['handled']:,} mutations in {got['run_s']:.2f}s = "
                f"{got['eventing_mps']:,.0f} mutations/s (workers up in {got['up_s']:.1f}s)"
            )
        ratio = figures["filtered"] / figures["unfiltered"]
        print(f"{label}ratio filtered/unfiltered: {ratio:.2f}")
        runs.append(
            {
                "unfiltered_mps": round(figures["unfiltered"]),
                "filtered_mps": round(figures["filtered"]),
                "ratio": round(ratio, 3),
            }
        )
    print(
        json.dumps(
            {
                "workload": "trivial",
                "filter_ratio": args.filter_ratio,
                "passing": passing,
                "mutations": args.mutations,
                "workers": args.workers,
                "ratio": statistics.median(r["ratio"] for r in runs),
                "runs": runs,
            }
        )
    )
    return 0


def measure_batch(args: argparse.Namespace, data_dir: str) -> int:
    """W1 per call and W1 as one on_batch call a batch (by column, by whole documents), in turn on the same
    loaded bucket."""
    t0 = time.perf_counter()
    load_bench_bucket(data_dir, "bench", args.documents, args.mutations)
    print(
        f"load: {args.mutations:,} mutations over {args.documents:,} documents in "
        f"{time.perf_counter() - t0:.1f}s"
    )
    runs: list[dict] = []
    for run in range(1, args.runs + 1):
        label = f"run {run}/{args.runs}: " if args.runs > 1 else ""
        figures = {}
        kinds = (
            ("per_call", TRIVIAL_HANDLER),
            ("batch", TRIVIAL_BATCH_HANDLER),
            ("batch_docs", TRIVIAL_BATCH_DOCS_HANDLER),
        )
        for kind, handler in kinds:
            executor = RayExecutor()
            got = eventing_run(
                data_dir, executor, args, handler, run, args.mutations, None, name=f"fn_{kind}_{run}"
            )
            ray.shutdown()
            if got is None:
                return 1
            figures[kind] = got["eventing_mps"]
            print(
                f"{label}{kind}: {got['handled']:,} mutations in {got['run_s']:.2f}s = "
                f"{got['eventing_mps']:,.0f} mutations/s (workers up in {got['up_s']:.1f}s)"
            )
        ratio = figures["batch"] / figures["per_call"]
        docs_ratio = figures["batch_docs"] / figures["per_call"]
        print(f"{label}ratio batch/per call: {ratio:.2f} (by column), {docs_ratio:.2f} (whole documents)")
        runs.append(
            {
                "per_call_mps": round(figures["per_call"]),
                "batch_mps": round(figures["batch"]),
                "batch_docs_mps": round(figures["batch_docs"]),
                "ratio": round(ratio, 3),
                "docs_ratio": round(docs_ratio, 3),
            }
        )
    print(
        json.dumps(
            {
                "workload": "trivial",
                "batch": True,
                "mutations": args.mutations,
                "workers": args.workers,
                "batch_size": args.batch_size,
                "per_call_mps": statistics.median(r["per_call_mps"] for r in runs),
                "batch_mps": statistics.median(r["batch_mps"] for r in runs),
                "batch_docs_mps": statistics.median(r["batch_docs_mps"] for r in runs),
                "batch_vs_per_call": statistics.median(r["ratio"] for r in runs),
                "batch_docs_vs_per_call": statistics.median(r["docs_ratio"] for r in runs),
                "runs": runs,
            }
        )
    )
    return 0


def eventing_run(
    data_dir: str,
    executor: RayExecutor,
    args: argparse.Namespace,
    handler: str,
    run: int,
    expected: int,
    plain_out: LocalBucket | None,
    *,
    isolation: str = "none",
    flt: dict | None = None,
    name: str | None = None,
) -> dict | None:
    """`eventing run --until-caught-up` of a freshly deployed function (and, writing, a fresh output bucket)
    over the loaded bucket; None (with one line on stderr) when it did not do what the plain loop did."""
    name = name or ("fn_bench" if run == 1 else f"fn_bench_{run}")
    out_name = "emails" if run == 1 else f"emails_{run}"
    if isolation != "none":  # each run's sandboxed function and output bucket are its own
        name, out_name = f"{name}_{isolation}", f"{out_name}_{isolation}"
    if plain_out is not None:
        create_bucket(data_dir, out_name, partitions=args.partitions)
    defn = FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "bench",
            "worker_count": args.workers,
            "batch_size": args.batch_size,
            "checkpoint_interval": "1s",
            "isolation": isolation,
            "bindings": [{"alias": "dst", "bucket": out_name, "access": "rw"}]
            if plain_out is not None
            else [],
            **({"filter": flt} if flt is not None else {}),
        }
    )
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, name)
    marks: dict[str, float] = {}

    def on_progress(summary) -> None:
        sup = service.supervisors.get(name)
        if sup is not None and sup.ready and "ready" not in marks:
            marks["ready"] = time.perf_counter()
            marks["handled_at_ready"] = sup.handled

    service = EventingService(
        data_dir, executor, until_caught_up=True, functions=[name], on_progress=on_progress
    )
    start_run = time.perf_counter()
    summary = service.run()
    end = time.perf_counter()
    handled = summary.functions[name].handled
    if handled != expected:
        print(f"error: eventing handled {handled} mutations, plain loop {expected}", file=sys.stderr)
        return None
    if plain_out is not None and bucket_contents(plain_out) != bucket_contents(
        open_bucket(data_dir, out_name)
    ):
        print("error: eventing and the plain loop left different emails buckets", file=sys.stderr)
        return None
    # Processing time: from every worker actor up and owning its vBuckets to the final checkpoint.
    # Start-up (ray.init, actor processes) is a fixed cost per run, reported separately.
    ready = marks.get("ready", start_run)
    run_s = end - ready
    return {
        "handled": handled,
        "run_s": run_s,
        "up_s": ready - start_run,
        "eventing_mps": (handled - marks.get("handled_at_ready", 0)) / run_s,
        "timed": handled - marks.get("handled_at_ready", 0),  # the mutations handled in the timed window
        "window": (ready, end),
    }


if __name__ == "__main__":
    sys.exit(main())
