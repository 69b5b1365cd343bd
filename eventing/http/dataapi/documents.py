"""The Data API's document operations: what a read answers and what a write changes (its checks, the stored
body and flags, the answer once committed), run on the bucket's request thread under its lock."""

from __future__ import annotations

import email.utils
import json
import sys
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import unquote_to_bytes

import msgspec

from eventing.core.mutation import (
    NESTING_LIMIT,
    OP_DELETE,
    OP_UPDATE,
    decode_document,
    encode_document,
    nests_too_deep,
)
from eventing.http.dataapi.errors import ApiError, bad
from eventing.http.dataapi.requests import (
    DURABILITY_LEVELS,
    FLAGS_BINARY,
    FLAGS_JSON,
    FLAGS_STRING,
    MAX_BODY_BYTES,
    UINT64,
    DocRequest,
    parse_cas,
    parse_expires,
    parse_flags,
    uint64_field,
)
from eventing.storage.keyspace import Collection
from eventing.storage.values import Changed, StoredDocument, Write

_json_decode = msgspec.json.decode
_pack = msgspec.msgpack.encode


def value_of(stored: bytes) -> dict | bytes:
    return decode_document(stored)


def raw_of(value: Any) -> bytes:
    """A stored document as the bytes of its body."""
    if isinstance(value, bytes):
        return value
    try:
        return _json_bytes(value)
    except RecursionError:
        return _deep_raw_of(value)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


_DEEP = threading.Lock()


def _deep_raw_of(value: Any) -> bytes:
    """A document stored before writes were held to NESTING_LIMIT levels (up to ~990) reads back: the
    encoder recurses once a level, on a stack a server's request already holds part of. The limit is the
    process's, so one such document at a time, and it is put back at once."""
    with _DEEP:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + 4 * NESTING_LIMIT)
        try:
            return _json_bytes(value)
        finally:
            sys.setrecursionlimit(limit)


def content_type_of(value: Any, flags: int) -> str:
    kind = flags >> 24
    if flags and kind == FLAGS_JSON >> 24:
        return "application/json"
    if flags and kind == FLAGS_STRING >> 24:
        return "text/plain"
    if flags and kind == FLAGS_BINARY >> 24:
        return "application/octet-stream"
    if not isinstance(value, bytes):
        return "application/json"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    try:
        json.loads(text)
        return "application/json"
    except ValueError:
        return "text/plain"
    except RecursionError:  # JSON nested too deeply to read again here: it was stored as JSON
        return "application/json"


def _too_deep() -> ApiError:
    return bad(
        f"The body's JSON nests more than about {NESTING_LIMIT} levels deep, deeper than documents may; "
        "flatten it"
    )


def stored_body(raw: bytes, flags: int, declared_json: bool) -> bytes:
    """The msgpack bytes to store for a body: a JSON object as a map (what handlers read as a dict), anything
    else as its bytes. A body declared JSON (Content-Type application/json) must be JSON."""
    kind = flags >> 24
    if declared_json or not flags or kind == FLAGS_JSON >> 24:
        try:
            value = _json_decode(raw)
        except RecursionError:
            raise _too_deep() from None
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            if declared_json:
                raise bad(
                    f"The body is declared application/json but is not valid JSON ({exc}); send JSON, or "
                    "another Content-Type for a text or binary document"
                ) from None
            value = None
        if isinstance(value, dict):
            # Readable here, yet deeper than documents may (how deep a decoder reaches depends on the stack):
            # it would not be read back. Only a body with that many brackets can be, so most are not walked.
            if raw.count(b"{") + raw.count(b"[") > NESTING_LIMIT and nests_too_deep(value):
                raise _too_deep()
            try:
                return _pack(value)
            except (OverflowError, TypeError, ValueError):
                pass  # a number msgpack cannot hold: keep the text as it is
    return encode_document(raw)


def etag(cas: int) -> str:
    return f"{cas:08x}"


def http_date(expiry: int) -> str:
    return email.utils.formatdate(expiry, usegmt=True)


def live(current: StoredDocument | None, now: float) -> StoredDocument | None:
    """The current version unless its expiry has passed (it reads as gone, as in Couchbase)."""
    if current is None or (current.expiry and current.expiry <= now):
        return None
    return current


