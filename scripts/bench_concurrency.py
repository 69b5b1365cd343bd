"""I/O-bound handlers and the function setting `concurrency`: throughput of a handler whose every call
waits on an HTTP service, with and without concurrent calls, on the default (Ray) executor.

A local HTTP server (a small asyncio HTTP/1.1 server, --server-processes processes sharing one port,
started by this script) answers every request after --call-ms (default 10 ms). The handler calls it once per mutation through a
URL binding (`curl`), then records the mutation in a ledger through the read-write binding `ledger`: the
document's history `h|<key>` (the seqnos of its calls, in the order they ran, read and written back) and
one effect `e|<key>|<seqno>`. Each run deploys a fresh function and ledger over the same loaded source:

  concurrency: --workers (4) workers with --concurrency (16) calls at once each, over --mutations;
  baseline:    the same workers with concurrency 1, over --baseline-mutations (it runs 16x slower).

Throughput is the handled mutations over the time from every worker up to the final checkpoint (as
scripts/bench.py). efficiency = throughput / (workers x concurrency / call time), with the nominal call
time (--call-ms): 1.0 would be every call slot busy all the time. order_violations is counted from the
ledger: per document, each place where its history does not list its source seqnos in the log's order
(a seqno out of order, missing or twice). `ledger_ok` is the harness's ledger check (exactly once, in order).

Prints each run; the last line is JSON with throughput, efficiency, order_violations, ledger_ok, the same
figures of the baseline under "baseline", speedup (throughput / the baseline's) and, with --runs N, every
run under "runs" (medians at the top; this machine's figures move from run to run, more so when shared).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ray  # noqa: E402

from eventing.control import lifecycle  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.core.mutation import OP_UPDATE  # noqa: E402
from eventing.storage.factory import create_bucket, open_bucket  # noqa: E402
from eventing.testing import check_ledger, load_source  # noqa: E402
from eventing.workers.executor import RayExecutor  # noqa: E402

HANDLER = '''
def on_update(doc, meta):
    r = curl("GET", api, {"path": "/doc", "params": {"id": meta.id, "seq": meta.seq}})
    if r.status != 200:
        raise RuntimeError(f"service answered {r.status}")
    ledger[f"e|{FUNCTION}|{meta.id}|{meta.seq}"] = {"fn": FUNCTION, "key": meta.id, "seq": meta.seq, "vb": meta.vb, "op": "update", "rev": doc.get("rev")}
    history = ledger.get(f"h|{FUNCTION}|{meta.id}") or {"seqs": []}
    history["seqs"].append(meta.seq)
    ledger[f"h|{FUNCTION}|{meta.id}"] = history
'''

# The HTTP service: answers each request after DELAY seconds; keeps a connection open unless asked to close.
SERVER = r'''
import asyncio, sys

DELAY = float(sys.argv[2]) / 1000
BODY = b'{"ok":true}'


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lower = head.lower()
            at = lower.find(b"content-length:")
            if at >= 0:
                await reader.readexactly(int(lower[at + 15:lower.index(b"\r\n", at)]))
            await asyncio.sleep(DELAY)
            close = b"connection: close" in lower
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                         % (len(BODY), b"Connection: close\r\n" if close else b"", BODY))
            await writer.drain()
            if close:
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=4096, reuse_port=True)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(call_ms: float, processes: int) -> tuple[list[subprocess.Popen], str]:
    """`processes` server processes on one port (SO_REUSEPORT): the kernel spreads the connections."""
    port = free_port()
    procs = []
    for _ in range(processes):
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(call_ms)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "listening":
            raise SystemExit("the HTTP service did not start")
    return procs, f"http://127.0.0.1:{port}"


def source_seqnos(source) -> dict[str, list[int]]:
    """Per document, the seqnos of its updates in the log's order (a key lives in one vBucket)."""
    out: dict[str, list[int]] = defaultdict(list)
    for vb in range(1024):
        for m in source.read_vb(vb, 0, 10**9):
            if m.op == OP_UPDATE:
                out[m.key].append(m.seqno)
    return out


def order_violations(ledger, name: str, expected: dict[str, list[int]]) -> int:
    """Places where a document's recorded history differs from its seqnos in log order."""
    violations = 0
    for key, seqnos in expected.items():
        got = (ledger.get(f"h|{name}|{key}") or {"seqs": []})["seqs"]
        violations += sum(1 for a, b in zip(got, seqnos, strict=False) if a != b) + abs(len(got) - len(seqnos))
    return violations


