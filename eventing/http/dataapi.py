"""Couchbase's Data API (the Capella Data API, v1) over the buckets of the data directory, plus a streamed
bulk load.

Paths, headers, status codes and error bodies follow the Data API's OpenAPI description: a document is
`/v1/buckets/{bucket}/scopes/{scope}/collections/{collection}/documents/{key}` (GET, POST creates, PUT
upserts or replaces under If-Match, DELETE), with /append, /prepend, /increment, /decrement and /touch;
`/v1/callerIdentity` names the caller. Errors are `{"code": ..., "message": ..., "resource": ...}`.
The /v1.alpha paths (locking, sub-document) are not served: 404, as a server whose alpha API is off.

A document is stored as the rest of the project stores it (eventing.core.mutation): a JSON object as a
msgpack map, so a handler gets a dict; any other body (text, binary, a JSON number or array, a counter)
as its bytes. `ETag` is the document's cas in hex, `X-CB-Flags` its flags (Couchbase's common flags: the
format in the top byte), `Expires` its expiry as an HTTP date. Every write goes through
`Collection.change`, one transaction that reads the current version, checks the condition (absent for a
create, the If-Match cas for a replace or delete) and writes, so two callers never both win. A write is a
mutation of the bucket like any other: functions whose source is the keyspace see it.

`POST /api/v1/keyspaces/{keyspace}/load` takes the JSON lines of `eventing bucket load --file`, read in
chunks as they arrive and committed in transactions of up to 20,000 lines; the first bad line stops it,
and the answer says which line and how many rows before it were committed.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import json
import logging
import os
import queue
import re
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote_to_bytes

import anyio
import anyio.from_thread
import anyio.to_thread
import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

from eventing.core.keyspaces import DEFAULT, Keyspace
from eventing.core.mutation import MAX_DOCUMENT_BYTES, OP_DELETE, OP_UPDATE, decode_document, encode_document
from eventing.errors import ConfigError, EventingError, InvalidKeyError, NotFoundError, StoreLockedError
from eventing.http.auth import (
    AUTH_ERROR_SCOPE_KEY,
    DATA_READ,
    DATA_WRITE,
    IDENTITY_SCOPE_KEY,
    AuthError,
    Identity,
    ServerConfig,
)
from eventing.ops.jsonl import rows_of_lines
from eventing.storage.bucket import Changed, StoredDocument, Write, bucket_path
from eventing.storage.factory import open_bucket
from eventing.storage.keyspace import Collection, parse_keyspace
from eventing.storage.protocol import FileBucket

MAX_BODY_BYTES = 20 * 1024 * 1024  # Couchbase's document limit; a larger body is a 413
MAX_KEY_BYTES = 250
MAX_LINE_BYTES = 2 * MAX_DOCUMENT_BYTES  # one JSON line of the bulk load (a document and its key)
LOAD_BATCH_LINES = 20_000
MAX_GROUP = 256  # document requests of one bucket answered in one turn (their writes: one transaction)
# Couchbase's common flags: the document's format in the top byte.
FLAGS_JSON = 0x02000000
FLAGS_BINARY = 0x03000000
FLAGS_STRING = 0x04000000
UINT32 = (1 << 32) - 1
UINT64 = (1 << 64) - 1
DURABILITY_LEVELS = frozenset({"None", "Majority", "MajorityAndPersistOnMaster", "PersistToMajority"})
DOCUMENT_OPS = frozenset({"append", "prepend", "increment", "decrement", "touch"})
LOAD_PREFIX = "/api/v1/keyspaces/"
_DURATION = re.compile(r"^(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_HEX = re.compile(r"^[0-9a-fA-F]{1,16}$")
_json_decode = msgspec.json.decode
log = logging.getLogger(__name__)
_pack = msgspec.msgpack.encode


def serves(path: str) -> bool:
    """Paths whose requests this module answers, reading their bodies itself (no whole-body buffering)."""
    return path.startswith(("/v1/", "/v1.alpha/", LOAD_PREFIX)) or path in ("/v1", "/v1.alpha")


class ApiError(Exception):
    """An answer in the Data API's error shape."""

    def __init__(self, status: int, code: str, message: str, resource: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.resource = status, code, message, resource
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.resource:
            out["resource"] = self.resource
        return out


def bad(message: str) -> ApiError:
    return ApiError(400, "InvalidArgument", message)


def too_large() -> ApiError:
    return ApiError(413, "InvalidArgument", f"The content of the request was too large (over {MAX_BODY_BYTES:,} bytes); "
                    "store a smaller document")


# -- where documents live: open buckets, one lock each ----------------------------------------------------


@dataclass
class _Open:
    bucket: FileBucket
    lock: threading.Lock
    inode: int


class Buckets:
    """The data directory's buckets, opened once and shared by the request threads (one lock a bucket: a
    SQLite connection runs one transaction at a time). A bucket dropped or re-created is opened again."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self._open: dict[str, _Open] = {}
        self._turns: dict[str, _Turns] = {}
        self._guard = threading.Lock()

    def get(self, name: str) -> _Open:
        try:
            inode = os.stat(bucket_path(self.data_dir, name)).st_ino
        except (OSError, ValueError):
            inode = -1
        with self._guard:
            found = self._open.get(name)
            if found is not None and found.inode == inode:
                return found
            if found is not None:
                self._open.pop(name)
                with found.lock:
                    found.bucket.close()
            if inode == -1:
                raise ApiError(404, "BucketNotFound", f"Bucket '{name}' was not found; create it with "
                               f"`eventing bucket create {name}`", f"/buckets/{name}")
            try:
                bucket = open_bucket(self.data_dir, name)
            except (NotFoundError, ConfigError):
                raise ApiError(404, "BucketNotFound", f"Bucket '{name}' was not found; create it with "
                               f"`eventing bucket create {name}`", f"/buckets/{name}") from None
            opened = _Open(bucket, threading.Lock(), inode)
            self._open[name] = opened
            return opened

    def collection(self, opened: _Open, ks: Keyspace) -> Collection:
        """The keyspace's collection (call under the bucket's lock): 404 naming the scope or collection."""
        if ks.is_default:
            return Collection(opened.bucket, ks, 0)
        registry = opened.bucket.collections()
        cid = registry.get((ks.scope, ks.collection))
        if cid is None:
            if ks.scope != DEFAULT and all(scope != ks.scope for scope, _ in registry):
                raise ApiError(404, "ScopeNotFound", f"Scope '{ks.scope}' not found in '{ks.bucket}'; create a "
                               f"collection in it with `eventing collection create {ks.bucket}.{ks.scope}.COLLECTION`",
                               f"/buckets/{ks.bucket}/scopes/{ks.scope}")
            raise ApiError(404, "CollectionNotFound", f"Collection '{ks.collection}' not found in '{ks.bucket}/{ks.scope}'; "
                           f"create it with `eventing collection create {ks}`",
                           f"/buckets/{ks.bucket}/scopes/{ks.scope}/collections/{ks.collection}")
        return Collection(opened.bucket, ks, cid)

    def run(self, ks: Keyspace, fn: Callable[[Collection], Any]) -> Any:
        """`fn(collection)` under the bucket's lock (in a request thread)."""
        opened = self.get(ks.bucket)
        with opened.lock:
            return fn(self.collection(opened, ks))

    def submit(self, req: DocRequest) -> asyncio.Future[Answer]:
        """Queue a document request for its bucket's thread; the future holds its answer (or the ApiError
        to answer), set once its write is committed."""
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        with self._guard:
            turns = self._turns.get(req.ks.bucket)
            if turns is None:
                turns = self._turns[req.ks.bucket] = _Turns(self, req.ks.bucket)
        turns.queue.put((req, future))
        return future

    def close(self) -> None:
        with self._guard:
            for turns in self._turns.values():
                turns.queue.put(None)
            self._turns.clear()
            for opened in self._open.values():
                with opened.lock:
                    opened.bucket.close()
            self._open.clear()


