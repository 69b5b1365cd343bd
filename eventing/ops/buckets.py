"""Bucket and collection administration that must agree with the functions using them: dropping or
flushing a bucket is refused while a deployed or paused function reads it as its source or writes it
through a binding; dropping a collection undeploys the functions naming it first, as Couchbase does (not
those taking it through a wildcard, `scope.*` or `*.*`, which run on without it). Flushing a collection
deletes its documents one delete mutation each, which the functions reading it handle like any other."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from eventing.control import lifecycle
from eventing.core.keyspaces import Keyspace
from eventing.core.mutation import OP_DELETE
from eventing.errors import LifecycleError, StoreCorruptError, fix
from eventing.storage import keyspace as keyspaces
from eventing.storage.state import StateLike, as_state
from eventing.storage.values import Write
from metadata import FunctionState

log = logging.getLogger("eventing.ops")


@dataclass(frozen=True)
class BucketUse:
    function: str
    state: str
    role: str  # "source" or "binding 'alias' (rw|r)"
    # The use is through a wildcard (`scope.*`, `*.*`): dropping one collection leaves the function deployed.
    wildcard: bool = False


def bucket_uses(state: StateLike, bucket: str) -> list[BucketUse]:
    """Every stored function that names `bucket` as its source or in a binding, in any state."""
    state = as_state(state)
    uses = []
    for r in _function_records(state):
        d = r.definition
        if d.get("source_bucket") == bucket:
            uses.append(BucketUse(r.name, r.state.value, "source"))
        for b in d.get("bindings", []):
            if b.get("bucket") == bucket:
                uses.append(
                    BucketUse(r.name, r.state.value, f"binding '{b.get('alias')}' ({b.get('access')})")
                )
    return uses


def collection_uses(state: StateLike, keyspace: Keyspace) -> list[BucketUse]:
    """Every stored function whose source keyspace takes the collection (by name, or through a wildcard:
    `scope.*`, `*.*`) or that binds it, in any state."""
    state = as_state(state)
    uses = []
    for r in _function_records(state):
        d = r.definition
        source = Keyspace.of(d.get("source_bucket", ""), d.get("source_scope"), d.get("source_collection"))
        if source.covers(keyspace):
            uses.append(BucketUse(r.name, r.state.value, "source", source.is_wildcard))
        for b in d.get("bindings", []):
            bound = Keyspace.of(b.get("bucket", ""), b.get("scope"), b.get("collection"))
            if "scope" not in b and isinstance(b.get("bucket"), str):
                bound = Keyspace.parse(b["bucket"])  # a binding written as "bucket.scope.collection"
            if bound.covers(keyspace):
                uses.append(
                    BucketUse(
                        r.name,
                        r.state.value,
                        f"binding '{b.get('alias')}' ({b.get('access')})",
                        bound.is_wildcard,
                    )
                )
    return uses


def _function_records(state: StateLike) -> list:
    state = as_state(state)
    if not state.exists():  # no metadata yet: no function uses anything
        return []
    store = state.metadata
    try:
        return store.list_functions()
    finally:
        store.close()


def _refuse_if_in_use(state: StateLike, bucket: str, action: str) -> list[BucketUse]:
    return _refuse_active(bucket_uses(state, bucket), f"cannot {action} bucket '{bucket}'")


def _refuse_active(uses: list[BucketUse], what: str) -> list[BucketUse]:
    active = [u for u in uses if u.state != FunctionState.UNDEPLOYED.value]
    if active:
        u = active[0]
        more = f" (and {len(active) - 1} more)" if len(active) > 1 else ""
        raise LifecycleError(
            f"{what}: it is the {u.role} of function '{u.function}', which is "
            f"{u.state}{more}; undeploy it first ({{fix}})",
            fix=fix("undeploy", function=u.function),
        )
    return uses


def drop(state: StateLike, bucket: str) -> dict:
    """Delete the bucket's file: every document, the mutation log and the effect marks it holds."""
    state = as_state(state)
    uses = _refuse_if_in_use(state, bucket, "drop")
    stats: dict = {"documents": None, "tombstones": None, "mutations": None}  # unknown: a damaged file
    try:
        with state.open_bucket(bucket) as source:
            stats = source.stats()
    except StoreCorruptError:
        pass  # dropping is the way out of a damaged bucket; drop_bucket deletes its files as they are
    path = state.drop_bucket(bucket)
    return {
        "bucket": bucket,
        "path": str(path),
        "documents": stats["documents"],
        "tombstones": stats["tombstones"],
        "mutations": stats["mutations"],
        "named_by_undeployed_functions": sorted({u.function for u in uses}),
    }


