"""Write-to-handler latency: how long after a write commits its handler's effect is committed.

A function `lat` (source `src`, binding `dst`) copies each document to `dst`. This script writes documents
to `src` at a steady rate (default 2,000/s for 60 s, one write a transaction, as an application writes)
through the Python API, or with --http through the Data API of an `eventing serve` subprocess (with --sdk
through Couchbase's Python SDK to that server's KV port, eventing.kv), while an
`eventing run` subprocess (default executor Ray; --executor in-process) runs the function. Each run does
two phases on the same data directory, alternating with --runs: write notifications on (the default),
then off (EVENTING_WAKE=0 for `eventing run`: caught-up workers are polled every 50 ms), the baseline.

For each mutation: latency = the commit of its effect in `dst` - the moment the write returned in this
process (a monotonic clock is not shared across processes, so both are wall clock, epoch ms). The commit
of the effect is the entry's `arrival_ms` in dst's log: the time its transaction stamped the entry, inside
the transaction, a fraction of a millisecond before it commits, in whole milliseconds (so a figure reads
up to 1 ms low). The handler also stores time.time() of its call, giving the write-to-handler-call figure
too; the difference is the step's flush of effects.

--store postgresql://... (or `postgresql`: a throwaway server started for the run, fsync on; see
eventing.testing.bench_store) runs the same on a PostgreSQL store: buckets, function and checkpoints on the
server, writes announced by NOTIFY after their commit (eventing.storage.postgres.wake). There the default
rate is 1,000 writes/s, from --writers threads (default 8 on a store, 1 otherwise: with fsync on, one
commit waits for the disk, ~2 ms on the development machine, so one thread cannot write 1,000 a second);
each write still starts at its due time and is stamped when it returns. An effect's `arrival_ms` is stamped
before its transaction's COMMIT, so the figures leave out that COMMIT's round trip and disk flush (as they
leave out a bucket file's commit).

The function runs as the machine's default has it (unconfined unless EVENTING_DEFAULT_ISOLATION says
sandbox); --isolation none or sandbox chooses (EVENTING_DEFAULT_ISOLATION for the `eventing run`
subprocess).

Prints every phase; the last line is JSON: p50_ms, p99_ms, max_ms, rate (writes/s achieved) with waking on,
and the same figures of the baseline under "baseline" (medians over --runs; every run under "runs").
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import msgpack  # noqa: E402

from eventing import Eventing, FunctionDefinition  # noqa: E402

HANDLER = """import time


def on_update(doc, meta):
    dst[meta.id] = {"i": doc["i"], "called": time.time()}
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Writer:
    def write(self, key: str, doc: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ApiWriter(Writer):
    def __init__(self, app: Eventing):
        self.app = app
        self.bucket = app.bucket("src")

    def write(self, key: str, doc: dict[str, Any]) -> None:
        self.bucket.upsert(key, doc)


class HttpWriter(Writer):
    """PUT /v1/buckets/src/scopes/_default/collections/_default/documents/{key} on one kept connection."""

    def __init__(self, port: int, token: str):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}

    def write(self, key: str, doc: dict[str, Any]) -> None:
        path = f"/v1/buckets/src/scopes/_default/collections/_default/documents/{key}"
        try:
            self.conn.request("PUT", path, body=json.dumps(doc), headers=self.headers)
            response = self.conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            # The server closed a keep-alive connection left idle (the wait for `eventing run`): once more.
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            self.conn.request("PUT", path, body=json.dumps(doc), headers=self.headers)
            response = self.conn.getresponse()
        body = response.read()
        if response.status >= 300:
            raise SystemExit(f"PUT {key}: HTTP {response.status} {body[:200]!r}")

    def close(self) -> None:
        self.conn.close()


class SdkWriter(Writer):
    """Couchbase's SDK (the `couchbase` package): an upsert to the KV port, signed in with the admin token."""

    def __init__(self, kv_port: int, token: str):
        from datetime import timedelta

        from couchbase.auth import PasswordAuthenticator
        from couchbase.cluster import Cluster
        from couchbase.options import ClusterOptions

        self.cluster = Cluster(
            f"couchbase://127.0.0.1:{kv_port}", ClusterOptions(PasswordAuthenticator("bench", token))
        )
        self.cluster.wait_until_ready(timedelta(seconds=60))
        self.collection = self.cluster.bucket("src").default_collection()

    def write(self, key: str, doc: dict[str, Any]) -> None:
        self.collection.upsert(key, doc)

    def close(self) -> None:
        self.cluster.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"eventing serve did not listen on {port} within {timeout:.0f}s")


