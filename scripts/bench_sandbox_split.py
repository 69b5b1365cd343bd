"""Where a sandboxed worker's time goes: one function, in-process, run unsandboxed then sandboxed over the
same loaded bucket, W1 (trivial) or W3 (writing).

For the sandboxed run the host's side of the line is timed call by call (eventing.workers.sandbox): each
request of the child (a log read, a document read, an effect, a checkpoint) from the frame read to the
answer sent, by kind; the rest of the time the host spends inside a call to the child (a step) is the
child's own work (decoding, calling the handler, building effects) plus the line's latency. The CPU of
this process (the host, the supervisor) and of the child comes from /proc/<pid>/stat.

    .venv/bin/python scripts/bench_sandbox_split.py --mutations 300000 --workers 1
    .venv/bin/python scripts/bench_sandbox_split.py --workload writing --mutations 60000

With --profile-child DIR the sandboxed child runs under cProfile (its figures then include cProfile's own
cost): each child's profile is copied to DIR/child-<pid>.prof as its sandbox ends, and the worker's is
summarised (the functions with the most own time).

The last line is JSON with both runs' figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from eventing.control import lifecycle  # noqa: E402
from eventing.control.service import EventingService  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.storage.factory import create_bucket  # noqa: E402
from eventing.testing.workloads import TRIVIAL_HANDLER, load_bench_bucket  # noqa: E402
from eventing.workers.executor import InProcessExecutor  # noqa: E402
from eventing.workers.sandbox import host as sandbox  # noqa: E402

FUNCTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "functions")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int | str = "self") -> float:
    """User and system CPU seconds of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Split:
    """The host's side of every sandbox line, timed: wraps _Sandboxed._rpc and _Sandboxed._answer."""

    def __init__(self) -> None:
        self.answer_s: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.answers: collections.Counter[str] = collections.Counter()
        self.rpc_s: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.rpcs: collections.Counter[str] = collections.Counter()
        self.children: dict[int, float] = {}  # pid: its CPU seconds when last seen alive
        self.in_step = False
        self.step_answer_s = 0.0  # the host answering requests made during steps, on its line's thread
        self.beside_s = 0.0  # the host applying effects handed over, on its writer thread (the child goes on)
        self.step_host_cpu_s = self.step_child_cpu_s = 0.0  # CPU of either side while a step ran
        split = self
        rpc, answer = sandbox._Sandboxed._rpc, sandbox._Sandboxed._answer

        def timed_rpc(self: sandbox._Sandboxed, method: str, args: tuple) -> object:
            step = method == "step"
            if step:
                split.in_step = True
                host0, child0 = cpu_s(), cpu_s(self.proc.pid)
            t0 = time.perf_counter()
            try:
                return rpc(self, method, args)
            finally:
                if step:
                    split.in_step = False
                    split.step_host_cpu_s += cpu_s() - host0
                    try:
                        split.step_child_cpu_s += cpu_s(self.proc.pid) - child0
                    except OSError:
                        pass
                split.rpc_s[method] += time.perf_counter() - t0
                split.rpcs[method] += 1
                proc = getattr(self, "proc", None)
                if proc is not None and proc.poll() is None:
                    try:
                        split.children[proc.pid] = cpu_s(proc.pid)
                    except OSError:
                        pass

        def timed_answer(self: sandbox._Sandboxed, ident: object, method: str, args: object) -> None:
            kind = method
            if method in ("bucket", "meta") and isinstance(args, tuple) and len(args) > 1:
                kind = f"{method} {args[1] if method == 'bucket' else args[0]}"
            t0 = time.perf_counter()
            try:
                answer(self, ident, method, args)
            finally:
                split.answer_s[kind] += time.perf_counter() - t0
                split.answers[kind] += 1
                if threading.current_thread().name.startswith("sandbox-effects"):
                    split.beside_s += time.perf_counter() - t0
                elif split.in_step:
                    split.step_answer_s += time.perf_counter() - t0

        sandbox._Sandboxed._rpc = timed_rpc  # type: ignore[method-assign]
        sandbox._Sandboxed._answer = timed_answer  # type: ignore[method-assign]


