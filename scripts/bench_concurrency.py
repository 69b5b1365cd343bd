"""I/O-bound handlers and the function setting `concurrency`: throughput of a handler whose every call
waits on an HTTP service, with and without concurrent calls, on the default (Ray) executor.

A local HTTP service started by this script answers every request --call-ms (default 10 ms) after it
arrived: scripts/bench_service.c, built with the machine's C compiler (--service c, the default), or a small
asyncio server (--service python, or without a compiler; --server-processes processes on one port). The
service shares this machine's cores with the workers, where a remote one would not: the C service takes
~0.2 core at 5,500 requests a second, the asyncio one ~0.5, and each run reports its share
(`service_cores`). The handler calls it once per mutation through a URL binding (`curl`), then records the
mutation in a ledger through the read-write binding `ledger`: the document's history `h|<key>` (the seqnos of
its calls, in the order they ran, read and written back) and one effect `e|<key>|<seqno>`. Each run deploys a
fresh function and ledger over the same loaded source:

  concurrency: --workers (4) workers with --concurrency (16) calls at once each, over --mutations;
  baseline:    the same workers with concurrency 1, over --baseline-mutations (it runs 16x slower).

Throughput is the handled mutations over the time from every worker up to the final checkpoint (as
scripts/bench.py). efficiency = throughput / (workers x concurrency / call time), with the nominal call
time (--call-ms): 1.0 would be every call slot busy all the time. order_violations is counted from the
ledger: per document, each place where its history does not list its source seqnos in the log's order
(a seqno out of order, missing or twice). `ledger_ok` is the harness's ledger check (exactly once, in order).

With --executor in-process the workers run in this process (threads of the in-process executor instead of
Ray actors), and each run also reports `cpu_us_per_call`: this process's CPU time from every worker up to the
final checkpoint over the mutations handled then (the workers' calls, reads and effect writes, and the
service loop beside them): what a call costs, which the machine's other load moves far less than it moves
the throughput.

Prints each run; the last line is JSON with throughput, efficiency, order_violations, ledger_ok, the same
figures of the baseline under "baseline", speedup (throughput / the baseline's) and, with --runs N, every
run under "runs" (medians at the top; this machine's figures move from run to run, more so when shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from eventing.workers.executor import InProcessExecutor, RayExecutor  # noqa: E402

HANDLER = """
def on_update(doc, meta):
    r = curl("GET", api, {"path": "/doc", "params": {"id": meta.id, "seq": meta.seq}})
    if r.status != 200:
        raise RuntimeError(f"service answered {r.status}")
    ledger[f"e|{FUNCTION}|{meta.id}|{meta.seq}"] = {"fn": FUNCTION, "key": meta.id, "seq": meta.seq, "vb": meta.vb, "op": "update", "rev": doc.get("rev")}
    history = ledger.get(f"h|{FUNCTION}|{meta.id}") or {"seqs": []}
    history["seqs"].append(meta.seq)
    ledger[f"h|{FUNCTION}|{meta.id}"] = history
"""  # noqa: E501

# The same handler in JavaScript (--language javascript), as a Couchbase Eventing function would write it.
HANDLER_JS = """
function OnUpdate(doc, meta) {
    var r = curl("GET", api, {path: "/doc", params: {id: meta.id, seq: meta.seq}});
    if (r.status !== 200) {
        throw new Error("service answered " + r.status);
    }
    ledger["e|" + FUNCTION + "|" + meta.id + "|" + meta.seq] = {fn: FUNCTION, key: meta.id, seq: meta.seq, vb: meta.vb, op: "update", rev: doc.rev === undefined ? null : doc.rev};
    var history = ledger["h|" + FUNCTION + "|" + meta.id] || {seqs: []};
    history.seqs.push(meta.seq);
    ledger["h|" + FUNCTION + "|" + meta.id] = history;
}
"""  # noqa: E501

# The HTTP service: answers each request --call-ms after it arrived; keeps a connection open unless asked to
# close. A bare asyncio protocol, so that its own CPU per request stays small (a service elsewhere would cost
# this machine nothing).
SERVER = r"""
import asyncio, selectors, sys

DELAY = float(sys.argv[2]) / 1000
BODY = b'{"ok":true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
OK_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(BODY), BODY)