class _Turns:
    """One bucket's request thread: it takes every document request queued since its last turn (up to
    MAX_GROUP), answers the reads, and makes the writes in one transaction (a group commit: one commit
    for many concurrent writers, FileBucket.change_documents), each checked against the document as the
    writes before it left it; each request is answered only once that transaction has committed."""

    def __init__(self, buckets: Buckets, name: str):
        self.buckets, self.name = buckets, name
        self.queue: queue.SimpleQueue[tuple[DocRequest, asyncio.Future[Answer]] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=f"dataapi-{name}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            group = [first]
            while len(group) < MAX_GROUP:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self.queue.put(None)  # stop after this group
                    break
                group.append(item)
            try:
                answers = self._answer([req for req, _ in group])
            except Exception as exc:  # the bucket could not be opened, or the commit failed: all alike
                answers = [exc] * len(group)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Answer], Answer | Exception]]] = {}
            for (_, future), answer in zip(group, answers, strict=True):
                by_loop.setdefault(future.get_loop(), []).append((future, answer))
            for loop, settled in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:
                    pass  # that event loop is closed: nobody waits for these answers

    def _answer(self, reqs: list[DocRequest]) -> list[Answer | Exception]:
        opened = self.buckets.get(self.name)
        with opened.lock:
            collections: dict[Keyspace, Collection] = {}
            planned: list[Answer | Change | Exception] = []
            for req in reqs:
                try:
                    coll = collections.get(req.ks)
                    if coll is None:
                        coll = collections[req.ks] = self.buckets.collection(opened, req.ks)
                    planned.append(plan_op(coll, req))
                except Exception as exc:
                    planned.append(_api_error(exc))
            changes = [(p.key, p.change) for p in planned if isinstance(p, Change)]
            done: list[Changed | Exception] = []
            if changes:
                try:
                    done = opened.bucket.change_documents(changes)
                except Exception as exc:
                    if len(changes) == 1 or isinstance(exc, StoreLockedError):
                        raise
                    # one write the store refused fails the transaction: make each on its own
                    done = []
                    for change in changes:
                        try:
                            done += opened.bucket.change_documents([change])
                        except Exception as one:
                            done.append(one)
        results = iter(done)
        answers: list[Answer | Exception] = []
        for p in planned:
            if isinstance(p, Change):
                result = next(results)
                try:
                    answers.append(p.answer(result) if isinstance(result, Changed) else _api_error(result))
                except Exception as exc:
                    answers.append(_api_error(exc))
            else:
                answers.append(p)
        return answers


