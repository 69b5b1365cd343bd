"""Buckets on PostgreSQL: every bucket of a store (``--store postgresql://...``) as rows of one set of tables
on the server (eventing.storage.postgres.schema), with the bucket files' semantics.

    db = PostgresDatabase.open("postgresql://user@host/db")   # metadata.postgres
    bucket = create_bucket(db, "orders")                         # or open_bucket(db, "orders")
    bucket.upsert("o1", {"total": 3})
    drop_bucket(db, "orders")

``PostgresBucket`` implements ``FileBucket`` (eventing.storage.protocol); ``PostgresWakeListener`` tells a
service which vBuckets were written, from any machine (eventing.storage.postgres.wake).
"""

from __future__ import annotations

from eventing.storage.postgres import registry
from eventing.storage.postgres.bucket import PostgresBucket
from eventing.storage.postgres.wake import PostgresWakeListener
from metadata.postgres import PostgresDatabase


def open_bucket(db: PostgresDatabase, name: str) -> PostgresBucket:
    """Open a bucket of the store; an unknown name is one NotFoundError naming the fix."""
    found = registry.find(db, name)
    if found is None:
        raise registry.unknown_bucket(db, name)
    bucket_id, bucket_uuid, partitions = found
    return PostgresBucket(registry.BucketRef(db, bucket_id, name), bucket_uuid, partitions)


def create_bucket(
    db: PostgresDatabase, name: str, *, exist_ok: bool = False, partitions: int = 1
) -> PostgresBucket:
    """Create a bucket and open it (ConfigError if it exists, unless ``exist_ok``: then it is opened as it
    is). ``partitions`` (1 to 64, as for a data directory) is recorded and reported, nothing more: a
    server takes concurrent writers of different vBuckets without files of their own."""
    registry.register(db, name, exist_ok=exist_ok, partitions=partitions)
    return open_bucket(db, name)


def drop_bucket(db: PostgresDatabase, name: str) -> None:
    """Delete a bucket with everything it holds (NotFoundError if there is none)."""
    registry.drop(db, name)


def bucket_names(db: PostgresDatabase) -> list[str]:
    """The store's buckets, by name."""
    return registry.names(db)


__all__ = [
    "PostgresBucket",
    "PostgresWakeListener",
    "bucket_names",
    "create_bucket",
    "drop_bucket",
    "open_bucket",
]
