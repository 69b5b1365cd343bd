"""What a sandbox adds to a woken step: one write, then one step of the worker that owns its vBucket, in a
loop, for the same function unconfined and sandboxed, alternated, in one process.

Each round writes --steps documents one at a time to the source bucket (a vBucket of the worker's, as an
application's write would land), and after each write calls the worker's step at once (as the service does
when a write notification wakes a caught-up worker). The handler copies each document to another bucket
(`bench_latency.py`'s). Measured per step: its wall time (p50, p90) and the CPU of this process (the worker,
or a sandboxed worker's host) and of the sandboxed child, from /proc/<pid>/stat (the write itself, ~0.1 ms
of this process's CPU, is in both). Nothing else runs in the loop, so the figures are the two ways' own
costs, without the waits for a core that a loaded machine adds (`bench_latency.py` has those).

    .venv/bin/python scripts/bench_sandbox_step.py                 # 3,000 steps, 256 vBuckets, 2 rounds
    .venv/bin/python scripts/bench_sandbox_step.py --vbuckets 1024 --rounds 3

The last line is JSON: each isolation's medians over the rounds, and sandbox / none ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.storage.state import as_state  # noqa: E402
from eventing.testing import deploy_function, ledger_definition, load_source  # noqa: E402
from eventing.workers.sandbox import host  # noqa: E402
from eventing.workers.sandbox.landlock import sandbox_unavailable  # noqa: E402
from eventing.workers.worker import WorkerCore, WorkerSpec  # noqa: E402
from sharding import vbucket_of  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
HANDLER = """import time


def on_update(doc, meta):
    dst[meta.id] = {"n": doc["n"], "called": time.time()}
"""


def cpu_s(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one_round(isolation: str, steps: int, vbuckets: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-step-") as data_dir:
        source = load_source(data_dir, 20, 100, seed=5)
        defn = ledger_definition("fn_step", "src", "dst", workers=1, isolation=isolation)
        defn = dataclasses.replace(defn, bindings=[dataclasses.replace(defn.bindings[0], alias="dst")])
        deploy_function(data_dir, defn, HANDLER)
        generation = as_state(data_dir).metadata.get_function("fn_step").generation
        spec = WorkerSpec(data_dir, "fn_step", generation, "local/w0", tuple(range(vbuckets)))
        core: object = host.SandboxedCore(spec) if isolation == "sandbox" else WorkerCore(spec)
        try:
            keys = [k for k in (f"doc-{i}" for i in range(50 * 1024)) if vbucket_of(k) < vbuckets][:50]
            while not core.step(100).caught_up:  # type: ignore[attr-defined]
                pass
            child = getattr(getattr(core, "proc", None), "pid", None)
            walls = []
            this0, child0, started = cpu_s(), cpu_s(child) if child else 0.0, time.perf_counter()
            for i in range(steps):
                source.upsert(keys[i % len(keys)], {"n": i})
                began = time.perf_counter()
                report = core.step(None, 0.0)  # type: ignore[attr-defined]
                walls.append(time.perf_counter() - began)
                if report.handled != 1:
                    raise SystemExit(f"a step handled {report.handled} mutations, not the one written")
            elapsed = time.perf_counter() - started
            this_cpu = cpu_s() - this0
            child_cpu = cpu_s(child) - child0 if child else 0.0
        finally:
            core.stop()  # type: ignore[attr-defined]
            if hasattr(core, "close"):
                core.close()
    walls.sort()
    return {
        "step_p50_us": round(walls[steps // 2] * 1e6, 1),
        "step_p90_us": round(walls[int(steps * 0.9)] * 1e6, 1),
        "cpu_this_us": round(this_cpu / steps * 1e6, 1),
        "cpu_child_us": round(child_cpu / steps * 1e6, 1),
        "cpu_us": round((this_cpu + child_cpu) / steps * 1e6, 1),
        "loop_us": round(elapsed / steps * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=3000, help="writes and steps a round (default 3000)")
    parser.add_argument(
        "--vbuckets", type=int, default=256, help="the worker's vBuckets (default 256, as one of 4)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of both isolations, alternated (default 2)"
    )
    args = parser.parse_args(argv)
    why = sandbox_unavailable()
    if why:
        print(f"this machine cannot sandbox: {why}", file=sys.stderr)
        return 2
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    runs: dict[str, list[dict]] = {"none": [], "sandbox": []}
    for r in range(args.rounds):
        for isolation in ("none", "sandbox"):
            figures = one_round(isolation, args.steps, args.vbuckets)
            runs[isolation].append(figures)
            print(
                f"round {r + 1} {isolation:7}: step p50 {figures['step_p50_us']:.0f} us, p90 "
                f"{figures['step_p90_us']:.0f}; CPU a step {figures['cpu_us']:.0f} us (this process "
                f"{figures['cpu_this_us']:.0f}, child {figures['cpu_child_us']:.0f})",
                flush=True,
            )
    medians = {iso: {k: statistics.median(f[k] for f in rs) for k in rs[0]} for iso, rs in runs.items()}
    ratios = {
        "step_p50": round(medians["sandbox"]["step_p50_us"] / medians["none"]["step_p50_us"], 2),
        "cpu": round(medians["sandbox"]["cpu_us"] / medians["none"]["cpu_us"], 2),
    }
    print(f"sandbox / none: step p50 {ratios['step_p50']}x, CPU a step {ratios['cpu']}x")
    print(json.dumps({"medians": medians, "ratios": ratios, "runs": runs, "steps": args.steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
