"""JavaScript against Python handlers on the W1 workload (scripts/bench.py's trivial handler), in one run.

Loads N mutations over D documents into one bucket, then times `eventing run --until-caught-up` of the
trivial handler written in Python (eventing.testing.workloads.TRIVIAL_HANDLER) and the same handler in
JavaScript, each deployed fresh over the same bucket, alternating for --runs rounds, with the same executor
(in-process by default: one worker, the handler path alone; --executor ray --workers N: Ray workers).
Then it splits one JavaScript call into its parts on the same documents (where the time goes): the
arguments written as JSON text, the V8 call (set the input, run the compiled script, parse, call
OnUpdate), and the Python handler's call for comparison; and the same per mutation when OnUpdate runs over
batches of 2,000 in one V8 call as a worker runs it (JsOnUpdate.batch): the batch's JSON text, and V8. The
last line is JSON with the rates and ratio.
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
import msgspec  # noqa: E402

from eventing.control import lifecycle  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.execution.context import CallContext  # noqa: E402
from eventing.execution.javascript import load_js_handler  # noqa: E402
from eventing.execution.loader import load_handler  # noqa: E402
from eventing.handler import Meta  # noqa: E402
from eventing.testing.workloads import TRIVIAL_HANDLER, load_bench_bucket  # noqa: E402
from eventing.workers.executor import make_executor  # noqa: E402

# W1's handler in JavaScript: keep the document's rev per key (global state, as the Python handler's dict).
JS_TRIVIAL_HANDLER = """
var seen = {};
function OnUpdate(doc, meta) { seen[meta.id] = doc.rev; }
function OnDelete(meta, options) { delete seen[meta.id]; }
"""


def timed_run(data_dir: str, args: argparse.Namespace, language: str, run: int) -> tuple[int, float]:
    name = f"fn_{language}_{run}"
    defn = FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "bench",
            "worker_count": args.workers,
            "batch_size": args.batch_size,
            "checkpoint_interval": "1s",
            "language": language,
        }
    )
    lifecycle.save_function(
        data_dir, defn, JS_TRIVIAL_HANDLER if language == "javascript" else TRIVIAL_HANDLER
    )
    lifecycle.deploy(data_dir, name)
    executor = make_executor(args.executor)
    try:
        service = EventingService(data_dir, executor, until_caught_up=True, functions=[name])
        start = time.perf_counter()
        summary = service.run()
        seconds = time.perf_counter() - start
    finally:
        executor.close()
    lifecycle.undeploy(data_dir, name)
    return summary.functions[name].handled, seconds


def breakdown(bucket, count: int) -> dict[str, float]:
    """Microseconds per call of each part of a JavaScript OnUpdate call, and of the Python call."""
    rows = []
    for vb in range(1024):
        for row in bucket.read_vb_rows(vb, 0, 64):
            if row[5] is not None:
                rows.append(row)
        if len(rows) >= count:
            break
    calls = [
        (
            msgpack.unpackb(r[5], raw=False),
            Meta(r[2], r[4], r[0], r[1], 0, 0, "json", {"bucket_name": "bench"}),
        )
        for r in rows[:count]
    ]
    js = load_js_handler("fn_js_parts", JS_TRIVIAL_HANDLER, {}, context=CallContext(60.0))
    py = load_handler("fn_py_parts", TRIVIAL_HANDLER, {})
    on_update_js, on_update_py = js.__dict__["on_update"], py.__dict__["on_update"]
    n = len(calls)
    encode = msgspec.json.Encoder().encode

    def per_call(fn) -> float:
        start = time.perf_counter()
        for doc, meta in calls:
            fn(doc, meta)
        return (time.perf_counter() - start) / n * 1e6

    def to_json(doc, meta) -> None:
        encode([doc, {"id": meta.id, "cas": str(meta.cas), "vb": meta.vb, "seq": meta.seq}]).decode()

    docs = [doc for doc, _ in calls]
    keyspace = {"bucket_name": "bench"}

    def per_mutation_batched(size: int, run_it: bool) -> float:
        start = time.perf_counter()
        for i in range(0, n, size):
            chunk = rows[i : i + size]
            if run_it:
                on_update_js.batch(chunk, docs[i : i + size], keyspace, lambda at: None)
            else:
                encode(
                    [
                        docs[i : i + size],
                        [r[2] for r in chunk],
                        [str(r[4]) for r in chunk],
                        [r[7] for r in chunk],
                        [r[8] for r in chunk],
                        [r[1] for r in chunk],
                        chunk[0][0],
                        keyspace,
                        50.0,
                    ]
                ).decode()
        return (time.perf_counter() - start) / n * 1e6

    per_call(on_update_js)  # warm V8's compiler
    per_mutation_batched(2000, True)
    out = {
        "json_args_us": per_call(to_json),
        "js_call_us": per_call(on_update_js),
        "python_call_us": per_call(on_update_py),
        "batch_json_us": per_mutation_batched(2000, False),
        "js_batch_us": per_mutation_batched(2000, True),
    }
    out["v8_us"] = out["js_call_us"] - out["json_args_us"]
    out["v8_batch_us"] = out["js_batch_us"] - out["batch_json_us"]
    js.__dict__["__js_handler__"].close()
    return {k: round(v, 2) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mutations", type=int, default=200_000)
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--executor", choices=("in-process", "ray"), default="in-process")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=2, help="rounds of (Python, JavaScript), default 2")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as temps:
        data_dir = temps.enter_context(
            tempfile.TemporaryDirectory(prefix="eventing-bench-js-", ignore_cleanup_errors=True)
        )
        bucket = load_bench_bucket(data_dir, "bench", args.documents, args.mutations)
        rates: dict[str, list[float]] = {"python": [], "javascript": []}
        for run in range(1, args.runs + 1):
            for language in ("python", "javascript"):
                handled, seconds = timed_run(data_dir, args, language, run)
                if handled != args.mutations:
                    print(
                        f"error: {language} handled {handled} of {args.mutations} mutations", file=sys.stderr
                    )
                    return 1
                rates[language].append(handled / seconds)
                print(
                    f"run {run} {language}: {handled:,} mutations in {seconds:.2f}s = "
                    f"{handled / seconds:,.0f}/s"
                )
        python_mps, js_mps = statistics.median(rates["python"]), statistics.median(rates["javascript"])
        parts = breakdown(bucket, 20_000)
        print(
            f"median python {python_mps:,.0f}/s, javascript {js_mps:,.0f}/s, ratio {js_mps / python_mps:.2f}"
        )
        print(f"per call: {parts}")
        print(
            json.dumps(
                {
                    "python_mps": round(python_mps),
                    "javascript_mps": round(js_mps),
                    "ratio": round(js_mps / python_mps, 3),
                    "mutations": args.mutations,
                    "executor": args.executor,
                    "workers": args.workers,
                    "per_call_us": parts,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
