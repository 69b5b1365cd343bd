"""The file source's filtered read (LocalBucket.read_vb_matching) against the exact filter, property-style:
on random logs (updates whose documents hold the filter's bytes nested, inside other strings or not at
all, deletes, entries written by the function's deployments and by others, keys of named collections)
and random ranges, it returns every entry the filter matches, the function wrote or a named collection
holds, and counts the range as the log holds it."""

from __future__ import annotations

import tempfile

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventing.core.filters import compile_filter
from eventing.core.keyspaces import COLLECTION_MARK
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.storage.factory import create_bucket
from eventing.storage.values import Write
from sharding import vbucket_of

FUNCTION = "fn_r"
FILTERS = [
    {"field": "type", "eq": "order"},
    {"field": "type", "in": ["order", True, None]},
    {"key_prefix": "o"},
    {"and": [{"key_prefix": "o"}, {"field": "type", "eq": "order"}]},
    {"and": [{"field": "type", "eq": "order"}, {"field": "flag", "eq": False}]},
    {"and": [{"field": "type", "ne": "order"}, {"field": "type", "exists": True}]},  # no byte check
]
VALUES = st.sampled_from(["order", "orders", "xorder", True, False, None, 1, {"type": "order"}, ["order"]])
DOCS = st.dictionaries(st.sampled_from(["type", "flag", "note", "inner"]), VALUES, max_size=3)
KEYS = st.sampled_from(["o1", "o2", "p1", "p2", f"{COLLECTION_MARK}1{COLLECTION_MARK}o1"])
ORIGINS = st.sampled_from([None, None, None, FUNCTION, f"{FUNCTION}@3", "fn_other@1", f"{FUNCTION}x@1"])
ENTRY = st.tuples(KEYS, st.one_of(DOCS, st.none()), ORIGINS)  # a None document: a delete


def _decode(raw: bytes):
    return msgpack.unpackb(raw, raw=False)


def _must_return(row: tuple, compiled) -> bool:
    origin = row[6]
    own = origin is not None and (origin == FUNCTION or origin.startswith(FUNCTION + "@"))
    return own or row[2].startswith(COLLECTION_MARK) or compiled.matches(row, _decode)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    entries=st.lists(ENTRY, min_size=1, max_size=60),
    spec=st.sampled_from(FILTERS),
    after=st.integers(0, 8),
    limit=st.integers(1, 40),
    past=st.integers(-5, 5),
)
def test_the_filtered_read_returns_every_entry_the_filter_keeps_and_counts_the_range(
    entries, spec, after, limit, past
):
    compiled = compile_filter(spec)
    with tempfile.TemporaryDirectory() as data_dir:
        bucket = create_bucket(data_dir, "src")
        live: set[str] = set()
        for key, doc, origin in entries:
            if doc is None and key not in live:
                continue  # a delete of a missing document logs nothing
            write = Write(key, OP_DELETE) if doc is None else Write(key, OP_UPDATE, encode_document(doc))
            (live.discard if doc is None else live.add)(key)
            bucket.write([write], origin=origin)
        highs = bucket.high_seqnos()
        for vb in [vb for vb, high in enumerate(highs) if high]:
            log = [r for r in bucket.read_vb_rows(vb, 0, 1000)]
            # `upto` past the high seqno too: a range whose last entry is missing is counted by the log
            upto = max(0, highs[vb] + past)
            rows, scanned, last = bucket.read_vb_matching(
                vb, after, limit, upto, compiled.prefilter, FUNCTION
            )
            in_range = [r for r in log if after < r[1] <= upto][:limit]
            assert scanned == len(in_range)
            assert last == (in_range[-1][1] if in_range else after)
            assert rows == [r for r in in_range if r in rows]  # log rows of the range, in seqno order
            assert [r for r in in_range if _must_return(r, compiled)] == [
                r for r in rows if _must_return(r, compiled)
            ]
            # what SQLite leaves out fails the exact filter
            assert not any(compiled.matches(r, _decode) for r in in_range if r not in rows)
        bucket.close()


def test_a_range_whose_last_entry_the_filter_rules_out_still_counts_to_it(tmp_path):
    bucket = create_bucket(str(tmp_path), "src")
    bucket.write(
        [Write("k", OP_UPDATE, encode_document({"type": t})) for t in ("order", "x", "order", "x", "x")]
    )
    vb = vbucket_of("k")
    compiled = compile_filter({"field": "type", "eq": "order"})
    rows, scanned, last = bucket.read_vb_matching(vb, 0, 4, 5, compiled.prefilter, FUNCTION)
    assert (scanned, last) == (4, 4)
    # the range's last entry comes back as the check of its count; the worker's exact filter drops it
    assert [r[1] for r in rows] == [1, 3, 4]
    assert [compiled.matches(r, _decode) for r in rows] == [True, True, False]
    assert bucket.read_vb_matching(vb, 5, 4, 5, compiled.prefilter, FUNCTION) == ([], 0, 5)
    bucket.close()
