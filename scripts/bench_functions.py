"""Many functions on one machine: N functions on one source, run until caught up by one `eventing run`.

Couchbase deployments commonly run dozens of functions on one source bucket. This loads one source of
--mutations mutations over --documents documents (the bench workload), deploys --functions functions (each
--workers workers, a trivial Python handler writing one document per mutation into a binding bucket of its
own), and runs them all with one `eventing run --until-caught-up --json` as a subprocess
(--executor ray: a Ray instance of its own, as a plain `eventing run` starts it). Every 0.5 s it samples the
process tree of that command by pid (the run, the Ray GCS, raylet, agents and worker processes it started)
and sums VmRSS (and PSS, which counts shared pages once); the peak is reported.

The baseline, measured in the same invocation on a copy of the same source: ONE such function with the same
workers, alone, times N (its catch-up time x N; its RSS as it is). Reported per run:

- catch_up_s: from the first handler call to the command's exit (the command's wall time less start-up);
- startup_s: from the command to its first handler call (`eventing run --json`'s
  startup.first_handler_call_s);
- peak_rss_mb / peak_pss_mb: the peak of the tree's summed RSS / PSS, with how many processes it held;
  peak_worker_rss_mb: the peak of the Ray worker processes' summed RSS alone (worker_processes of them);
- first/last_caught_up_s, least_done_when_first_caught_up: fairness between the functions, from their
  checkpoints read once a second: when the first and the last had checkpointed all their mutations, and
  the share the least advanced one had checkpointed when the first was done;
- ratio: catch_up_s / (baseline catch_up_s x N). The project's goals: 20 functions within 2 GB of RSS and
  caught up within 2x the baseline;
- cpu_s / cpu_ratio: CPU seconds of the whole tree (each process as last sampled), and N functions' CPU over
  N x the baseline's. On a machine busy with other work, 2N worker processes take a larger share of the
  cores than 2 do, which flatters the wall-clock ratio; the CPU ratio does not depend on that. The whole
  tree's CPU counts Ray's own start-up (a few CPU seconds) once against N times; worker_cpu_s and
  worker_cpu_ratio count the Ray worker processes alone: what handling the mutations costs.

--worker-processes N runs the functions' workers in N shared Ray worker processes (`eventing run
--worker-processes N`, eventing.workers.shared_host) instead of one process per worker; several values
(`--worker-processes 0 2`) measure each in every run, 0 being one process per worker. The baseline of a
variant runs with the same setting.

Runs alternate baseline first / many first (--runs). Each line names the load average at its start. The last
line is JSON (medians over the runs, and every run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from eventing.control import lifecycle  # noqa: E402
from eventing.core.definition import FunctionDefinition  # noqa: E402
from eventing.storage.factory import create_bucket, open_bucket  # noqa: E402
from eventing.testing.workloads import load_bench_bucket  # noqa: E402

# One binding write per mutation: the cheapest handler that still does what a function is for.
HANDLER = """
def on_update(doc, meta):
    dst[meta.id] = {"rev": doc.get("rev")}

def on_delete(meta, options):
    if meta.id in dst:
        del dst[meta.id]
"""

SAMPLE_EVERY_S = 0.5


# -- the process tree, from /proc ----------------------------------------------------------------------


TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int, float] | None:
    """(parent pid, start time in clock ticks, CPU seconds used) of a live process (not of a zombie: ended,
    its parent has not yet collected its status)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / TICKS


