"""Ingest benchmark: `eventing bucket load --file` against raw SQLite inserts of the same rows.

Writes N mutations over D documents (the bench workload: scripts/bench.py's generator, seed 7) as a JSON
lines file, the way a user hands them to `bucket load`. Then, per run, in the same process and on the
same rows:

(a) raw SQLite: the rows the load stores (log entries with vb, seqno, key, op, cas, doc as msgpack bytes,
    expiry, flags, arrival_ms; one docs row per mutation; the touched high seqnos), prepared in memory
    before the clock starts, inserted with executemany into a fresh bucket file (the same schema and
    indexes, the same connection pragmas), one transaction per chunk of the same size as the load's;
(b) `eventing bucket load NAME --file F` in this process (the CLI's main, timed around the call), and
(c) the same command as a subprocess (`python -m eventing ...`), timed from its start to its exit, so
    interpreter start and imports are included.

Prints every run; the last line is JSON with each run's rates and ratios (load / raw) and their medians.
``--profile`` instead runs the in-process load once under cProfile and prints the top entries.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import msgpack  # noqa: E402

from eventing.cli.app import main as cli_main  # noqa: E402
from eventing.core.mutation import OP_UPDATE  # noqa: E402
from eventing.storage import loadgen  # noqa: E402
from eventing.storage.bucket import LocalBucket  # noqa: E402
from eventing.storage.files import _DOCS_COLUMNS_PLAIN, _LOG_COLUMNS_PLAIN  # noqa: E402
from eventing.storage.write_turns import keep_wal_short  # noqa: E402

CHUNK = 20_000  # rows per transaction, as `bucket load` commits them


def write_jsonl(path: str, documents: int, mutations: int) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for w in loadgen.generate(documents, mutations, seed=7):
            if w.op == OP_UPDATE:
                line = {"key": w.key, "doc": msgpack.unpackb(w.doc, raw=False)}
            else:
                line = {"key": w.key, "op": "delete"}
            out.write(json.dumps(line, separators=(",", ":")) + "\n")


def prepare_rows(path: str) -> list[tuple[list[tuple], list[tuple], list[tuple]]]:
    """Per chunk: the log rows, docs rows and high-seqno updates the load writes for the file's lines."""
    highs = [0] * 1024
    cas = time.time_ns()
    arrival = cas // 1_000_000
    chunks = []
    log_rows: list[tuple] = []
    doc_rows: list[tuple] = []
    touched: set[int] = set()
    with open(path, "rb") as f:
        for raw in f:
            item = json.loads(raw)
            key = item["key"]
            vb = ((zlib.crc32(key.encode()) >> 16) & 0x7FFF) % 1024
            highs[vb] += 1
            touched.add(vb)
            cas += 1
            if "doc" in item:
                doc = msgpack.packb(item["doc"], use_bin_type=True)
                log_rows.append((vb, highs[vb], key, 0, cas, doc, None, 0, 0, arrival))
                doc_rows.append((key, vb, highs[vb], cas, 0, doc, 0, 0))
            else:
                log_rows.append((vb, highs[vb], key, 1, cas, None, None, 0, 0, arrival))
                doc_rows.append((key, vb, highs[vb], cas, 1, None, 0, 0))
            if len(log_rows) == CHUNK:
                chunks.append((log_rows, doc_rows, [(highs[v], v) for v in sorted(touched)]))
                log_rows, doc_rows, touched = [], [], set()
    if log_rows:
        chunks.append((log_rows, doc_rows, [(highs[v], v) for v in sorted(touched)]))
    return chunks


def raw_inserts(data_dir: str, chunks: list, *, ordered: bool = False) -> tuple[int, float]:
    """executemany of the prepared rows, one transaction per chunk. ``ordered``: in the order the load
    itself inserts them (log rows by vBucket, the last version of each document, by key), to show how much
    of the load's lead over plain inserts comes from that order."""
    bucket = LocalBucket.create(data_dir, "raw-ordered" if ordered else "raw")
    db = bucket.file.db  # the bucket's own connection: the same pragmas
    n = 0
    start = time.perf_counter()
    for log_rows, doc_rows, high_rows in chunks:
        if ordered:  # counted in the time: the load pays for it too
            log_rows = sorted(log_rows, key=lambda r: r[0])
            doc_rows = sorted({r[0]: r for r in doc_rows}.values(), key=lambda r: r[0])
        db.execute("BEGIN IMMEDIATE")
        db.executemany(f"INSERT INTO log({_LOG_COLUMNS_PLAIN}) VALUES(?,?,?,?,?,?,?,?,?,?)", log_rows)
        db.executemany(
            f"INSERT OR REPLACE INTO docs({_DOCS_COLUMNS_PLAIN}) VALUES(?,?,?,?,?,?,?,?)", doc_rows
        )
        db.executemany("UPDATE high SET seqno=? WHERE vb=?", high_rows)
        db.execute("COMMIT")
        keep_wal_short(
            db, bucket.path
        )  # the WAL discipline of every bucket write (eventing.storage.write_turns)
        n += len(log_rows)
    seconds = time.perf_counter() - start
    bucket.close()
    return n, seconds


def load_inprocess(data_dir: str, path: str) -> tuple[int, float]:
    LocalBucket.create(data_dir, "cli").close()
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli_main(["bucket", "load", "cli", "--file", path, "--data-dir", data_dir, "--json"])
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"bucket load exited {code}: {out.getvalue()[-500:]}")
    return json.loads(out.getvalue())["mutations_written"], seconds


