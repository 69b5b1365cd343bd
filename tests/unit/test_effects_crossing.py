"""A batch's effects cross processes (a sandbox's line, Ray) with their writes packed as one msgpack array of
columns (the source seqnos, then each field of the writes), or as plain tuples where msgpack cannot carry a
value (EffectGroup.__reduce__): they arrive equal, as Write objects, and writes of the wrong shape are
refused."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from eventing.core.mutation import OP_DELETE, OP_UPDATE
from eventing.storage.values import EffectGroup, Write
from eventing.workers.sandbox.line import _values


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
