"""Arrays sent to PostgreSQL in its binary array format by one ``struct`` call (or a join) each.

psycopg dumps a Python list element by element in Python: for a statement of a dozen short arrays (a flush
of effects: eventing.storage.postgres.effects) that was about a third of the client's CPU. A list wrapped in
one of these types (``Int2s``, ``Int8s``, ``Texts``, ``Byteas``) is dumped here instead; the statement's
placeholder stays ``%b`` and its cast (``::int8[]`` ...) names the same type. ``None`` is NULL.
"""

from __future__ import annotations

import struct
from typing import Any

from psycopg import adapters
from psycopg.adapt import Dumper
from psycopg.pq import Format

_HEADER = struct.Struct(">iiIii")  # ndim, has nulls, element oid, length, lower bound
_EMPTY = struct.Struct(">iiI")  # an empty array: no dimensions
_LENGTH = struct.Struct(">i")


class Int2s(list):
    """A list of ints sent as int2[]."""


class Int8s(list):
    """A list of ints (or None) sent as int8[]."""


class Texts(list):
    """A list of str (or None) sent as text[]."""


class Byteas(list):
    """A list of bytes (or None) sent as bytea[]."""


def _fixed(values: list[Any], oid: int, code: str, size: int) -> bytes:
    n = len(values)
    if not n:
        return _EMPTY.pack(0, 0, oid)
    if None not in values:
        body = [0] * (2 * n)
        body[0::2] = [size] * n
        body[1::2] = values
        return _HEADER.pack(1, 0, oid, n, 1) + struct.pack(f">{f'i{code}' * n}", *body)
    parts = [_HEADER.pack(1, 1, oid, n, 1)]
    item = struct.Struct(f">i{code}")
    for value in values:
        parts.append(_LENGTH.pack(-1) if value is None else item.pack(size, value))
    return b"".join(parts)


def _varlen(values: list[Any], oid: int) -> bytes:
    n = len(values)
    if not n:
        return _EMPTY.pack(0, 0, oid)
    nulls = None in values
    parts = [_HEADER.pack(1, 1 if nulls else 0, oid, n, 1)]
    pack = _LENGTH.pack
    for value in values:
        if value is None:
            parts.append(pack(-1))
        else:
            parts.append(pack(len(value)))
            parts.append(value)
    return b"".join(parts)


class _Int2sDumper(Dumper):
    format = Format.BINARY
    oid = 1005  # int2[]

    def dump(self, obj: Any) -> bytes:
        return _fixed(obj, 21, "h", 2)


class _Int8sDumper(Dumper):
    format = Format.BINARY
    oid = 1016  # int8[]

    def dump(self, obj: Any) -> bytes:
        return _fixed(obj, 20, "q", 8)


class _TextsDumper(Dumper):
    format = Format.BINARY
    oid = 1009  # text[]

    def dump(self, obj: Any) -> bytes:
        return _varlen([None if v is None else v.encode() for v in obj], 25)


class _ByteasDumper(Dumper):
    format = Format.BINARY
    oid = 1001  # bytea[]

    def dump(self, obj: Any) -> bytes:
        return _varlen(obj, 17)


adapters.register_dumper(Int2s, _Int2sDumper)
adapters.register_dumper(Int8s, _Int8sDumper)
adapters.register_dumper(Texts, _TextsDumper)
adapters.register_dumper(Byteas, _ByteasDumper)

__all__ = ["Byteas", "Int2s", "Int8s", "Texts"]
