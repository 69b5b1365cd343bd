"""Data API throughput against a real `eventing serve` on 127.0.0.1: single-document PUTs from N keep-alive
connections, then the bulk load (POST /api/v1/keyspaces/K/load) against `eventing bucket load --file` of
the same JSON lines, in the same run. The last line is JSON.

The PUTs come from `wrk` (2 threads, N connections, a Lua script making each request's key and body) when
it is installed (Debian: `apt-get install wrk`), since it costs the shared cores little; otherwise, or with
`--client python`, from N Python threads with one keep-alive httpx.Client each (which take a large share of
the CPU themselves).

`--client sdk` adds Couchbase's Python SDK (the `couchbase` package) against the KV port of the same server
(eventing.kv): N threads sharing one Cluster, as an application would, each upserting single documents; the
Data API's PUTs run first in the same run (wrk when installed, else Python threads) for the comparison.

`--store postgresql://...` (or `--store postgresql`: a throwaway server started for the run, fsync on; see
eventing.testing.bench_store) runs the same on a PostgreSQL store, and first, in the same run, the PUTs on a
data directory for the baseline: the JSON adds `store_docs_per_s` and `store_vs_data_dir` (PUTs) and the
bulk figures are the store's.

    .venv/bin/python scripts/bench_dataapi.py [--clients 16] [--seconds 10] [--rows 200000] [--client auto|wrk|python|sdk]
    .venv/bin/python scripts/bench_dataapi.py --store postgresql --rows 50000
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent / "eventing"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(base: str, proc: subprocess.Popen, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"eventing serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/v1/callerIdentity", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("eventing serve did not answer within 30 s")


def put_bench(base: str, clients: int, seconds: float) -> dict[str, float]:
    path = f"{base}/v1/buckets/bench/scopes/_default/collections/_default/documents"
    counts = [0] * clients
    errors = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(timeout=30.0) as c:
            n = 0
            while time.monotonic() < stop:
                r = c.put(
                    f"{path}/c{i}-{n}",
                    content=b'{"n": %d, "client": %d, "text": "a small document"}' % (n, i),
                    headers={"Content-Type": "application/json"},
                )
                if r.status_code == 200:
                    counts[i] += 1
                else:
                    errors[i] += 1
                n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    return {
        "docs": sum(counts),
        "errors": sum(errors),
        "seconds": round(elapsed, 2),
        "docs_per_s": round(sum(counts) / elapsed),
    }


def sdk_bench(kv_port: int, clients: int, seconds: float) -> dict[str, float]:
    """Single-document upserts through Couchbase's SDK from `clients` threads sharing one connection."""
    from datetime import timedelta

    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.options import ClusterOptions

    cluster = Cluster(
        f"couchbase://127.0.0.1:{kv_port}", ClusterOptions(PasswordAuthenticator("bench", "bench"))
    )
    cluster.wait_until_ready(timedelta(seconds=30))
    coll = cluster.bucket("bench").default_collection()
    counts = [0] * clients
    errors = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            try:
                coll.upsert(f"s{i}-{n}", {"n": n, "client": i, "text": "a small document"})
                counts[i] += 1
            except Exception:
                errors[i] += 1
            n += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    cluster.close()
    return {
        "docs": sum(counts),
        "errors": sum(errors),
        "seconds": round(elapsed, 2),
        "docs_per_s": round(sum(counts) / elapsed),
    }


