"""Bucket administration that must agree with the functions using a bucket: drop and flush are refused
while a deployed or paused function reads it as its source or writes it through a binding."""

from __future__ import annotations

from dataclasses import dataclass

from eventing.errors import LifecycleError, NotFoundError, StoreCorruptError
from eventing.storage.factory import drop_bucket, open_bucket
from metadata import FunctionState
from metadata.factory import open_store


@dataclass(frozen=True)
class BucketUse:
    function: str
    state: str
    role: str  # "source" or "binding 'alias' (rw|r)"


def bucket_uses(data_dir: str, bucket: str) -> list[BucketUse]:
    """Every stored function that names `bucket` as its source or in a binding, in any state."""
    try:
        store = open_store(data_dir, create=False)
    except NotFoundError:  # no metadata yet: no function uses anything
        return []
    try:
        records = store.list_functions()
    finally:
        store.close()
    uses = []
    for r in records:
        d = r.definition
        if d.get("source_bucket") == bucket:
            uses.append(BucketUse(r.name, r.state.value, "source"))
        for b in d.get("bindings", []):
            if b.get("bucket") == bucket:
                uses.append(BucketUse(r.name, r.state.value, f"binding '{b.get('alias')}' ({b.get('access')})"))
    return uses


def _refuse_if_in_use(data_dir: str, bucket: str, action: str) -> list[BucketUse]:
    uses = bucket_uses(data_dir, bucket)
    active = [u for u in uses if u.state != FunctionState.UNDEPLOYED.value]
    if active:
        u = active[0]
        more = f" (and {len(active) - 1} more)" if len(active) > 1 else ""
        raise LifecycleError(
            f"cannot {action} bucket '{bucket}': it is the {u.role} of function '{u.function}', which is "
            f"{u.state}{more}; undeploy it first (`eventing undeploy {u.function}`)"
        )
    return uses


def drop(data_dir: str, bucket: str) -> dict:
    """Delete the bucket's file: every document, the mutation log and the effect marks it holds."""
    uses = _refuse_if_in_use(data_dir, bucket, "drop")
    stats: dict = {"documents": None, "tombstones": None, "mutations": None}  # unknown: a damaged file
    try:
        source = open_bucket(data_dir, bucket)
        try:
            stats = source.stats()
        finally:
            source.close()
    except StoreCorruptError:
        pass  # dropping is the way out of a damaged bucket; drop_bucket deletes its files as they are
    path = drop_bucket(data_dir, bucket)
    return {
        "bucket": bucket, "path": str(path), "documents": stats["documents"], "tombstones": stats["tombstones"],
        "mutations": stats["mutations"], "named_by_undeployed_functions": sorted({u.function for u in uses}),
    }


def flush(data_dir: str, bucket: str) -> dict:
    """Empty the bucket and give it a new identity (see LocalBucket.flush)."""
    _refuse_if_in_use(data_dir, bucket, "flush")
    target = open_bucket(data_dir, bucket)
    try:
        return target.flush()
    finally:
        target.close()