class Answer(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer, self.need = transport, b"", 0
        self.loop = asyncio.get_running_loop()

    def data_received(self, data):
        arrived = self.loop.time()
        buffer = self.buffer + data
        while True:
            if self.need:
                if len(buffer) < self.need:
                    break
                buffer, self.need = buffer[self.need:], 0
                self.loop.call_at(arrived + DELAY, self.answer, self.closing)
                continue
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head, buffer = buffer[:end].lower(), buffer[end + 4:]
            self.closing = b"connection: close" in head
            at = head.find(b"content-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at)
                self.need = int(head[at + 15:stop if stop >= 0 else None]) or 0
                if self.need:
                    continue
            self.loop.call_at(arrived + DELAY, self.answer, self.closing)
        self.buffer = buffer

    def answer(self, close):
        if self.transport.is_closing():
            return
        self.transport.write(OK_CLOSE if close else OK)
        if close:
            self.transport.close()


async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Answer, "127.0.0.1", int(sys.argv[1]), backlog=4096, reuse_port=True)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()

# select(), unlike epoll, sleeps to the microsecond: epoll rounds each wait up to the next millisecond.
asyncio.SelectorEventLoop(selectors.SelectSelector()).run_until_complete(main())
"""  # noqa: E501


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compile_service(into: str) -> str | None:
    """scripts/bench_service.c built with the machine's C compiler; None without one."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    binary = os.path.join(into, "bench_service")
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_service.c")
    built = subprocess.run([compiler, "-O2", "-o", binary, source], capture_output=True, text=True)
    if built.returncode != 0:
        print(
            f"note: could not build bench_service.c ({built.stderr.strip()[:200]}); using the asyncio service"
        )
        return None
    return binary


def start_server(
    call_ms: float, kind: str, processes: int, workdir: str
) -> tuple[list[subprocess.Popen], str, str]:
    """The HTTP service: the C one (kind "c", one process), or `processes` asyncio ones on one port
    (SO_REUSEPORT: the kernel spreads the connections). Returns the processes, the URL and the kind run."""
    binary = compile_service(workdir) if kind == "c" else None
    if binary is None:
        kind = "python"
    port = free_port()
    procs = []
    for _ in range(1 if binary else processes):
        command = (
            [binary, str(port), str(call_ms)]
            if binary
            else [sys.executable, "-c", SERVER, str(port), str(call_ms)]
        )
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "listening":
            raise SystemExit("the HTTP service did not start")
    return procs, f"http://127.0.0.1:{port}", kind


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU the processes have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


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
        violations += sum(1 for a, b in zip(got, seqnos, strict=False) if a != b) + abs(
            len(got) - len(seqnos)
        )
    return violations


def one_run(
    data_dir: str,
    source,
    args: argparse.Namespace,
    url: str,
    concurrency: int,
    mutations: int,
    run: int,
    expected: dict[str, list[int]],
    server_pids: list[int],
) -> dict:
    name = f"fn_io_c{concurrency}_r{run}"
    ledger_name = f"ledger_c{concurrency}_r{run}"
    create_bucket(data_dir, ledger_name)
    defn = FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "worker_count": args.workers,
            "concurrency": concurrency,
            "language": args.language,
            "batch_size": args.batch_size,
            "checkpoint_interval": "1s",
            "execution_timeout": "30s",
            "bindings": [{"alias": "ledger", "bucket": ledger_name, "access": "rw"}],
            "url_bindings": [{"alias": "api", "url": url}],
            "constants": {"FUNCTION": name},
        }
    )
    lifecycle.save_function(data_dir, defn, HANDLER_JS if args.language == "javascript" else HANDLER)
    lifecycle.deploy(data_dir, name)
    marks: dict[str, float] = {}
    last = [0.0]

    def on_progress(summary) -> None:
        sup = service.supervisors.get(name)
        if sup is None:
            return
        if sup.ready and "ready" not in marks:
            marks["ready"], marks["handled_at_ready"] = time.perf_counter(), sup.handled
            marks["service_cpu_at_ready"] = cpu_seconds(server_pids)
            marks["cpu_at_ready"] = time.process_time()
        if args.progress and time.perf_counter() - last[0] >= 2:
            last[0] = time.perf_counter()
            print(f"    ... {sup.handled:,} handled", flush=True)

    service = EventingService(
        data_dir,
        RayExecutor() if args.executor == "ray" else InProcessExecutor(),
        until_caught_up=True,
        functions=[name],
        on_progress=on_progress,
    )
    started = time.perf_counter()
    service_cpu_at_start = cpu_seconds(server_pids)
    summary = service.run()
    end = time.perf_counter()
    cpu = time.process_time()
    service_cpu = cpu_seconds(server_pids)
    if args.executor == "ray":
        ray.shutdown()
    handled = summary.functions[name].handled
    if handled != mutations:
        raise SystemExit(f"error: {name} handled {handled} mutations, expected {mutations}")
    ready = marks.get("ready", started)
    throughput = (handled - marks.get("handled_at_ready", 0)) / (end - ready)
    cpu_per_call = (cpu - marks.get("cpu_at_ready", cpu)) / max(1, handled - marks.get("handled_at_ready", 0))
    ledger = open_bucket(data_dir, ledger_name)
    report = check_ledger(source, ledger)
    return {
        "concurrency": concurrency,
        "mutations": handled,
        "throughput": round(throughput, 1),
        "efficiency": round(throughput / (args.workers * concurrency / (args.call_ms / 1000)), 3),
        "order_violations": order_violations(ledger, name, expected),
        "ledger_ok": report.ok,
        "cpu_us_per_call": round(cpu_per_call * 1e6, 1) if args.executor == "in-process" else None,
        "up_s": round(ready - started, 1),
        "run_s": round(end - ready, 2),
        # The HTTP service's share of this machine while the workers ran (cores): CPU the workers could not
        # use.
        "service_cores": round(
            (service_cpu - marks.get("service_cpu_at_ready", service_cpu_at_start)) / (end - ready), 2
        ),
    }


