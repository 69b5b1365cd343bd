"""`eventing backup [-o FILE]` and `eventing restore FILE`: the metadata store to a file and back."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eventing.cli.common import existing_state, state_of
from eventing.cli.output import emit_json


def cmd_backup(args: argparse.Namespace) -> int:
    from eventing.ops.backup import backup

    result = backup(existing_state(args), args.output, with_buckets=args.with_buckets)
    if args.json:
        emit_json(result)
        return 0
    folders = result["created_folders"]
    if folders:
        they = "it" if len(folders) == 1 else "they"
        print(
            f"created the folder{'' if len(folders) == 1 else 's'} {', '.join(folders)} ({they} did not "
            "exist)"
        )
    if args.with_buckets:
        functions = f"{result['functions']} function" + ("" if result["functions"] == 1 else "s")
        buckets = ", ".join(result["buckets"]) or "none"
        print(
            f"backed up the metadata store ({functions}) and buckets ({buckets}), {result['bytes']:,} bytes, "
            f"to {result['folder']}; restore them with `eventing restore {result['folder']}`"
        )
    else:
        functions = f"{result['functions']} function" + ("" if result["functions"] == 1 else "s")
        print(
            f"backed up the metadata store ({functions}, {result['bytes']:,} bytes) to "
            f"{result['file']}; restore it with `eventing restore {result['file']}` (buckets are not in it: "
            "`--with-buckets` copies them too)"
        )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from eventing.ops.backup import restore

    result = restore(state_of(args), args.file)
    if args.json:
        emit_json(result)
        return 0
    kept = f"; the replaced store is kept as {result['previous']}" if result["previous"] else ""
    print(f"restored the metadata store {result['restored']} from {result['from']}{kept}")
    for f in result["functions"]:
        print(f"  {f['name']}: {f['state']}")
    if result["buckets_restored"]:
        print(f"restored buckets: {', '.join(result['buckets_restored'])}")
    for name in result["buckets_kept"]:
        print(
            f"bucket '{name}' exists here: kept it (the backup's copy was not restored; "
            f"`eventing bucket drop {name}` first to restore the backup's)"
        )
    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if result["warnings"]:
        print(
            "functions whose buckets are here resume after the restored checkpoints; the others fail to "
            "start until their buckets are back"
        )
    else:
        print(
            "functions resume after the restored checkpoints; effects already applied are not applied again"
        )
    return 0


def register(sub: Any, add: Any) -> None:
    p = add(
        "backup",
        cmd_backup,
        "copy the metadata store (definitions, states, checkpoints, dead letters) to a file; safe while "
        "eventing runs (SQLite online backup; a Couchbase store is backed up with cbbackupmgr)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write it (default: DATA_DIR/backups/metadata-<UTC time>.sqlite3; with "
        "--with-buckets a new folder, default DATA_DIR/backups/backup-<UTC time>/); folders "
        "it names that do not exist are created, and the command says which",
    )
    p.add_argument(
        "--with-buckets",
        action="store_true",
        help="also copy every bucket (SQLite online backup), into a folder laid out as a data "
        "directory; `eventing restore FOLDER` brings both back",
    )
    p = add(
        "restore",
        cmd_restore,
        "replace the metadata store with a backup (refused while an eventing service runs; the replaced "
        "file is kept as metadata.sqlite3.bak)",
    )
    p.add_argument(
        "file",
        help="a file written by `eventing backup`, or a folder written by "
        "`eventing backup --with-buckets` (its buckets are restored where none of that "
        "name exists)",
    )
