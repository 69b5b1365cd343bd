"""`eventing backup [-o FILE]` and `eventing restore FILE`: the metadata store to a file and back."""

from __future__ import annotations

import argparse
from typing import Any

from eventing.cli.common import data_dir_of, existing_data_dir
from eventing.cli.output import emit_json


def cmd_backup(args: argparse.Namespace) -> int:
    from eventing.ops.backup import backup

    result = backup(existing_data_dir(args), args.output)
    if args.json:
        emit_json(result)
    else:
        functions = f"{result['functions']} function" + ("" if result["functions"] == 1 else "s")
        print(f"backed up the metadata store ({functions}, {result['bytes']:,} bytes) to "
              f"{result['file']}; restore it with `eventing restore {result['file']}`")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from eventing.ops.backup import restore

    result = restore(data_dir_of(args), args.file)
    if args.json:
        emit_json(result)
        return 0
    kept = f"; the replaced store is kept as {result['previous']}" if result["previous"] else ""
    print(f"restored the metadata store {result['restored']} from {result['from']}{kept}")
    for f in result["functions"]:
        print(f"  {f['name']}: {f['state']}")
    print("functions resume after the restored checkpoints; effects already applied are not applied again")
    return 0


def register(sub: Any, add: Any) -> None:
    p = add("backup", cmd_backup,
            "copy the metadata store (definitions, states, checkpoints, dead letters) to a file; safe while "
            "eventing runs (SQLite online backup; a Couchbase store is backed up with cbbackupmgr)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write it (default: DATA_DIR/backups/metadata-<UTC time>.sqlite3)")
    p = add("restore", cmd_restore,
            "replace the metadata store with a backup (refused while an eventing service runs; the replaced "
            "file is kept as metadata.sqlite3.bak)")
    p.add_argument("file", help="a file written by `eventing backup`")