def _api_error(exc: Exception) -> Exception:
    """What to answer for an exception of a document request: the store's refusals as 400."""
    if isinstance(exc, InvalidKeyError):
        return bad(f"{exc}")
    if isinstance(exc, EventingError) and not isinstance(exc, StoreLockedError):
        return bad(f"{exc}")  # e.g. a document over the size limit
    return exc


def _settle(settled: list[tuple[asyncio.Future[Answer], Answer | Exception]]) -> None:
    for future, answer in settled:
        if future.done():
            continue  # the request was cancelled (its client went away); its write stands
        if isinstance(answer, Exception):
            future.set_exception(answer)
        else:
            future.set_result(answer)


# -- documents: bodies, flags, headers ---------------------------------------------------------------------


def value_of(stored: bytes) -> dict | bytes:
    return decode_document(stored)


def raw_of(value: Any) -> bytes:
    """A stored document as the bytes of its body."""
    if isinstance(value, bytes):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


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


def stored_body(raw: bytes, flags: int, declared_json: bool) -> bytes:
    """The msgpack bytes to store for a body: a JSON object as a map (what handlers read as a dict), anything
    else as its bytes. A body declared JSON (Content-Type application/json) must be JSON."""
    kind = flags >> 24
    if declared_json or not flags or kind == FLAGS_JSON >> 24:
        try:
            value = _json_decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            if declared_json:
                raise bad(f"The body is declared application/json but is not valid JSON ({exc}); send JSON, or "
                          "another Content-Type for a text or binary document") from None
            value = None
        if isinstance(value, dict):
            try:
                return _pack(value)
            except (OverflowError, TypeError, ValueError):
                pass  # a number msgpack cannot hold: keep the text as it is
    return encode_document(raw)


def etag(cas: int) -> str:
    return f"{cas:08x}"


def http_date(expiry: int) -> str:
    return email.utils.formatdate(expiry, usegmt=True)


