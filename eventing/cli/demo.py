"""`eventing demo`: the main job on embedded defaults, end to end, as a new user would first see it."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from eventing.cli.common import ProgressRenderer, writable_data_dir
from eventing.cli.output import emit_json, progress_enabled
from eventing.errors import EventingError
from eventing.ops.stats import function_stats, vbucket_map
from eventing.runtime import lifecycle
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket, bucket_path, chunked
from eventing.storage.metadata import open_metadata
from functions import FUNCTIONS_DIR
from metadata import FunctionState

DEMO_BUCKETS = ("customers", "emails", "scores")
DEMO_FUNCTIONS = ("fn_email", "fn_score")


def _reset(data_dir: str) -> None:
    """Start from a clean slate so the demo can be run again: drop its functions and buckets."""
    store = open_metadata(data_dir)
    known = {r.name: r for r in store.list_functions()}
    for name in DEMO_FUNCTIONS:
        record = known.get(name)
        if record is None:
            continue
        if record.state in (FunctionState.DEPLOYED, FunctionState.PAUSED):
            store.transition(name, FunctionState.UNDEPLOYING, "undeploy")
        if record.state is not FunctionState.UNDEPLOYED:
            lifecycle.complete_transition(store, name, FunctionState.UNDEPLOYED, "undeploy")
        store.delete_function(name)
    store.close()
    for name in DEMO_BUCKETS:
        for suffix in ("", "-wal", "-shm"):
            path = bucket_path(data_dir, name)
            path.with_name(path.name + suffix).unlink(missing_ok=True)


def run_demo(data_dir: str, args: argparse.Namespace) -> int:
    from eventing.runtime.executor import make_executor
    from eventing.runtime.service import EventingService

    say = (lambda *a: None) if args.json else print
    if open_metadata(data_dir).live_services(lifecycle.SERVICE_STALE_S):
        raise EventingError(f"an eventing service is running on {data_dir}; stop it (Ctrl-C) before the demo resets it")
    _reset(data_dir)
    say(f"1. creating buckets {', '.join(DEMO_BUCKETS)} in {data_dir}")
    for name in DEMO_BUCKETS:
        LocalBucket.create(data_dir, name)
    say(f"2. loading {args.mutations:,} faker mutations over {args.documents:,} customers (seed {args.seed})")
    source = LocalBucket.open(data_dir, "customers")
    t0 = time.perf_counter()
    for chunk in chunked(loadgen.generate(args.documents, args.mutations, seed=args.seed), 20_000):
        source.write(chunk)
    load_s = time.perf_counter() - t0
    say(f"   {args.mutations / load_s:,.0f} mutations/s")
    say("3. deploying fn_email (4 workers) and fn_score (3 workers)")
    for name in DEMO_FUNCTIONS:
        lifecycle.save_from_file(data_dir, FUNCTIONS_DIR / f"{name}.json")
        lifecycle.deploy(data_dir, name)
    say(f"4. processing everything on {'a local Ray instance' if args.executor == 'ray' and not args.ray_address else args.executor}")

    executor = make_executor(args.executor, args.ray_address)
    renderer = ProgressRenderer(enabled=not args.json and progress_enabled())
    try:
        summary = EventingService(data_dir, executor, until_caught_up=True, on_progress=renderer).run()
    finally:
        renderer.close()
    if summary.errors:
        for err in summary.errors:
            print(f"error: {err}")
        return 1
    stats = {name: function_stats(data_dir, name) for name in DEMO_FUNCTIONS}
    vbmaps = {name: vbucket_map(data_dir, name) for name in DEMO_FUNCTIONS}
    emails = LocalBucket.open(data_dir, "emails")
    scores = LocalBucket.open(data_dir, "scores")
    result = {
        "data_dir": data_dir,
        "load_mutations_per_s": round(args.mutations / load_s),
        "run_seconds": round(summary.seconds, 2),
        "functions": {n: {"handled": p.handled, "state": p.state} for n, p in summary.functions.items()},
        "stats": stats,
        "vbmap": vbmaps,
        "buckets": {b.name: b.stats()["documents"] for b in (source, emails, scores)},
    }
    if args.json:
        emit_json(result)
        return 0
    print(f"   done in {summary.seconds:.1f}s")
    print()
    for name in DEMO_FUNCTIONS:
        s = stats[name]
        print(f"== {name}: {s['mutations_seen']:,} mutations seen, on_update ok {s['on_update_success']:,} / failed "
              f"{s['on_update_failure']}, on_delete ok {s['on_delete_success']:,} / failed {s['on_delete_failure']}, "
              f"checkpoint lag {s['checkpoint_lag']}, {s.get('last_run', {}).get('mutations_per_s', 0):,} mutations/s")
        for w in vbmaps[name]["workers"]:
            print(f"   {w['worker']}: {w['vbuckets']} vBuckets  {w['ranges']}")
    print()
    print(f"customers: {result['buckets']['customers']:,} documents; emails: {result['buckets']['emails']:,} drafts; "
          f"scores: {result['buckets']['scores']:,} scores")
    key = next(iter(emails.keys()), None)
    if key:
        print(f"example: emails[{key!r}] = {emails.get(key)}")
        print(f"         scores[{key!r}] = {scores.get(key)}")
    print(f"\nnext: eventing --data-dir {data_dir} stats fn_email   |   eventing --data-dir {data_dir} vbmap fn_score")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(writable_data_dir(args), args)


def register(sub: Any, add: Any) -> None:
    p = add("demo", cmd_demo, "the main job on embedded defaults: load customers, deploy fn_email and fn_score, "
            "process everything on a local Ray instance, print stats and vBucket maps")
    p.add_argument("--documents", type=int, default=20_000)
    p.add_argument("--mutations", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ray-address", default=os.environ.get("EVENTING_RAY_ADDRESS"))
    p.add_argument("--executor", choices=["ray", "in-process"], default="ray")
