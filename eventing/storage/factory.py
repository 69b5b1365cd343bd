"""Opening, creating and dropping a data directory's buckets: the one place that picks the class.

A bucket's main file (``buckets/<name>.sqlite3``) says how many files the bucket has. One: a
``LocalBucket``; more: a ``PartitionedBucket`` over them (eventing.storage.partitions). Both implement
``FileBucket`` (eventing.storage.protocol), which is what callers get.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

from eventing.errors import StoreCorruptError
from eventing.storage import write_turns
from eventing.storage.bucket import LocalBucket
from eventing.storage.files import bucket_path, create_files, drop_damaged
from eventing.storage.partitions import PartitionedBucket
from eventing.storage.protocol import FileBucket


def open_bucket(data_dir: str | os.PathLike[str], name: str) -> FileBucket:
    """Open a bucket of the data directory: an unknown name, a damaged file or a missing partition is one
    clear error."""
    main = LocalBucket.open_main(data_dir, name)
    partitions = main.partitions()
    if partitions == 1:
        return main
    parts = [main]
    try:
        for part in range(1, partitions):
            parts.append(LocalBucket.open_partition(data_dir, name, part, partitions))
    except BaseException:
        for opened in parts:
            opened.close()
        raise
    return PartitionedBucket(parts)


def create_bucket(
    data_dir: str | os.PathLike[str], name: str, *, exist_ok: bool = False, partitions: int = 1
) -> FileBucket:
    """Create a bucket and open it. ``partitions`` > 1 spreads its vBuckets over that many files; with
    ``exist_ok`` an existing bucket of that name is opened as it is."""
    create_files(data_dir, name, exist_ok=exist_ok, partitions=partitions)
    return open_bucket(data_dir, name)


def drop_bucket(data_dir: str | os.PathLike[str], name: str) -> Path:
    """Delete a bucket's files (with their WAL and shared-memory files); returns the main file's path."""
    path = bucket_path(data_dir, name)
    try:
        bucket = open_bucket(data_dir, name)  # unknown name or not a bucket: the usual clear error
    except StoreCorruptError:
        return drop_damaged(
            data_dir, name
        )  # dropping is the way out of a damaged bucket: its files go as they are
    with bucket:
        # A PartitionedBucket's files, the main file first; else the one file.
        parts = bucket.parts if isinstance(bucket, PartitionedBucket) else [cast(LocalBucket, bucket)]
        files = [part.path for part in parts]
        # Move each WAL into its file first: a stale WAL left behind must never meet a new bucket of this
        # name.
        for part in parts:
            part.checkpoint_wal()
    # The main file goes last, so a drop cut short leaves a bucket that reports its missing partition.
    for file in [*files[1:], files[0]]:
        write_turns.forget(file)
        for suffix in ("-wal", "-shm", write_turns.TURN_SUFFIX):
            Path(f"{file}{suffix}").unlink(missing_ok=True)
        file.unlink()
    if len(files) > 1:
        files[1].parent.rmdir()
    return path
