"""Sub-document operations on a JSON document, as kv_engine's docs/SubDocument.md describes them: paths
(`a.b[2].c`, `` `a.b` `` for a name holding dots, `[-1]` for the last element), the lookups (get, exists,
count) and the mutations (dict add/upsert, replace, delete, array push first/last, insert, add unique,
counter), each failing with the status the SDKs map to their exceptions.
"""

from __future__ import annotations

import json
from typing import Any

from eventing.kv import protocol as p

# sub-document opcodes (in multi lookup/mutation specs)
GET_DOC, SET_DOC, DELETE_DOC = 0x00, 0x01, 0x04
GET, EXISTS, DICT_ADD, DICT_UPSERT, DELETE, REPLACE = 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA
ARRAY_PUSH_LAST, ARRAY_PUSH_FIRST, ARRAY_INSERT, ARRAY_ADD_UNIQUE, COUNTER, GET_COUNT = (
    0xCB,
    0xCC,
    0xCD,
    0xCE,
    0xCF,
    0xD2,
)
LOOKUPS = frozenset({GET_DOC, GET, EXISTS, GET_COUNT})
MUTATIONS = frozenset(
    {
        SET_DOC,
        DELETE_DOC,
        DICT_ADD,
        DICT_UPSERT,
        DELETE,
        REPLACE,
        ARRAY_PUSH_LAST,
        ARRAY_PUSH_FIRST,
        ARRAY_INSERT,
        ARRAY_ADD_UNIQUE,
        COUNTER,
    }
)

# path flags and document flags
PATH_MKDIR_P, PATH_XATTR, PATH_EXPAND_MACROS = 0x01, 0x04, 0x10
DOC_MKDOC, DOC_ADD, DOC_ACCESS_DELETED = 0x01, 0x02, 0x04

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class SubdocError(Exception):
    def __init__(self, status: int, message: str = ""):
        super().__init__(message or f"sub-document status 0x{status:02x}")
        self.status = status


Component = str | int  # a dictionary key, or an array index


def parse_path(path: str) -> list[Component]:
    """`a.b[0].c` -> ["a", "b", 0, "c"]; SubdocError(SUBDOC_PATH_EINVAL) for a malformed path."""
    out: list[Component] = []
    i, n = 0, len(path)
    if n == 0:
        return out
    expect_name = True
    while i < n:
        ch = path[i]
        if ch == "[":
            end = path.find("]", i)
            if end < 0:
                raise SubdocError(p.SUBDOC_PATH_EINVAL, f"path {path!r} has an unclosed '['")
            text = path[i + 1 : end]
            try:
                out.append(int(text))
            except ValueError:
                raise SubdocError(p.SUBDOC_PATH_EINVAL, f"path {path!r}: [{text}] is not an index") from None
            i = end + 1
            expect_name = False
        elif ch == ".":
            if expect_name:
                raise SubdocError(p.SUBDOC_PATH_EINVAL, f"path {path!r} has an empty part")
            i += 1
            expect_name = True
        elif expect_name:
            if ch == "`":
                name_chars = []
                i += 1
                while True:
                    if i >= n:
                        raise SubdocError(p.SUBDOC_PATH_EINVAL, f"path {path!r} has an unclosed '`'")
                    if path[i] == "`":
                        if i + 1 < n and path[i + 1] == "`":
                            name_chars.append("`")
                            i += 2
                            continue
                        i += 1
                        break
                    name_chars.append(path[i])
                    i += 1
                out.append("".join(name_chars))
            else:
                j = i
                while j < n and path[j] not in ".[":
                    j += 1
                out.append(path[i:j])
                i = j
            expect_name = False
        else:
            raise SubdocError(p.SUBDOC_PATH_EINVAL, f"path {path!r} is malformed at {i}")
    if expect_name:
        raise SubdocError(p.SUBDOC_PATH_EINVAL, f"path {path!r} ends with '.'")
    return out


def _step(node: Any, part: Component) -> Any:
    if isinstance(part, int):
        if not isinstance(node, list):
            raise SubdocError(p.SUBDOC_PATH_MISMATCH)
        if not -len(node) <= part < len(node):
            raise SubdocError(p.SUBDOC_PATH_ENOENT)
        return node[part]
    if not isinstance(node, dict):
        raise SubdocError(p.SUBDOC_PATH_MISMATCH)
    if part not in node:
        raise SubdocError(p.SUBDOC_PATH_ENOENT)
    return node[part]


def lookup(doc: Any, parts: list[Component]) -> Any:
    node = doc
    for part in parts:
        node = _step(node, part)
    return node


def _parent(doc: Any, parts: list[Component], mkdir: bool) -> Any:
    """The container holding the path's last part; with `mkdir` missing dictionaries on the way are made."""
    node = doc
    for index, part in enumerate(parts[:-1]):
        try:
            node = _step(node, part)
        except SubdocError as exc:
            if exc.status != p.SUBDOC_PATH_ENOENT or not mkdir or isinstance(part, int):
                raise
            nxt: Any = [] if isinstance(parts[index + 1], int) else {}
            node[part] = nxt
            node = nxt
    return node