def time_steps() -> dict[str, float]:
    """Time WorkerCore.step in this process (the unsandboxed worker's steps; a sandboxed one's run in its
    child)."""
    from eventing.workers.worker import WorkerCore

    spent = {"steps_s": 0.0}
    step = WorkerCore.step

    def timed_step(self: WorkerCore, *args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        try:
            return step(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            spent["steps_s"] += time.perf_counter() - t0

    WorkerCore.step = timed_step  # type: ignore[method-assign,assignment]
    return spent


def profile_children(folder: str) -> None:
    """Run every sandboxed child under cProfile (eventing.workers.sandbox.zygote.PROFILE_ENV), its profile
    written in its private folder and copied to `folder` before the folder goes (the host waits for the
    child to end rather than killing it)."""
    import shutil
    import subprocess

    from eventing.workers.sandbox.zygote import PROFILE_ENV

    child_env, end = sandbox.child_env, sandbox._Sandboxed._end_child

    def profiled_env(*args: object) -> dict:
        return {**child_env(*args), PROFILE_ENV: "1"}  # type: ignore[arg-type]

    def end_profiled(self: sandbox._Sandboxed) -> None:
        if not self._ended:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            found = os.path.join(self.tmp, "child.prof")
            if os.path.exists(found):
                shutil.copy(found, os.path.join(folder, f"child-{self.proc.pid}.prof"))
        end(self)

    sandbox.child_env = profiled_env  # type: ignore[assignment]
    sandbox._Sandboxed._end_child = end_profiled  # type: ignore[method-assign]


def run(data_dir: str, args: argparse.Namespace, handler: str, isolation: str, split: Split | None) -> dict:
    name = f"fn_split_{isolation}"
    bindings = []
    if args.workload == "writing":
        create_bucket(data_dir, f"out_{isolation}", partitions=args.workers)
        bindings = [{"alias": "dst", "bucket": f"out_{isolation}", "access": "rw"}]
    defn = FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "bench",
            "worker_count": args.workers,
            "batch_size": args.batch_size,
            "checkpoint_interval": "1s",
            "isolation": isolation,
            "bindings": bindings,
        }
    )
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, name)
    cpu0, t0 = cpu_s(), time.perf_counter()
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True, functions=[name]).run()
    wall, host_cpu = time.perf_counter() - t0, cpu_s() - cpu0
    handled = summary.functions[name].handled
    out: dict = {
        "isolation": isolation,
        "handled": handled,
        "wall_s": round(wall, 3),
        "mps": round(handled / wall),
        "host_cpu_s": round(host_cpu, 3),
    }
    if split is not None:
        out["child_cpu_s"] = round(sum(split.children.values()), 3)
        out["in_calls_to_child_s"] = round(sum(split.rpc_s.values()), 3)
        out["host_answering_s"] = round(sum(split.answer_s.values()), 3)
        out["steps_s"] = round(split.rpc_s["step"], 3)
        out["steps_host_answering_s"] = round(split.step_answer_s, 3)
        out["host_applying_beside_s"] = round(split.beside_s, 3)
        out["steps_host_cpu_s"] = round(split.step_host_cpu_s, 3)
        out["steps_child_cpu_s"] = round(split.step_child_cpu_s, 3)
        out["answers"] = {
            k: [split.answers[k], round(v, 3)]
            for k, v in sorted(split.answer_s.items(), key=lambda item: -item[1])
        }
        out["calls_to_child"] = {
            k: [split.rpcs[k], round(v, 3)]
            for k, v in sorted(split.rpc_s.items(), key=lambda item: -item[1])[:6]
        }
    return out


def summarise_profiles(folder: str) -> None:
    """The largest child profile (the worker's): its total and the functions with the most own time."""
    import pstats

    files = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".prof")]
    if not files:
        print("  no child profile was written")
        return
    stats = pstats.Stats(max(files, key=os.path.getsize))
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"  the worker's child under cProfile: {total:.2f}s in Python calls; most own time:")
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:18]  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, own, cumulative, _) in rows:
        print(
            f"    {own:7.3f}s own {cumulative:7.3f}s cum {calls:>9,} calls  {os.path.basename(file)}:{line} "
            f"{name}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=("trivial", "writing"), default="trivial")
    parser.add_argument("--mutations", type=int, default=300_000)
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=2000)
    parser.add_argument(
        "--profile-child",
        metavar="DIR",
        default=None,
        help="run the sandboxed child under cProfile, its profile copied to DIR",
    )
    args = parser.parse_args(argv)
    handler = TRIVIAL_HANDLER
    if args.workload == "writing":
        with open(os.path.join(FUNCTIONS, "fn_email.py")) as f:
            handler = f.read()
    with tempfile.TemporaryDirectory(prefix="eventing-split-", ignore_cleanup_errors=True) as data_dir:
        load_bench_bucket(data_dir, "bench", args.documents, args.mutations)
        print(f"load average at start: {os.getloadavg()[0]:.2f}")
        steps = time_steps()
        plain = run(data_dir, args, handler, "none", None)
        plain["steps_s"] = round(steps["steps_s"], 3)
        print(
            f"none: {plain['handled']:,} mutations in {plain['wall_s']:.2f}s = {plain['mps']:,}/s, "
            f"CPU {plain['host_cpu_s']:.2f}s; in steps {plain['steps_s']:.2f}s"
        )
        split = Split()
        if args.profile_child:
            os.makedirs(args.profile_child, exist_ok=True)
            profile_children(args.profile_child)
        boxed = run(data_dir, args, handler, "sandbox", split)
        print(
            f"sandbox: {boxed['handled']:,} mutations in {boxed['wall_s']:.2f}s = {boxed['mps']:,}/s, CPU "
            f"host {boxed['host_cpu_s']:.2f}s + child {boxed['child_cpu_s']:.2f}s"
        )
        child_side = boxed["steps_s"] - boxed["steps_host_answering_s"]
        print(
            f"  in steps {boxed['steps_s']:.2f}s (CPU host {boxed['steps_host_cpu_s']:.2f}s + child "
            f"{boxed['steps_child_cpu_s']:.2f}s): host answering the child's requests "
            f"{boxed['steps_host_answering_s']:.2f}s, the child's own work and the line {child_side:.2f}s; "
            f"starting and ending children {boxed['in_calls_to_child_s'] - boxed['steps_s']:.2f}s"
        )
        print(
            "  the host applying effects handed over, beside the child: "
            f"{boxed['host_applying_beside_s']:.2f}s"
        )
        for kind, (count, seconds) in boxed["answers"].items():
            print(
                f"    {kind}: {count:,} requests, {seconds:.3f}s ({1e6 * seconds / max(count, 1):,.0f} us "
                "each)"
            )
        if args.profile_child:
            summarise_profiles(args.profile_child)
        print(
            json.dumps(
                {"workload": args.workload, "mutations": args.mutations, "none": plain, "sandbox": boxed}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
