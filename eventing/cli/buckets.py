"""`eventing bucket ...`: create, load, browse and change local buckets."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from eventing.cli.common import EXIT_INTERRUPTED, data_dir_of, parse_doc_arg, writable_data_dir
from eventing.cli.output import emit_json, progress_enabled, table
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.errors import ConfigError, EventingError, InvalidDocumentError, InvalidKeyError, NotFoundError
from eventing.storage.bucket import LocalBucket, Write, chunked, list_buckets
from sharding import validate_key


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
        if args.file != "-" and not os.path.isfile(args.file):
            what = "is a directory" if os.path.isdir(args.file) else "does not exist"
            raise NotFoundError(f"file {args.file} {what}; give a JSON lines file with --file (or - for stdin)")
        writes = _json_lines(args.file, rejected)
        total = None
    else:
        from eventing.storage import loadgen

        if args.documents < 1 or args.mutations < args.documents:
            raise ConfigError("--mutations must be >= --documents >= 1 (each document is created once first)")
        writes = loadgen.generate(args.documents, args.mutations, seed=args.seed, prefix=args.prefix)
        total = args.mutations
    written = skipped = 0
    try:
        with tqdm(total=total, unit="mut", disable=args.json or not progress_enabled(), desc=f"load {args.name}") as bar:
            for chunk in chunked(writes, 20_000):
                results = bucket.write(chunk)  # one transaction: a chunk is committed whole or not at all
                done = sum(1 for r in results if r is not None)
                written += done
                skipped += len(results) - done
                bar.update(len(chunk))
    except KeyboardInterrupt:
        # Chunks are transactions: what was counted is committed, the chunk in flight was rolled back.
        message = (f"interrupted: {written:,} mutations committed to '{args.name}' before Ctrl-C; the rest was not "
                   "loaded (run the load again for it: a seed gives the same mutations again)")
        if args.json:
            print(json.dumps({"error": message, "exit": EXIT_INTERRUPTED, "mutations_written": written}),
                  file=sys.stderr)
        else:
            print(message, file=sys.stderr)
        return EXIT_INTERRUPTED
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
    if args.expiry < 0:
        raise ConfigError(
            f"--expiry is {args.expiry}; give epoch seconds after which the document expires, or 0 for never"
        )
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
    if args.json:
        emit_json({"bucket": args.name, "expired": n})
    else:
        print(f"{n} expired documents turned into expiration mutations")
    return 0


def register(sub: Any, add: Any) -> None:
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
