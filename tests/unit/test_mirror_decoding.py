"""pgoutput messages and column values as a mirror reads them (eventing.storage.mirror)."""

from __future__ import annotations

import struct

import pytest

from eventing.core.mutation import MAX_DOCUMENT_BYTES, decode_document, encode_document
from eventing.errors import InvalidDocumentError
from eventing.storage.mirror.follower import Shape
from eventing.storage.mirror.pgoutput import (
    PG_EPOCH_US,
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    Truncate,
    Update,
    decode,
    lsn_text,
    parse_lsn,
)
from eventing.storage.mirror.pgtypes import Types, parse_array


def _tuple(*values) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            data = v.encode()
            out += b"t" + struct.pack(">i", len(data)) + data
    return out


def test_transactions_and_changes_decode():
    assert decode(b"B" + struct.pack(">qqI", 100, 5, 7)) == Begin(100, 5 + PG_EPOCH_US, 7)
    assert decode(b"C" + struct.pack(">bqqq", 0, 100, 120, 5)) == Commit(100, 120, 5 + PG_EPOCH_US)
    rel = b"R" + struct.pack(">i", 16384) + b"public\x00orders\x00d" + struct.pack(">h", 2)
    rel += b"\x01id\x00" + struct.pack(">ii", 23, -1) + b"\x00note\x00" + struct.pack(">ii", 25, -1)
    decoded = decode(rel)
    assert (
        isinstance(decoded, Relation)
        and decoded.name == "orders"
        and [c.key for c in decoded.columns] == [True, False]
    )
    assert decode(b"I" + struct.pack(">i", 16384) + b"N" + _tuple("1", None)) == Insert(16384, ["1", None])
    moved = decode(b"U" + struct.pack(">i", 1) + b"K" + _tuple("1", None) + b"N" + _tuple("2", UNCHANGED))
    assert moved == Update(1, ["1", None], "K", ["2", UNCHANGED])
    assert decode(b"D" + struct.pack(">i", 1) + b"O" + _tuple("2", "x")) == Delete(1, ["2", "x"], "O")
    assert decode(b"T" + struct.pack(">ib", 2, 0) + struct.pack(">ii", 5, 6)) == Truncate([5, 6])
    assert decode(b"Y" + b"anything") is None
    assert parse_lsn(lsn_text(0x16B374D848)) == 0x16B374D848 and lsn_text(0x16B374D848) == "16/B374D848"


def test_values_map_as_a_user_expects():
    t = Types()
    assert t.converter(23)("42") == 42 and t.converter(16)("t") is True and t.converter(701)("1.5") == 1.5
    assert t.converter(701)("NaN") == "NaN"
    numeric = t.converter(1700)
    assert numeric("12") == 12 and numeric("0.5") == 0.5 and numeric("19.99") == "19.99"
    assert numeric("123456789012345678901234567890") == "123456789012345678901234567890"
    assert t.converter(3802)('{"a": [1, null]}') == {"a": [1, None]}
    assert t.converter(17)("\\x0102ff") == "AQL/"
    assert t.converter(1184)("2024-05-01 12:00:00.5+00") == "2024-05-01T12:00:00.5+00:00"
    assert t.converter(1114)("2024-05-01 12:00:00") == "2024-05-01T12:00:00"
    assert t.converter(1007)("{1,2,NULL}") == [1, 2, None]
    assert t.converter(1009)('{"a b","c\\"d",plain}') == ["a b", 'c"d', "plain"]
    assert parse_array("{{1,2},{3,4}}", int) == [[1, 2], [3, 4]] and parse_array("{}", int) == []
    assert t.converter(2950)("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11") == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    t.learn([(90001, 0, "E", 0), (90002, 90001, "A", 0), (90003, 0, "N", 23)])  # an enum, its array, a domain
    assert t.converter(90002)("{x,y}") == ["x", "y"] and t.converter(90003)("7") == 7