def flush(state: StateLike, bucket: str) -> dict:
    """Empty the bucket and give it a new identity (see LocalBucket.flush); `bucket` may name a collection
    (`bucket.scope.collection`): then see flush_collection."""
    state = as_state(state)
    ks = keyspaces.parse_keyspace(state, bucket)
    if not ks.is_default:
        return flush_collection(state, ks)
    _refuse_if_in_use(state, ks.bucket, "flush")
    with state.open_bucket(ks.bucket) as target:
        return target.flush()


FLUSH_PAGE = 1000  # documents deleted per transaction by flush_collection


def flush_collection(state: StateLike, keyspace: str | Keyspace) -> dict:
    """Delete every document of a collection, each a delete mutation (the functions reading it see them),
    a page of documents a transaction. The bucket keeps its identity, log and other collections."""
    state = as_state(state)
    deleted = 0
    with keyspaces.open_keyspace(state, keyspace) as collection:
        collection.check_writable()
        while True:
            keys = collection.keys(limit=FLUSH_PAGE)
            if not keys:
                break
            placed = collection.bucket.write([Write(collection.stored(key), OP_DELETE) for key in keys])
            deleted += sum(1 for p in placed if p is not None)
        return {
            "bucket": collection.keyspace.bucket,
            "keyspace": collection.name,
            "documents": deleted,
            "delete_mutations": deleted,
        }


def list_collections(state: StateLike, bucket: str) -> list[dict]:
    """The collections of a bucket, `_default._default` first: keyspace, scope, collection, id, documents."""
    state = as_state(state)
    with state.open_bucket(bucket) as target:
        rows = []
        mirrored = target.mirrors()
        for ks, cid in keyspaces.list_collections(target):
            rows.append(
                {
                    "keyspace": str(ks),
                    "bucket": ks.bucket,
                    "scope": ks.scope,
                    "collection": ks.collection,
                    "id": cid,
                    "documents": keyspaces.Collection(target, ks, cid).count(),
                    "mirror": mirrored.get(cid),
                }
            )
        return rows


def create_collection(state: StateLike, keyspace: str | Keyspace) -> dict:
    state = as_state(state)
    ks = keyspaces.parse_keyspace(state, keyspace)
    cid = keyspaces.create_collection(state, ks)
    return {
        "keyspace": str(ks),
        "bucket": ks.bucket,
        "scope": ks.scope,
        "collection": ks.collection,
        "id": cid,
    }


def drop_collection(state: StateLike, keyspace: str | Keyspace) -> dict:
    """Drop a collection and its documents. As in Couchbase, a deployed or paused function that reads or
    binds it is undeployed first (waiting for a running service to stop its workers), so no worker reads or
    writes the collection while it goes; every other function runs on untouched. A mirror of a table is
    dropped by eventing.ops.mirrors.drop_collection, which drops its slot and publication first."""
    state = as_state(state)
    ks = keyspaces.parse_keyspace(state, keyspace)
    uses: list[BucketUse] = []
    undeployed: list[dict[str, str]] = []
    if not ks.is_default:
        ks.check()
        uses = collection_uses(state, ks)
        for function, roles in _active_roles(uses).items():
            lifecycle.undeploy(state, function)
            undeployed.append({"function": function, "role": roles})
            log.warning("function %s undeployed: collection '%s' (its %s) is dropped", function, ks, roles)
    documents = keyspaces.drop_collection(state, ks)
    named = sorted({u.function for u in uses if not u.wildcard} - {u["function"] for u in undeployed})
    return {
        "keyspace": str(ks),
        "bucket": ks.bucket,
        "scope": ks.scope,
        "collection": ks.collection,
        "documents": documents,
        "undeployed_functions": undeployed,
        "named_by_undeployed_functions": named,
    }


def _active_roles(uses: list[BucketUse]) -> dict[str, str]:
    """Function -> the roles the collection has in it ("source", "binding 'out' (rw)"), for the functions
    that are not undeployed. A wildcard source or binding (`scope.*`, `*.*`) is no such role: as in
    Couchbase, the function stays deployed and only stops seeing the collection's mutations (its worker
    passes them over, eventing.workers.collections); its accessors find the collection gone."""
    roles: dict[str, list[str]] = {}
    for u in uses:
        if u.state != FunctionState.UNDEPLOYED.value and not u.wildcard:
            roles.setdefault(u.function, []).append(u.role)
    return {function: " and ".join(r) for function, r in roles.items()}
