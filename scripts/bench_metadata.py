"""Metadata store micro-benchmark: a worker's commit and claim on the SQLite store and on a PostgreSQL store,
in the same run on this machine.

A worker's commit moves the checkpoints of the vBuckets it owns (--vbuckets, default 256) and adds a few
counters, in one transaction conditional on its epochs; a claim takes those vBuckets with a higher epoch.
For each store this script times:
  commit   one thread committing --commits times (every vBucket's seqno moves by one each commit);
  claim    --claims claims of the same vBuckets (each bumps every epoch);
  parallel --threads threads, each a store of its own (a process's connection) with its own vBuckets,
           committing at once for --seconds: commits of different vBuckets that share the counter rows.
PostgreSQL: --store postgresql://... (a database the script may create tables in), else a throwaway server
started here (Debian's postgresql, as scripts/setup.sh installs), with fsync on as a real server runs
(every commit waits for the disk to flush the WAL: this machine's fdatasync takes ~2 ms), or with
--server-fsync off to see the CPU's share. The SQLite store runs as always: synchronous=NORMAL in WAL mode,
no flush per commit.
The last line is JSON: per store, commits/s, claims/s and parallel commits/s, and pg_vs_sqlite ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from metadata import SqliteMetadataStore  # noqa: E402

COUNTERS = {"dcp_mutation": 64, "on_update_success": 60, "on_delete_success": 4}


def timed_commits(store: Any, function: str, vbs: list[int], commits: int) -> float:
    epochs = {vb: cp.epoch for vb, cp in store.claim(function, vbs, "bench/w0").items()}
    seqno = store.checkpoints(function)[vbs[0]].seqno
    start = time.perf_counter()
    for _ in range(commits):
        seqno += 1
        store.commit(function, epochs, dict.fromkeys(vbs, seqno), counters=COUNTERS)
    return commits / (time.perf_counter() - start)


def timed_claims(store: Any, function: str, vbs: list[int], claims: int) -> float:
    start = time.perf_counter()
    for i in range(claims):
        store.claim(function, vbs, f"bench/w{i}")
    return claims / (time.perf_counter() - start)


def parallel_commits(
    open_store: Callable[[], Any], function: str, vbuckets: int, threads: int, seconds: float
) -> float:
    stores = [open_store() for _ in range(threads)]
    done = [0] * threads
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        store = stores[i]
        vbs = [(i * vbuckets + j) % 1024 for j in range(vbuckets)]
        epochs = {vb: cp.epoch for vb, cp in store.claim(function, vbs, f"bench/p{i}").items()}
        seqno = 1_000_000
        barrier.wait()
        while not stop.is_set():
            seqno += 1
            store.commit(function, epochs, dict.fromkeys(vbs, seqno), counters=COUNTERS)
            done[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    rate = sum(done) / (time.perf_counter() - start)
    for s in stores:
        s.close()
    return rate


def run_store(name: str, open_store: Callable[[], Any], args: argparse.Namespace) -> dict[str, float]:
    store = open_store()
    vbs = list(range(args.vbuckets))
    store.init_checkpoints("bench", dict.fromkeys(range(1024), 0), "uuid")
    timed_commits(
        store, "bench", vbs, max(1, args.commits // 10)
    )  # warm up: statements prepared, pages cached
    commits = timed_commits(store, "bench", vbs, args.commits)
    claims = timed_claims(store, "bench", vbs, args.claims)
    store.init_checkpoints("par", dict.fromkeys(range(1024), 0), "uuid")
    parallel = parallel_commits(open_store, "par", args.vbuckets, args.threads, args.seconds)
    store.close()
    print(
        f"{name}: {commits:,.0f} commits/s ({args.vbuckets} vBuckets + {len(COUNTERS)} counters), "
        f"{claims:,.0f} claims/s, {parallel:,.0f} commits/s from {args.threads} threads",
        flush=True,
    )
    return {
        "commits_per_s": round(commits),
        "claims_per_s": round(claims),
        "parallel_commits_per_s": round(parallel),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", help="postgresql://... URL (default: a throwaway server started here)")
    parser.add_argument("--only", choices=["sqlite", "postgresql"], help="time one store only")
    parser.add_argument(
        "--server-fsync",
        choices=["on", "off"],
        default="on",
        help="fsync of the throwaway server (default on)",
    )
    parser.add_argument("--vbuckets", type=int, default=256)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    out: dict[str, Any] = {
        "vbuckets": args.vbuckets,
        "server_fsync": args.server_fsync if not args.store else None,
    }
    with tempfile.TemporaryDirectory(prefix="bench-metadata-") as folder:
        if args.only != "postgresql":
            path = os.path.join(folder, "metadata.sqlite3")
            out["sqlite"] = run_store("sqlite", lambda: SqliteMetadataStore(path), args)
        if args.only != "sqlite":
            out["postgresql"] = run_postgres(args)
    if "sqlite" in out and "postgresql" in out:
        out["pg_vs_sqlite"] = {k: round(out["postgresql"][k] / out["sqlite"][k], 3) for k in out["sqlite"]}
    print(json.dumps(out))


def run_postgres(args: argparse.Namespace) -> dict[str, float]:
    from metadata.postgres import PostgresMetadataStore

    server = None
    url = args.store
    if url is None:
        from eventing.testing.postgres import ThrowawayPostgres

        server = ThrowawayPostgres(fsync=args.server_fsync == "on")
        server.start()
        url = server.create_database("bench")
    try:
        return run_store("postgresql", lambda: PostgresMetadataStore(url), args)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
