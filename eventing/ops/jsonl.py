"""JSON lines import (`eventing bucket load --file`, `Eventing.load_jsonl`): one mutation a line,
`{"key": ..., "doc": ...}` (a JSON object, or any other JSON value as `bucket upsert` takes it; "datatype":
"text" or "binary" with base64 for a document that is not JSON; an optional "expiry", and "xattrs": the
document's extended attributes; as `eventing bucket export` writes them) or `{"key": ..., "op": "delete"}`,
committed in transactions of up to 20,000 lines; a bad line is reported with its number, never loaded. An
upsert without "xattrs" keeps those the document has, as Couchbase's full-document writes do;
`"xattrs": {}` leaves it none."""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from eventing.core import xattrs as xattr_codec
from eventing.core.mutation import (
    MAX_DOCUMENT_BYTES,
    NESTING_LIMIT,
    OP_DELETE,
    OP_UPDATE,
    encode_document,
    nests_too_deep,
)
from eventing.errors import EventingError, InvalidDocumentError, InvalidKeyError
from sharding import validate_key
from sharding.vbucket import MAX_KEY_BYTES


@dataclass
class JsonLinesLoad:
    written: int = 0  # mutations logged
    skipped: int = 0  # deletes of documents that do not exist: nothing logged


def load_json_lines(bucket: Any, path: str, rejected: list[str]) -> JsonLinesLoad:
    """Load the file at `path` (- for stdin) into `bucket`, each batch one transaction (committed whole or
    not at all); bad lines are added to `rejected`."""
    done = JsonLinesLoad()
    for rows in json_line_rows(path, rejected):
        written = bucket.load_rows(rows)
        done.written += written
        done.skipped += len(rows) - written
    return done


MAX_EXPIRY = (1 << 32) - 1  # expiries are unsigned 32-bit Unix seconds, as Couchbase's


class _Line(msgspec.Struct):
    """The common shape of an import line, decoded in one C call; anything else takes _parse_line."""

    key: str
    doc: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    op: str = "upsert"
    expiry: Annotated[int, msgspec.Meta(ge=0, le=MAX_EXPIRY)] = 0
    xattrs: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    datatype: str = "json"


_line_decoder = msgspec.json.Decoder(_Line)
_doc_encoder = (
    msgspec.msgpack.Encoder()
)  # the same bytes as msgpack.packb(doc, use_bin_type=True) for JSON values


def json_line_rows(path: str, rejected: list[str], size: int = 20_000) -> Iterator[list[tuple]]:
    """Rows ``(key, op, doc, expiry)`` for LocalBucket.load_rows from `{"key":..., "doc":{...}}` or
    `{"key":..., "op":"delete"}` lines, in lists of up to `size`; bad lines are reported, not lost.

    A line in the common shape is decoded by msgspec straight into typed fields and its document encoded to
    msgpack without a validation walk: JSON text holds only JSON values, and msgspec refuses NaN, infinity
    and numbers out of range. Any line it refuses goes through _parse_line (json + encode_document), which
    accepts or rejects it exactly as before and names the problem."""
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    with stream:
        yield from rows_of_lines(stream, rejected, size)


def rows_of_lines(
    lines: Iterable[bytes], rejected: list[str], size: int = 20_000, *, stop_at_bad_line: bool = False
) -> Iterator[list[tuple]]:
    """json_line_rows of any lines (a file, a request body split at newlines). With `stop_at_bad_line`,
    the first bad line ends it: the rows of the lines before it come out, none after."""
    decode, encode = _line_decoder.decode, _doc_encoder.encode
    rows: list[tuple] = []
    for number, raw in enumerate(lines, 1):
        try:
            line = decode(raw)
            key = line.key
            kb = key.encode()
            if not kb or len(kb) > MAX_KEY_BYTES:
                raise ValueError(key)
            doc = line.doc
            if line.op == "delete":
                rows.append((key, OP_DELETE, None, 0))
            elif (
                doc is msgspec.UNSET
                or line.op not in ("upsert", "update", "insert")
                or line.datatype != "json"
            ):
                raise ValueError(line.op)
            else:
                if raw.count(b"{") + raw.count(b"[") > NESTING_LIMIT and nests_too_deep(doc):
                    raise ValueError(key)  # _parse_line names it (encode_document)
                data = encode(doc)
                if len(data) > MAX_DOCUMENT_BYTES:
                    raise ValueError(key)
                if line.xattrs is msgspec.UNSET:
                    rows.append((key, OP_UPDATE, data, line.expiry))
                else:
                    rows.append((key, OP_UPDATE, data, line.expiry, xattrs_field(line.xattrs)))
        except (
            msgspec.DecodeError,
            msgspec.ValidationError,
            InvalidDocumentError,
            ValueError,
            OverflowError,
            UnicodeError,
            RecursionError,
        ):
            if not raw.strip():
                continue
            row = _parse_line(raw, number, rejected)
            if row is not None:
                rows.append(row)
            elif stop_at_bad_line:
                break
        if len(rows) >= size:
            yield rows
            rows = []
    if rows:
        yield rows