def _reference(names, converters, row, current=None) -> dict:
    """A row's document column by column, as the mapping of docs/postgresql-mirror.md says."""
    doc = {}
    for name, convert, value in zip(names, converters, row, strict=True):
        doc[name] = (
            (None if current is None else current.get(name))
            if value is UNCHANGED
            else (None if value is None else convert(value))
        )
    return doc


def test_a_row_becomes_the_same_document_and_key_on_every_path():
    t = Types()
    oids = [20, 23, 25, 16, 701, 1700, 1184, 17, 2950, 3802, 1007]
    names = ["id", "n", "note", "ok", "f", "amount", "at", "raw", "u", "meta", "tags"]
    converters = [t.converter(oid) for oid in oids]
    row = [
        "7",
        "-3",
        "é text",
        "f",
        "Infinity",
        "19.99",
        "2024-05-01 12:00:00+00",
        "\\x01",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        '{"a": 1}',
        "{1,NULL}",
    ]
    for columns in (
        list(range(9)),
        list(range(11)),
    ):  # only scalar columns (packed at once), then json and arrays
        shape = Shape([names[i] for i in columns], [converters[i] for i in columns], [0])
        values = [row[i] for i in columns]
        expected = _reference(shape.names, shape.converters, values)
        assert shape.document(values) == expected and shape.encode(values) == encode_document(expected)
        nulls = [values[0]] + [None] * (len(values) - 1)
        assert shape.encode(nulls) == encode_document(
            {name: None if i else 7 for i, name in enumerate(shape.names)}
        )
    assert expected["f"] == "Infinity" and expected["amount"] == "19.99" and expected["tags"] == [1, None]
    assert Shape(["id", "region"], [int, t.converter(25)], [0, 1]).key(["7", "eu"]) == "7::eu"
    assert Shape(["region", "id"], [t.converter(25), int], [1]).key(["eu", "7"]) == "7"
    toasted = Shape(["id", "body"], [int, t.converter(25)], [0])
    assert decode_document(toasted.encode(["1", UNCHANGED], {"id": 1, "body": "kept"})) == {
        "id": 1,
        "body": "kept",
    }
    assert toasted.document(["1", UNCHANGED]) == {"id": 1, "body": None}


def test_no_two_composite_keys_share_a_document_key():
    text = Types().converter(25)
    shape = Shape(["a", "b"], [text, text], [0, 1])
    rows = [
        ["a::b", "c"],
        ["a", "b::c"],
        ["a:", ":b"],
        ["a", "::b"],
        ["a:::", "b"],
        ["a%3A%3Ab", "c"],
        ["a%", "b"],
        ["a%25", "b"],
        ["a%3a", "b"],
        ["a:", "b"],
        ["a", ":b"],
        ["x:y", "z"],
        ["x", "y:z"],
    ]
    keys = [shape.key(row) for row in rows]
    assert len(set(keys)) == len(rows), keys
    assert shape.key(["7", "eu"]) == "7::eu" and shape.key(["x:y", "z"]) == "x:y::z"  # kept as they read
    assert shape.key(["50%", "z"]) == "50%::z"  # as a mirror made before this rule keyed it
    assert shape.key(["a::b", "c"]) == "a%3A%3Ab::c"
    for key in keys:  # `::` in a key is always a separator: each part decodes back to its column
        parts = key.split("::")
        assert len(parts) == 2 and all(p and not p.startswith(":") and not p.endswith(":") for p in parts)


def test_a_row_over_the_document_limit_fails_as_any_document_does():
    shape = Shape(["id", "body"], [int, Types().converter(25)], [0])
    row = ["1", "x" * (MAX_DOCUMENT_BYTES + 1)]
    with pytest.raises(InvalidDocumentError) as direct:
        encode_document({"id": 1, "body": row[1]})
    with pytest.raises(InvalidDocumentError) as mirrored:
        shape.encode(row)
    assert str(mirrored.value) == str(direct.value) and "split it" in str(mirrored.value)
