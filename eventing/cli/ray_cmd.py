"""`eventing ray start|stop|status`: a Ray instance kept running for the data directory, which every
`eventing run` there joins instead of starting its own (eventing.workers.ray_instance)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from eventing.cli.common import state_of, writable_state
from eventing.cli.output import emit_json


def _describe(instance: Any) -> dict[str, Any]:
    return {
        "address": instance.address,
        "pid": instance.pid,
        "num_cpus": instance.num_cpus,
        "temp_dir": instance.temp_dir,
        "up_s": round(time.time() - instance.started_at, 1),
    }


def cmd_ray_start(args: argparse.Namespace) -> int:
    from eventing.workers import ray_instance

    state = writable_state(args)
    was_up = ray_instance.running(state.runtime_dir()) is not None
    started = time.perf_counter()
    instance = ray_instance.start(state.runtime_dir(), num_cpus=args.num_cpus, workers=args.workers)
    if args.json:
        emit_json({**_describe(instance), "already_running": was_up})
    elif was_up:
        print(f"a Ray instance is already up for {state.shown} at {instance.address} (pid {instance.pid})")
    else:
        print(
            f"Ray instance up at {instance.address} in {time.perf_counter() - started:.1f}s "
            f"({instance.num_cpus} CPUs, {args.workers} worker processes waiting, pid {instance.pid}); "
            f"`eventing run` on {state.shown} joins it; `eventing ray stop` ends it"
        )
    return 0


def cmd_ray_stop(args: argparse.Namespace) -> int:
    from eventing.workers import ray_instance

    instance = ray_instance.stop(state_of(args).runtime_dir())
    if args.json:
        emit_json({"stopped": instance is not None, **(_describe(instance) if instance else {})})
    elif instance is None:
        print("no Ray instance was started for this store (`eventing ray start` starts one)")
    else:
        print(f"stopped the Ray instance at {instance.address} (pid {instance.pid})")
    return 0


def cmd_ray_status(args: argparse.Namespace) -> int:
    from eventing.workers import ray_instance

    instance = ray_instance.running(state_of(args).runtime_dir())
    if args.json:
        emit_json({"running": instance is not None, **(_describe(instance) if instance else {})})
    elif instance is None:
        print(
            "no Ray instance is up for this store: each `eventing run` starts its own (~2.5s); "
            "`eventing ray start` keeps one up"
        )
    else:
        print(
            f"up at {instance.address} for {time.time() - instance.started_at:,.0f}s "
            f"({instance.num_cpus} CPUs, pid {instance.pid}); `eventing run` joins it"
        )
    return 0


def register(sub: Any, add: Any) -> None:
    ray = sub.add_parser(
        "ray",
        help="a Ray instance kept up for this data directory: start, stop, status",
        description="Keep a local Ray instance up for this data directory. Every `eventing run` there joins "
        "it (~0.1s) instead of starting a Ray instance of its own (~2.5s); --ray-address still picks a "
        "cluster.",
    )
    rsub = ray.add_subparsers(dest="ray_command", metavar="ACTION", required=True)
    p = add("start", cmd_ray_start, "start it (or say it is already up)", rsub)
    p.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs Ray may schedule (default: the machine's)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=4,
        help="worker processes kept waiting for runs (default 4; a run needing more starts more, "
        "and they stay)",
    )
    add("stop", cmd_ray_stop, "end every process of it, by pid (other Ray instances are left alone)", rsub)
    add("status", cmd_ray_status, "whether it is up, and where", rsub)


__all__ = ["register"]