def parse_expires(value: str | None, *, iso: bool = False) -> int | None:
    """Couchbase's expiry header: "0" or empty (none), an HTTP date, or a Go duration ("90s", "1h30m");
    the touch body also takes an ISO 8601 time. Returns absolute Unix seconds (0: none), None if absent."""
    if value is None:
        return None
    text = value.strip()
    if text in ("", "0"):
        return 0
    when: float | None = None
    if _DURATION.match(text):
        when = time.time() + sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))
    else:
        try:
            parsed = email.utils.parsedate_to_datetime(text)
            when = parsed.timestamp() if parsed.tzinfo else None
        except (TypeError, ValueError, IndexError):
            when = None
        if when is None and iso:
            try:
                from datetime import datetime

                parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
                when = parsed.timestamp() if parsed.tzinfo else None
            except ValueError:
                when = None
    if when is None:
        raise bad(f"Invalid time format '{value[:60]}': give 0, an HTTP date (Mon, 02 Jan 2006 15:04:05 GMT)"
                  + (", an ISO 8601 time" if iso else "") + " or a duration such as 90s or 1h30m")
    seconds = int(when)
    if not 0 < seconds <= UINT32:
        raise bad(f"Expiry '{value[:60]}' is out of range; give a time after 1970 and before 2106")
    return seconds


