"""The mutation model and document codec: documents travel as msgpack bytes and are decoded once."""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

import msgpack

from eventing.errors import InvalidDocumentError

OP_UPDATE = 0
OP_DELETE = 1
OP_EXPIRE = 2
OP_TIMER = 3  # a fired timer (never in a bucket log): vb = TIMER_VB_BASE + vb, seqno = fire_seq, cas = due ms
OP_NAMES = {OP_UPDATE: "update", OP_DELETE: "delete", OP_EXPIRE: "expire", OP_TIMER: "timer"}

# Couchbase refuses documents over 20 MiB; so does a local bucket.
MAX_DOCUMENT_BYTES = 20 * 1024 * 1024
# About how deep JSON may nest: Python's recursion limit (1,000 frames) stops reading it a little before.
NESTING_LIMIT = 900
_TOO_DEEP = f"document nests more than about {NESTING_LIMIT} levels deep; flatten it"


class Mutation(NamedTuple):
    """One row of a bucket's per-vBucket mutation log; `doc` stays msgpack bytes until the handler.

    ``arrival_ms`` is when the source assigned the seqno (epoch ms UTC, see ``eventing.storage.bucket``);
    0 means unknown (a mutation built by hand, or a dead-letter row written before the field existed)."""

    vb: int
    seqno: int
    key: str
    op: int
    cas: int
    doc: bytes | None
    origin: str | None  # name of the function whose binding wrote it (recursion guard), else None
    expiry: int
    flags: int
    arrival_ms: int = 0
    # The document's extended attributes as of this mutation (eventing.core.xattrs), None: none. A row read
    # from a log always has this field; a mutation built by hand or an older dead-letter row may not.
    xattrs: bytes | None = None


def _check_json(value: Any, path: str, depth: int = 1) -> None:
    """Raise InvalidDocumentError unless value holds only JSON values, nested at most NESTING_LIMIT deep (a
    document stored deeper could not be read back as JSON: RecursionError). Scalars inside a container are
    checked inline (no call, no path string): most documents are flat, and this runs on every write."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        _check_scalar(value, path)
        return
    is_dict = isinstance(value, dict)
    for k, item in items:
        if is_dict and type(k) is not str:
            raise InvalidDocumentError(
                f"document field {path} has a non-string key {k!r}; JSON keys are strings"
            )
        t = type(item)
        if t is str or t is int or t is bool or item is None:
            continue
        if t is float and math.isfinite(item):
            continue
        if depth >= NESTING_LIMIT:
            raise InvalidDocumentError(_TOO_DEEP)
        _check_json(item, f"{path}.{k}" if is_dict else f"{path}[{k}]", depth + 1)


def _check_scalar(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidDocumentError(f"document field {path} is {value}; JSON has no NaN or infinity")
        return
    raise InvalidDocumentError(
        f"document field {path} is a {type(value).__name__}; documents hold only JSON values"
    )


def encode_document(doc: Any) -> bytes:
    """Validate a JSON object and encode it as msgpack bytes. A `bytes` value (a binary or non-object
    document written through the Data API) is stored as it is: msgpack bin, decoded back to the same bytes."""
    if isinstance(doc, bytes):
        data = msgpack.packb(doc, use_bin_type=True)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise InvalidDocumentError(
                f"document is {len(doc):,} bytes, {len(data):,} stored, which exceeds the limit "
                f"of {MAX_DOCUMENT_BYTES:,} bytes stored; split it"
            )
        return data
    if not isinstance(doc, dict):
        raise InvalidDocumentError(
            f'document is a JSON {_json_kind(doc)}, not an object; wrap it, for example {{"value": ...}}'
        )
    try:
        _check_json(doc, "$")
        data = msgpack.packb(doc, use_bin_type=True)
    except RecursionError:
        raise InvalidDocumentError(_TOO_DEEP) from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise InvalidDocumentError(
            f"document is {len(data):,} bytes encoded, which exceeds the limit of {MAX_DOCUMENT_BYTES:,} "
            "bytes; split it"
        )
    return data


def nests_too_deep(value: Any) -> bool:
    """Whether a decoded JSON value nests more than NESTING_LIMIT containers deep (walked without
    recursion)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                if depth >= NESTING_LIMIT:
                    return True
                stack.append((child, depth + 1))
    return False


def decode_document(data: bytes) -> dict:
    """The stored document: a JSON object (a dict), or the bytes of a binary document (see
    encode_document)."""
    return msgpack.unpackb(data, raw=False)


def parse_json_document(text: str) -> dict:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidDocumentError(f"document is not valid JSON ({exc}); check the quoting") from None
    encode_document(doc)  # validates
    return doc


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def pack_mutation(m: Mutation) -> bytes:
    """The mutation itself as bytes, for dead-letter rows."""
    return msgpack.packb(list(m), use_bin_type=True)


def unpack_mutation(data: bytes) -> Mutation:
    return Mutation(*msgpack.unpackb(data, raw=False))