def tree(root: int) -> dict[int, tuple[int, float]]:
    """Every live process under `root` (and root), by pid, with its start time and CPU seconds."""
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append(int(name))
                stats[int(name)] = (st[1], st[2])
    out: dict[int, tuple[int, float]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in stats and pid not in out:
            out[pid] = stats[pid]
            todo.extend(children.get(pid, ()))
    return out


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of a process in MB; zeros once it is gone."""
    rss = pss = 0.0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) / 1024
    except OSError:
        pass
    return rss, pss


def _is_ray_worker(pid: int) -> bool:
    """A Ray worker process (Ray sets its title to ray::<Class>.<method> or ray::IDLE), not one of Ray's
    agents."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    return title.startswith("ray::") and not title.endswith("Agent")


class TreeSampler(threading.Thread):
    """Samples the summed RSS/PSS of a process tree every SAMPLE_EVERY_S; keeps the peaks and every pid
    seen."""

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root = root
        self.peak_rss = self.peak_pss = 0.0
        self.peak_worker_rss = 0.0  # the Ray worker processes' summed RSS alone (the workers' hosts)
        self.peak_processes = 0
        self.seen: dict[int, tuple[int, float]] = {}  # pid: (start time, CPU seconds when last seen)
        self.workers: set[int] = set()  # pids of Ray worker processes (ray::WorkerHost..., ray::IDLE)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(SAMPLE_EVERY_S)

    def sample(self) -> None:
        pids = tree(self.root)
        self.seen.update(pids)
        self.workers.update(pid for pid in pids if _is_ray_worker(pid))
        rss = pss = worker_rss = 0.0
        for pid in pids:
            r, p = memory_mb(pid)
            rss += r
            pss += p
            if pid in self.workers:
                worker_rss += r
        self.peak_worker_rss = max(self.peak_worker_rss, worker_rss)
        if rss > self.peak_rss:
            self.peak_rss, self.peak_processes = rss, len(pids)
        self.peak_pss = max(self.peak_pss, pss)

    def end_leftovers(self) -> int:
        """End (SIGKILL, by pid) any process of the tree still alive after the command exited: only those this
        run started (same pid and same start time)."""
        ended = 0
        for pid, (started, _) in self.seen.items():
            st = _stat(pid)
            if st is not None and st[1] == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                    ended += 1
                except OSError:
                    pass
        return ended


class ProgressSampler(threading.Thread):
    """Reads every function's checkpoints once a second (its own read of the metadata store) and notes when
    each is caught up, and how far the least advanced function was when the first one was: a function
    starved by the others would be far behind then."""

    def __init__(self, data_dir: Path, functions: int, total: int):
        super().__init__(daemon=True)
        self.data_dir, self.names, self.total = data_dir, [f"fn{i}" for i in range(functions)], total
        self.started = time.perf_counter()
        self.done_at: dict[str, float] = {}
        self.least_when_first_done: float | None = (
            None  # fraction of its mutations the last one had checkpointed
        )
        self.stop = threading.Event()

    def run(self) -> None:
        from metadata.factory import open_store

        with open_store(self.data_dir, create=False) as store:
            while not self.stop.wait(1.0) and len(self.done_at) < len(self.names):
                now = time.perf_counter() - self.started
                fractions = {
                    n: sum(cp.seqno for cp in store.checkpoints(n).values()) / self.total for n in self.names
                }
                for name, fraction in fractions.items():
                    if fraction >= 1.0 and name not in self.done_at:
                        self.done_at[name] = now
                        if self.least_when_first_done is None:
                            self.least_when_first_done = min(fractions.values())

    def figures(self) -> dict[str, Any]:
        if not self.done_at:
            return {}
        return {
            "first_caught_up_s": round(min(self.done_at.values()), 1),
            "last_caught_up_s": round(max(self.done_at.values()), 1),
            "least_done_when_first_caught_up": round(self.least_when_first_done or 0.0, 3),
        }


# -- one measurement -----------------------------------------------------------------------------------


def prepare(seed: Path, data_dir: Path, functions: int, workers: int) -> None:
    shutil.copytree(seed, data_dir)
    for i in range(functions):
        create_bucket(data_dir, f"dst{i}")
        defn = FunctionDefinition.from_dict(
            {
                "name": f"fn{i}",
                "source_bucket": "src",
                "worker_count": workers,
                "bindings": [{"alias": "dst", "bucket": f"dst{i}", "access": "rw"}],
                "batch_size": 1000,
                "checkpoint_interval": "1s",
            }
        )
        lifecycle.save_function(str(data_dir), defn, HANDLER)
        lifecycle.deploy(str(data_dir), f"fn{i}")


def measure(
    data_dir: Path, executor: str, functions: int, mutations: int, env: dict[str, str], processes: int = 0
) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "eventing",
        "--data-dir",
        str(data_dir),
        "run",
        "--until-caught-up",
        "--json",
        "--executor",
        executor,
        "--worker-processes",
        str(processes),
    ]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    total = sum(open_bucket(str(data_dir), "src").high_seqnos())
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    progress = ProgressSampler(data_dir, functions, total)
    progress.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    sampler.done.set()
    sampler.join()
    progress.stop.set()
    progress.join()
    leftovers = sampler.end_leftovers()
    if proc.returncode != 0:
        raise SystemExit(f"error: eventing run exited {proc.returncode}: {err.strip()[-800:]}")
    # Lines that Ray's workers print (log_to_driver) may come before the JSON object, which ends the output.
    start = 0 if out.startswith("{") else out.rfind("\n{\n") + 1
    try:
        result = json.loads(out[start:])
    except ValueError:
        raise SystemExit(
            f"error: eventing run printed no JSON (exit {proc.returncode}): {out[-400:]!r} {err[-800:]!r}"
        ) from None
    handled = {name: f["handled"] for name, f in result["functions"].items()}
    if len(handled) != functions or any(n != mutations for n in handled.values()):
        raise SystemExit(f"error: not every function handled {mutations:,} mutations: {handled}")
    startup = result["startup"]["first_handler_call_s"]
    return {
        "load": round(load, 2),
        "wall_s": round(wall, 2),
        "startup_s": startup,
        "catch_up_s": round(wall - startup, 2),
        "run_seconds": result["seconds"],
        "ray_s": result["startup"]["ray_s"],
        "workers_ready_s": result["startup"]["workers_ready_s"],
        "peak_rss_mb": round(sampler.peak_rss),
        "peak_pss_mb": round(sampler.peak_pss),
        "peak_worker_rss_mb": round(sampler.peak_worker_rss),
        "peak_processes": sampler.peak_processes,
        "worker_processes": len(sampler.workers),
        "leftovers_ended": leftovers,
        # CPU of every process of the tree, as last sampled: independent of how busy the machine is.
        "cpu_s": round(sum(cpu for _, cpu in sampler.seen.values()), 1),
        "worker_cpu_s": round(
            sum(cpu for pid, (_, cpu) in sampler.seen.items() if pid in sampler.workers), 1
        ),
        # Fairness (from the command's start, sampled each second): when the first and the last function had
        # checkpointed all their mutations, and what share the least advanced one had when the first had.
        **progress.figures(),
    }


