"""`eventing store copy --from A --to B`: move a deployment's whole state between a data directory and a
PostgreSQL store (eventing.ops.store_copy), and `eventing store info`: where this command's state is."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eventing.cli.common import state_of
from eventing.cli.output import emit_json
from eventing.core.wording import counted


def cmd_store_copy(args: argparse.Namespace) -> int:
    from eventing.ops.store_copy import copy_store
    from eventing.storage.state import open_state

    source, target = open_state(args.source), open_state(args.target)
    try:

        def step(line: str) -> None:
            if not args.json:
                print(f"  {line}", file=sys.stderr, flush=True)

        result = copy_store(source, target, on_step=step)
    finally:
        source.close()
        target.close()
    if args.json:
        emit_json(result)
    else:
        buckets = len(result["buckets"])
        print(
            f"copied {result['from']} to {result['to']}: {buckets} bucket{'s' if buckets != 1 else ''}, "
            f"{result['functions']} function{'s' if result['functions'] != 1 else ''} with their "
            f"checkpoints; run on it with `eventing {_location_option(result['to'])} run`"
        )
    return 0


def _location_option(shown: str) -> str:
    """The option that names a copy's target, quoted for a shell (a URL's `?` and `&` are its syntax)."""
    import shlex

    from metadata.postgres.location import is_postgres_url

    return f"--store {shlex.quote(shown)}" if is_postgres_url(shown) else f"--data-dir {shlex.quote(shown)}"


def cmd_store_info(args: argparse.Namespace) -> int:
    state = state_of(args)
    buckets = state.bucket_names() if state.exists() else []
    info: dict[str, Any] = {
        "store": state.shown,
        "kind": "directory" if state.directory is not None else "postgresql",
        "exists": state.exists(),
        "buckets": buckets,
    }
    if args.json:
        emit_json(info)
    else:
        print(
            f"{info['kind']} store {info['store']}: "
            + (
                f"{counted(len(buckets), 'bucket')} ({', '.join(buckets) or 'none'})"
                if info["exists"]
                else "nothing stored yet"
            )
        )
    return 0


def register(sub: Any, add: Any) -> None:
    store = sub.add_parser(
        "store",
        help="where the state is kept: copy it between a data directory and PostgreSQL",
        description="A deployment's state: a data directory (SQLite files) or a PostgreSQL "
        "store (--store postgresql://...; docs/postgresql.md).",
    )
    ssub = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    p = add(
        "copy",
        cmd_store_copy,
        "copy every bucket, function (with its checkpoints), dead letter, timer, user, window and log from "
        "one store into another, empty one; no service may run on the source",
        ssub,
    )
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="LOCATION",
        help="the store to copy: a data directory or a postgresql:// URL",
    )
    p.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="LOCATION",
        help="the empty store to copy into: a data directory or a postgresql:// URL",
    )
    add(
        "info",
        cmd_store_info,
        "where this command's state is (--store, --data-dir or the default) and its buckets",
        ssub,
    )
