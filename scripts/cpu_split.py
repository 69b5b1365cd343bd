"""Where the machine's CPU goes while a benchmark runs: every process of the project, Ray and PostgreSQL,
grouped by what it is (worker actors, data service actors, sandbox children, the service, the bench, the
PostgreSQL server, Ray's own processes), sampled from /proc over --seconds, beside the machine's idle time.

Start a benchmark, then this in another shell while it writes, for example:

    .venv/bin/python scripts/bench_latency.py --cluster --no-baseline --seconds 30 &
    sleep 20; .venv/bin/python scripts/cpu_split.py --seconds 10 --rate 2000

--rate (the benchmark's writes a second) adds each group's CPU per write. The last line is JSON. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from eventing.workers.ray_instance import cmdline  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
# The first key found in a process's command line names its group.
GROUPS = (
    ("ray::ServedData", "data service actors"),
    ("ray::WorkerHost", "worker actors"),
    ("-m eventing", "service (eventing run, serve)"),
    ("scripts/bench", "bench (writers)"),
    ("postgres", "postgresql server"),
    ("raylet", "ray raylets"),
    ("gcs_server", "ray gcs"),
    ("ray", "other ray processes"),
)


# Sandboxed children and their zygotes share the zygote's command line: their process names tell them apart.
NAMED = {"sandboxed-child": "sandbox children", "sandbox-zygote": "sandbox zygotes"}


def _group(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            named = NAMED.get(f.read().strip())
    except OSError:
        return None  # ended meanwhile
    if named:
        return named
    args = cmdline(int(pid))  # "" once it ended
    return next((name for key, name in GROUPS if key in args), None) if args else None


def _cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None  # ended meanwhile
    return (int(fields[11]) + int(fields[12])) / TICK


def _idle_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (fields[3] + fields[4]) / TICK  # idle and iowait


def split(seconds: float) -> tuple[dict[str, float], float, float]:
    """Each group's CPU (cores) and the idle cores over `seconds`, and the machine's core count."""
    groups = {int(p): g for p in os.listdir("/proc") if p.isdigit() and (g := _group(p))}
    before = {pid: _cpu_s(pid) for pid in groups}
    idle_before, started = _idle_s(), time.monotonic()
    time.sleep(seconds)
    after = {pid: _cpu_s(pid) for pid in groups}
    idle_after, elapsed = _idle_s(), time.monotonic() - started
    used: dict[str, float] = {}
    for pid, group in groups.items():
        b, a = before[pid], after[pid]
        if b is not None and a is not None:
            used[group] = used.get(group, 0.0) + (a - b) / elapsed
    return used, (idle_after - idle_before) / elapsed, float(os.cpu_count() or 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to sample (default 10)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="the benchmark's writes a second (adds CPU a write)"
    )
    args = parser.parse_args()
    used, idle, cores = split(args.seconds)
    for group, share in sorted(used.items(), key=lambda kv: -kv[1]):
        per_write = f"  {share / args.rate * 1e6:6.0f} us a write" if args.rate else ""
        print(f"{group:32} {share * 100:6.1f}% of a core{per_write}")
    print(
        f"{'all of these':32} {sum(used.values()) * 100:6.1f}%; idle {idle * 100:.1f}% of {cores:.0f} cores"
    )
    print(json.dumps({"cores_used": used, "idle_cores": idle, "cores": cores, "seconds": args.seconds}))


if __name__ == "__main__":
    main()