def _values(raw: bytes, multi: bool) -> list[Any]:
    """A spec's value: JSON, or for the array operations a comma-separated list of JSON values."""
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(f"[{text}]") if multi else [json.loads(text)]
    except ValueError:
        raise SubdocError(p.SUBDOC_VALUE_CANTINSERT, "the value is not JSON") from None


def mutate(doc: Any, opcode: int, parts: list[Component], flags: int, raw: bytes) -> Any:
    """Apply one mutation spec to `doc` in place; returns the counter's new value for COUNTER, else None."""
    mkdir = bool(flags & PATH_MKDIR_P)
    if opcode in (ARRAY_PUSH_LAST, ARRAY_PUSH_FIRST, ARRAY_ADD_UNIQUE) and True:
        values = _values(raw, multi=opcode != ARRAY_ADD_UNIQUE)
        try:
            target = lookup(doc, parts)
        except SubdocError as exc:
            if exc.status != p.SUBDOC_PATH_ENOENT or not mkdir or not parts:
                raise
            parent = _parent(doc, parts, mkdir)
            target = []
            _set_child(parent, parts[-1], target)
        if not isinstance(target, list):
            raise SubdocError(p.SUBDOC_PATH_MISMATCH)
        if opcode == ARRAY_PUSH_LAST:
            target.extend(values)
        elif opcode == ARRAY_PUSH_FIRST:
            target[0:0] = values
        else:
            value = values[0]
            if isinstance(value, (dict, list)) or any(isinstance(v, (dict, list)) for v in target):
                raise SubdocError(p.SUBDOC_PATH_MISMATCH, "add unique takes primitives only")
            if any(type(v) is type(value) and v == value for v in target):
                raise SubdocError(p.SUBDOC_PATH_EEXISTS)
            target.append(value)
        return None
    if not parts:
        raise SubdocError(p.SUBDOC_PATH_EINVAL, "this operation needs a path")
    if opcode == ARRAY_INSERT:
        values = _values(raw, multi=True)
        if not isinstance(parts[-1], int):
            raise SubdocError(p.SUBDOC_PATH_EINVAL, "an array insert's path ends with [index]")
        parent = _parent(doc, parts, False)
        if not isinstance(parent, list):
            raise SubdocError(p.SUBDOC_PATH_MISMATCH)
        index = parts[-1]
        if not 0 <= index <= len(parent):
            raise SubdocError(p.SUBDOC_PATH_ENOENT)
        parent[index:index] = values
        return None
    parent = _parent(doc, parts, mkdir)
    last = parts[-1]
    exists = _has_child(parent, last)
    if opcode == DELETE:
        if not exists:
            raise SubdocError(p.SUBDOC_PATH_ENOENT)
        del parent[last]
        return None
    if opcode == COUNTER:
        try:
            delta = int(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise SubdocError(p.SUBDOC_DELTA_EINVAL) from None
        if delta == 0 or not INT64_MIN <= delta <= INT64_MAX:
            raise SubdocError(p.SUBDOC_DELTA_EINVAL)
        current = parent[last] if exists else 0
        if isinstance(current, bool) or not isinstance(current, int):
            raise SubdocError(p.SUBDOC_PATH_MISMATCH)
        value = current + delta
        if not INT64_MIN <= value <= INT64_MAX:
            raise SubdocError(p.SUBDOC_NUM_ERANGE)
        _set_child(parent, last, value)
        return value
    value = _values(raw, multi=False)[0]
    if opcode == DICT_ADD:
        if isinstance(last, int) or not isinstance(parent, dict):
            raise SubdocError(p.SUBDOC_PATH_MISMATCH)
        if exists:
            raise SubdocError(p.SUBDOC_PATH_EEXISTS)
    elif opcode == DICT_UPSERT:
        if isinstance(last, int) or not isinstance(parent, dict):
            raise SubdocError(p.SUBDOC_PATH_MISMATCH)
    elif opcode == REPLACE:
        if not exists:
            raise SubdocError(p.SUBDOC_PATH_ENOENT)
    _set_child(parent, last, value)
    return None


def _has_child(parent: Any, last: Component) -> bool:
    if isinstance(last, int):
        if not isinstance(parent, list):
            raise SubdocError(p.SUBDOC_PATH_MISMATCH)
        return -len(parent) <= last < len(parent)
    if not isinstance(parent, dict):
        raise SubdocError(p.SUBDOC_PATH_MISMATCH)
    return last in parent


def _set_child(parent: Any, last: Component, value: Any) -> None:
    if isinstance(last, int):
        if not isinstance(parent, list) or not -len(parent) <= last < len(parent):
            raise SubdocError(p.SUBDOC_PATH_ENOENT)
    elif not isinstance(parent, dict):
        raise SubdocError(p.SUBDOC_PATH_MISMATCH)
    parent[last] = value


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