def line(kind: str, r: dict[str, Any]) -> str:
    return (
        f"{kind}: catch-up {r['catch_up_s']:.2f}s (command {r['wall_s']:.2f}s, start-up "
        f"{r['startup_s']:.2f}s: Ray {r['ray_s']:.2f}s, workers up {r['workers_ready_s']:.2f}s), "
        f"peak RSS {r['peak_rss_mb']:,} MB / PSS {r['peak_pss_mb']:,} MB over {r['peak_processes']} "
        f"processes (Ray worker processes: {r['worker_processes']}, {r['peak_worker_rss_mb']:,} MB), "
        f"CPU {r['cpu_s']:.1f}s (worker processes {r['worker_cpu_s']:.1f}s), load {r['load']}"
        + (
            f"; functions caught up {r['first_caught_up_s']:.0f}-{r['last_caught_up_s']:.0f}s after the "
            f"command, the least advanced at {r['least_done_when_first_caught_up']:.0%} when the first was"
            if "first_caught_up_s" in r
            else ""
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--functions", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2, help="workers per function")
    parser.add_argument("--mutations", type=int, default=200_000)
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--executor", choices=("ray", "in-process"), default="ray")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--light-workers",
        choices=("on", "off", "both"),
        default="on",
        help="Ray worker processes without Ray's Arrow/Starlette serializers (the default, "
        "eventing/workers/ray_setup.py), without (EVENTING_RAY_LIGHT_WORKERS=0), or both in "
        "each run, for a before/after",
    )
    parser.add_argument(
        "--worker-processes",
        type=int,
        nargs="+",
        default=[0],
        metavar="N",
        help="shared Ray worker processes for all the functions' workers (0: one process per "
        "worker, the default); several values measure each in every run",
    )
    args = parser.parse_args(argv)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    lights = ["off", "on"] if args.light_workers == "both" else [args.light_workers]
    variants = [f"{light}/{n}" for n in args.worker_processes for light in lights]
    work = Path(tempfile.mkdtemp(prefix="bench-functions-"))
    try:
        seed = work / "seed"
        load_bench_bucket(seed, "src", args.documents, args.mutations)
        print(
            f"{args.functions} functions x {args.workers} workers over {args.mutations:,} mutations "
            f"({args.documents:,} documents), executor {args.executor}",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for i in range(args.runs):
            order = variants if i % 2 == 0 else variants[::-1]
            for variant in order:
                got: dict[str, dict[str, Any]] = {}
                light, processes = variant.split("/")
                venv = {**env, "EVENTING_RAY_LIGHT_WORKERS": "1" if light == "on" else "0"}
                tag = f"run {i + 1}"
                if len(lights) > 1:
                    tag += f" light workers {light}"
                if len(args.worker_processes) > 1 or processes != "0":
                    tag += f" worker processes {processes if processes != '0' else 'one per worker'}"
                for kind in ("baseline", "many") if i % 2 == 0 else ("many", "baseline"):
                    n = args.functions if kind == "many" else 1
                    data_dir = work / f"{kind}-{light}-{processes}-{i}"
                    prepare(seed, data_dir, n, args.workers)
                    got[kind] = measure(data_dir, args.executor, n, args.mutations, venv, int(processes))
                    print(f"{tag}: " + line(f"{n} function(s)", got[kind]), flush=True)
                    shutil.rmtree(data_dir, ignore_errors=True)
                x_n = got["baseline"]["catch_up_s"] * args.functions
                ratio = got["many"]["catch_up_s"] / x_n
                cpu_ratio = got["many"]["cpu_s"] / (got["baseline"]["cpu_s"] * args.functions)
                worker_cpu_ratio = got["many"]["worker_cpu_s"] / max(
                    got["baseline"]["worker_cpu_s"] * args.functions, 1e-9
                )
                print(
                    f"{tag}: baseline catch-up x {args.functions} = {x_n:.2f}s; ratio {ratio:.2f}; CPU ratio "
                    f"{cpu_ratio:.2f} (worker processes {worker_cpu_ratio:.2f}); RSS "
                    f"{got['many']['peak_rss_mb']:,} MB against one function's "
                    f"{got['baseline']['peak_rss_mb']:,} MB",
                    flush=True,
                )
                runs[variant].append(
                    {
                        **got,
                        "baseline_catch_up_x_n_s": round(x_n, 2),
                        "ratio": round(ratio, 3),
                        "cpu_ratio": round(cpu_ratio, 3),
                        "worker_cpu_ratio": round(worker_cpu_ratio, 3),
                    }
                )

        def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
            def med(kind: str, key: str) -> float:
                return statistics.median(r[kind][key] for r in rs)

            return {
                "peak_rss_mb": med("many", "peak_rss_mb"),
                "peak_pss_mb": med("many", "peak_pss_mb"),
                "catch_up_s": med("many", "catch_up_s"),
                "baseline_catch_up_x_n_s": round(
                    statistics.median(r["baseline_catch_up_x_n_s"] for r in rs), 2
                ),
                "ratio": round(statistics.median(r["ratio"] for r in rs), 3),
                "cpu_ratio": round(statistics.median(r["cpu_ratio"] for r in rs), 3),
                "worker_cpu_ratio": round(statistics.median(r["worker_cpu_ratio"] for r in rs), 3),
                "startup_s": med("many", "startup_s"),
                "worker_processes": med("many", "worker_processes"),
                "baseline_peak_rss_mb": med("baseline", "peak_rss_mb"),
                "baseline_startup_s": med("baseline", "startup_s"),
            }

        main_variant = variants[-1]
        out: dict[str, Any] = {
            "functions": args.functions,
            "workers": args.workers,
            "mutations": args.mutations,
            "executor": args.executor,
            "light_workers": main_variant.split("/")[0],
            "shared_processes": int(main_variant.split("/")[1]),
            **summary(runs[main_variant]),
        }
        if len(variants) > 1:  # every variant, by "light workers/shared processes" (0: one per worker)
            out["variants"] = {v: summary(runs[v]) for v in variants}
        out["runs"] = runs
        print(json.dumps(out))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
