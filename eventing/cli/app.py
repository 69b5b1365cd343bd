"""The `eventing` command: buckets, function lifecycle, the runtime, and inspection (vbmap, stats).

Every subcommand takes --data-dir (default $EVENTING_DATA_DIR or ./.eventing) and, where it prints
data, --json. User mistakes print `error: ...` naming the thing and the fix, and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from eventing.cli.output import emit_json, progress_enabled, table
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document, parse_json_document
from eventing.errors import ConfigError, EventingError, InvalidDocumentError, InvalidKeyError, NotFoundError
from eventing.runtime import lifecycle
from eventing.storage.bucket import LocalBucket, Write, chunked, list_buckets
from eventing.storage.metadata import METADATA_FILE, open_metadata
from metadata import METADATA_URL_ENV
from sharding import NUM_VBUCKETS, format_ranges, validate_key, worker_plan

DEFAULT_DATA_DIR = ".eventing"

# Modules with a `register(sub, add)` function that adds their subcommands (see build_parser).
COMMAND_MODULES: list[str] = ["eventing.cli.nodes", "eventing.cli.dlq", "eventing.cli.debug", "eventing.cli.verify", "eventing.cli.windows"]
EXIT_USAGE = 2


# -- helpers ------------------------------------------------------------------------------------------


def data_dir_of(args: argparse.Namespace) -> str:
    return args.data_dir or os.environ.get("EVENTING_DATA_DIR") or DEFAULT_DATA_DIR


def writable_data_dir(args: argparse.Namespace) -> str:
    """The data directory, created if needed; a clear error if it cannot be written."""
    path = Path(data_dir_of(args))
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise EventingError(
            f"data directory {path} is not writable ({exc.strerror}); pass --data-dir DIR or set EVENTING_DATA_DIR "
            "to a writable directory"
        ) from None
    return str(path)


def existing_data_dir(args: argparse.Namespace) -> str:
    path = Path(data_dir_of(args))
    if not (path / METADATA_FILE).exists() and not os.environ.get(METADATA_URL_ENV):
        raise NotFoundError(
            f"no eventing metadata in {path}; deploy a function first (`eventing deploy functions/fn_email.json`) "
            "or pass the right --data-dir"
        )
    return str(path)


def parse_doc_arg(text: str) -> dict:
    return parse_json_document(text)


# -- bucket commands ----------------------------------------------------------------------------------


def cmd_bucket_create(args: argparse.Namespace) -> int:
    bucket = LocalBucket.create(writable_data_dir(args), args.name, exist_ok=args.exist_ok)
    if args.json:
        emit_json(bucket.stats())
    else:
        print(f"bucket '{args.name}' ready ({bucket.path})")
    return 0


def cmd_bucket_list(args: argparse.Namespace) -> int:
    data_dir = data_dir_of(args)
    rows = []
    for name in list_buckets(data_dir):
        bucket = LocalBucket.open(data_dir, name)
        rows.append(bucket.stats())
        bucket.close()
    if args.json:
        emit_json(rows)
    elif not rows:
        print(f"no buckets in {data_dir}; create one with `eventing bucket create NAME`")
    else:
        print(table(["bucket", "documents", "tombstones", "mutations"],
                    [[r["name"], r["documents"], r["tombstones"], r["mutations"]] for r in rows]))
    return 0


def cmd_bucket_load(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    data_dir = writable_data_dir(args)
    bucket = LocalBucket.open(data_dir, args.name)
    start = time.perf_counter()
    rejected: list[str] = []
    if args.file:
        writes = _json_lines(args.file, rejected)
        total = None
    else:
        from eventing.storage import loadgen

        if args.documents < 1 or args.mutations < args.documents:
            raise ConfigError("--mutations must be >= --documents >= 1 (each document is created once first)")
        writes = loadgen.generate(args.documents, args.mutations, seed=args.seed, prefix=args.prefix)
        total = args.mutations
    written = skipped = 0
    with tqdm(total=total, unit="mut", disable=args.json or not progress_enabled(), desc=f"load {args.name}") as bar:
        for chunk in chunked(writes, 20_000):
            results = bucket.write(chunk)
            done = sum(1 for r in results if r is not None)
            written += done
            skipped += len(results) - done
            bar.update(len(chunk))
    seconds = time.perf_counter() - start
    summary = {
        "bucket": args.name,
        "mutations_written": written,
        "deletes_of_missing_documents": skipped,
        "rejected_lines": len(rejected),
        "seconds": round(seconds, 3),
        "mutations_per_s": round(written / seconds) if seconds else None,
    }
    if args.json:
        summary["rejected"] = rejected[:100]
        emit_json(summary)
    else:
        print(f"loaded {written:,} mutations into '{args.name}' in {seconds:.1f}s ({summary['mutations_per_s']:,}/s)")
        if skipped:
            print(f"  {skipped:,} deletes named documents that do not exist; nothing was logged for them")
        for line in rejected[:20]:
            print(f"  rejected: {line}", file=sys.stderr)
        if len(rejected) > 20:
            print(f"  ... and {len(rejected) - 20} more rejected lines", file=sys.stderr)
    return 1 if rejected else 0


def _json_lines(path: str, rejected: list[str]):
    """Read `{"key":..., "doc":{...}}` or `{"key":..., "op":"delete"}` lines; bad lines are reported, not lost."""
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    with stream:
        for number, raw in enumerate(stream, 1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                rejected.append(f"line {number}: not UTF-8 ({exc.reason} at byte {exc.start}); re-encode the file as UTF-8")
                continue
            try:
                item = json.loads(text)
                if not isinstance(item, dict) or "key" not in item:
                    raise InvalidDocumentError('each line must be an object with "key" and "doc" or "op"')
                key = item["key"]
                validate_key(key)
                op = item.get("op", "upsert")
                if op == "delete":
                    yield Write(key, OP_DELETE)
                elif op in ("upsert", "update", "insert"):
                    if "doc" not in item:
                        raise InvalidDocumentError('an upsert line needs "doc"')
                    yield Write(key, OP_UPDATE, encode_document(item["doc"]), int(item.get("expiry", 0)))
                else:
                    raise InvalidDocumentError(f'unknown op {op!r}; use "upsert" or "delete"')
            except json.JSONDecodeError as exc:
                rejected.append(f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})")
            except (EventingError, InvalidKeyError, ValueError, TypeError) as exc:
                rejected.append(f"line {number}: {exc}")


def cmd_bucket_upsert(args: argparse.Namespace) -> int:
    bucket = LocalBucket.open(writable_data_dir(args), args.name)
    vb, seqno = bucket.upsert(args.key, parse_doc_arg(args.doc), expiry=args.expiry)
    _print_write(args, "upserted", vb, seqno)
    return 0


def cmd_bucket_delete(args: argparse.Namespace) -> int:
    bucket = LocalBucket.open(writable_data_dir(args), args.name)
    vb, seqno = bucket.delete(args.key)
    _print_write(args, "deleted", vb, seqno)
    return 0


def _print_write(args: argparse.Namespace, verb: str, vb: int, seqno: int) -> None:
    if args.json:
        emit_json({"key": args.key, "vb": vb, "seqno": seqno})
    else:
        print(f"{verb} '{args.key}' (vBucket {vb}, seqno {seqno})")


def cmd_bucket_get(args: argparse.Namespace) -> int:
    bucket = LocalBucket.open(data_dir_of(args), args.name)
    validate_key(args.key)
    doc = bucket.get(args.key)
    if doc is None:
        raise NotFoundError(f"document '{args.key}' does not exist in bucket '{args.name}'")
    if args.json:
        emit_json({"key": args.key, "meta": bucket.get_meta(args.key), "doc": doc})
    else:
        print(json.dumps(doc, indent=2))
    return 0


def cmd_bucket_info(args: argparse.Namespace) -> int:
    stats = LocalBucket.open(data_dir_of(args), args.name).stats()
    if args.json:
        emit_json(stats)
    else:
        for k, v in stats.items():
            print(f"{k:>20}: {v}")
    return 0


def cmd_bucket_expire(args: argparse.Namespace) -> int:
    n = LocalBucket.open(writable_data_dir(args), args.name).expire_due()
    print(f"{n} expired documents turned into expiration mutations")
    return 0


# -- function lifecycle -------------------------------------------------------------------------------


def _record_view(record) -> dict[str, Any]:
    d = record.definition
    return {
        "name": record.name,
        "state": record.state.value,
        "source_bucket": d["source_bucket"],
        "workers": d.get("worker_count", 1),
        "boundary": d.get("boundary", "everything"),
        "bindings": [f"{b['alias']}={b['bucket']}:{b['access']}" for b in d.get("bindings", [])],
        "generation": record.generation,
    }


def _announce(args: argparse.Namespace, record, verb: str) -> int:
    if args.json:
        emit_json(_record_view(record))
    else:
        print(f"function '{record.name}' {verb} (state: {record.state.value})")
    return 0


def _name_or_file(args: argparse.Namespace, data_dir: str) -> str:
    """`deploy` takes a definition file (saved first) or the name of a stored function."""
    target = args.function
    if target.endswith(".json") or os.path.sep in target:
        return lifecycle.save_from_file(data_dir, target).name
    return target


def cmd_create(args: argparse.Namespace) -> int:
    data_dir = writable_data_dir(args)
    return _announce(args, lifecycle.save_from_file(data_dir, args.file), "saved")


def cmd_deploy(args: argparse.Namespace) -> int:
    data_dir = writable_data_dir(args)
    name = _name_or_file(args, data_dir)
    record = lifecycle.deploy(data_dir, name, args.boundary)
    return _announce(args, record, "deployed")


def cmd_pause(args: argparse.Namespace) -> int:
    return _announce(args, lifecycle.pause(existing_data_dir(args), args.function, wait_s=args.wait), "paused")


def cmd_resume(args: argparse.Namespace) -> int:
    return _announce(args, lifecycle.resume(existing_data_dir(args), args.function), "resumed")


def cmd_undeploy(args: argparse.Namespace) -> int:
    return _announce(args, lifecycle.undeploy(existing_data_dir(args), args.function, wait_s=args.wait), "undeployed")


def cmd_delete(args: argparse.Namespace) -> int:
    lifecycle.delete(existing_data_dir(args), args.function)
    if args.json:
        emit_json({"name": args.function, "deleted": True})
    else:
        print(f"function '{args.function}' deleted")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    path = Path(data_dir_of(args)) / METADATA_FILE
    exists = path.exists() or bool(os.environ.get(METADATA_URL_ENV))
    records = open_metadata(data_dir_of(args)).list_functions() if exists else []
    views = [_record_view(r) for r in records]
    if args.json:
        emit_json(views)
    elif not views:
        print("no functions; deploy one with `eventing deploy functions/fn_email.json`")
    else:
        print(table(["function", "state", "source", "workers", "boundary", "bindings"],
                    [[v["name"], v["state"], v["source_bucket"], v["workers"], v["boundary"], " ".join(v["bindings"])]
                     for v in views]))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    store = open_metadata(existing_data_dir(args), create=False)
    records = [store.get_function(args.function)] if args.function else store.list_functions()
    services = store.live_services(lifecycle.SERVICE_STALE_S)
    leader = _leader_view(store, services)
    standbys = [sid for sid in services if leader is None or sid != leader["id"]]
    views = []
    for r in records:
        view = _record_view(r)
        cps = store.checkpoints(r.name)
        view["vbuckets_leased"] = sum(1 for c in cps.values() if c.leased)
        view["service_running"] = bool(services)
        views.append(view)
    if args.json:
        emit_json({"services": services, "leader": leader, "standbys": standbys, "functions": views})
    else:
        print(f"eventing service: {'running (' + ', '.join(services) + ')' if services else 'not running'}")
        if leader is not None:
            print(f"  leader: {leader['id']} (lease term {leader['term']}, expires in {leader['expires_in_s']:.1f}s)")
        if services:
            print(f"  standby: {', '.join(standbys) if standbys else 'none'}")
        for v in views:
            print(f"  {v['name']}: {v['state']} ({v['vbuckets_leased']}/{NUM_VBUCKETS} vBuckets owned by live workers)")
    return 0


def _leader_view(store, services: list[str]) -> dict[str, Any] | None:
    """The service holding the leader lease, if the lease is current."""
    from eventing.runtime.failover import LEADER_LEASE

    lease = store.lease(LEADER_LEASE)
    if lease is None or lease.expired(time.time()):
        return None
    return {
        "id": lease.holder, "term": lease.term, "since": lease.acquired_at,
        "expires_in_s": round(lease.expires_at - time.time(), 2), "heartbeat": lease.holder in services,
    }


def cmd_export(args: argparse.Namespace) -> int:
    data = lifecycle.export_function(existing_data_dir(args), args.function)
    text = json.dumps(data, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        print(f"exported function '{args.function}' to {args.output}")
    else:
        print(text)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    data_dir = writable_data_dir(args)
    try:
        data = json.loads(Path(args.file).read_text())
    except FileNotFoundError:
        raise ConfigError(f"file {args.file} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{args.file} is not valid JSON ({exc})") from None
    records = lifecycle.import_definitions(data_dir, data)
    if args.json:
        emit_json([_record_view(r) for r in records])
    else:
        for r in records:
            print(f"imported function '{r.name}' (state: {r.state.value})")
    return 0


# -- runtime -----------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from eventing.runtime.executor import make_executor
    from eventing.runtime.failover import failover_timeout_s
    from eventing.runtime.service import EventingService

    data_dir = existing_data_dir(args)
    timeout_s = failover_timeout_s(args.failover_timeout)  # a bad value fails before Ray starts
    executor = make_executor(args.executor, args.ray_address)
    renderer = _ProgressRenderer(enabled=not args.json and not args.quiet and progress_enabled())
    service = EventingService(
        data_dir, executor, until_caught_up=args.until_caught_up, functions=args.function or None,
        on_progress=renderer, standby=args.standby, failover_timeout_s=timeout_s,
    )
    if args.standby and not args.json and not args.quiet:
        print(f"standby {service.service_id}: waiting for the leader's lease; takes over when it stops",
              file=sys.stderr, flush=True)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: service.stop())
    try:
        summary = service.run()
    except KeyboardInterrupt:
        service.stop()
        summary = service.summary
    finally:
        signal.signal(signal.SIGTERM, previous)
        renderer.close()
    result = {
        "seconds": round(summary.seconds, 2),
        "functions": {
            name: {"handled": p.handled, "backlog": p.backlog, "state": p.state, "error": p.error}
            for name, p in summary.functions.items()
        },
        "errors": summary.errors,
        "leadership": summary.leadership,
        "failovers": summary.failovers,
    }
    if args.json:
        emit_json(result)
    elif not args.quiet:
        if summary.leadership.get("took_over_from"):
            print(f"took over from {summary.leadership['took_over_from']} after waiting "
                  f"{summary.leadership['waited_s']:.1f}s as a standby")
        for f in summary.failovers:
            print(f"failed over node(s) {', '.join(f['nodes'])}: their vBuckets had no live owner for "
                  f"{f['unowned_s']:.1f}s (failover timeout {f['timeout_s']:g}s)")
        if not summary.functions:
            print("no deployed functions to run; deploy one with `eventing deploy functions/fn_email.json`")
        for name, p in summary.functions.items():
            rate = p.handled / summary.seconds if summary.seconds else 0
            extra = f" error: {p.error}" if p.error else ""
            print(f"{name}: {p.handled:,} mutations handled in {summary.seconds:.1f}s ({rate:,.0f}/s), {p.state}{extra}")
    return 1 if summary.errors else 0


class _ProgressRenderer:
    """Live counters on stderr: one tqdm bar per function (total known in --until-caught-up)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bars: dict[str, Any] = {}
        self.last = 0.0

    def __call__(self, summary) -> None:
        if not self.enabled or time.monotonic() - self.last < 0.2:
            return
        from tqdm import tqdm

        self.last = time.monotonic()
        for position, (name, p) in enumerate(sorted(summary.functions.items())):
            bar = self.bars.get(name)
            if bar is None:
                bar = self.bars[name] = tqdm(desc=name, unit="mut", position=position, leave=True, dynamic_ncols=True)
            total = p.handled + p.backlog
            if total and bar.total != total:
                bar.total = total
            bar.n = p.handled
            bar.set_postfix_str(p.state, refresh=False)
            bar.refresh()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def _vbmap(data_dir: str, name: str) -> dict[str, Any]:
    store = open_metadata(data_dir, create=False)
    record = store.get_function(name)
    cps = store.checkpoints(name)
    workers: dict[str, list[int]] = {}
    if cps:
        for vb, cp in cps.items():
            workers.setdefault(cp.owner or "(never owned)", []).append(vb)
        source = "metadata store (last recorded owners)"
    else:
        count = record.definition.get("worker_count", 1)
        for i, vbs in enumerate(worker_plan(range(NUM_VBUCKETS), count)):
            workers[f"local/w{i}"] = vbs
        source = "plan (function not deployed)"
    leased = {cp.owner for cp in cps.values() if cp.leased}
    return {
        "function": name,
        "source": source,
        "workers": [
            {"worker": w, "vbuckets": len(vbs), "ranges": format_ranges(vbs), "live": w in leased}
            for w, vbs in sorted(workers.items())
        ],
    }


