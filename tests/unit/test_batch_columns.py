"""A batch's columns from a bulk read (eventing.execution.batch_columns): one field of each document read
without decoding the documents gives what `doc.get(field, default)` gives over the decoded documents, for
documents that are not objects, fields that are missing or null, deletions among the updates, and a
default of any kind."""

from __future__ import annotations

import msgpack
import pytest

from eventing.core.mutation import OP_DELETE, OP_EXPIRE, OP_UPDATE
from eventing.execution.batch import Batch, _Segment
from eventing.execution.batch_columns import field_of, well_formed
from eventing.storage.bucket import LocalBucket
from eventing.storage.values import Write
from sharding.vbucket import vbucket_of

DOCS = [
    {"rev": 1, "name": "a"},
    {"name": "no rev"},
    {"rev": None},
    [1, 2, 3],  # documents that are not objects
    "text",
    {"rev": {"nested": [1, {"x": 2}]}},
]


class _Runner:
    keyspace = None


def _bucket_with(data_dir: str, entries: list) -> tuple[LocalBucket, int]:
    bucket = LocalBucket.create(data_dir, "src")
    for entry in entries:
        if entry in (OP_DELETE, OP_EXPIRE):
            bucket.write([Write("k", entry)])
        else:
            bucket.write([Write("k", OP_UPDATE, msgpack.packb(entry))])
    return bucket, vbucket_of("k")


@pytest.mark.parametrize("default", [None, -1, "missing"])
def test_a_column_is_what_get_gives_over_the_decoded_documents(data_dir, default):
    entries = [DOCS[0], DOCS[1], OP_DELETE, DOCS[2], DOCS[3], OP_EXPIRE, DOCS[4], DOCS[5], {"rev": 7}]
    bucket, vb = _bucket_with(data_dir, entries)
    packed = bucket.read_vb_packed(vb, 0, 100, "fn")
    assert packed is not None and well_formed(packed)
    batch = Batch.build(_Runner(), [_Segment(vb, None, packed=packed)])  # type: ignore[arg-type]
    column = batch.column("rev", default)
    expected = [
        doc.get("rev", default) if isinstance(doc, dict) else default
        for doc in [None if e in (OP_DELETE, OP_EXPIRE) else e for e in entries]
    ]
    assert column == expected
    assert batch.deleted == [e in (OP_DELETE, OP_EXPIRE) for e in entries]
    assert batch.docs == [None if e in (OP_DELETE, OP_EXPIRE) else e for e in entries]
    assert batch.column("rev", default) == expected  # from the decoded documents now


def test_a_field_is_read_alone_only_where_every_document_is_an_object(data_dir):
    bucket, vb = _bucket_with(data_dir, [DOCS[0], DOCS[1]])
    packed = bucket.read_vb_packed(vb, 0, 100, "fn")
    assert field_of(packed, "rev", None) == [1, None] and field_of(packed, "rev", 0) == [1, 0]
    bucket, vb = _bucket_with(data_dir + "/2", [DOCS[0], DOCS[3]])
    assert field_of(bucket.read_vb_packed(vb, 0, 100, "fn"), "rev", None) is None  # the caller decodes
