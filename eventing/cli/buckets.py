"""`eventing bucket ...`: create, load, browse and change local buckets. Where a command takes a bucket's
documents it takes a keyspace too (`bucket.scope.collection`, eventing.core.keyspaces): a bare bucket
name is its default collection."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from typing import Any

from eventing.cli.common import (
    EXIT_INTERRUPTED,
    parse_doc_arg,
    positive_int,
    state_of,
    store_int,
    writable_state,
)
from eventing.cli.output import emit_json, progress_enabled, table
from eventing.core import xattrs as xattr_codec
from eventing.core.wording import counted
from eventing.errors import (
    ConfigError,
    NotFoundError,
    StoreError,
)
from eventing.storage.keyspace import open_keyspace
from eventing.storage.writes import chunked


def cmd_bucket_create(args: argparse.Namespace) -> int:
    state = writable_state(args)
    bucket = state.create_bucket(args.name, exist_ok=args.exist_ok, partitions=args.partitions)
    if args.json:
        emit_json(bucket.stats())
    else:
        parts = bucket.stats()["partitions"]
        where = bucket.path or state.shown  # a file, or the server's tables (a PostgreSQL store)
        print(f"bucket '{args.name}' ready ({where}{f', {parts} partitions' if parts > 1 else ''})")
    return 0


def cmd_bucket_list(args: argparse.Namespace) -> int:
    state = state_of(args)
    rows = []
    for name in state.bucket_names():
        bucket = state.open_bucket(name)
        rows.append(bucket.stats())
        bucket.close()
    if args.json:
        emit_json(rows)
    elif not rows:
        print(f"no buckets in {state.shown}; create one with `eventing bucket create NAME`")
    else:
        print(
            table(
                ["bucket", "documents", "tombstones", "mutations", "partitions"],
                [[r["name"], r["documents"], r["tombstones"], r["mutations"], r["partitions"]] for r in rows],
            )
        )
    return 0


def cmd_bucket_load(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from eventing.ops.jsonl import json_line_rows

    state = writable_state(args)
    bucket = open_keyspace(state, args.name)  # a bucket's default collection, or the collection named
    bucket.bucket.verify_integrity()  # never add to a damaged file: one line naming it and the way out
    start = time.perf_counter()
    rejected: list[str] = []
    if args.file:
        if args.file != "-" and not os.path.isfile(args.file):
            what = "is a directory" if os.path.isdir(args.file) else "does not exist"
            raise NotFoundError(
                f"file {args.file} {what}; give a JSON lines file with --file (or - for stdin)"
            )
        batches = json_line_rows(args.file, rejected)
        total = None
    else:
        from eventing.storage import loadgen

        if args.documents < 1 or args.mutations < args.documents:
            raise ConfigError("--mutations must be >= --documents >= 1 (each document is created once first)")
        writes = loadgen.generate(args.documents, args.mutations, seed=args.seed, prefix=args.prefix)
        batches = ([(w.key, w.op, w.doc, w.expiry) for w in chunk] for chunk in chunked(writes, 20_000))
        total = args.mutations
    written = skipped = 0
    try:
        with tqdm(
            total=total, unit="mut", disable=args.json or not progress_enabled(), desc=f"load {args.name}"
        ) as bar:
            for rows in batches:
                done = bucket.load_rows(rows)  # one transaction: a batch is committed whole or not at all
                written += done
                skipped += len(rows) - done
                bar.update(len(rows))
    except StoreError as exc:  # a full disk, a damaged file: say what the batches before it committed
        raise type(exc)(
            f"{exc}; {counted(written, 'mutation')} of this load "
            f"{'was' if written == 1 else 'were'} committed to '{args.name}' before it "
            "(loading again adds every mutation of the load again)"
        ) from None
    except KeyboardInterrupt:
        # Chunks are transactions: what was counted is committed, the chunk in flight was rolled back.
        message = (
            f"interrupted: {counted(written, 'mutation')} committed to '{args.name}' before Ctrl-C; the rest "
            "was not loaded (run the load again for it: a seed gives the same mutations again)"
        )
        if args.json:
            print(
                json.dumps({"error": message, "exit": EXIT_INTERRUPTED, "mutations_written": written}),
                file=sys.stderr,
            )
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
        print(
            f"loaded {counted(written, 'mutation')} into '{args.name}' in {seconds:.1f}s "
            f"({summary['mutations_per_s']:,}/s)"
        )
        if skipped:
            print(f"  {skipped:,} deletes named documents that do not exist; nothing was logged for them")
        for line in rejected[:20]:
            print(f"  rejected: {line}", file=sys.stderr)
        if len(rejected) > 20:
            print(f"  ... and {len(rejected) - 20} more rejected lines", file=sys.stderr)
    return 1 if rejected else 0


def cmd_bucket_upsert(args: argparse.Namespace) -> int:
    from eventing.kv.protocol import RELATIVE_EXPIRY_LIMIT, absolute_expiry
    from eventing.ops.jsonl import MAX_EXPIRY

    if not 0 <= args.expiry <= MAX_EXPIRY:
        raise ConfigError(
            f"--expiry is {args.expiry}; give seconds from now (up to {RELATIVE_EXPIRY_LIMIT}, 30 days), the "
            f"Unix time when the document expires (up to {MAX_EXPIRY}), or 0 for never"
        )
    expiry = absolute_expiry(args.expiry, time.time())  # Couchbase's rule: up to 30 days is from now
    with open_keyspace(writable_state(args), args.name) as bucket:
        vb, seqno = bucket.upsert(args.key, _document_arg(args.doc), expiry=expiry)
    _print_write(args, "upserted", vb, seqno)
    return 0


def _document_arg(text: str) -> object:
    """A JSON object as handlers read it (a dict); any other JSON value (a string, number, array, true, false,
    null) as its JSON text, as the Data API and the SDKs store them and handlers write them."""
    from eventing.ops.jsonl import stored_document

    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return parse_doc_arg(text)  # its one-line error names the quoting
    if isinstance(value, dict):
        return parse_doc_arg(text)
    return stored_document(value)  # as `bucket load --file` stores the same value


def _shown(doc: object) -> tuple[object, str]:
    """A stored document as JSON and its kind: an object; a JSON value kept as its text; UTF-8 text that is
    not JSON (as a string); or binary bytes (as base64)."""
    if not isinstance(doc, bytes):
        return doc, "json"
    try:
        text = doc.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(doc).decode(), "binary"
    try:
        return json.loads(text), "json"
    except ValueError:
        return text, "text"


def cmd_bucket_delete(args: argparse.Namespace) -> int:
    with open_keyspace(writable_state(args), args.name) as bucket:
        vb, seqno = bucket.delete(args.key)
    _print_write(args, "deleted", vb, seqno)
    return 0


def _print_write(args: argparse.Namespace, verb: str, vb: int, seqno: int) -> None:
    if args.json:
        emit_json({"key": args.key, "vb": vb, "seqno": seqno})
    else:
        print(f"{verb} '{args.key}' (vBucket {vb}, seqno {seqno})")


def cmd_bucket_get(args: argparse.Namespace) -> int:
    with open_keyspace(state_of(args), args.name) as bucket:
        bucket.stored(args.key)  # the key's rules first
        bucket.bucket.verify_integrity()  # a miss on a damaged file must not read as "does not exist"
        doc = bucket.get(args.key)
        if doc is None:
            raise NotFoundError(f"document '{args.key}' does not exist in {bucket.keyspace_phrase()}")
        meta = bucket.get_meta(args.key)
    value, kind = _shown(doc)
    if args.json:
        xattrs = meta.pop("xattrs", None) if meta else None
        emit_json(
            {
                "key": args.key,
                "meta": meta,
                "doc": value,
                **({"datatype": kind} if kind != "json" else {}),
                **({"xattrs": xattr_codec.decode(xattrs)} if xattrs is not None else {}),
            }
        )
    elif kind == "json":
        print(json.dumps(value, indent=2, ensure_ascii=False))
    elif kind == "text":
        print(value)
    else:
        print(f"(binary document, {len(doc)} bytes, base64) {value}")
    return 0


def cmd_bucket_info(args: argparse.Namespace) -> int:
    with state_of(args).open_bucket(args.name) as bucket:
        stats = bucket.stats()
    if args.json:
        emit_json(stats)
    else:
        for k, v in stats.items():
            print(f"{k:>20}: {v}")
    return 0


def cmd_bucket_expire(args: argparse.Namespace) -> int:
    state = writable_state(args)
    try:
        opened = state.open_bucket(args.name)
    except NotFoundError:
        _refuse_a_collection(state, args.name)
        raise
    with opened as bucket:
        n = bucket.expire_due()
    if args.json:
        emit_json({"bucket": args.name, "expired": n})
    else:
        print(f"{n} expired documents turned into expiration mutations")
    return 0


def _refuse_a_collection(state: Any, name: str) -> None:
    """`name` is no bucket: if it is a collection of one (bucket.scope.collection), say that expiry runs
    over the whole bucket, every collection of it."""
    bucket = name.split(".", 1)[0]
    if "." not in name or not state.has_bucket(bucket):
        return
    raise ConfigError(
        f"'{name}' is a collection; `eventing bucket expire` turns the due documents of a whole bucket into "
        f"expirations, every collection of it: run `eventing bucket expire {bucket}`"
    )


def cmd_bucket_keys(args: argparse.Namespace) -> int:
    with open_keyspace(state_of(args), args.name) as bucket:
        keys = bucket.keys(args.prefix, args.limit)
    if args.json:
        emit_json(keys)
    else:
        for key in keys:
            print(key)
    return 0


def _doc_line(key: str, doc: object, meta: dict) -> dict:
    # `bucket load --file` reads key, doc (with its datatype), expiry and xattrs back and ignores meta.
    value, kind = _shown(doc)  # a JSON value as it is; text and binary marked, as `bucket get --json` does
    line: dict[str, Any] = {"key": key, "doc": value}
    if kind != "json":
        line["datatype"] = kind
    if meta["expiry"]:
        line["expiry"] = meta["expiry"]
    xattrs = meta.pop("xattrs", None)
    if xattrs is not None:  # the document's extended attributes, user and system ones, as JSON
        line["xattrs"] = xattr_codec.decode(xattrs)
    line["meta"] = meta
    return line


def cmd_bucket_scan(args: argparse.Namespace) -> int:
    with open_keyspace(state_of(args), args.name) as bucket:
        lines = (_doc_line(*item) for item in bucket.scan(args.prefix, args.limit))
        if args.json:
            emit_json(list(lines))
        else:
            for line in lines:
                print(json.dumps(line, separators=(",", ":"), default=str))
    return 0


def cmd_bucket_export(args: argparse.Namespace) -> int:
    bucket = open_keyspace(state_of(args), args.name)
    count = 0
    try:
        out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        bucket.close()
        raise ConfigError(
            f"cannot write {args.output}: {exc.strerror}; pick a writable path with -o"
        ) from None
    try:
        for item in bucket.scan(args.prefix, args.limit):
            out.write(json.dumps(_doc_line(*item), separators=(",", ":"), default=str) + "\n")
            count += 1
    finally:
        bucket.close()
        if out is not sys.stdout:
            out.close()
    summary = {"bucket": args.name, "documents": count, "file": args.output}
    if args.output != "-":
        if args.json:
            emit_json(summary)
        else:
            print(
                f"exported {counted(count, 'document')} of '{args.name}' to {args.output} "
                f"(read back with `eventing bucket load NAME --file {args.output}`)"
            )
    return 0


def cmd_bucket_count(args: argparse.Namespace) -> int:
    with open_keyspace(state_of(args), args.name) as bucket:
        count = bucket.count()
    if args.json:
        emit_json({"bucket": args.name, "documents": count})
    else:
        print(count)
    return 0


def cmd_bucket_drop(args: argparse.Namespace) -> int:
    from eventing.ops import buckets

    result = buckets.drop(state_of(args), args.name)
    if args.json:
        emit_json(result)
    elif result["documents"] is None:
        print(f"dropped bucket '{args.name}': deleted the damaged {result['path']} and the rest of its files")
    else:
        documents = counted(result["documents"], "document")
        tombstones = counted(result["tombstones"], "tombstone")
        print(
            f"dropped bucket '{args.name}': deleted {result['path']} with {documents}, {tombstones} and a "
            f"log of {counted(result['mutations'], 'mutation')}"
        )
        if result["named_by_undeployed_functions"]:
            names = ", ".join(result["named_by_undeployed_functions"])
            print(f"  undeployed functions still name it ({names}); recreate it before deploying them")
    return 0


def cmd_bucket_flush(args: argparse.Namespace) -> int:
    from eventing.ops import buckets

    result = buckets.flush(state_of(args), args.name)
    if args.json:
        emit_json(result)
    elif "keyspace" in result:
        documents = counted(result["documents"], "document")
        print(
            f"flushed collection '{result['keyspace']}': deleted {documents}, one delete "
            "mutation each (functions reading it handle them); the bucket's other collections are unchanged"
        )
    else:
        documents = counted(result["documents"], "document")
        tombstones = counted(result["tombstones"], "tombstone")
        print(
            f"flushed bucket '{args.name}': deleted {documents}, {tombstones} and a log of "
            f"{counted(result['mutations'], 'mutation')}; "
            "it has a new identity, so functions deployed later start from seqno 0"
        )
    return 0


KEYSPACE_HELP = "a bucket (its default collection) or BUCKET.SCOPE.COLLECTION"


def register(sub: Any, add: Any) -> None:
    bucket = sub.add_parser(
        "bucket",
        help="local buckets: create, load, upsert, delete, get, info, list, keys, scan, export, "
        "count, drop, flush",
        description="Local buckets (SQLite files under the data directory). load, get, upsert, "
        "delete, keys, scan, export, count and flush take a keyspace BUCKET.SCOPE.COLLECTION "
        "where they take a bucket name.",
    )
    bsub = bucket.add_subparsers(dest="bucket_command", metavar="ACTION", required=True)
    p = add("create", cmd_bucket_create, "create an empty bucket", bsub)
    p.add_argument("name")
    p.add_argument("--exist-ok", action="store_true", help="do nothing if it exists")
    p.add_argument(
        "--partitions",
        type=int,
        default=1,
        metavar="N",
        help="spread its vBuckets over N files (1-64, default 1): workers that write documents of "
        "their own vBuckets (N = the writing function's worker count) then write in parallel; "
        "see docs/handler-api.md",
    )
    add("list", cmd_bucket_list, "list buckets", bsub)
    p = add(
        "load", cmd_bucket_load, "generate faker mutations, or import JSON lines from a file or stdin", bsub
    )
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
    p.add_argument("--documents", type=store_int, default=10_000, help="distinct documents (default 10000)")
    p.add_argument(
        "--mutations", type=store_int, default=100_000, help="total mutations, >= documents (default 100000)"
    )
    p.add_argument("--seed", type=int, default=0, help="same seed, same mutations (default 0)")
    p.add_argument("--prefix", default="customer", help="key prefix (default customer)")
    p.add_argument(
        "--file",
        help='JSON lines: {"key":..., "doc":...} (any JSON value, as upsert takes; "datatype": "binary" with '
        'base64 or "text", as bucket export writes) or {"key":..., "op":"delete"}; - for stdin',
    )
    p = add("upsert", cmd_bucket_upsert, "create or replace one document", bsub)
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
    p.add_argument("key")
    p.add_argument("doc", help="the document as a JSON object")
    p.add_argument(
        "--expiry",
        type=store_int,
        default=0,
        metavar="SECONDS",
        help="when it expires, as in Couchbase: up to 2592000 (30 days) seconds from now, a larger number "
        "the Unix time (0: never)",
    )
    p = add("delete", cmd_bucket_delete, "delete one document (a tombstone mutation)", bsub)
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
    p.add_argument("key")
    p = add("get", cmd_bucket_get, "print one document", bsub)
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
    p.add_argument("key")
    p = add("info", cmd_bucket_info, "documents, mutations and identity of a bucket", bsub)
    p.add_argument("name")
    p = add("expire", cmd_bucket_expire, "turn documents past their expiry into expiration mutations", bsub)
    p.add_argument("name")
    p = add("keys", cmd_bucket_keys, "list document keys in key order", bsub)
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
    p.add_argument("--prefix", default="", help="only keys starting with this")
    p.add_argument("--limit", type=positive_int, help="at most this many keys")
    p = add(
        "scan",
        cmd_bucket_scan,
        "print documents as JSON lines {key, doc, meta} in key order (--json: one JSON array)",
        bsub,
    )
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
    p.add_argument("--prefix", default="", help="only keys starting with this")
    p.add_argument("--limit", type=positive_int, help="at most this many documents")
    p = add(
        "export",
        cmd_bucket_export,
        "write documents as JSON lines that `bucket load --file` reads back",
        bsub,
    )
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write; - for stdout")
    p.add_argument("--prefix", default="", help="only keys starting with this")
    p.add_argument("--limit", type=positive_int, help="at most this many documents")
    p = add("count", cmd_bucket_count, "how many documents a bucket holds (tombstones not counted)", bsub)
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
    p = add(
        "drop",
        cmd_bucket_drop,
        "delete a bucket: its file, documents, mutation log and effect marks (refused while a deployed or "
        "paused function uses it)",
        bsub,
    )
    p.add_argument("name")
    p = add(
        "flush",
        cmd_bucket_flush,
        "empty a bucket: documents and mutation log deleted, new identity (refused while a deployed or "
        "paused function uses it); of a collection BUCKET.SCOPE.COLLECTION: each of its documents deleted, a "
        "delete mutation each",
        bsub,
    )
    p.add_argument("name", metavar="KEYSPACE", help=KEYSPACE_HELP)