def load_avg() -> float:
    return round(os.getloadavg()[0], 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--call-ms", type=float, default=10.0, help="the service's wait before each answer")
    # ~15 s a run: the ramp at the start and the workers' last batches (~0.2 s a run) weigh half as much as
    # in the 40,000 this had before (0.81-0.85 there against 0.85-0.88 on the same tree).
    parser.add_argument("--mutations", type=int, default=80_000)
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--baseline-mutations", type=int, default=3_000)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument(
        "--service",
        choices=("c", "python"),
        default="c",
        help="the HTTP service: scripts/bench_service.c (built with cc; the asyncio one without a "
        "compiler) or the asyncio one",
    )
    parser.add_argument(
        "--server-processes",
        type=int,
        default=2,
        help="processes of the asyncio service (one port): its own CPU must not be the limit; "
        "each serves up to ~1,000 connections (select())",
    )
    parser.add_argument(
        "--language",
        choices=("python", "javascript"),
        default="python",
        help="the handler's language (the same handler in each)",
    )
    parser.add_argument(
        "--executor",
        choices=("ray", "in-process"),
        default="ray",
        help="where the workers run: Ray actors (the default), or threads of this process, which then "
        "also reports the process's CPU a call (cpu_us_per_call)",
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--progress", action="store_true", help="print the handled count every 2 s")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    say = (lambda *a, **k: None) if args.json else print
    with tempfile.TemporaryDirectory(prefix="eventing-bench-conc-", ignore_cleanup_errors=True) as root:
        servers, url, service = start_server(args.call_ms, args.service, args.server_processes, root)
        pids = [server.pid for server in servers]
        try:
            # Two data directories: the baseline's log is shorter (it runs ~concurrency times slower), made by
            # the same generator (documents updated in a random order, no deletes).
            main_dir, base_dir = os.path.join(root, "main"), os.path.join(root, "base")
            os.makedirs(main_dir)
            os.makedirs(base_dir)
            source = load_source(main_dir, args.documents, args.mutations, delete_ratio=0.0, seed=7)
            base_source = load_source(
                base_dir,
                min(args.documents, args.baseline_mutations),
                args.baseline_mutations,
                delete_ratio=0.0,
                seed=7,
            )
            expected, base_expected = source_seqnos(source), source_seqnos(base_source)
            say(
                f"service ({service}): {url}, {args.call_ms:g} ms a call; {args.mutations:,} mutations over "
                f"{args.documents:,} documents; baseline {args.baseline_mutations:,}; load {load_avg()}"
            )
            runs = []
            for run in range(1, args.runs + 1):
                label = f"run {run}/{args.runs}: " if args.runs > 1 else ""
                load = load_avg()
                row = one_run(
                    main_dir, source, args, url, args.concurrency, args.mutations, run, expected, pids
                )
                row["load"] = load
                say(
                    f"{label}{args.workers} workers x concurrency {args.concurrency}: "
                    f"{row['throughput']:,.0f}/s, efficiency {row['efficiency']:.2f}, order violations "
                    f"{row['order_violations']}, service {row['service_cores']} cores, "
                    f"ledger {'ok' if row['ledger_ok'] else 'NOT OK'}"
                    + (f", {row['cpu_us_per_call']:,.0f} us CPU a call" if row["cpu_us_per_call"] else "")
                    + f" (load {load})"
                )
                load = load_avg()
                base = one_run(
                    base_dir, base_source, args, url, 1, args.baseline_mutations, run, base_expected, pids
                )
                base["load"] = load
                say(
                    f"{label}{args.workers} workers x concurrency 1: {base['throughput']:,.0f}/s, "
                    f"efficiency {base['efficiency']:.2f}, order violations {base['order_violations']}, "
                    f"ledger {'ok' if base['ledger_ok'] else 'NOT OK'} (load {load})"
                )
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
        "throughput": med(runs, "throughput"),
        "efficiency": med(runs, "efficiency"),
        "order_violations": sum(r["order_violations"] for r in runs),
        "ledger_ok": all(r["ledger_ok"] for r in runs),
        "speedup": med(runs, "speedup"),
        "workers": args.workers,
        "concurrency": args.concurrency,
        "call_ms": args.call_ms,
        "mutations": args.mutations,
        "batch_size": args.batch_size,
        "service": service,
        "service_cores": med(runs, "service_cores"),
        "executor": args.executor,
        "cpu_us_per_call": med(runs, "cpu_us_per_call") if args.executor == "in-process" else None,
        "language": args.language,
        "baseline": {
            "throughput": med(bases, "throughput"),
            "efficiency": med(bases, "efficiency"),
            "order_violations": sum(b["order_violations"] for b in bases),
            "ledger_ok": all(b["ledger_ok"] for b in bases),
            "mutations": args.baseline_mutations,
        },
        **({"runs": runs} if args.runs > 1 else {}),
    }
    print(json.dumps(out))
    return 0 if out["order_violations"] == 0 and out["ledger_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