def _counter_value(doc: StoredDocument, req: DocRequest) -> int:
    value = value_of(doc.doc)
    text = value.strip() if isinstance(value, bytes) else b""
    if not text.isdigit() or int(text) > UINT64:
        raise ApiError(
            400,
            "DocumentNotNumeric",
            f"Cannot perform counter operation on non-numeric document "
            f"'{req.key}' in {req.where}; a counter document holds a whole number from 0 to {UINT64}",
            req.resource,
        )
    return int(text)


Answer = tuple[int, dict[str, str], bytes, str | None]  # status, headers, body, content type


class Change(NamedTuple):
    """A write planned by `plan_op`, made in the bucket's next group commit (FileBucket.change_documents):
    the stored key, the check-and-set to run against the document as it is then, and the answer to give
    once that transaction has committed."""

    key: str
    change: Callable[[StoredDocument | None], Write | None]
    answer: Callable[[Changed], Answer]


def mutation_token(req: DocRequest, bucket_uuid: str, done: Changed) -> str:
    """Couchbase's `X-CB-MutationToken`, BUCKET:VB:VBUUID:SEQNO: the bucket's uuid (new when the bucket is
    re-created or flushed) stands for the vBucket's."""
    try:
        vbuuid = int(bucket_uuid[:8], 16)
    except ValueError:
        vbuuid = zlib.crc32(bucket_uuid.encode())
    return f"{req.ks.bucket}:{done.vb}:{vbuuid:08x}:{done.seqno}"