def effects(data_dir: str, prefix: str) -> dict[str, tuple[int, float]]:
    """key -> (arrival_ms of its effect in dst's log, the handler's time.time()), for keys of one phase."""
    if data_dir.startswith(("postgresql:", "postgres:")):
        from metadata.postgres import PostgresDatabase

        rows = PostgresDatabase.open(data_dir).read(
            "SELECT l.key, l.arrival_ms, l.doc FROM bucket_log l JOIN bucket_registry r ON r.id = l.bucket "
            "WHERE r.name = 'dst' AND l.key >= %s AND l.key < %s",
            (prefix, prefix + "\uffff"),
        )
    else:
        db = sqlite3.connect(
            f"file:{os.path.join(data_dir, 'buckets', 'dst.sqlite3')}?mode=ro", uri=True, timeout=30
        )
        try:
            rows = db.execute(
                "SELECT key, arrival_ms, doc FROM log WHERE key >= ? AND key < ?", (prefix, prefix + "\uffff")
            ).fetchall()
        finally:
            db.close()
    out = {}
    for key, arrival, doc in rows:
        if key not in out:
            out[key] = (int(arrival), float(msgpack.unpackb(doc, raw=False)["called"]))
    return out


def write_range(
    writer: Writer,
    prefix: str,
    numbers: range,
    begin: float,
    rate: float,
    written: dict[str, float],
    call_s: list[float],
) -> None:
    """Write documents ``numbers``, each at its due time (begin + i / rate), stamping each when it
    returned."""
    for i in numbers:
        delay = begin + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        key = f"{prefix}{i:08d}"
        t0 = time.perf_counter()
        writer.write(key, {"i": i, "written": time.time()})
        written[key] = time.time() * 1000  # right after the write returned: it is committed
        call_s.append(time.perf_counter() - t0)


