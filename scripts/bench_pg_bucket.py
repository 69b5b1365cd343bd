"""PostgreSQL buckets against SQLite buckets, in the same run (eventing.storage.postgres; docs/benchmarks.md,
"PostgreSQL buckets").

Starts a throwaway PostgreSQL server (fsync on, on this machine's cores) and a data directory, then times
on both stores:

  load     the bucket load: N mutations (default 1M, over N/10 documents, faker) in writes of 50,000;
  read     the whole log read back as workers read it: per vBucket, runs of --run mutations (a worker's
           batch) with read_vb_rows, one vBucket after another, in --readers threads (each a worker's
           share of the vBuckets);
  single   single-document writes as the Data API makes them: change_documents of one document per
           transaction, from --threads threads (a new document each, then replaced);
  grouped  the same writes as the Data API's writer thread commits them: change_documents of --group
           documents a transaction (the requests queued since its last commit), one thread;
  highs    high_seqnos of a worker's quarter of the vBuckets (spans), as a worker asks at every batch;
  effects  apply_effects of --effects binding writes (8 source vBuckets, marks moved), --effect-batches times;
  w1       W1 (the trivial handler over the loaded bucket) through `EventingService --until-caught-up` with
           the in-process executor (--workers worker cores, one process): the source bucket a file, then
           the PostgreSQL bucket (the service's bucket opens sent to the store: a stand-in until the
           store's handle routes them; the metadata store stays the data directory's).

Prints one line per figure and, last, JSON with every figure and the PostgreSQL / SQLite ratios.

    .venv/bin/python scripts/bench_pg_bucket.py                  # ~3 min
    .venv/bin/python scripts/bench_pg_bucket.py --mutations 200000 --single 4000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.core.mutation import OP_UPDATE, encode_document  # noqa: E402
from eventing.storage import loadgen  # noqa: E402
from eventing.storage import postgres as pg_buckets  # noqa: E402
from eventing.storage.factory import create_bucket  # noqa: E402
from eventing.storage.protocol import FileBucket  # noqa: E402
from eventing.storage.values import EffectGroup, StoredDocument, Write  # noqa: E402
from eventing.storage.writes import chunked  # noqa: E402
from eventing.testing.postgres import ThrowawayPostgres, _children  # noqa: E402
from metadata.postgres import PostgresDatabase  # noqa: E402
from sharding import NUM_VBUCKETS  # noqa: E402


def server_cpu_s(server: ThrowawayPostgres) -> float:
    """CPU seconds used so far by the server's processes (the postmaster and its children)."""
    pid = server.pid()
    if pid is None:
        return 0.0
    total = 0
    for proc in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{proc}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


CPU: dict[str, float] = {}  # of the last timed call: client and server CPU seconds


def timed(fn: Callable[[], int], server: ThrowawayPostgres | None = None) -> tuple[int, float]:
    started, client, on_server = time.perf_counter(), os.times(), server_cpu_s(server) if server else 0.0
    count = fn()
    wall = time.perf_counter() - started
    done = os.times()
    CPU["client"] = done.user - client.user + done.system - client.system
    CPU["server"] = server_cpu_s(server) - on_server if server else 0.0
    return count, wall


def cpu(count: int) -> str:
    """The last timed call's CPU per item: this process's, and the server's."""
    return (
        f"[cpu/item: client {CPU['client'] / count * 1e6:5.1f} us, server {CPU['server'] / count * 1e6:5.1f} "
        "us]"
    )