def cmd_vbmap(args: argparse.Namespace) -> int:
    data = _vbmap(existing_data_dir(args), args.function)
    if args.json:
        emit_json(data)
    else:
        print(f"vBucket map of {data['function']} (from the {data['source']}):")
        print(table(["worker", "vBuckets", "live", "ranges"],
                    [[w["worker"], w["vbuckets"], "yes" if w["live"] else "no", w["ranges"]] for w in data["workers"]]))
    return 0


def _stats(data_dir: str, name: str) -> dict[str, Any]:
    store = open_metadata(data_dir, create=False)
    record = store.get_function(name)
    counters = store.counters(name)
    cps = store.checkpoints(name)
    lag = None
    if cps:
        source = LocalBucket.open(data_dir, record.definition["source_bucket"])
        highs = source.high_seqnos()
        lag = sum(max(0, highs[vb] - cp.seqno) for vb, cp in cps.items())
    keys = [
        "mutations_seen", "on_update_success", "on_update_failure", "on_update_timeout", "on_delete_success",
        "on_delete_failure", "on_delete_timeout", "recursion_filtered", "retries", "effects_applied",
        "effects_duplicate", "effects_fenced", "fenced_checkpoint_writes",
    ]
    out: dict[str, Any] = {"function": name, "state": record.state.value}
    out.update({k: int(counters.get(k, 0)) for k in keys})
    out["dlq"] = {k[4:]: int(v) for k, v in counters.items() if k.startswith("dlq_")}
    out["checkpoint_lag"] = lag
    out["throughput_mps"] = counters.get("throughput_mps", 0.0)
    if counters.get("last_run_seconds"):
        out["last_run"] = {
            "handled": int(counters.get("last_run_handled", 0)),
            "seconds": round(counters["last_run_seconds"], 2),
            "mutations_per_s": round(counters.get("last_run_handled", 0) / counters["last_run_seconds"]),
        }
    return out