def load_subprocess(data_dir: str, path: str) -> tuple[int, float]:
    LocalBucket.create(data_dir, "sub").close()
    env = dict(os.environ, PYTHONPATH=ROOT)
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventing",
            "bucket",
            "load",
            "sub",
            "--file",
            path,
            "--data-dir",
            data_dir,
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"bucket load (subprocess) exited {proc.returncode}: {proc.stderr[-500:]}")
    return json.loads(proc.stdout)["mutations_written"], seconds


def same_log(data_dir: str, a: str, b: str) -> bool:
    """The two buckets hold the same log entries (all but cas and arrival time, which are per write)."""
    bucket = LocalBucket.open(data_dir, a)
    db = bucket.file.db
    db.execute("ATTACH DATABASE ? AS other", (str(bucket.path.parent / f"{b}.sqlite3"),))
    cols = "vb, seqno, key, op, doc, origin, expiry, flags"
    diff = db.execute(
        f"SELECT count(*) FROM (SELECT {cols} FROM log EXCEPT SELECT {cols} FROM other.log)"
    ).fetchone()[0]
    counts = [db.execute(f"SELECT count(*) FROM {s}log").fetchone()[0] for s in ("", "other.")]
    docs = db.execute(
        "SELECT count(*) FROM (SELECT key, vb, seqno, deleted, doc FROM docs "
        "EXCEPT SELECT key, vb, seqno, deleted, doc FROM other.docs)"
    ).fetchone()[0]
    bucket.close()
    return diff == 0 and docs == 0 and counts[0] == counts[1]


def uptime() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mutations", type=int, default=1_000_000)
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-subprocess", action="store_true", help="skip the subprocess variant")
    parser.add_argument("--no-ordered", action="store_true", help="skip the raw inserts in the load's order")
    parser.add_argument("--profile", action="store_true", help="cProfile one in-process load instead")
    parser.add_argument("--work-dir", default=None, help="default: a fresh temporary directory")
    args = parser.parse_args(argv)

    work = args.work_dir or tempfile.mkdtemp(prefix="eventing-ingest-")
    path = os.path.join(work, f"bench-{args.mutations}-{args.documents}.jsonl")
    if not os.path.exists(path):
        t = time.perf_counter()
        write_jsonl(path, args.documents, args.mutations)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB) in {time.perf_counter() - t:.1f}s")

    if args.profile:
        import cProfile
        import pstats

        data_dir = os.path.join(work, "profile")
        shutil.rmtree(data_dir, ignore_errors=True)
        prof = cProfile.Profile()
        prof.enable()
        n, seconds = load_inprocess(data_dir, path)
        prof.disable()
        print(f"profiled load: {n:,} mutations in {seconds:.1f}s (under cProfile)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        return 0

    chunks = prepare_rows(path)
    # A user's `bucket load` holds no million prepared tuples: keep them out of the cyclic GC's walks, which
    # would otherwise slow the in-process load (and only it) down.
    gc.freeze()
    runs = []
    for i in range(args.runs):
        data_dir = os.path.join(work, f"run{i}")
        shutil.rmtree(data_dir, ignore_errors=True)
        load_before = uptime()
        n_raw, raw_s = raw_inserts(data_dir, chunks)
        n_cli, cli_s = load_inprocess(data_dir, path)
        run: dict[str, Any] = {
            "run": i + 1,
            "load_avg": load_before,
            "rows": n_raw,
            "raw_mps": round(n_raw / raw_s),
            "load_mps": round(n_cli / cli_s),
        }
        run["ratio"] = round(run["load_mps"] / run["raw_mps"], 3)
        if not args.no_ordered:
            n_ord, ord_s = raw_inserts(data_dir, chunks, ordered=True)
            run["raw_ordered_mps"] = round(n_ord / ord_s)
            run["ratio_to_ordered"] = round(run["load_mps"] / run["raw_ordered_mps"], 3)
        if not args.no_subprocess:
            n_sub, sub_s = load_subprocess(data_dir, path)
            run["subprocess_mps"] = round(n_sub / sub_s)
            run["subprocess_ratio"] = round(run["subprocess_mps"] / run["raw_mps"], 3)
        if n_cli != n_raw:
            print(f"error: the load wrote {n_cli} mutations, the raw inserts {n_raw}", file=sys.stderr)
            return 1
        if i == 0 and not same_log(data_dir, "raw", "cli"):
            print("error: the loaded bucket's log differs from the raw inserts'", file=sys.stderr)
            return 1
        print(
            f"run {i + 1} (load avg {load_before}): raw {run['raw_mps']:,}/s, bucket load "
            f"{run['load_mps']:,}/s (ratio {run['ratio']:.2f})"
            + (
                f", subprocess {run['subprocess_mps']:,}/s (ratio {run['subprocess_ratio']:.2f})"
                if "subprocess_mps" in run
                else ""
            )
            + (
                f"; raw in the load's order {run['raw_ordered_mps']:,}/s (load/that "
                f"{run['ratio_to_ordered']:.2f})"
                if "raw_ordered_mps" in run
                else ""
            )
        )
        runs.append(run)
        shutil.rmtree(data_dir, ignore_errors=True)
    result: dict = {"mutations": args.mutations, "documents": args.documents, "runs": runs}
    for k in (
        "raw_mps",
        "load_mps",
        "ratio",
        "subprocess_mps",
        "subprocess_ratio",
        "raw_ordered_mps",
        "ratio_to_ordered",
    ):
        if k in runs[0]:
            result[f"median_{k}"] = statistics.median(r[k] for r in runs)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