def parse_cas(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if text.startswith("W/"):
        text = text[2:]
    text = text.strip('"')
    if not _HEX.match(text):
        raise bad(f"Invalid etag format '{value[:60]}'; send the ETag of the document as it was returned (hex)")
    cas = int(text, 16)
    if cas == 0:
        raise bad("CAS value cannot be zero; send the ETag of the document as it was returned")
    return cas


def parse_flags(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or int(text) > UINT32:
        raise bad(f"Invalid X-CB-Flags '{value[:60]}'; give a whole number from 0 to {UINT32}")
    return int(text)


def live(current: StoredDocument | None, now: float) -> StoredDocument | None:
    """The current version unless its expiry has passed (it reads as gone, as in Couchbase)."""
    if current is None or (current.expiry and current.expiry <= now):
        return None
    return current


@dataclass
class DocRequest:
    ks: Keyspace
    key: str
    method: str
    op: str  # "" for the document itself, else append/prepend/increment/decrement/touch
    headers: dict[str, str]
    query: str
    body: bytes

    @property
    def resource(self) -> str:
        return f"/buckets/{self.ks.bucket}/scopes/{self.ks.scope}/collections/{self.ks.collection}/documents/{self.key}"

    @property
    def where(self) -> str:
        return f"'{self.ks.bucket}/{self.ks.scope}/{self.ks.collection}'"

    def missing(self) -> ApiError:
        return ApiError(404, "DocumentNotFound", f"Document '{self.key}' not found in {self.where}", self.resource)

    def exists(self) -> ApiError:
        return ApiError(409, "DocumentExists", f"Document '{self.key}' already exists in {self.where}; PUT replaces "
                        "it, or POST another key", self.resource)

    def cas_mismatch(self) -> ApiError:
        return ApiError(409, "CasMismatch", f"The specified CAS for '{self.key}' in {self.where} did not match: the "
                        "document changed since; GET it again for the current ETag", self.resource)

    def json_body(self) -> dict[str, Any] | None:
        """An optional JSON object body (counters), None when empty."""
        if not self.body.strip():
            return None
        ctype = self.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise bad(f"Unexpected content type '{ctype}'; send the body as application/json")
        try:
            data = json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad(f"The request body is not valid JSON ({exc}); send a JSON object") from None
        if not isinstance(data, dict):
            raise bad("The request body must be a JSON object")
        return data


def _uint64(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT64:
        raise bad(f"'{name}' must be a whole number from 0 to {UINT64}, not {json.dumps(value)[:40]}")
    return value


def _counter_value(doc: StoredDocument, req: DocRequest) -> int:
    value = value_of(doc.doc)
    text = value.strip() if isinstance(value, bytes) else b""
    if not text.isdigit() or int(text) > UINT64:
        raise ApiError(400, "DocumentNotNumeric", f"Cannot perform counter operation on non-numeric document "
                       f"'{req.key}' in {req.where}; a counter document holds a whole number from 0 to {UINT64}",
                       req.resource)
    return int(text)


# -- the operations (on the bucket's request thread, under the bucket's lock) ------------------------------

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
        raise bad(f"Invalid durability level '{h['x-cb-durabilitylevel'][:40]}'; give one of "
                  f"{', '.join(sorted(DURABILITY_LEVELS))}")
    cas = parse_cas(h.get("if-match")) if h.get("if-match", "").strip() != "*" else None
    any_version = h.get("if-match", "").strip() == "*"
    bucket_uuid = str(coll.bucket.uuid)

    def written(done: Changed) -> Answer:
        return 200, {"ETag": etag(done.cas), "X-CB-MutationToken": mutation_token(req, bucket_uuid, done)}, b"", None

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
            raise bad(f"Content-Encoding '{encoding[:40]}' is not supported; send the document uncompressed (identity)")
        ctype = h.get("content-type", "").split(";")[0].strip().lower()
        flags = {"application/json": FLAGS_JSON, "text/plain": FLAGS_STRING,
                 "application/octet-stream": FLAGS_BINARY}.get(ctype, 0)
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
            return Write(stored, OP_UPDATE, data, keep, flags)

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
                raise ApiError(400, "ValueTooLarge", f"Updated value made document '{req.key}' larger than "
                               f"{MAX_BODY_BYTES:,} bytes in {req.where}", req.resource)
            return Write(stored, OP_UPDATE, stored_body(raw, cur.flags, False), cur.expiry, cur.flags)

        return Change(stored, extend, written)

    if req.op in ("increment", "decrement"):
        body = req.json_body() or {}
        delta = _uint64(body, "delta")
        delta = 1 if delta is None else delta
        initial = _uint64(body, "initial")
        expiry = parse_expires(h.get("expires"))
        if expiry and initial is None:
            raise bad("Expiry cannot be set when the document does not exist and initial is not set; an expiry only "
                      "applies to a counter document created by this request")
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
            return Write(stored, OP_UPDATE, encode_document(str(value).encode()), cur.expiry, cur.flags)

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
        return Write(stored, OP_UPDATE, cur.doc, new_expiry, cur.flags)

    def touched(done: Changed) -> Answer:
        after = done.after
        assert after is not None
        if not give:
            return 204, {"ETag": etag(after.cas)}, b"", None
        return _content(req, decode_document(after.doc), after.cas, 0, after.flags)

    return Change(stored, touch, touched)


def _content(req: DocRequest, value: Any, cas: int, expiry: int, flags: int) -> tuple[int, dict[str, str], bytes, str]:
    headers = {"ETag": etag(cas), "X-CB-Flags": str(flags)}
    if expiry:
        headers["Expires"] = http_date(expiry)
    project = _project_fields(req.query)
    if project:
        if not isinstance(value, dict):
            raise ApiError(400, "DocumentNotJson", f"Document '{req.key}' was not a JSON object in {req.where}; "
                           "project only applies to JSON documents", req.resource)
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


# -- the ASGI side -----------------------------------------------------------------------------------------


class DataApi:
    """Answers the Data API paths and the bulk load; hands every other request to `app`."""

    def __init__(self, app: ASGIApp, config: ServerConfig):
        self.app = app
        self.config = config
        self.buckets = Buckets(config.data_dir)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not serves(scope["path"]):
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith(LOAD_PREFIX):
            await self.load(scope, receive, send)
            return
        try:
            status, headers, body, ctype = await self.dispatch(scope, receive)
        except ApiError as exc:
            status, headers, body, ctype = exc.status, exc.headers, json.dumps(exc.body()).encode(), "application/json"
        except StoreLockedError as exc:
            status, headers, ctype = 503, {}, "application/json"
            body = json.dumps({"code": "UnderlyingServiceUnavailable", "message": f"{exc}"}).encode()
        except Exception as exc:  # a fault of this server: still the Data API's error shape
            log.exception("Data API: %s %s failed", scope["method"], scope["path"])
            status, headers, ctype = 500, {}, "application/json"
            body = json.dumps({"code": "Internal", "message": f"An internal error occurred ({type(exc).__name__}); "
                               "the server log has the details"}).encode()
        await respond(send, status, headers, body, ctype)

    async def dispatch(self, scope: Scope, receive: Receive) -> tuple[int, dict[str, str], bytes, str | None]:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        segments = raw_path.split(b"?")[0].split(b"/")[1:]
        method = scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if segments[0] != b"v1":
            raise ApiError(404, "InvalidArgument", f"{scope['path']} is not served: the alpha Data API (locking, "
                           "sub-document operations) is not enabled on this server; see docs/data-api.md")
        if segments[1:] == [b"openapi.json"]:  # no data in it: any authenticated caller
            if method not in ("GET", "HEAD"):
                raise _not_allowed(method, "GET")
            from eventing.http.dataapi_openapi import dataapi_openapi

            return 200, {}, (b"" if method == "HEAD" else json.dumps(dataapi_openapi()).encode()), "application/json"
        if segments[1:] == [b"callerIdentity"]:
            if method not in ("GET", "HEAD"):
                raise _not_allowed(method, "GET")
            caller = self.check(scope, headers, DATA_READ, None)
            return 200, {}, json.dumps({"user": caller}).encode(), "application/json"
        if not (len(segments) in (9, 10) and segments[1] == b"buckets" and segments[3] == b"scopes"
                and segments[5] == b"collections" and segments[7] == b"documents"):
            raise ApiError(404, "InvalidArgument", f"no Data API endpoint {scope['path']}; documents are at "
                           "/v1/buckets/BUCKET/scopes/SCOPE/collections/COLLECTION/documents/KEY")
        try:
            bucket, scope_name, collection, key = (unquote_to_bytes(s).decode("utf-8") for s in segments[2:9:2])
        except UnicodeDecodeError:
            raise bad("A path segment is not valid UTF-8 once percent-decoded; encode names and keys as UTF-8") from None
        op = segments[9].decode("latin-1") if len(segments) == 10 else ""
        if op and op not in DOCUMENT_OPS:
            raise ApiError(404, "InvalidArgument", f"no document operation '{op[:40]}'; use one of "
                           f"{', '.join(sorted(DOCUMENT_OPS))}")
        allowed = "POST" if op else "GET, POST, PUT, DELETE"
        if method not in allowed.split(", ") and not (method == "HEAD" and not op):
            raise _not_allowed(method, allowed)
        ks = Keyspace(bucket, scope_name, collection)
        self.check(scope, headers, DATA_READ if method in ("GET", "HEAD") else DATA_WRITE, ks)
        key_bytes = len(key.encode())
        if not 1 <= key_bytes <= MAX_KEY_BYTES:
            raise bad(f"Length of document key '{key[:60]}' is {key_bytes} bytes; a key is 1 to {MAX_KEY_BYTES} bytes")
        body = await read_body(receive, headers)
        req = DocRequest(ks, key, "GET" if method == "HEAD" else method, op, headers,
                         scope.get("query_string", b"").decode("latin-1"), body)
        status, out_headers, out, ctype = await self.buckets.submit(req)
        return status, out_headers, (b"" if method == "HEAD" else out), ctype

    def check(self, scope: Scope, headers: dict[str, str], permission: str, ks: Keyspace | None) -> str:
        """The caller's name if it may read (`data.read`) or write (`data.write`) the documents of `ks`, else
        the Data API's 401 or 403. The guard (eventing.http.app) has authenticated the caller (tokens, or
        users by HTTP Basic: eventing.http.auth); here its roles decide: data_reader / data_writer on the
        keyspace (with * wildcards), ro_admin reads, admin reads and writes, a server without credentials
        trusts local callers."""
        refused: AuthError | None = scope.get(AUTH_ERROR_SCOPE_KEY)
        identity: Identity | None = scope.get(IDENTITY_SCOPE_KEY)
        if refused is not None or identity is None:
            if not headers.get("authorization", "").strip():
                raise ApiError(401, "Unauthorized", "You must send authentication to use this endpoint; send "
                               "`Authorization: Basic` (a user's name and password, or any name and a token as "
                               "password) or `Bearer TOKEN`", headers={"WWW-Authenticate": 'Basic realm="eventing"'})
            raise ApiError(403, "InvalidAuth", "Your username or password is invalid; check the user's password "
                           "(`eventing user list` names the users) or the token (--admin-token / --read-token)")
        if ks is not None and not identity.can(permission, ks):
            where = f"'{ks.bucket}/{ks.scope}/{ks.collection}'"
            resource = f"/buckets/{ks.bucket}/scopes/{ks.scope}/collections/{ks.collection}"
            roles = ", ".join(str(g) for g in identity.grants) or "none"
            if permission == DATA_WRITE:
                raise ApiError(403, "NoWriteAccess", f"No permissions to write documents into {where} as "
                               f"{identity.user} (roles: {roles}); a write needs data_writer[{ks}] or admin", resource)
            raise ApiError(403, "NoReadAccess", f"No permissions to read documents from {where} as {identity.user} "
                           f"(roles: {roles}); a read needs data_reader[{ks}], ro_admin or admin", resource)
        return identity.user

    # -- bulk load ---------------------------------------------------------------------------------------

    async def load(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /api/v1/keyspaces/{keyspace}/load (the guard has checked the token and the admin role)."""
        rest = scope["path"][len(LOAD_PREFIX):]
        keyspace, _, tail = rest.rpartition("/")
        if tail != "load" or not keyspace or "/" in keyspace:
            await respond_json(send, 404, {"error": f"no endpoint {scope['path']}",
                                           "fix": "POST JSON lines to /api/v1/keyspaces/KEYSPACE/load"})
            return
        if scope["method"] != "POST":
            await respond_json(send, 405, {"error": f"{scope['method']} is not allowed on {scope['path']}; it answers POST",
                                           "fix": "use POST"}, {"Allow": "POST"})
            return
        try:
            ks = parse_keyspace(self.config.data_dir, keyspace)
            ks.check()
        except ConfigError as exc:
            await respond_json(send, 400, {"error": str(exc), "fix": None})
            return
        loader = _Loader(self.buckets, ks)
        send_chunks, chunks = anyio.create_memory_object_stream[bytes | None](8)
        status, answer = 200, dict[str, Any]()
        async with anyio.create_task_group() as tg:
            async def feed() -> None:
                async with send_chunks:
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            loader.abandoned = True
                            break
                        if message.get("body"):
                            try:
                                await send_chunks.send(message["body"])
                            except anyio.BrokenResourceError:
                                break  # the loader stopped at a bad line: the rest is not read
                        if not message.get("more_body", False):
                            break

            tg.start_soon(feed)
            status, answer = await anyio.to_thread.run_sync(loader.run, chunks)
            tg.cancel_scope.cancel()
        await respond_json(send, status, answer)


class _Loader:
    """The bulk load's thread: splits the chunks into lines, parses them as `bucket load` does and commits
    batches, under the bucket's lock for each commit only."""

    def __init__(self, buckets: Buckets, ks: Keyspace):
        self.buckets, self.ks = buckets, ks
        self.lines = 0
        self.committed = 0
        self.written = 0
        self.abandoned = False
        self.error: str | None = None

    def _lines(self, chunks: Any) -> Any:
        partial = b""
        while True:
            chunk = anyio.from_thread.run(_receive_or_none, chunks)
            if chunk is None:
                break
            pieces = (partial + chunk).split(b"\n")
            partial = pieces.pop()
            for line in pieces:
                self.lines += 1
                yield line + b"\n"
            if len(partial) > MAX_LINE_BYTES:
                self.error = f"line {self.lines + 1}: longer than {MAX_LINE_BYTES:,} bytes; split the document"
                return
        if partial.strip() and not self.abandoned:
            self.lines += 1
            yield partial

    def run(self, chunks: Any) -> tuple[int, dict[str, Any]]:
        rejected: list[str] = []
        try:
            with chunks:
                for rows in rows_of_lines(self._lines(chunks), rejected, LOAD_BATCH_LINES, stop_at_bad_line=True):
                    if self.abandoned:
                        break
                    self.written += self.buckets.run(self.ks, functools.partial(Collection.load_rows, rows=rows))
                    self.committed += len(rows)
        except ApiError as exc:
            return exc.status, {"error": exc.message, "fix": None, "committed": self.committed}
        except (EventingError, InvalidKeyError) as exc:
            rejected.append(f"{exc}")
        problem = rejected[0] if rejected else self.error
        answer: dict[str, Any] = {"keyspace": str(self.ks), "committed": self.committed, "written": self.written,
                                  "skipped": self.committed - self.written}
        if problem:
            fix = "fix that line and send the lines from it on again"
            return 400, {"error": f"{problem}; the {self.committed:,} rows before it are committed, none after",
                         "fix": fix, **answer}
        return 200, answer


async def _receive_or_none(chunks: Any) -> bytes | None:
    try:
        item: bytes = await chunks.receive()
        return item
    except anyio.EndOfStream:
        return None


def _not_allowed(method: str, allowed: str) -> ApiError:
    return ApiError(405, "InvalidArgument", f"{method} is not allowed here; this path answers {allowed}",
                    headers={"Allow": allowed})


async def read_body(receive: Receive, headers: dict[str, str]) -> bytes:
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large()
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large()
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def respond(send: Send, status: int, headers: dict[str, str], body: bytes, ctype: str | None) -> None:
    out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if ctype is not None:
        out.append((b"content-type", ctype.encode()))
    out.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


async def respond_json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    await respond(send, status, headers or {}, json.dumps(body).encode(), "application/json")
