"""Mirror of a PostgreSQL table to a function's committed effect (docs/benchmarks.md, "Mirrors of PostgreSQL
tables"): a table mirrored into a collection, a trivial function copying each row's key into `dst`, and
`eventing run` (in-process executor) as a process of its own.

- latency: one row inserted a transaction at --rate rows/s for --seconds; a row's latency is the arrival
  time of its effect in `dst`'s log minus the wall-clock time right after its INSERT committed;
- throughput: --rows rows inserted as fast as two writers can (transactions of 100 rows); rows_per_s is
  rows over the time from the first commit until the function's last effect.

Without --url it starts a throwaway PostgreSQL server (eventing.testing.postgres). The last line is JSON with
rows_per_s, p50_ms and p99_ms, and (on Linux) the CPU time the service and the follower spent on the
throughput phase, per row (cpu_us_per_row): on a machine shared with other work that figure moves much less
than the rates do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HANDLER = "def on_update(doc, meta):\n    dst[meta.id] = {}\n"


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process so far (Linux /proc), None when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def main() -> int:
    import psycopg

    from eventing.control import lifecycle
    from eventing.core.definition import FunctionDefinition
    from eventing.ops import mirrors
    from eventing.storage.mirror import definition as mirror_defs
    from eventing.storage.state import open_state
    from eventing.testing import wait_for
    from metadata.factory import open_store

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", help="a PostgreSQL database with wal_level=logical (default: a throwaway server)"
    )
    parser.add_argument("--rate", type=int, default=1000, help="rows a second in the latency phase")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the throughput phase")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        from eventing.testing.postgres import ThrowawayPostgres

        server = ThrowawayPostgres(fsync=True)
        server.start()
        url = server.create_database("bench")
    data_dir = tempfile.mkdtemp(prefix="bench-mirror-")
    service = None
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_rows")
            conn.execute("CREATE TABLE bench_rows (id bigint PRIMARY KEY, v int, note text)")
        open_store(data_dir).close()
        state = open_state(data_dir)
        for name in ("src", "dst"):
            state.create_bucket(name).close()
        mirrors.create_mirror(state, "src.pg.rows", source=url, table="public.bench_rows")
        defn = FunctionDefinition.from_dict(
            {
                "name": "fn_copy",
                "source_bucket": "src",
                "source_scope": "pg",
                "source_collection": "rows",
                "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
                "worker_count": 1,
            }
        )
        lifecycle.save_function(state, defn, HANDLER)
        lifecycle.deploy(state, "fn_copy")
        service = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eventing",
                "--data-dir",
                data_dir,
                "run",
                "--executor",
                "in-process",
                "--quiet",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def mirrors_pid() -> int | None:
            return mirror_defs.status(state.metadata, "src.pg.rows").get("pid")

        def handled() -> int:
            with state.open_bucket("dst") as dst:
                return dst.count()

        def committed_effects() -> dict[str, int]:
            with state.open_bucket("dst") as dst:
                return {m.key: m.arrival_ms for batch in dst.scan_log() for m in batch}

        # warm up: the follower's snapshot and the first rows
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO bench_rows VALUES (0, 0, 'warm')")
        wait_for(lambda: handled() >= 1, "the first row handled", timeout=120)

        # latency at a steady rate
        committed_at: dict[str, float] = {}
        with psycopg.connect(url, autocommit=True) as conn:
            total = int(args.rate * args.seconds)
            start = time.perf_counter()
            for i in range(1, total + 1):
                due = start + i / args.rate
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                conn.execute("INSERT INTO bench_rows VALUES (%s, 0, 'l')", (i,))
                committed_at[str(i)] = time.time() * 1000
        wait_for(lambda: handled() >= total + 1, "every latency row handled", timeout=300)
        arrivals = committed_effects()
        lat = sorted(arrivals[k] - t for k, t in committed_at.items())
        p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
        print(
            f"latency at {args.rate}/s for {args.seconds}s: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max "
            f"{lat[-1]:.1f} ms"
        )

        # throughput
        base = 10_000_000
        before = handled()
        pids = {"service": service.pid, "follower": mirrors_pid()}
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        per_writer = args.rows // 2

        def write(offset: int) -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                for chunk in range(0, per_writer, 100):
                    with conn.transaction():
                        with conn.cursor().copy("COPY bench_rows (id, v, note) FROM STDIN") as copy:
                            for i in range(chunk, min(chunk + 100, per_writer)):
                                copy.write_row((base + offset + i, 1, "t"))

        t0 = time.perf_counter()
        writers = [threading.Thread(target=write, args=(k * per_writer,)) for k in range(2)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        written_s = time.perf_counter() - t0
        wait_for(
            lambda: handled() >= before + 2 * per_writer,
            "every throughput row handled",
            timeout=600,
            every=0.2,
        )
        elapsed = time.perf_counter() - t0
        rate = 2 * per_writer / elapsed
        cpu: dict[str, float] = {}
        for name, pid in pids.items():
            first, last = cpu_before[name], cpu_seconds(pid)
            if first is not None and last is not None:
                cpu[name] = round((last - first) / (2 * per_writer) * 1e6, 1)
        print(
            f"throughput: {2 * per_writer:,} rows committed in {written_s:.1f}s, handled in {elapsed:.1f}s: "
            f"{rate:,.0f} rows/s; CPU a row: " + ", ".join(f"{k} {v} us" for k, v in cpu.items())
        )
        print(
            json.dumps(
                {
                    "rows_per_s": round(rate),
                    "p50_ms": round(p50, 1),
                    "p99_ms": round(p99, 1),
                    "rate": args.rate,
                    "rows": 2 * per_writer,
                    "cpu_us_per_row": cpu,
                }
            )
        )
        state.close()
        return 0
    finally:
        if service is not None:
            service.terminate()
            service.wait(60)
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