def cmd_stats(args: argparse.Namespace) -> int:
    data = _stats(existing_data_dir(args), args.function)
    if args.json:
        emit_json(data)
    else:
        _print_stats(data)
    return 0


def _print_stats(data: dict[str, Any]) -> None:
    print(f"stats of {data['function']} ({data['state']}):")
    for k, v in data.items():
        if k in ("function", "state"):
            continue
        if isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items()) or "-"
        print(f"  {k:>26}: {v if v is not None else '-'}")


def cmd_demo(args: argparse.Namespace) -> int:
    from eventing.ops.demo import run_demo

    return run_demo(writable_data_dir(args), args)


# -- parser ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS,
                        help=f"where buckets and metadata live (default $EVENTING_DATA_DIR or ./{DEFAULT_DATA_DIR})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")

    parser = argparse.ArgumentParser(
        prog="eventing",
        description="Couchbase-Eventing-style mutation processing: deploy Python handlers on Ray workers that "
        "own vBuckets, keep per-document order and checkpoint their progress.",
        epilog="Quick start: eventing demo   |   Typical flow: eventing bucket create customers; "
        "eventing bucket load customers; eventing deploy functions/fn_email.json; eventing run --until-caught-up",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, func, help_text: str, parent=sub) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    bucket = sub.add_parser("bucket", help="local buckets: create, load, upsert, delete, get, info, list",
                            description="Local buckets (SQLite files under the data directory).")
    bsub = bucket.add_subparsers(dest="bucket_command", metavar="ACTION", required=True)
    p = add("create", cmd_bucket_create, "create an empty bucket", bsub)
    p.add_argument("name")
    p.add_argument("--exist-ok", action="store_true", help="do nothing if it exists")
    add("list", cmd_bucket_list, "list buckets", bsub)
    p = add("load", cmd_bucket_load, "generate faker mutations, or import JSON lines from a file or stdin", bsub)
    p.add_argument("name")
    p.add_argument("--documents", type=int, default=10_000, help="distinct documents (default 10000)")
    p.add_argument("--mutations", type=int, default=100_000, help="total mutations, >= documents (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="same seed, same mutations (default 0)")
    p.add_argument("--prefix", default="customer", help="key prefix (default customer)")
    p.add_argument("--file", help='JSON lines: {"key":..., "doc":{...}} or {"key":..., "op":"delete"}; - for stdin')
    p = add("upsert", cmd_bucket_upsert, "create or replace one document", bsub)
    p.add_argument("name")
    p.add_argument("key")
    p.add_argument("doc", help="the document as a JSON object")
    p.add_argument("--expiry", type=int, default=0, help="epoch seconds after which it expires (0: never)")
    p = add("delete", cmd_bucket_delete, "delete one document (a tombstone mutation)", bsub)
    p.add_argument("name")
    p.add_argument("key")
    p = add("get", cmd_bucket_get, "print one document", bsub)
    p.add_argument("name")
    p.add_argument("key")
    p = add("info", cmd_bucket_info, "documents, mutations and identity of a bucket", bsub)
    p.add_argument("name")
    p = add("expire", cmd_bucket_expire, "turn documents past their expiry into expiration mutations", bsub)
    p.add_argument("name")

    p = add("create", cmd_create, "save a function definition (JSON + handler file) without deploying it")
    p.add_argument("file")
    p = add("deploy", cmd_deploy, "deploy a function: a definition file (saved first) or a stored function's name")
    p.add_argument("function", help="NAME or path/to/definition.json")
    p.add_argument("--boundary", choices=["everything", "from_now"], default=None,
                   help="feed boundary: all mutations from seqno 0, or only new ones (default: the definition's)")
    p = add("pause", cmd_pause, "pause a deployed function: workers checkpoint and stop")
    p.add_argument("function")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for a running service (default 60)")
    p = add("resume", cmd_resume, "resume a paused function right after its checkpoints")
    p.add_argument("function")
    p = add("undeploy", cmd_undeploy, "undeploy a function: workers stop and checkpoints are dropped")
    p.add_argument("function")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for a running service (default 60)")
    p = add("delete", cmd_delete, "delete an undeployed function's definition")
    p.add_argument("function")
    add("list", cmd_list, "list functions and their states")
    p = add("status", cmd_status, "function states and whether an eventing service is running")
    p.add_argument("function", nargs="?")
    p = add("export", cmd_export, "print a function definition with its handler source as JSON")
    p.add_argument("function")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p = add("import", cmd_import, "import function definitions exported with `eventing export`")
    p.add_argument("file")

    p = add("run", cmd_run, "run every deployed function on Ray workers (Ctrl-C stops after a checkpoint)")
    p.add_argument("--until-caught-up", action="store_true",
                   help="stop once the high seqnos seen at start are processed and checkpointed")
    p.add_argument("--ray-address", default=os.environ.get("EVENTING_RAY_ADDRESS"),
                   help="join an existing Ray cluster (default: start a local Ray instance)")
    p.add_argument("--executor", choices=["ray", "in-process"], default="ray",
                   help="ray (default) or in-process (one process, for debugging and tests)")
    p.add_argument("--function", action="append", help="run only this function (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress and no summary")
    p.add_argument("--standby", action="store_true",
                   help="wait as a standby while another service leads; take over (resuming every function from "
                        "its checkpoints) within seconds of its death")
    p.add_argument("--failover-timeout", metavar="DURATION", default=None,
                   help="fail over an eventing node whose Ray node is down this long, e.g. 10s; 0 turns it off "
                        "(default: $EVENTING_FAILOVER_TIMEOUT or 10s)")
    p = add("vbmap", cmd_vbmap, "which worker owns which vBucket ranges")
    p.add_argument("function")
    p = add("stats", cmd_stats, "mutations seen, handler successes and failures, checkpoint lag, throughput")
    p.add_argument("function")

    p = add("demo", cmd_demo, "the main job on embedded defaults: load customers, deploy fn_email and fn_score, "
            "process everything on a local Ray instance, print stats and vBucket maps")
    p.add_argument("--documents", type=int, default=20_000)
    p.add_argument("--mutations", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ray-address", default=os.environ.get("EVENTING_RAY_ADDRESS"))
    p.add_argument("--executor", choices=["ray", "in-process"], default="ray")

    # Commands that live in their own modules register themselves here: register(sub, add).
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub, add)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    # --data-dir and --json may come before or after the subcommand; absent means default.
    args.data_dir = getattr(args, "data_dir", None)
    args.json = getattr(args, "json", False)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except (EventingError, InvalidKeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