def one_run(data_dir: str, source, args: argparse.Namespace, url: str, concurrency: int, mutations: int,
            run: int, expected: dict[str, list[int]]) -> dict:
    name = f"fn_io_c{concurrency}_r{run}"
    ledger_name = f"ledger_c{concurrency}_r{run}"
    create_bucket(data_dir, ledger_name)
    defn = FunctionDefinition.from_dict({
        "name": name, "source_bucket": "src", "worker_count": args.workers, "concurrency": concurrency,
        "batch_size": args.batch_size, "checkpoint_interval": "1s", "execution_timeout": "30s",
        "bindings": [{"alias": "ledger", "bucket": ledger_name, "access": "rw"}],
        "url_bindings": [{"alias": "api", "url": url}],
        "constants": {"FUNCTION": name},
    })
    lifecycle.save_function(data_dir, defn, HANDLER)
    lifecycle.deploy(data_dir, name)
    marks: dict[str, float] = {}
    last = [0.0]

    def on_progress(summary) -> None:
        sup = service.supervisors.get(name)
        if sup is None:
            return
        if sup.ready and "ready" not in marks:
            marks["ready"], marks["handled_at_ready"] = time.perf_counter(), sup.handled
        if args.progress and time.perf_counter() - last[0] >= 2:
            last[0] = time.perf_counter()
            print(f"    ... {sup.handled:,} handled", flush=True)

    service = EventingService(data_dir, RayExecutor(), until_caught_up=True, functions=[name], on_progress=on_progress)
    started = time.perf_counter()
    summary = service.run()
    end = time.perf_counter()
    ray.shutdown()
    handled = summary.functions[name].handled
    if handled != mutations:
        raise SystemExit(f"error: {name} handled {handled} mutations, expected {mutations}")
    ready = marks.get("ready", started)
    throughput = (handled - marks.get("handled_at_ready", 0)) / (end - ready)
    ledger = open_bucket(data_dir, ledger_name)
    report = check_ledger(source, ledger)
    return {
        "concurrency": concurrency, "mutations": handled, "throughput": round(throughput, 1),
        "efficiency": round(throughput / (args.workers * concurrency / (args.call_ms / 1000)), 3),
        "order_violations": order_violations(ledger, name, expected), "ledger_ok": report.ok,
        "up_s": round(ready - started, 1), "run_s": round(end - ready, 2),
    }


def load_avg() -> float:
    return round(os.getloadavg()[0], 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--call-ms", type=float, default=10.0, help="the service's wait before each answer")
    parser.add_argument("--mutations", type=int, default=40_000)
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--baseline-mutations", type=int, default=3_000)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--server-processes", type=int, default=2,
                        help="processes of the HTTP service (one port): its own CPU must not be the limit")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--progress", action="store_true", help="print the handled count every 2 s")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    say = (lambda *a, **k: None) if args.json else print
    servers, url = start_server(args.call_ms, args.server_processes)
    try:
        with tempfile.TemporaryDirectory(prefix="eventing-bench-conc-", ignore_cleanup_errors=True) as root:
            # Two data directories: the baseline's log is shorter (it runs ~concurrency times slower), made by
            # the same generator (documents updated in a random order, no deletes).
            main_dir, base_dir = os.path.join(root, "main"), os.path.join(root, "base")
            os.makedirs(main_dir)
            os.makedirs(base_dir)
            source = load_source(main_dir, args.documents, args.mutations, delete_ratio=0.0, seed=7)
            base_source = load_source(base_dir, min(args.documents, args.baseline_mutations),
                                      args.baseline_mutations, delete_ratio=0.0, seed=7)
            expected, base_expected = source_seqnos(source), source_seqnos(base_source)
            say(f"service: {url}, {args.call_ms:g} ms a call; {args.mutations:,} mutations over "
                f"{args.documents:,} documents; baseline {args.baseline_mutations:,}; load {load_avg()}")
            runs = []
            for run in range(1, args.runs + 1):
                label = f"run {run}/{args.runs}: " if args.runs > 1 else ""
                load = load_avg()
                row = one_run(main_dir, source, args, url, args.concurrency, args.mutations, run, expected)
                row["load"] = load
                say(f"{label}{args.workers} workers x concurrency {args.concurrency}: {row['throughput']:,.0f}/s, "
                    f"efficiency {row['efficiency']:.2f}, order violations {row['order_violations']}, "
                    f"ledger {'ok' if row['ledger_ok'] else 'NOT OK'} (load {load})")
                load = load_avg()
                base = one_run(base_dir, base_source, args, url, 1, args.baseline_mutations, run, base_expected)
                base["load"] = load
                say(f"{label}{args.workers} workers x concurrency 1: {base['throughput']:,.0f}/s, "
                    f"efficiency {base['efficiency']:.2f}, order violations {base['order_violations']}, "
                    f"ledger {'ok' if base['ledger_ok'] else 'NOT OK'} (load {load})")
                row["speedup"] = round(row["throughput"] / base["throughput"], 2)
                runs.append({**row, "baseline": base})
    finally:
        for server in servers:
            server.terminate()
            server.wait()

    def med(rows: list[dict], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 3)

    bases = [r["baseline"] for r in runs]
    out = {
        "throughput": med(runs, "throughput"), "efficiency": med(runs, "efficiency"),
        "order_violations": sum(r["order_violations"] for r in runs), "ledger_ok": all(r["ledger_ok"] for r in runs),
        "speedup": med(runs, "speedup"), "workers": args.workers, "concurrency": args.concurrency,
        "call_ms": args.call_ms, "mutations": args.mutations, "batch_size": args.batch_size,
        "baseline": {
            "throughput": med(bases, "throughput"), "efficiency": med(bases, "efficiency"),
            "order_violations": sum(b["order_violations"] for b in bases), "ledger_ok": all(b["ledger_ok"] for b in bases),
            "mutations": args.baseline_mutations,
        },
        **({"runs": runs} if args.runs > 1 else {}),
    }
    print(json.dumps(out))
    return 0 if out["order_violations"] == 0 and out["ledger_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
