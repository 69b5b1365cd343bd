"""Decoding the messages of PostgreSQL's ``pgoutput`` plugin (protocol version 1, text values): what a
logical replication slot streams for the tables of a publication.

``decode(data)`` turns one message into a tuple-like value: ``Begin``, ``Commit``, ``Relation``, ``Insert``,
``Update``, ``Delete``, ``Truncate``, or None for what a mirror ignores (origins, types, logical messages).
A tuple's columns are text values (``str``), None for NULL, or ``UNCHANGED`` for a TOASTed value an UPDATE
left as it was (the value is not sent: the previous version of the row has it).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

PG_EPOCH_US = (
    946_684_800_000_000  # 2000-01-01 in microseconds since 1970-01-01: PostgreSQL's timestamps start there
)
UNCHANGED = object()  # a TOASTed column an UPDATE did not change (no value sent)

Row = list  # column values in the relation's column order: str, None or UNCHANGED


class Column(NamedTuple):
    name: str
    type_oid: int
    key: bool  # part of the replica identity


class Relation(NamedTuple):
    oid: int
    schema: str
    name: str
    identity: str  # replica identity: d(efault), n(othing), f(ull), i(ndex)
    columns: list[Column]


class Begin(NamedTuple):
    final_lsn: int
    commit_us: int  # microseconds since 1970-01-01 (UTC)
    xid: int


class Commit(NamedTuple):
    commit_lsn: int
    end_lsn: int
    commit_us: int


class Insert(NamedTuple):
    oid: int
    new: Row


class Update(NamedTuple):
    oid: int
    old: Row | None  # the old key ('K': the key changed) or the whole old row ('O': REPLICA IDENTITY FULL)
    old_kind: str  # "K", "O" or ""
    new: Row


class Delete(NamedTuple):
    oid: int
    old: Row
    old_kind: str  # "K" (the key only) or "O" (the whole row)


class Truncate(NamedTuple):
    oids: list[int]


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate

_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">h")
_BEGIN = struct.Struct(">qqI")
_COMMIT = struct.Struct(">bqqq")


class DecodeError(ValueError):
    """A message this decoder does not understand (another protocol version, a corrupt stream)."""


def _string(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(b"\x00", pos)
    return data[pos:end].decode(), end + 1


def _tuple(data: bytes, pos: int) -> tuple[Row, int]:
    (count,) = _H.unpack_from(data, pos)
    pos += 2
    row: Row = []
    append = row.append
    for _ in range(count):
        kind = data[pos]
        pos += 1
        if kind == 0x74:  # 't': text
            (size,) = _I.unpack_from(data, pos)
            pos += 4
            append(data[pos : pos + size].decode())
            pos += size
        elif kind == 0x6E:  # 'n': null
            append(None)
        elif kind == 0x75:  # 'u': unchanged TOAST
            append(UNCHANGED)
        elif kind == 0x62:  # 'b': binary (never asked for)
            raise DecodeError("a binary column value arrived; the mirror asks for text values")
        else:
            raise DecodeError(f"unknown column kind {kind!r} in a tuple")
    return row, pos


def decode(data: bytes) -> Message | None:
    """One pgoutput message (see the module docstring)."""
    kind = data[0]
    if kind == 0x42:  # 'B'
        final_lsn, ts, xid = _BEGIN.unpack_from(data, 1)
        return Begin(final_lsn, ts + PG_EPOCH_US, xid)
    if kind == 0x43:  # 'C'
        _, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
        return Commit(commit_lsn, end_lsn, ts + PG_EPOCH_US)
    if kind == 0x49:  # 'I'
        (oid,) = _I.unpack_from(data, 1)
        if data[5] != 0x4E:
            raise DecodeError("an INSERT without its new tuple")
        row, _ = _tuple(data, 6)
        return Insert(oid, row)
    if kind == 0x55:  # 'U'
        (oid,) = _I.unpack_from(data, 1)
        pos = 5
        old: Row | None = None
        old_kind = ""
        if data[pos] in (0x4B, 0x4F):  # 'K' / 'O'
            old_kind = chr(data[pos])
            old, pos = _tuple(data, pos + 1)
        if data[pos] != 0x4E:
            raise DecodeError("an UPDATE without its new tuple")
        new, _ = _tuple(data, pos + 1)
        return Update(oid, old, old_kind, new)
    if kind == 0x44:  # 'D'
        (oid,) = _I.unpack_from(data, 1)
        old_kind = chr(data[5])
        if old_kind not in ("K", "O"):
            raise DecodeError("a DELETE without its old key")
        old, _ = _tuple(data, 6)
        return Delete(oid, old, old_kind)
    if kind == 0x52:  # 'R'
        (oid,) = _I.unpack_from(data, 1)
        schema, pos = _string(data, 5)
        name, pos = _string(data, pos)
        identity = chr(data[pos])
        (count,) = _H.unpack_from(data, pos + 1)
        pos += 3
        columns = []
        for _ in range(count):
            flags = data[pos]
            column, pos = _string(data, pos + 1)
            (type_oid,) = _I.unpack_from(data, pos)
            pos += 8  # the type's oid and its modifier
            columns.append(Column(column, type_oid & 0xFFFFFFFF, bool(flags & 1)))
        return Relation(oid, schema, name, identity, columns)
    if kind == 0x54:  # 'T'
        (count,) = _I.unpack_from(data, 1)
        oids = [_I.unpack_from(data, 6 + 4 * i)[0] for i in range(count)]
        return Truncate(oids)
    if kind in (0x4F, 0x59, 0x4D):  # 'O'rigin, t'Y'pe, logical 'M'essage
        return None
    raise DecodeError(f"unknown pgoutput message {chr(kind)!r}")


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)