def stored_document(value: Any, datatype: Any = "json") -> dict | bytes:
    """A document as it is stored: a JSON object as it is; any other JSON value (an array, a string, a
    number, true, false, null) as its JSON text, as `bucket upsert`, the Data API and the SDKs store them;
    with "datatype": "text" a string's UTF-8 bytes, with "binary" its base64 decoded (how `bucket export`
    and `bucket get --json` write documents that are not JSON)."""
    if datatype == "json":
        if isinstance(value, dict):
            return value
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        except ValueError:
            raise InvalidDocumentError("document holds NaN or infinity, which JSON does not have") from None
    if datatype == "text" and isinstance(value, str):
        return value.encode("utf-8")
    if datatype == "binary" and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            raise InvalidDocumentError(
                '"doc" of a "binary" document must be base64 text, as `bucket export` writes it'
            ) from None
    if datatype in ("text", "binary"):
        raise InvalidDocumentError(f'"doc" of a {json.dumps(datatype)} document must be a string')
    raise InvalidDocumentError(
        f'"datatype" {json.dumps(datatype)[:40]} is not known; give "json" (the default), "text" or "binary"'
    )


def _expiry(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 5.0, as a JSON writer may give a whole number
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EXPIRY:
        raise InvalidDocumentError(
            f'"expiry" {json.dumps(value)[:40]} is not valid; give the Unix time in whole '
            f"seconds when the document expires, from 1 to {MAX_EXPIRY} (0: never)"
        )
    return value


def xattrs_field(value: Any) -> bytes:
    """A line's "xattrs" as a write carries them (eventing.core.xattrs.for_write: {} leaves none)."""
    if not isinstance(value, dict):
        raise InvalidDocumentError(
            '"xattrs" must be an object of extended attributes, {"name": value, ...}, as bucket export writes'
        )
    for name in value:
        if name.startswith("$") or not xattr_codec.valid_name(name):
            raise InvalidDocumentError(
                f'"xattrs" holds {name[:40]!r}, not an extended attribute\'s name: 1 to 15 bytes, not '
                'starting with "$" or punctuation other than "_"'
            )
    raw = xattr_codec.for_write(value)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise InvalidDocumentError(
            f'"xattrs" is larger than {MAX_DOCUMENT_BYTES:,} bytes encoded; keep them smaller'
        )
    return raw


def _parse_line(raw: bytes, number: int, rejected: list[str]) -> tuple | None:
    """One line the general way; a bad line is added to `rejected` with its number and what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        rejected.append(
            f"line {number}: not UTF-8 ({exc.reason} at byte {exc.start}); re-encode the file as UTF-8"
        )
        return None
    try:
        item = json.loads(text)
        if not isinstance(item, dict) or "key" not in item:
            raise InvalidDocumentError('each line must be an object with "key" and "doc" or "op"')
        key = item["key"]
        validate_key(key)
        op = item.get("op", "upsert")
        if op == "delete":
            return (key, OP_DELETE, None, 0)
        if op in ("upsert", "update", "insert"):
            if "doc" not in item:
                raise InvalidDocumentError('an upsert line needs "doc"')
            doc = stored_document(item["doc"], item.get("datatype", "json"))
            row = (key, OP_UPDATE, encode_document(doc), _expiry(item.get("expiry", 0)))
            return row if "xattrs" not in item else (*row, xattrs_field(item["xattrs"]))
        raise InvalidDocumentError(f'unknown op {op!r}; use "upsert" or "delete"')
    except json.JSONDecodeError as exc:
        rejected.append(f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})")
    except OverflowError:
        rejected.append(f"line {number}: a number is out of range (documents hold 64-bit integers at most)")
    except RecursionError:
        rejected.append(
            f"line {number}: the JSON nests more than about {NESTING_LIMIT} levels deep, deeper than "
            "documents may; flatten it"
        )
    except (EventingError, InvalidKeyError, ValueError, TypeError) as exc:
        rejected.append(f"line {number}: {exc}")
    return None