def plan_op(coll: Collection, req: DocRequest) -> Answer | Change:
    """A read's answer, or the write to make for a document request (its checks, and its answer once
    committed). Raises ApiError for a request refused before the write."""
    now = time.time()
    stored = coll.stored(req.key)
    h = req.headers
    if req.method == "GET":
        doc = coll.get_doc(req.key)
        meta = coll.get_meta(req.key) if doc is not None else None
        if doc is None or meta is None or (doc[2] and doc[2] <= now):
            raise req.missing()
        return _content(req, decode_document(doc[0]), doc[1], doc[2], meta["flags"])

    if h.get("x-cb-durabilitylevel") is not None and h["x-cb-durabilitylevel"] not in DURABILITY_LEVELS:
        raise bad(
            f"Invalid durability level '{h['x-cb-durabilitylevel'][:40]}'; give one of "
            f"{', '.join(sorted(DURABILITY_LEVELS))}"
        )
    cas = parse_cas(h.get("if-match")) if h.get("if-match", "").strip() != "*" else None
    any_version = h.get("if-match", "").strip() == "*"
    bucket_uuid = str(coll.bucket.uuid)

    def written(done: Changed) -> Answer:
        return (
            200,
            {"ETag": etag(done.cas), "X-CB-MutationToken": mutation_token(req, bucket_uuid, done)},
            b"",
            None,
        )

    if req.op == "":
        if req.method == "DELETE":

            def remove(cur: StoredDocument | None) -> Write:
                cur = live(cur, now)
                if cur is None:
                    raise req.missing()
                if cas is not None and cur.cas != cas:
                    raise req.cas_mismatch()
                return Write(stored, OP_DELETE)

            return Change(stored, remove, written)
        encoding = h.get("content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("identity", ""):
            raise bad(
                f"Content-Encoding '{encoding[:40]}' is not supported; send the document uncompressed "
                "(identity)"
            )
        ctype = h.get("content-type", "").split(";")[0].strip().lower()
        flags = {
            "application/json": FLAGS_JSON,
            "text/plain": FLAGS_STRING,
            "application/octet-stream": FLAGS_BINARY,
        }.get(ctype, 0)
        given_flags = parse_flags(h.get("x-cb-flags"))
        flags = flags if given_flags is None else given_flags
        expiry = parse_expires(h.get("expires"))
        data = stored_body(req.body, flags, ctype == "application/json")
        create = req.method == "POST"
        replace = cas is not None or any_version

        def put(cur: StoredDocument | None) -> Write:
            cur = live(cur, now)
            if create and cur is not None:
                raise req.exists()
            if replace and cur is None:
                raise req.missing()
            if cas is not None and cur is not None and cur.cas != cas:
                raise req.cas_mismatch()
            keep = cur.expiry if (cur is not None and expiry is None) else (expiry or 0)
            # a document's extended attributes stay, as Couchbase's full-document writes keep them
            return Write(stored, OP_UPDATE, data, keep, flags, xattrs=None if cur is None else cur.xattrs)

        return Change(stored, put, written)

    if req.op in ("append", "prepend"):
        if not req.body:
            raise bad("No content was provided in the request body; send the bytes to " + req.op)

        def extend(cur: StoredDocument | None) -> Write:
            cur = live(cur, now)
            if cur is None:
                raise req.missing()
            if cas is not None and cur.cas != cas:
                raise req.cas_mismatch()
            old = raw_of(value_of(cur.doc))
            raw = old + req.body if req.op == "append" else req.body + old
            if len(raw) > MAX_BODY_BYTES:
                raise ApiError(
                    400,
                    "ValueTooLarge",
                    f"Updated value made document '{req.key}' larger than "
                    f"{MAX_BODY_BYTES:,} bytes in {req.where}",
                    req.resource,
                )
            return Write(
                stored,
                OP_UPDATE,
                stored_body(raw, cur.flags, False),
                cur.expiry,
                cur.flags,
                xattrs=cur.xattrs,
            )

        return Change(stored, extend, written)

    if req.op in ("increment", "decrement"):
        body = req.json_body() or {}
        delta = uint64_field(body, "delta")
        delta = 1 if delta is None else delta
        initial = uint64_field(body, "initial")
        expiry = parse_expires(h.get("expires"))
        if expiry and initial is None:
            raise bad(
                "Expiry cannot be set when the document does not exist and initial is not set; an expiry "
                "only applies to a counter document created by this request"
            )
        result: list[int] = []

        def count(cur: StoredDocument | None) -> Write:
            cur = live(cur, now)
            if cur is None:
                if initial is None:
                    raise req.missing()
                result[:] = [initial]
                return Write(stored, OP_UPDATE, encode_document(str(initial).encode()), expiry or 0, 0)
            value = _counter_value(cur, req)
            value = (value + delta) & UINT64 if req.op == "increment" else max(0, value - delta)
            result[:] = [value]
            return Write(
                stored,
                OP_UPDATE,
                encode_document(str(value).encode()),
                cur.expiry,
                cur.flags,
                xattrs=cur.xattrs,
            )

        def counted(done: Changed) -> Answer:
            _, headers, _, _ = written(done)
            return 200, headers, str(result[0]).encode(), "application/json"

        return Change(stored, count, counted)

    # touch
    touch_body = req.json_body()
    if touch_body is None or "expiry" not in touch_body:
        raise bad('Expiry not specified in request body; send {"expiry": "2030-01-01T00:00:00Z"}')
    if not isinstance(touch_body["expiry"], str):
        raise bad("'expiry' must be a string: an ISO 8601 or HTTP date, 0, or a duration such as 90s")
    new_expiry = parse_expires(touch_body["expiry"], iso=True) or 0
    give = touch_body.get("returnContent", False)
    if not isinstance(give, bool):
        raise bad("'returnContent' must be true or false")

    def touch(cur: StoredDocument | None) -> Write:
        cur = live(cur, now)
        if cur is None:
            raise req.missing()
        return Write(stored, OP_UPDATE, cur.doc, new_expiry, cur.flags, xattrs=cur.xattrs)

    def touched(done: Changed) -> Answer:
        after = done.after
        assert after is not None
        if not give:
            return 204, {"ETag": etag(after.cas)}, b"", None
        return _content(req, decode_document(after.doc), after.cas, 0, after.flags)

    return Change(stored, touch, touched)


def _content(
    req: DocRequest, value: Any, cas: int, expiry: int, flags: int
) -> tuple[int, dict[str, str], bytes, str]:
    headers = {"ETag": etag(cas), "X-CB-Flags": str(flags)}
    if expiry:
        headers["Expires"] = http_date(expiry)
    project = _project_fields(req.query)
    if project:
        if not isinstance(value, dict):
            raise ApiError(
                400,
                "DocumentNotJson",
                f"Document '{req.key}' was not a JSON object in {req.where}; "
                "project only applies to JSON documents",
                req.resource,
            )
        value = _projection(value, project)
    return 200, headers, raw_of(value), content_type_of(value, flags)


def _project_fields(query: str) -> list[str]:
    fields: list[str] = []
    for part in query.split("&"):
        name, _, val = part.partition("=")
        if name == "project":
            text = unquote_to_bytes(val.replace("+", " ")).decode("utf-8", "replace")
            fields += [f for f in text.split(",") if f]
    return fields


def _projection(doc: dict, paths: list[str]) -> dict:
    out: dict[str, Any] = {}
    for path in paths:
        parts = path.split(".")
        node: Any = doc
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            target = out
            for part in parts[:-1]:
                target = target.setdefault(part, {})
            target[parts[-1]] = node
    return out
