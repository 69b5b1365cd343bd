"""Filters before the handler: a small declarative predicate a function declares as `filter` (as DynamoDB's
FilterCriteria or an Atlas trigger's `$match`), validated when the definition is saved and compiled here to
plain callables a worker runs on its log rows. Mutations that do not match are checkpointed without calling
the handler (counter `filtered`). Pure: no I/O, no storage.

The language (JSON), docs/functions.md "Filters":

    {"field": "total", "gte": 100}          a condition: one operator on one field
    {"key_prefix": "order::"}               the document key starts with the text
    {"and": [F, ...]}  {"or": [F, ...]}  {"not": F}

Operators: eq, ne, lt, lte, gt, gte (a JSON scalar), in (a list of scalars), exists (true or false).
A field is a dotted path into the document (`address.city`), or `meta.id`, `meta.cas`, `meta.expiration`,
`meta.flags`, `meta.vb`, `meta.seq` for the mutation's meta; `doc.` in front names a document field that
would read as meta (`doc.meta.source`). Equality is JSON's: numbers compare as numbers (1 == 1.0), true is
not 1, strings compare with strings; lt/lte/gt/gte hold only between two numbers or two strings; a missing
field fails every operator but `ne` (not eq) and `exists: false`.

Deletes carry no document: a condition on a document field is unknown for them, and a delete is filtered
out only when its key and meta alone make the filter fail (three-valued logic: `and` is false when one part
is false, `not` of unknown is unknown). So only key_prefix and meta conditions ever filter out a delete.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from eventing.core.mutation import OP_UPDATE

COMPARE = ("lt", "lte", "gt", "gte")
OPERATORS = ("eq", "ne", *COMPARE, "in", "exists")
# meta field -> its index in a log row (Mutation's field order: vb, seqno, key, op, cas, doc, origin, expiry,
# flags)
META_FIELDS = {"id": 2, "cas": 4, "expiration": 7, "flags": 8, "vb": 0, "seq": 1}
MAX_DEPTH = 32
MAX_NODES = 1000

_MISSING = object()
Row = tuple  # a log row in Mutation's field order
Unknown = None  # a delete's document condition: neither true nor false


class FilterError(ValueError):
    """A filter that is not valid; the message names the bad part (a path such as `and[1].gte`)."""


@dataclass(frozen=True)
class Prefilter:
    """What a bucket can check on a log row without decoding it, necessary for the filter to hold:
    the key starts with every one of `key_prefixes` (updates and deletes alike), and an update's msgpack
    document contains, for each clause of `needles`, at least one of its byte strings (the encoding of a
    field name followed by a string, boolean or null value: `{"field": "type", "eq": "order"}` cannot hold
    for a document whose bytes lack packb("type") + packb("order")). Documents are encoded by
    eventing.core.mutation.encode_document (msgpack, shortest forms), so equal values have equal bytes."""

    key_prefixes: tuple[str, ...] = ()
    needles: tuple[tuple[bytes, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.key_prefixes or self.needles)


@dataclass(frozen=True)
class CompiledFilter:
    """A filter ready to run. `update(row, doc)` decides an update (doc: the decoded document, or None when
    `needs_doc` is false); `delete(row)` decides a delete or expiry; `prefilter` is the byte check a bucket
    may apply first; `deletes_pass`: every delete matches (no key or meta condition: each part is unknown
    for a delete), so a worker need not ask `delete`."""

    spec: dict
    update: Callable[[Row, Any], bool]
    delete: Callable[[Row], bool]
    needs_doc: bool
    prefilter: Prefilter
    deletes_pass: bool = False

    def matches(self, row: Row, decode: Callable[[bytes], Any]) -> bool:
        """The decision for any log row (decoding the document only when a condition needs it). A document
        that cannot be decoded matches, so the handler path dead-letters it as it would without a filter."""
        if row[3] != OP_UPDATE or row[5] is None:
            return self.delete(row)
        if not self.needs_doc:
            return self.update(row, None)
        try:
            doc = decode(row[5])
        except Exception:  # noqa: BLE001 - undecodable: left to the handler path's dead letter
            return True
        return self.update(row, doc)


def compile_filter(spec: Any) -> CompiledFilter:
    """Validate a filter and compile it; FilterError names the first bad part."""
    counter = [0]
    _check(spec, "filter", 0, counter)
    update, needs_doc = _compile_update(spec)
    delete_tri = _compile_delete(spec)
    prefixes: list[str] = []
    needles: list[tuple[bytes, ...]] = []
    _necessary(spec, prefixes, needles)
    return CompiledFilter(
        spec,
        update,
        lambda row: delete_tri(row) is not False,
        needs_doc,
        Prefilter(tuple(prefixes), tuple(needles)),
        not _reads_row(spec),
    )


def check_filter(spec: Any) -> None:
    """Raise FilterError unless spec is a valid filter."""
    _check(spec, "filter", 0, [0])


# -- validation -------------------------------------------------------------------------------------------


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool | int | float) and value == value  # NaN is no JSON


def _show(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _check(spec: Any, where: str, depth: int, counter: list[int]) -> None:
    counter[0] += 1
    if counter[0] > MAX_NODES or depth > MAX_DEPTH:
        raise FilterError(
            f"{where} is too large (at most {MAX_NODES} parts, nested {MAX_DEPTH} deep); simplify it"
        )
    if not isinstance(spec, dict):
        raise FilterError(
            f'{where} is {_show(spec)}; give an object such as {{"field": "type", "eq": "order"}}, '
            '{"key_prefix": "order::"}, {"and": [...]}, {"or": [...]} or {"not": {...}}'
        )
    if "field" in spec:
        _check_condition(spec, where)
        return
    keys = sorted(spec)
    if keys == ["key_prefix"]:
        if not isinstance(spec["key_prefix"], str) or not spec["key_prefix"]:
            raise FilterError(f"{where}.key_prefix is {_show(spec['key_prefix'])}; give a non-empty string")
        return
    if keys in (["and"], ["or"]):
        op = keys[0]
        parts = spec[op]
        if not isinstance(parts, list) or not parts:
            raise FilterError(f"{where}.{op} is {_show(parts)}; give a non-empty list of filters")
        for i, part in enumerate(parts):
            _check(part, f"{where}.{op}[{i}]", depth + 1, counter)
        return
    if keys == ["not"]:
        _check(spec["not"], f"{where}.not", depth + 1, counter)
        return
    raise FilterError(
        f"{where} has keys {', '.join(keys) or 'none'}; use one of field (with an operator), key_prefix, "
        "and, or, not"
    )


def _check_condition(spec: dict, where: str) -> None:
    path = spec["field"]
    if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
        raise FilterError(
            f'{where}.field is {_show(path)}; give a dotted path such as "total" or "address.city"'
        )
    parts = path.split(".")
    if parts[0] == "meta" and (len(parts) != 2 or parts[1] not in META_FIELDS):
        raise FilterError(
            f"{where}.field {path!r} is not a meta field; use one of "
            f"{', '.join('meta.' + m for m in META_FIELDS)} (a document field named meta: doc.{path})"
        )
    if parts[0] == "doc" and len(parts) == 1:
        raise FilterError(f"{where}.field 'doc' names no field; give doc.NAME")
    ops = [k for k in spec if k != "field"]
    unknown = [k for k in ops if k not in OPERATORS]
    if unknown or len(ops) != 1:
        raise FilterError(
            f"{where} (field {path!r}) has "
            f"{'operator(s) ' + ', '.join(sorted(ops)) if ops else 'no operator'}; give exactly one of "
            f"{', '.join(OPERATORS)}"
        )
    op = ops[0]
    value = spec[op]
    if op == "in":
        if not isinstance(value, list) or not value or not all(_is_scalar(v) for v in value):
            raise FilterError(
                f"{where}.in is {_show(value)}; give a non-empty list of strings, numbers, booleans or null"
            )
    elif op == "exists":
        if not isinstance(value, bool):
            raise FilterError(f"{where}.exists is {_show(value)}; give true or false")
    elif op in COMPARE:
        if isinstance(value, bool) or not isinstance(value, str | int | float) or value != value:
            raise FilterError(f"{where}.{op} is {_show(value)}; compare with a number or a string")
    elif not _is_scalar(value):
        raise FilterError(f"{where}.{op} is {_show(value)}; give a string, number, boolean or null")


# -- compiling ----------------------------------------------------------------------------------------------


def _kind(value: Any) -> int:
    """JSON type classes for equality and order: 0 null, 1 bool, 2 number, 3 string, 4 other."""
    t = type(value)
    if t is str:
        return 3
    if t is bool:
        return 1
    if t is int or t is float:
        return 2
    return 0 if value is None else 4


def _equal(a: Any, b: Any) -> bool:
    return a == b and _kind(a) == _kind(b)


def _getter(path: str) -> tuple[Callable[[Row, Any], Any], bool]:
    """(get(row, doc) -> value or _MISSING, whether it reads the document)."""
    parts = path.split(".")
    if parts[0] == "meta":
        index = META_FIELDS[parts[1]]
        return (lambda row, doc: row[index]), False
    if parts[0] == "doc":
        parts = parts[1:]
    if len(parts) == 1:
        name = parts[0]

        def get_one(row: Row, doc: Any) -> Any:
            return doc.get(name, _MISSING) if type(doc) is dict else _MISSING

        return get_one, True

    def get_path(row: Row, doc: Any) -> Any:
        value = doc
        for name in parts:
            if type(value) is not dict:
                return _MISSING
            value = value.get(name, _MISSING)
        return value

    return get_path, True


def _test(op: str, target: Any) -> Callable[[Any], bool]:
    """The operator as a test of a present or _MISSING value."""
    if op == "exists":
        return (lambda v: v is not _MISSING) if target else (lambda v: v is _MISSING)
    if op == "in":
        targets = tuple(target)
        return lambda v: v is not _MISSING and any(_equal(v, t) for t in targets)
    if op == "ne":
        return lambda v: v is _MISSING or not _equal(v, target)
    if op == "eq":
        kind = _kind(target)
        if kind == 3:  # the common case, without a type dispatch
            return lambda v: v == target and type(v) is str
        return lambda v: v is not _MISSING and _equal(v, target)
    kind = _kind(target)
    if op == "lt":
        return lambda v: _kind(v) == kind and v < target
    if op == "lte":
        return lambda v: _kind(v) == kind and v <= target
    if op == "gt":
        return lambda v: _kind(v) == kind and v > target
    return lambda v: _kind(v) == kind and v >= target


def _condition(spec: dict) -> tuple[Callable[[Row, Any], bool], bool]:
    op = next(k for k in spec if k != "field")
    test = _test(op, spec[op])
    parts = spec["field"].split(".")
    if parts[0] == "doc":
        parts = parts[1:]
    if len(parts) == 1 and spec["field"].split(".")[0] != "meta":
        # A field at the top of the document (the common case): its getter inlined, one call fewer a row.
        name = parts[0]
        return (lambda row, doc: test(doc.get(name, _MISSING) if type(doc) is dict else _MISSING)), True
    get, needs_doc = _getter(spec["field"])
    return (lambda row, doc: test(get(row, doc))), needs_doc


def _compile_update(spec: dict) -> tuple[Callable[[Row, Any], bool], bool]:
    if "field" in spec:
        return _condition(spec)
    if "key_prefix" in spec:
        prefix = spec["key_prefix"]
        return (lambda row, doc: row[2].startswith(prefix)), False
    if "not" in spec:
        inner, needs = _compile_update(spec["not"])
        return (lambda row, doc: not inner(row, doc)), needs
    op = "and" if "and" in spec else "or"
    compiled = [_compile_update(part) for part in spec[op]]
    # Conditions without the document first: they are the cheapest to decide.
    compiled.sort(key=lambda c: c[1])
    parts = tuple(fn for fn, _ in compiled)
    needs = any(n for _, n in compiled)
    if len(parts) == 1:
        return parts[0], needs
    if op == "and":
        return (lambda row, doc: all(p(row, doc) for p in parts)), needs
    return (lambda row, doc: any(p(row, doc) for p in parts)), needs


def _compile_delete(spec: dict) -> Callable[[Row], bool | None]:
    """Three-valued: True, False, or None (Unknown) where the answer depends on the absent document."""
    if "field" in spec:
        condition, needs_doc = _condition(spec)
        if needs_doc:
            return lambda row: Unknown
        return lambda row: condition(row, None)
    if "key_prefix" in spec:
        prefix = spec["key_prefix"]
        return lambda row: row[2].startswith(prefix)
    if "not" in spec:
        inner = _compile_delete(spec["not"])

        def negate(row: Row) -> bool | None:
            value = inner(row)
            return None if value is None else not value

        return negate
    op = "and" if "and" in spec else "or"
    parts = tuple(_compile_delete(part) for part in spec[op])
    decisive = op == "or"  # True decides an or, False an and

    def combine(row: Row) -> bool | None:
        unknown = False
        for part in parts:
            value = part(row)
            if value is None:
                unknown = True
            elif value is decisive:
                return decisive
        return None if unknown else not decisive

    return combine


def _reads_row(spec: dict) -> bool:
    """Whether a filter has a key or meta condition: the only parts that can decide a delete."""
    if "key_prefix" in spec:
        return True
    if "field" in spec:
        return spec["field"].split(".")[0] == "meta"
    if "not" in spec:
        return _reads_row(spec["not"])
    return any(_reads_row(part) for part in spec["and" if "and" in spec else "or"])


def _necessary(spec: dict, prefixes: list[str], needles: list[tuple[bytes, ...]]) -> None:
    """Collect the Prefilter parts of the conjuncts at the top of the filter (an and of ands counts)."""
    if "and" in spec:
        for part in spec["and"]:
            _necessary(part, prefixes, needles)
    elif "key_prefix" in spec:
        prefixes.append(spec["key_prefix"])
    elif "field" in spec and spec["field"].split(".")[0] != "meta":
        name = spec["field"].split(".")[-1]
        values = [spec["eq"]] if "eq" in spec else spec.get("in")
        # Strings, booleans and null only: a number has several encodings (1 and 1.0 are equal).
        if values and all(v is None or isinstance(v, str | bool) for v in values):
            key = msgpack.packb(name)
            needles.append(tuple(key + msgpack.packb(v) for v in values))
