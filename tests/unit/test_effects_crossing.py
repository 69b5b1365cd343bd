"""A batch's effects cross processes (a sandbox's line, Ray) with their writes packed as one msgpack array of
columns (the source seqnos, then each field of the writes), or as plain tuples where msgpack cannot carry a
value (EffectGroup.__reduce__): they arrive equal, as Write objects when read, and writes of the wrong shape
are refused. A group that crossed keeps its columns until its `writes` are read: buckets apply it, split it by
partition and judge its keys from the columns, with the outcome of the same writes made in process."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from eventing.core import xattrs
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.storage.factory import create_bucket
from eventing.storage.values import EffectGroup, Write
from eventing.storage.writes import _items, group_items
from eventing.workers.sandbox.line import _values
from eventing.workers.sandbox.scope import ScopedService


def _group() -> EffectGroup:
    writes = [
        (7, Write("a", OP_UPDATE, b"\x81\xa1x\x01", 0, 0, 123)),
        (8, Write("b", OP_DELETE)),
        (9, Write("c", OP_UPDATE, b"\x80", 60, 2, None, 0, 5)),
    ]
    return EffectGroup(3, 2, writes, conditional=True, upto=11)


def test_effect_groups_arrive_equal_with_their_writes_as_write_objects():
    group = _group()
    for loads in (pickle.loads, _values):  # the plain unpickler, and the sandbox host's values-only one
        arrived = loads(pickle.dumps([group], 5))[0]
        assert arrived == group
        assert all(type(w) is Write for _, w in arrived.writes)
        assert arrived.writes[2][1].delta == 5 and arrived.writes[0][1].cas == 123


def test_writes_cross_packed_and_a_key_msgpack_cannot_carry_crosses_as_tuples():
    group = _group()
    packed = group.__reduce__()[1][2]
    assert type(packed) is bytes  # packed: one msgpack array of columns
    columns = msgpack.unpackb(packed)
    assert columns[:3] == [[7, 8, 9], ["a", "b", "c"], [OP_UPDATE, OP_DELETE, OP_UPDATE]]
    assert len(columns) == 1 + len(Write._fields)
    assert _values(pickle.dumps(EffectGroup(5, 1, []), 5)).writes == []
    odd = EffectGroup(4, 1, [(2, Write("\udc80", OP_UPDATE, b"\x80"))])  # a lone surrogate: no UTF-8
    assert type(odd.__reduce__()[1][2]) is list
    for sent in (group, odd):
        arrived = _values(pickle.dumps(sent, 5))
        assert arrived == sent and all(type(w) is Write for _, w in arrived.writes)


def test_packed_writes_of_the_wrong_shape_are_refused():
    fields = len(Write._fields)
    for packed in (
        [[1], ["k"], [OP_UPDATE]],  # too few columns
        [[1, 2], *[["k"] for _ in range(fields)]],  # columns of unequal lengths
        [[1, "k", OP_UPDATE]],
        {"k": 1},
    ):
        with pytest.raises(TypeError, match="not columns of source seqnos"):
            EffectGroup(0, 0, msgpack.packb(packed))


def test_a_write_of_the_wrong_shape_is_refused():
    with pytest.raises(TypeError, match=f"a write has {len(Write._fields)} fields, not 2"):
        EffectGroup(0, 0, [(1, ("k", OP_UPDATE))])


def test_groups_made_in_process_keep_their_writes_as_given():
    writes: list = []
    group = EffectGroup(0, 0, writes)
    assert group.writes is writes  # nothing copied: the worker appends to it


def _crossed(groups: list[EffectGroup]) -> list[EffectGroup]:
    return _values(pickle.dumps(groups, 5))


def _docs(bucket, keys) -> dict:
    return {k: (bucket.get_doc(k), (bucket.get_meta(k) or {}).get("xattrs")) for k in keys}


def _writes(vb: int, count: int, *, with_xattrs: bool = False) -> EffectGroup:
    writes = [
        (
            s,
            Write(
                f"k{vb}-{s}",
                OP_DELETE if s % 5 == 0 else OP_UPDATE,
                None if s % 5 == 0 else encode_document({"s": s}),
                0,
                s % 3,
                10**12 + vb * 1000 + s,  # a handler's write carries its cas: equal outcomes compare equal
                xattrs=xattrs.encode({"tag": s}) if with_xattrs and s % 2 else None,
            ),
        )
        for s in range(1, count + 1)
    ]
    return EffectGroup(vb, 1, writes, upto=count + 3)


@pytest.mark.parametrize("partitions", [1, 4])
@pytest.mark.parametrize("with_xattrs", [False, True])
def test_groups_that_crossed_are_applied_from_their_columns_as_the_same_writes_made_in_process(
    tmp_path, partitions, with_xattrs
):
    made = [_writes(vb, 40, with_xattrs=with_xattrs) for vb in (3, 700, 1000)]
    crossed = _crossed(made)
    assert all(g.columns is not None and "writes" not in vars(g) for g in crossed)
    assert group_items(crossed) == _items(w for g in made for _, w in g.writes)
    here = create_bucket(tmp_path, "here", partitions=partitions)
    there = create_bucket(tmp_path, "there", partitions=partitions)
    try:
        assert here.apply_effects("fn", made) == there.apply_effects("fn", crossed)
        # applied from the columns: no Write made (reading `writes` makes them and drops the columns)
        assert all(g.columns is not None and "writes" not in vars(g) for g in crossed)
        keys = [w.key for g in made for _, w in g.writes]
        assert _docs(here, keys) == _docs(there, keys) and any(_docs(here, keys).values())
        assert here.effect_marks("fn") == there.effect_marks("fn") == {vb: (1, 43) for vb in (3, 700, 1000)}
        # a replay: every write is at or below the marks (found by reading the writes), none applied again
        assert there.apply_effects("fn", _crossed(made)) == here.apply_effects("fn", made)
        assert here.apply_effects("fn", made).duplicates == 120
        assert _docs(here, keys) == _docs(there, keys)
    finally:
        here.close()
        there.close()


@pytest.mark.parametrize("deletes", [False, True], ids=["updates", "with deletes"])
def test_groups_that_crossed_are_applied_on_a_postgresql_store_as_the_same_writes_made_in_process(
    pg_url, deletes
):
    from eventing.storage import postgres as pg_buckets
    from metadata.postgres import PostgresDatabase

    made = [_writes(vb, 40) for vb in (3, 700, 1000)]
    if not deletes:  # plain updates: the server's function, from the columns
        made = [
            EffectGroup(g.vb, g.epoch, [(s, w) for s, w in g.writes if w.op == OP_UPDATE], upto=g.upto)
            for g in made
        ]
    crossed = _crossed(made)
    db = PostgresDatabase.open(pg_url)
    try:
        here, there = pg_buckets.create_bucket(db, "here"), pg_buckets.create_bucket(db, "there")
        assert here.apply_effects("fn", made) == there.apply_effects("fn", crossed)
        if not deletes:  # no Write made on the way
            assert all(g.columns is not None and "writes" not in vars(g) for g in crossed)
        keys = [w.key for g in made for _, w in g.writes]
        assert _docs(here, keys) == _docs(there, keys) and any(_docs(here, keys).values())
        assert here.effect_marks("fn") == there.effect_marks("fn") == {vb: (1, 43) for vb in (3, 700, 1000)}
        assert there.apply_effects("fn", _crossed(made)) == here.apply_effects("fn", made)
        assert _docs(here, keys) == _docs(there, keys)
    finally:
        db.close()


def test_reading_the_writes_of_a_group_that_crossed_makes_them_once_and_drops_its_columns():
    crossed = _crossed([_writes(9, 4)])[0]
    assert list(crossed.seqnos()) == [1, 2, 3, 4] and list(crossed.keys())[0] == "k9-1"
    writes = crossed.writes
    assert crossed.columns is None and crossed.writes is writes
    assert all(type(w) is Write for _, w in writes)
    writes.append((5, Write("k9-5", OP_UPDATE, b"\x80")))  # a list like any other group's
    assert list(crossed.seqnos()) == [1, 2, 3, 4, 5] and crossed.keys()[-1] == "k9-5"
    assert pickle.loads(pickle.dumps(crossed)) == crossed
    with pytest.raises(AttributeError):
        crossed.other  # noqa: B018 - only `writes` is made on demand
    kept = _crossed(_crossed([_writes(9, 4)]))[0]  # sent on again as it came (host to data service)
    assert kept.columns is not None and kept == _writes(9, 4)


def test_the_sandbox_judges_a_crossed_groups_keys_from_its_columns_and_refuses_anything_else():
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn",
            "source_bucket": "src",
            "handler": "h",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )

    class Backend:
        def call(self, method, *args):
            assert (method, args[1]) == ("bucket", "collection_list")
            return []

    scope = ScopedService("fn", defn, Backend())
    crossed = _crossed([_writes(2, 3)])
    assert scope._effects_allowed("dst", ("fn", crossed)) and "writes" not in vars(crossed[0])
    elsewhere = _crossed([EffectGroup(2, 1, [(1, Write("\x01" + "9\x01k", OP_UPDATE, b"\x80"))])])
    assert not scope._effects_allowed("dst", ("fn", elsewhere))  # a collection the function does not write
    assert not scope._effects_allowed("dst", ("fn", [(2, 1, [])]))  # not an effect group
