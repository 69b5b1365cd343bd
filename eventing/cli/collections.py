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
    from eventing.ops import buckets

    result = buckets.create_collection(writable_state(args), args.keyspace)
    if args.json:
        emit_json(result)
    else:
        print(f"collection '{result['keyspace']}' ready (id {result['id']}); load it with "
              f"`eventing bucket load {result['keyspace']} --file FILE`")
    return 0


def cmd_collection_list(args: argparse.Namespace) -> int:
    from eventing.ops import buckets

    rows = buckets.list_collections(state_of(args), args.bucket)
    if args.json:
        emit_json(rows)
    else:
        print(table(["keyspace", "scope", "collection", "id", "documents"],
                    [[r["keyspace"], r["scope"], r["collection"], r["id"], r["documents"]] for r in rows]))
    return 0


def cmd_collection_drop(args: argparse.Namespace) -> int:
    from eventing.ops import buckets

    result = buckets.drop_collection(writable_state(args), args.keyspace)
    if args.json:
        emit_json(result)
    else:
        for gone in result["undeployed_functions"]:
            print(f"undeployed function '{gone['function']}': collection '{result['keyspace']}' is its "
                  f"{gone['role']} (deploy it again once the collection is back)")
        print(f"dropped collection '{result['keyspace']}' with {counted(result['documents'], 'document')}")
        if result["named_by_undeployed_functions"]:
            names = ", ".join(result["named_by_undeployed_functions"])
            print(f"  undeployed functions still name it ({names}); recreate it before deploying them")
    return 0


def register(sub: Any, add: Any) -> None:
    collection = sub.add_parser("collection", help="scopes and collections of a bucket: create, list, drop",
                                description="Scopes and collections of a bucket, named BUCKET.SCOPE.COLLECTION.")
    csub = collection.add_subparsers(dest="collection_command", metavar="ACTION", required=True)
    p = add("create", cmd_collection_create, "create a collection (and its scope) in an existing bucket", csub)
    p.add_argument("keyspace", metavar="BUCKET.SCOPE.COLLECTION")
    p = add("list", cmd_collection_list, "the collections of a bucket with their documents", csub)
    p.add_argument("bucket", metavar="BUCKET")
    p = add("drop", cmd_collection_drop,
            "delete a collection and its documents; deployed or paused functions that read or bind it are undeployed first",
            csub)
    p.add_argument("keyspace", metavar="BUCKET.SCOPE.COLLECTION")
