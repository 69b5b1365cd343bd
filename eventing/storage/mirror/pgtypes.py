"""A table row as a JSON document: each column's text value (as PostgreSQL's output function writes it,
under the session settings of ``SESSION_OPTIONS``) turned into the JSON value a user expects, by the
column's type.

    integers -> int          real, double precision -> float (NaN and infinities as strings)
    boolean -> true/false    numeric -> int when whole, else float when the float is exact, else the string
    json, jsonb -> parsed    bytea -> base64 text
    timestamp(tz) -> ISO 8601 ("2024-05-01T12:00:00.5+00:00")    date, time, interval (ISO 8601) -> text
    arrays -> lists of their elements' values                    anything else (text, uuid, enums) -> text

Types are told by their oid; a type the built-in table does not know (a domain, an enum, an array of
those) is resolved once through ``Types.learn`` from ``pg_type``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

# What both the snapshot's connection and the replication connection set, so values read alike.
SESSION_OPTIONS = (
    "-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 -c extra_float_digits=3 -c bytea_output=hex"
)

Convert = Callable[[str], Any]


def _bool(text: str) -> bool:
    return text == "t"


def _float(text: str) -> float | str:
    value = float(text)
    return value if value == value and value not in (float("inf"), float("-inf")) else text


def _numeric(text: str) -> int | float | str:
    if "." not in text and "e" not in text and "N" not in text and "I" not in text:
        value = int(text)
        return value if -(2**63) <= value < 2**63 else text  # msgpack's integers are 64-bit
    try:
        exact = Decimal(text)
    except InvalidOperation:
        return text
    if not exact.is_finite():
        return text
    number = float(text)
    return number if Decimal(number) == exact else text


def _json(text: str) -> Any:
    return json.loads(text)


def _bytea(text: str) -> str:
    return base64.b64encode(bytes.fromhex(text[2:]) if text.startswith("\\x") else text.encode()).decode()


def _timestamp(text: str) -> str:
    if not text[:1].isdigit():  # infinity, -infinity
        return text
    date, _, rest = text.partition(" ")
    return f"{date}T{rest}" if rest else date


def _timestamptz(text: str) -> str:
    if not text[:1].isdigit():
        return text
    stamp = _timestamp(text)
    sign = max(stamp.rfind("+"), stamp.rfind("-"))
    if sign > 10:  # the offset: "+00" or "+05:30" or "-03:00:05"
        offset = stamp[sign + 1 :]
        if len(offset) == 2:
            stamp = f"{stamp}:00"
    return stamp


def _text(text: str) -> str:
    return text


# oid -> converter of the built-in types a mirror knows; oid -> element oid of their arrays.
SCALARS: dict[int, Convert] = {
    16: _bool,
    20: int,
    21: int,
    23: int,
    26: int,
    700: _float,
    701: _float,
    1700: _numeric,
    114: _json,
    3802: _json,
    17: _bytea,
    1114: _timestamp,
    1184: _timestamptz,
}
ARRAYS: dict[int, int] = {
    1000: 16,
    1005: 21,
    1007: 23,
    1016: 20,
    1028: 26,
    1021: 700,
    1022: 701,
    1231: 1700,
    199: 114,
    3807: 3802,
    1001: 17,
    1115: 1114,
    1185: 1184,
    1009: 25,
    1015: 1043,
    1014: 1042,
    2951: 2950,
    1182: 1082,
    1183: 1083,
    1002: 18,
    1003: 19,
    1187: 1186,
}


def parse_array(text: str, element: Convert) -> list | str:
    """A PostgreSQL array's text form (``{1,2,NULL}``, ``{{1,2},{3,4}}``, ``{"a b","c\\"d"}``) as a list;
    the text itself when it is not one (an array with explicit bounds, ``[0:1]={...}``)."""
    if not text.startswith("{"):
        return text
    pos = 0
    stack: list[list] = []
    result: list | None = None
    size = len(text)
    while pos < size:
        char = text[pos]
        if char == "{":
            stack.append([])
            pos += 1
        elif char == "}":
            done = stack.pop()
            if stack:
                stack[-1].append(done)
            else:
                result = done
            pos += 1
        elif char == ",":
            pos += 1
        elif char == '"':
            pos += 1
            chunk = []
            while text[pos] != '"':
                if text[pos] == "\\":
                    pos += 1
                chunk.append(text[pos])
                pos += 1
            pos += 1
            stack[-1].append(element("".join(chunk)))
        else:
            end = pos
            while text[end] not in ",}":
                end += 1
            word = text[pos:end]
            stack[-1].append(None if word == "NULL" else element(word))
            pos = end
    return result if result is not None else []


_SCALAR_CONVERTERS = {_text, int, _bool, _float, _numeric, _bytea, _timestamp, _timestamptz}


def is_text(convert: Convert) -> bool:
    """Whether a converter gives the text as it is (the value needs no call)."""
    return convert is _text


def scalar(convert: Convert) -> bool:
    """Whether a converter only gives JSON scalars: text, 64-bit integers, finite floats, booleans (not json,
    jsonb or arrays, whose values a document must check)."""
    return convert in _SCALAR_CONVERTERS


class Types:
    """Converters by type oid, the built-ins' known, others learnt from the source's ``pg_type``."""

    def __init__(self) -> None:
        self._known: dict[int, Convert] = dict(SCALARS)
        for array, element in ARRAYS.items():
            self._known[array] = self._array_of(SCALARS.get(element, _text))

    @staticmethod
    def _array_of(element: Convert) -> Convert:
        return lambda text: parse_array(text, element)

    def unknown(self, oids: Iterable[int]) -> list[int]:
        return sorted(
            {oid for oid in oids if oid not in self._known and oid < 10_000 and oid not in _TEXT_OIDS}
            | {oid for oid in oids if oid >= 10_000 and oid not in self._known}
        )

    def learn(self, rows: Iterable[tuple[int, int, str, int]]) -> None:
        """``(oid, typelem, typcategory, typbasetype)`` rows of ``pg_type``: a domain converts as its base
        type, an array ('A') as a list of its element's values, the rest as text."""
        for oid, elem, category, base in rows:
            if base:
                self._known[oid] = self.converter(base)
            elif category == "A" and elem:
                self._known[oid] = self._array_of(self.converter(elem))
            else:
                self._known[oid] = _text

    def converter(self, oid: int) -> Convert:
        return self._known.get(oid, _text)


_TEXT_OIDS = {
    25,
    1043,
    1042,
    19,
    18,
    2950,
    1082,
    1083,
    1266,
    1186,
    869,
    650,
    829,
    774,
    1560,
    1562,
    3614,
    3615,
    142,
    600,
    601,
    602,
    603,
    604,
    628,
    718,
    790,
    3904,
    3906,
    3908,
    3910,
    3912,
    3926,
    24,
    2202,
    2205,
    2206,
    3734,
    3769,
    4089,
    4096,
    2278,
    705,
}

__all__ = ["SESSION_OPTIONS", "Types", "is_text", "parse_array", "scalar"]
