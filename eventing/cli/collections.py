"""`eventing collection create|list|drop`: the scopes and collections of a bucket (eventing.core.keyspaces).

A collection is named by its keyspace, BUCKET.SCOPE.COLLECTION (`` `bu.cket`.scope.collection`` for a
bucket name with dots); its scope comes and goes with its collections. Dropping a collection deletes its
documents and first undeploys the deployed or paused functions that read or bind it, as Couchbase does.
"""

from __future__ import annotations

import argparse
from typing import Any

from eventing.cli.common import state_of, writable_state
from eventing.cli.output import emit_json, table
from eventing.core.wording import counted


def cmd_collection_create(args: argparse.Namespace) -> int:
    from eventing.errors import ConfigError
    from eventing.ops import buckets, mirrors

    if args.mirror is None and (args.table or args.publication or args.slot):
        raise ConfigError("--table, --publication and --slot describe a mirror: give --mirror URL too")
    if args.mirror is not None:
        if not args.table:
            raise ConfigError(
                "--mirror needs --table SCHEMA.TABLE: the table whose rows the collection follows"
            )
        result = mirrors.create_mirror(
            writable_state(args),
            args.keyspace,
            source=_mirror_url(args.mirror),
            table=args.table,
            publication=args.publication,
            slot=args.slot,
        )
        if args.json:
            emit_json(result)
        else:
            m = result["mirror"]
            print(
                f"collection '{result['keyspace']}' mirrors table {m['table']} of {m['source']} (slot "
                f"{m['slot']}, publication {m['publication']}); the running service (`eventing run`) takes "
                "its snapshot and follows the table"
            )
        return 0
    result = buckets.create_collection(writable_state(args), args.keyspace)
    if args.json:
        emit_json(result)
    else:
        print(
            f"collection '{result['keyspace']}' ready (id {result['id']}); load it with "
            f"`eventing bucket load {result['keyspace']} --file FILE`"
        )
    return 0


def _mirror_url(given: str) -> str:
    """--mirror's URL; `-` reads it from $EVENTING_MIRROR_URL instead, so a password stays off the command
    line (and out of `ps`)."""
    import os

    from eventing.errors import ConfigError

    if given != "-":
        return given
    url = os.environ.get("EVENTING_MIRROR_URL", "").strip()
    if not url:
        raise ConfigError("--mirror - reads the URL from $EVENTING_MIRROR_URL, which is not set")
    return url


def cmd_collection_resync(args: argparse.Namespace) -> int:
    from eventing.ops import mirrors

    result = mirrors.resync_mirror(writable_state(args), args.keyspace)
    if args.json:
        emit_json(result)
    else:
        print(
            f"mirror '{result['keyspace']}' will take a new snapshot (generation {result['generation']}) on "
            "a new slot; the running service does it now, or at its next start"
        )
    return 0


def cmd_collection_list(args: argparse.Namespace) -> int:
    from eventing.ops import buckets

    rows = buckets.list_collections(state_of(args), args.bucket)
    if args.json:
        emit_json(rows)
    else:
        print(
            table(
                ["keyspace", "scope", "collection", "id", "documents", "mirror of"],
                [
                    [
                        r["keyspace"],
                        r["scope"],
                        r["collection"],
                        r["id"],
                        r["documents"],
                        r.get("mirror") or "",
                    ]
                    for r in rows
                ],
            )
        )
    return 0


def cmd_collection_drop(args: argparse.Namespace) -> int:

    from eventing.ops import mirrors

    result = mirrors.drop_collection(writable_state(args), args.keyspace, force=args.force)
    if args.json:
        emit_json(result)
    else:
        for gone in result["undeployed_functions"]:
            print(
                f"undeployed function '{gone['function']}': collection '{result['keyspace']}' is its "
                f"{gone['role']} (deploy it again once the collection is back)"
            )
        print(f"dropped collection '{result['keyspace']}' with {counted(result['documents'], 'document')}")
        if result.get("mirror"):
            m = result["mirror"]
            kept = m.get("slot_kept")
            print(
                f"  slot {m['slot']} {'kept (drop it by hand)' if kept else 'dropped'}"
                + (f", publication {m['publication']} dropped" if m.get("own_publication") else "")
            )
        if result["named_by_undeployed_functions"]:
            names = ", ".join(result["named_by_undeployed_functions"])
            print(f"  undeployed functions still name it ({names}); recreate it before deploying them")
    return 0


def register(sub: Any, add: Any) -> None:
    collection = sub.add_parser(
        "collection",
        help="scopes and collections of a bucket: create, list, drop",
        description="Scopes and collections of a bucket, named BUCKET.SCOPE.COLLECTION.",
    )
    csub = collection.add_subparsers(dest="collection_command", metavar="ACTION", required=True)
    p = add(
        "create",
        cmd_collection_create,
        "create a collection (and its scope) in an existing bucket; with "
        "--mirror, one whose documents follow a PostgreSQL table",
        csub,
    )
    p.add_argument("keyspace", metavar="BUCKET.SCOPE.COLLECTION")
    p.add_argument(
        "--mirror",
        metavar="URL",
        default=None,
        help="mirror a table of this PostgreSQL database (postgresql://user[:password]@host/db; `-`: "
        "read it from $EVENTING_MIRROR_URL): a snapshot, then every change by logical replication "
        "(docs/postgresql-mirror.md)",
    )
    p.add_argument("--table", metavar="SCHEMA.TABLE", default=None, help="the table a mirror follows")
    p.add_argument(
        "--publication",
        default=None,
        help="an existing publication of the table to use (default: one the command creates)",
    )
    p.add_argument(
        "--slot", default=None, help="the replication slot's name (default: eventing_<keyspace>_<hash>)"
    )
    p = add(
        "resync",
        cmd_collection_resync,
        "take a new snapshot of a mirror on a new slot (after its slot was dropped by hand)",
        csub,
    )
    p.add_argument("keyspace", metavar="BUCKET.SCOPE.COLLECTION")
    p = add("list", cmd_collection_list, "the collections of a bucket with their documents", csub)
    p.add_argument("bucket", metavar="BUCKET")
    p = add(
        "drop",
        cmd_collection_drop,
        "delete a collection and its documents; deployed or paused functions that read or bind it are "
        "undeployed first; a mirror's slot and publication are dropped too",
        csub,
    )
    p.add_argument("keyspace", metavar="BUCKET.SCOPE.COLLECTION")
    p.add_argument(
        "--force",
        action="store_true",
        help="a mirror whose source cannot be reached: drop it anyway, leaving its slot (drop that by hand)",
    )