def load(bucket: FileBucket, mutations: int) -> int:
    for part in chunked(loadgen.generate(max(1, mutations // 10), mutations, seed=7), 50_000):
        bucket.write(part)
    return mutations


def read_all(bucket: FileBucket, run: int, readers: int) -> int:
    """Every vBucket's log in runs of ``run``, the vBuckets split over ``readers`` threads."""
    highs = bucket.high_seqnos()
    counts = [0] * readers

    def reader(index: int) -> None:
        got = 0
        for vb in range(index, NUM_VBUCKETS, readers):
            position = 0
            while position < highs[vb]:
                rows = bucket.read_vb_rows(vb, position, run)
                got += len(rows)
                position = rows[-1][1]
        counts[index] = got

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def single_writes(bucket: FileBucket, total: int, threads: int) -> int:
    """change_documents of one document a transaction, as the Data API's PUT: half new documents, half
    replaced."""
    doc = encode_document({"name": "x" * 40, "n": 1})

    def put(key: str) -> Callable[[StoredDocument | None], Write]:
        return lambda current: Write(key, OP_UPDATE, doc)

    def writer(index: int) -> None:
        for i in range(total // threads):
            key = f"single-{index}-{i % (total // threads // 2 or 1)}"
            done = bucket.change_documents([(key, put(key))])
            if isinstance(done[0], Exception):
                raise done[0]

    pool = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return (total // threads) * threads


def grouped_writes(bucket: FileBucket, total: int, group: int) -> int:
    """change_documents of ``group`` documents a transaction, one thread: the Data API's group commit."""
    doc = encode_document({"name": "x" * 40, "n": 1})

    def put(key: str) -> Callable[[StoredDocument | None], Write]:
        return lambda current: Write(key, OP_UPDATE, doc)

    for start in range(0, total - group + 1, group):
        keys = [f"grouped-{(start + i) % (total // 2)}" for i in range(group)]
        done = bucket.change_documents([(key, put(key)) for key in keys])
        if any(isinstance(d, Exception) for d in done):
            raise next(d for d in done if isinstance(d, Exception))
    return total - total % group


def w1(data_dir: str, source: str, workers: int, run: str) -> int:
    """W1 over bucket ``source`` of the data directory (or of the store the bucket opens are sent to)."""
    from eventing.control import lifecycle
    from eventing.control.service import EventingService
    from eventing.core.definition import FunctionDefinition
    from eventing.testing.workloads import TRIVIAL_HANDLER
    from eventing.workers.executor import InProcessExecutor

    name = f"fn_w1_{run}"  # one function a store
    defn = FunctionDefinition.from_dict(
        {"name": name, "source_bucket": source, "worker_count": workers, "checkpoint_interval": "1s"}
    )
    lifecycle.save_function(data_dir, defn, TRIVIAL_HANDLER)
    lifecycle.deploy(data_dir, name)
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True, functions=[name]).run()
    return int(summary.functions[name].handled)


class BucketsOn:
    """While in effect, every bucket the service, its workers and the lifecycle open (by name) is the
    PostgreSQL store's."""

    MODULES = (
        "eventing.control.lifecycle",
        "eventing.control.supervisor",
        "eventing.storage.remote",
        "eventing.execution.runner",
    )

    def __init__(self, db: PostgresDatabase):
        self.db = db
        self.saved: dict[str, Callable] = {}

    def __enter__(self) -> None:
        import importlib

        for name in self.MODULES:
            module = importlib.import_module(name)
            self.saved[name] = module.open_bucket
            module.open_bucket = lambda data_dir, bucket: pg_buckets.open_bucket(self.db, bucket)

    def __exit__(self, *exc: object) -> None:
        import importlib

        for name, fn in self.saved.items():
            importlib.import_module(name).open_bucket = fn


def effects(bucket: FileBucket, writes: int, batches: int) -> int:
    """apply_effects of ``writes`` binding writes in 8 groups (source vBuckets), ``batches`` times."""
    per_group = writes // 8
    doc = encode_document({"email": "someone@example.com", "n": 12345, "ok": True})
    seqno = 0
    for _ in range(batches):
        groups = []
        for g in range(8):
            groups.append(
                EffectGroup(
                    g * 128,
                    1,
                    [
                        (seqno + i + 1, Write(f"out-{g}-{seqno + i}", OP_UPDATE, doc))
                        for i in range(per_group)
                    ],
                )
            )
        result = bucket.apply_effects("bench", groups)
        assert result.applied == per_group * 8, result
        seqno += per_group
    return per_group * 8 * batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutations", type=int, default=1_000_000)
    parser.add_argument("--run", type=int, default=1000, help="mutations a read asks for (a worker's batch)")
    parser.add_argument("--readers", type=int, default=1, help="threads reading the log at once")
    parser.add_argument("--single", type=int, default=16_000, help="single-document writes in all")
    parser.add_argument("--threads", type=int, default=16, help="threads making single-document writes")
    parser.add_argument("--group", type=int, default=16, help="documents a transaction in the grouped writes")
    parser.add_argument("--effects", type=int, default=8_000, help="binding writes per apply_effects")
    parser.add_argument("--effect-batches", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4, help="worker cores of the W1 function")
    parser.add_argument("--only", default="", help="comma-separated parts to run (load is always run)")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    os.environ.setdefault("EVENTING_PG_POOL_SIZE", str(max(args.threads, args.readers) + 2))

    figures: dict[str, float] = {}
    folder = tempfile.mkdtemp(prefix="bench-pg-bucket-")
    server = ThrowawayPostgres(fsync=True)  # a folder of its own (the server runs as `postgres` under root)
    server.start()
    try:
        db = PostgresDatabase.open(server.create_database("bench"))
        stores: dict[str, Callable[[str], FileBucket]] = {
            "sqlite": lambda name: create_bucket(os.path.join(folder, "data"), name),
            "postgres": lambda name: pg_buckets.create_bucket(db, name),
        }
        sources: dict[str, FileBucket] = {}
        for store, make in stores.items():
            source = sources[store] = make("src")
            watched = server if store == "postgres" else None
            n, s = timed(lambda b=source: load(b, args.mutations), watched)
            figures[f"{store}_load_mps"] = round(n / s)
            print(
                f"{store:8s} load     {n:>9,} mutations  {s:6.1f} s  {n / s:>10,.0f}/s  {cpu(n)}", flush=True
            )
            if store == "postgres":
                # What autovacuum does some time after a load, done now so that it does not run during
                # the timed parts (it costs the server seconds of CPU after 1M rows).
                _, s = timed(lambda: db.run(lambda conn: conn.execute("VACUUM (ANALYZE)")) or 1, server)
                print(f"postgres vacuum   (analyze) after the load  {s:6.1f} s", flush=True)
                figures["postgres_vacuum_s"] = round(s, 1)
        for part in ("read", "highs", "single", "grouped", "effects", "w1"):
            if only and part not in only:
                continue
            for store, make in stores.items():
                watched = server if store == "postgres" else None
                if part == "read":
                    n, s = timed(lambda b=sources[store]: read_all(b, args.run, args.readers), watched)
                    assert n == args.mutations, n
                    figures[f"{store}_read_mps"] = round(n / s)
                    figures[f"{store}_read_cpu_us"] = round((CPU["client"] + CPU["server"]) / n * 1e6, 2)
                    print(
                        f"{store:8s} read     {n:>9,} mutations  {s:6.1f} s  {n / s:>10,.0f}/s  {cpu(n)} "
                        f"(runs of {args.run}, {args.readers} reader(s))",
                        flush=True,
                    )
                elif part == "highs":
                    n, s = timed(
                        lambda b=sources[store]: sum(
                            1 for _ in range(2000) if b.high_seqnos(spans=((0, 255),))
                        )
                    )
                    figures[f"{store}_highs_us"] = round(s / n * 1e6)
                    print(
                        f"{store:8s} highs    {n:>9,} calls      {s:6.1f} s  {s / n * 1e6:>10,.0f} us a call "
                        "(256 vBuckets)",
                        flush=True,
                    )
                elif part == "single":
                    target = make("single")
                    n, s = timed(lambda b=target: single_writes(b, args.single, args.threads), watched)
                    figures[f"{store}_single_wps"] = round(n / s)
                    print(
                        f"{store:8s} single   {n:>9,} writes     {s:6.1f} s  {n / s:>10,.0f}/s  {cpu(n)} "
                        f"({args.threads} threads, one document a transaction)",
                        flush=True,
                    )
                elif part == "w1":
                    data_dir = os.path.join(folder, "data")
                    route = BucketsOn(db) if store == "postgres" else contextlib.nullcontext()
                    with route:
                        n, s = timed(lambda d=data_dir, r=store: w1(d, "src", args.workers, r), watched)
                    assert n == args.mutations, n
                    figures[f"{store}_w1_mps"] = round(n / s)
                    print(
                        f"{store:8s} w1       {n:>9,} mutations  {s:6.1f} s  {n / s:>10,.0f}/s  {cpu(n)} "
                        f"(in-process, {args.workers} worker cores; start-up included)",
                        flush=True,
                    )
                elif part == "grouped":
                    target = make("grouped")
                    n, s = timed(lambda b=target: grouped_writes(b, args.single, args.group), watched)
                    figures[f"{store}_grouped_wps"] = round(n / s)
                    print(
                        f"{store:8s} grouped  {n:>9,} writes     {s:6.1f} s  {n / s:>10,.0f}/s  {cpu(n)} "
                        f"({args.group} documents a transaction, one thread)",
                        flush=True,
                    )
                else:
                    target = make("effects")
                    n, s = timed(lambda b=target: effects(b, args.effects, args.effect_batches), watched)
                    figures[f"{store}_effects_wps"] = round(n / s)
                    print(
                        f"{store:8s} effects  {n:>9,} writes     {s:6.1f} s  {n / s:>10,.0f}/s  {cpu(n)} "
                        f"({args.effects:,} a transaction)",
                        flush=True,
                    )
        if "sqlite_highs_us" in figures:
            figures["highs_postgres_vs_sqlite_time"] = round(
                figures["postgres_highs_us"] / max(1, figures["sqlite_highs_us"]), 2
            )
        for what in ("load_mps", "read_mps", "single_wps", "grouped_wps", "effects_wps", "w1_mps"):
            if f"sqlite_{what}" in figures and f"postgres_{what}" in figures:
                figures[f"{what.rsplit('_', 1)[0]}_postgres_vs_sqlite"] = round(
                    figures[f"postgres_{what}"] / figures[f"sqlite_{what}"], 3
                )
        db.close()
    finally:
        server.stop()
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