WRK_SCRIPT = r"""
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
function init(args)
  n = 0
  prefix = "/v1/buckets/bench/scopes/_default/collections/_default/documents/w" .. id .. "-"
end
request = function()
  n = n + 1
  return wrk.format("PUT", prefix .. n, {["Content-Type"] = "application/json"},
    '{"n": ' .. n .. ', "client": ' .. id .. ', "text": "a small document"}')
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK {"requests": %d, "duration_us": %d, "non_2xx": %d, "socket_errors": %d, ' ..
    '"p50_ms": %.2f, "p99_ms": %.2f}\n', summary.requests, summary.duration, e.status,
    e.connect + e.read + e.write + e.timeout, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""


def put_bench_wrk(base: str, clients: int, seconds: float, work: Path) -> dict[str, float]:
    """The same PUTs from wrk: keys w<thread>-<n>, one small JSON document each."""
    script = work / "put.lua"
    script.write_text(WRK_SCRIPT)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{clients}", f"-d{max(1, round(seconds))}s", "-s", str(script), base + "/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK ")), None)
    if line is None:
        raise SystemExit(f"wrk printed no summary:\n{out}")
    got = json.loads(line[4:])
    errors = got["non_2xx"] + got["socket_errors"]
    elapsed = got["duration_us"] / 1e6
    return {
        "docs": got["requests"] - errors,
        "errors": errors,
        "seconds": round(elapsed, 2),
        "docs_per_s": round((got["requests"] - errors) / elapsed),
        "p50_ms": got["p50_ms"],
        "p99_ms": got["p99_ms"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument(
        "--client",
        choices=("auto", "wrk", "python", "sdk"),
        default="auto",
        help="who sends the PUTs: wrk when installed (auto), else Python threads; sdk: also Couchbase's "
        "SDK over the KV port, after the Data API's PUTs",
    )
    ap.add_argument(
        "--store",
        default=None,
        metavar="postgresql[://...]",
        help="also on this PostgreSQL store, the data directory's PUTs first as the baseline: a URL, or "
        "`postgresql` for a throwaway server started for the run (fsync on)",
    )
    args = ap.parse_args()
    if args.store is not None:
        from eventing.testing.bench_store import BenchStore, check_option

        why = check_option(args.store)
        if why:
            ap.error(why)
        with BenchStore(args.store) as store:
            print(f"store: {store.describe()}", file=sys.stderr)
            run(args, store)
        return
    run(args, None)


def process_cpu_s(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(where: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str, int]:
    port, kv_port = free_port(), free_port()
    proc = subprocess.Popen(
        [str(BIN), "serve", *where, "--port", str(port), "--kv-port", str(kv_port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, f"http://127.0.0.1:{port}", kv_port


def run(args: argparse.Namespace, store) -> None:  # noqa: ANN001 - a BenchStore or None
    client = args.client
    sdk = client == "sdk"
    if client in ("auto", "sdk"):
        client = "wrk" if shutil.which("wrk") else "python"
    elif client == "wrk" and not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk); use --client python")
    work = Path(tempfile.mkdtemp(prefix="bench-dataapi-"))
    data = work / "data"
    env = {**os.environ, "EVENTING_ADMIN_TOKEN": "", "EVENTING_READ_TOKEN": ""}
    baseline = None
    if store is not None:  # the data directory's PUTs first, in the same run
        subprocess.run(
            [str(BIN), "bucket", "create", "bench", "--data-dir", str(data)],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        proc, base, _ = serve(["--data-dir", str(data)], env)
        try:
            wait_up(base, proc)
            serve_before = process_cpu_s(proc.pid)
            baseline = (
                put_bench_wrk(base, args.clients, args.seconds, work)
                if client == "wrk"
                else put_bench(base, args.clients, args.seconds)
            )
            baseline["serve_cpu_us"] = round(
                (process_cpu_s(proc.pid) - serve_before) / max(1, baseline["docs"]) * 1e6
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        print(f"data directory: PUT from {args.clients} {client} clients: {baseline}", file=sys.stderr)
    where = ["--store", store.location("dataapi")] if store is not None else ["--data-dir", str(data)]
    for bucket in ("bench", "bulk_http", "bulk_cli"):
        if store is not None or bucket != "bench" or baseline is None:
            subprocess.run(
                [str(BIN), "bucket", "create", bucket, *where], check=True, env=env, stdout=subprocess.DEVNULL
            )
    lines = work / "rows.jsonl"
    with open(lines, "wb") as f:
        for i in range(args.rows):
            f.write(b'{"key":"k%07d","doc":{"i":%d,"name":"user %d","tags":["a","b"]}}\n' % (i, i, i))
    proc, base, kv_port = serve(where, env)
    try:
        wait_up(base, proc)
        server_before = store.snapshot() if store is not None else {}
        serve_before = process_cpu_s(proc.pid)
        if client == "wrk":
            put = put_bench_wrk(base, args.clients, args.seconds, work)
        else:
            put = put_bench(base, args.clients, args.seconds)
        put["serve_cpu_us"] = round((process_cpu_s(proc.pid) - serve_before) / max(1, put["docs"]) * 1e6)
        server = store.since(server_before, put["docs"]) if store is not None else {}
        print(
            f"{'store' if store is not None else 'data directory'}: PUT from {args.clients} {client} "
            f"clients: {put}" + (f"; per PUT on the server: {server}" if server else ""),
            file=sys.stderr,
        )
        sdk_put = sdk_bench(kv_port, args.clients, args.seconds) if sdk else None
        if sdk_put is not None:
            print(f"SDK upserts from {args.clients} threads: {sdk_put}", file=sys.stderr)

        def chunks():
            with open(lines, "rb") as f:
                while chunk := f.read(256 * 1024):
                    yield chunk

        t0 = time.monotonic()
        r = httpx.post(f"{base}/api/v1/keyspaces/bulk_http/load", content=chunks(), timeout=600.0)
        http_s = time.monotonic() - t0
        assert r.status_code == 200 and r.json()["committed"] == args.rows, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    t0 = time.monotonic()
    subprocess.run(
        [str(BIN), "bucket", "load", "bulk_cli", "--file", str(lines), *where],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    cli_s = time.monotonic() - t0
    result = {
        "client": client,
        "clients": args.clients,
        "docs_per_s": put["docs_per_s"],
        "put_errors": put["errors"],
        "rows": args.rows,
        "bulk_http_rows_per_s": round(args.rows / http_s),
        "bucket_load_rows_per_s": round(args.rows / cli_s),
        "bulk_vs_bucket_load": round(cli_s / http_s, 2),
    }
    if baseline is not None:
        result.update(
            {
                "store_docs_per_s": put["docs_per_s"],
                "docs_per_s": baseline["docs_per_s"],
                "store_put_errors": put["errors"],
                "put_errors": baseline["errors"],
                "store_vs_data_dir": round(put["docs_per_s"] / max(1, baseline["docs_per_s"]), 3),
                **({"store_p50_ms": put["p50_ms"], "store_p99_ms": put["p99_ms"]} if "p50_ms" in put else {}),
            }
        )
        result["store_serve_cpu_us"] = put["serve_cpu_us"]
        result["serve_cpu_us"] = baseline["serve_cpu_us"]
        result.update({f"store_{k}_per_put": v for k, v in server.items()})
    if sdk_put is not None:
        result.update(
            {
                "sdk_docs_per_s": sdk_put["docs_per_s"],
                "sdk_errors": sdk_put["errors"],
                "sdk_vs_dataapi": round(sdk_put["docs_per_s"] / max(1, put["docs_per_s"]), 2),
            }
        )
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