def phase(args: argparse.Namespace, app: Eventing, data_dir: str, label: str, waking: bool) -> dict[str, Any]:
    env = dict(
        os.environ,
        EVENTING_WAKE="1" if waking else "0",
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    if args.isolation != "default":  # the machine's default for the function (it sets none of its own)
        env["EVENTING_DEFAULT_ISOLATION"] = args.isolation
    where = ["--store" if args.store else "--data-dir", data_dir]
    command = [
        sys.executable,
        "-m",
        "eventing",
        *where,
        "run",
        "--executor",
        args.executor,
        "--progress-every",
        "5",
    ]
    if args.ray_address:
        command += ["--ray-address", args.ray_address]
    runner = subprocess.Popen(command, env=env, cwd=ROOT)
    server = None
    writer: Writer
    try:
        if args.http or args.sdk:
            port, kv_port, token = free_port(), free_port(), "bench-latency-token"
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eventing",
                    *where,
                    "serve",
                    "--port",
                    str(port),
                    "--kv-port",
                    str(kv_port),
                ],
                env=dict(env, EVENTING_ADMIN_TOKEN=token),
                cwd=ROOT,
            )
            wait_http(port)

            def make_writer() -> Writer:
                return SdkWriter(kv_port, token) if args.sdk else HttpWriter(port, token)
        else:

            def make_writer() -> Writer:
                return ApiWriter(app)

        writer = make_writer()
        # Up once a first write has its effect (workers started, vBuckets claimed); then a second to settle.
        started = time.monotonic()
        warm = f"{label}-warm"
        writer.write(warm, {"i": -1})
        while warm not in effects(data_dir, warm):
            if runner.poll() is not None:
                raise SystemExit(f"eventing run exited with {runner.returncode}")
            if time.monotonic() - started > 180:
                raise SystemExit("eventing run did not handle a first write within 180 s")
            time.sleep(0.05)
        up_s = time.monotonic() - started
        time.sleep(1.0)
        prefix = f"{label}-k"
        count = int(args.rate * args.seconds)
        written: dict[str, float] = {}
        call_s: list[float] = []
        begin = time.monotonic()
        if args.writers <= 1:
            write_range(writer, prefix, range(count), begin, args.rate, written, call_s)
        else:
            # Write i still starts at its due time, from whichever thread has it (each thread its own writer).
            writers = [writer] + [make_writer() for _ in range(args.writers - 1)]
            threads = [
                threading.Thread(
                    target=write_range,
                    args=(w, prefix, range(n, count, args.writers), begin, args.rate, written, call_s),
                )
                for n, w in enumerate(writers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for w in writers[1:]:
                w.close()
        took = time.monotonic() - begin
        deadline = time.monotonic() + 120
        seen = effects(data_dir, prefix)
        while len(seen) < count and time.monotonic() < deadline:
            time.sleep(0.2)
            seen = effects(data_dir, prefix)
        writer.close()
    finally:
        for proc in (server, runner):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (server, runner):
            if proc is not None:
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    commit = [seen[k][0] - t for k, t in written.items() if k in seen]
    called = [seen[k][1] * 1000 - t for k, t in written.items() if k in seen]
    result = {
        "waking": waking,
        "p50_ms": round(percentile(commit, 0.50), 2) if commit else None,
        "p90_ms": round(percentile(commit, 0.90), 2) if commit else None,
        "p99_ms": round(percentile(commit, 0.99), 2) if commit else None,
        "max_ms": round(max(commit), 2) if commit else None,
        "call_p50_ms": round(percentile(called, 0.50), 2) if called else None,
        "call_p99_ms": round(percentile(called, 0.99), 2) if called else None,
        "rate": round(count / took, 1),
        "write_call_p50_ms": round(percentile(call_s, 0.5) * 1000, 3),
        "write_call_p99_ms": round(percentile(call_s, 0.99) * 1000, 3),
        "mutations": count,
        "missing": count - len(commit),
        "up_s": round(up_s, 2),
    }
    print(
        f"{label}: waking {'on ' if waking else 'off'} {result['rate']:,.0f} writes/s, write to effect "
        f"committed p50 {result['p50_ms']} ms, p90 {result['p90_ms']} ms, p99 {result['p99_ms']} ms, max "
        f"{result['max_ms']} ms (to the handler call p50 {result['call_p50_ms']} ms, p99 "
        f"{result['call_p99_ms']} ms; a write call p50 {result['write_call_p50_ms']} ms; missing "
        f"{result['missing']}; run up in {result['up_s']} s)",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="writes per second (default 2000; 1000 on a --store)"
    )
    parser.add_argument(
        "--writers",
        type=int,
        default=None,
        help="threads writing (default 1; 8 on a --store), each write at its due time",
    )
    parser.add_argument(
        "--store",
        default=None,
        metavar="postgresql[://...]",
        help="run on this PostgreSQL store: a URL, or `postgresql` for a throwaway server started "
        "for the run (fsync on)",
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="seconds of writes per phase (default 60)"
    )
    parser.add_argument("--executor", choices=["ray", "in-process"], default="ray")
    parser.add_argument(
        "--ray-address", default=None, help="run the function on the Ray cluster at this address"
    )
    parser.add_argument("--workers", type=int, default=4, help="the function's workers (default 4)")
    parser.add_argument("--runs", type=int, default=1, help="alternate both phases this many times")
    parser.add_argument("--http", action="store_true", help="write through the Data API of `eventing serve`")
    parser.add_argument(
        "--sdk", action="store_true", help="write through Couchbase's SDK to the KV port of `eventing serve`"
    )
    parser.add_argument("--no-baseline", action="store_true", help="only the phase with waking on")
    parser.add_argument(
        "--isolation",
        choices=["default", "sandbox", "none"],
        default="default",
        help="how the function runs: the machine's default (none, unless EVENTING_DEFAULT_ISOLATION "
        "says sandbox), or this",
    )
    parser.add_argument("--data-dir", default=None, help="default: a fresh temporary folder")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="cluster mode: start a 2-node Ray cluster on this machine whose second node cannot see "
        "the data directory, and run every worker there (needs root for the hidden node)",
    )
    args = parser.parse_args()
    if args.http and not os.path.exists(os.path.join(ROOT, "eventing", "http", "dataapi.py")):
        parser.error("--http needs the Data API (eventing/http/dataapi/__init__.py)")
    if args.rate is None:
        args.rate = 1000.0 if args.store else 2000.0
    if args.writers is None:
        args.writers = 8 if args.store else 1
    if args.store is None:
        return on_location(args, args.data_dir or tempfile.mkdtemp(prefix="bench-latency-"))
    from eventing.testing.bench_store import BenchStore, check_option

    why = check_option(args.store)
    if why is None and (args.cluster or args.data_dir):
        why = "--store runs without --cluster and --data-dir"
    if why:
        parser.error(why)
    with BenchStore(args.store) as store:
        args.server = store
        print(f"store: {store.describe()}", flush=True)
        return on_location(args, store.location("lat"))


def on_location(args: argparse.Namespace, data_dir: str) -> int:
    app = (
        Eventing(store=data_dir, executor=args.executor)
        if args.store
        else Eventing(data_dir, executor=args.executor)
    )
    app.create_bucket("src")
    app.create_bucket("dst")
    app.deploy(
        FunctionDefinition.from_dict(
            {
                "name": "lat",
                "source_bucket": "src",
                "worker_count": args.workers,
                "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            }
        ),
        HANDLER,
    )
    cluster = start_cluster(args, data_dir) if args.cluster else None
    try:
        return measure(args, app, data_dir)
    finally:
        if cluster is not None:
            cluster.stop()
        if args.data_dir is None and not args.store:  # the script's own temporary folder
            shutil.rmtree(data_dir, ignore_errors=True)


def start_cluster(args: argparse.Namespace, data_dir: str) -> Any:
    """A head and a node `n2` that sees neither the data directory nor the packages; the function's workers
    all pinned to n2 (eventing node add/remove, rebalance), so every read and effect goes through the data
    service on the head."""
    from eventing.cli.app import main as cli
    from eventing.testing.cluster import LocalRayCluster

    if not LocalRayCluster.can_hide():
        raise SystemExit("--cluster needs root and unshare (a node hidden from the data directory)")
    cluster = LocalRayCluster()
    packages = [os.path.join(ROOT, name) for name in ("eventing", "metadata", "sharding")]
    args.ray_address = cluster.start()
    node = cluster.add_node("n2", hidden=[data_dir, *packages])
    for command in (
        ["node", "add", "n2", "--ray-node-id", node.node_id],
        ["node", "remove", "local"],
        ["rebalance"],
    ):
        if cli(["--data-dir", data_dir, *command]) != 0:
            cluster.stop()
            raise SystemExit(f"eventing {' '.join(command)} failed")
    return cluster


def measure(args: argparse.Namespace, app: Eventing, data_dir: str) -> int:
    print(
        f"data dir {data_dir}; {args.rate:,.0f} writes/s for {args.seconds:.0f} s per phase, executor "
        f"{args.executor}{' on ' + args.ray_address if args.ray_address else ''}, {args.workers} workers, "
        f"writes through {'the Data API' if args.http else 'the Python API'} from {args.writers} thread(s)",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    for n in range(args.runs):
        on = phase(args, app, data_dir, f"r{n}-wake", True)
        off = None if args.no_baseline else phase(args, app, data_dir, f"r{n}-poll", False)
        runs.append({"wake": on, "baseline": off})

    def median(kind: str, field: str) -> float | None:
        values = [r[kind][field] for r in runs if r[kind] is not None and r[kind][field] is not None]
        return round(statistics.median(values), 2) if values else None

    fields = ("p50_ms", "p99_ms", "max_ms", "rate", "call_p50_ms", "call_p99_ms", "missing")
    out: dict[str, Any] = {field: median("wake", field) for field in fields}
    out["baseline"] = None if args.no_baseline else {field: median("baseline", field) for field in fields}
    out.update(
        executor=args.executor,
        http=args.http,
        workers=args.workers,
        seconds=args.seconds,
        writers=args.writers,
        store=args.store is not None,
        isolation=args.isolation,
        runs=runs,
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
