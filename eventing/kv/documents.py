"""The KV port's document operations, planned like the Data API's (eventing.http.dataapi.documents): a read
answers at once, a write is a `Change` (the check-and-set to run against the document as it is then, and the
answer once the bucket's group commit has made it), run on the bucket's request thread in the order the
connection sent them. Each answer is the response packet itself; a refusal is a `KvError` with its status.

Values are stored as the rest of the project stores them: a JSON object as a map (what handlers read as a
dict), any other value as its bytes, with the flags the client gave. Expiries are absolute Unix seconds.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eventing.core import xattrs as xattr_codec
from eventing.core.keyspaces import Keyspace
from eventing.core.mutation import NESTING_LIMIT, OP_DELETE, OP_UPDATE, decode_document, encode_document
from eventing.http.dataapi.documents import Answer, Change, live, raw_of, stored_body, value_of
from eventing.http.dataapi.requests import FLAGS_JSON, UINT64
from eventing.kv import protocol as p
from eventing.kv import subdoc as sd
from eventing.kv import xattr_specs as xs
from eventing.storage.keyspace import Collection
from eventing.storage.values import Changed, StoredDocument, Write

_FLAGS_EXPIRY = struct.Struct(">II")
_COUNTER = struct.Struct(">QQI")
_META = struct.Struct(">IIIQB")
_TOKEN = struct.Struct(">QQ")
_SPEC_LOOKUP = struct.Struct(">BBH")
_SPEC_MUTATION = struct.Struct(">BBHI")
_NO_CREATE = 0xFFFFFFFF  # a counter's expiry that means "do not create a missing document"


class KvError(Exception):
    """A refused request: its status and a line for the error's context."""

    def __init__(self, status: int, message: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message


class MultiPathFailure(Exception):
    """A sub-document mutation whose spec `index` failed with `status`: nothing was written."""

    def __init__(self, index: int, status: int):
        super().__init__(f"spec {index} failed with status 0x{status:02x}")
        self.index, self.status = index, status


@dataclass
class KvCall:
    """One document request of a connection, planned on its bucket's request thread (`plan`)."""

    ks: Keyspace
    key: str
    req: p.Request
    opcode: int  # as sent (a quiet variant answers only what is interesting)
    tokens: bool  # mutation tokens negotiated (HELLO MUTATION_SEQNO)
    json: bool  # datatype JSON negotiated

    @property
    def base(self) -> int:
        return p.QUIET.get(self.opcode, self.opcode)

    @property
    def quiet(self) -> bool:
        return self.opcode in p.QUIET

    def packet(self, status: int = p.SUCCESS, **fields: Any) -> Answer:
        return 0, {}, p.response(self.opcode, self.req.opaque, status, **fields), None

    def silent(self) -> Answer:
        return 0, {}, b"", None

    def plan(self, coll: Collection) -> Answer | Change:
        op = self.base
        handler = _PLANS.get(op)
        if handler is None:
            raise KvError(p.UNKNOWN_COMMAND, f"opcode 0x{self.opcode:02x} is not served")
        level = self.req.frames.get(p.FRAME_DURABILITY)
        if level is not None and (not level or level[0] not in (1, 2, 3)):
            raise KvError(p.DURABILITY_INVALID_LEVEL, "durability level must be 1 (majority), 2 or 3")
        return handler(self, coll, time.time())

    # -- shared pieces --------------------------------------------------------------------------------

    def token(self, coll: Collection, done: Changed) -> bytes:
        if not self.tokens:
            return b""
        return _TOKEN.pack(vbucket_uuid(str(coll.bucket.uuid)), done.seqno)

    def written(self, coll: Collection) -> Any:
        def answer(done: Changed) -> Answer:
            if self.quiet:
                return self.silent()
            return self.packet(cas=done.cas, extras=self.token(coll, done))

        return answer

    def check_cas(self, cur: StoredDocument | None) -> None:
        if self.req.cas:
            if cur is None:
                raise KvError(p.KEY_ENOENT, f"document '{self.key}' does not exist")
            if cur.cas != self.req.cas:
                raise KvError(
                    p.KEY_EEXISTS, f"document '{self.key}' has another cas (it changed since it was read)"
                )

    def datatype(self, value: Any, flags: int) -> int:
        if not self.json:
            return 0
        if isinstance(value, dict) or (flags >> 24 == FLAGS_JSON >> 24 and value not in (b"",)):
            return p.DATATYPE_JSON
        return 0


def vbucket_uuid(bucket_uuid: str) -> int:
    try:
        return int(bucket_uuid.replace("-", "")[:16], 16)
    except ValueError:
        return 0


def _read(coll: Collection, key: str, now: float) -> StoredDocument | None:
    stored = coll.stored(key)
    doc = coll.bucket.get_doc(stored)
    if doc is None or (doc[2] and doc[2] <= now):
        return None
    meta = coll.bucket.get_meta(stored)
    if meta is None:
        return None
    return StoredDocument(
        stored, doc[0], doc[1], doc[2], meta["flags"], meta["vb"], meta["seqno"], meta.get("xattrs")
    )


def _kept(cur: StoredDocument | None) -> bytes | None:
    return None if cur is None else cur.xattrs


def _missing(call: KvCall) -> KvError:
    return KvError(p.KEY_ENOENT, f"document '{call.key}' does not exist in {call.ks}")


# -- reads ------------------------------------------------------------------------------------------------


def _get(call: KvCall, coll: Collection, now: float) -> Answer:
    cur = _read(coll, call.key, now)
    if cur is None:
        if call.quiet:
            return call.silent()
        raise _missing(call)
    value = value_of(cur.doc)
    key = call.req.key if call.base == p.GETK else b""
    return call.packet(
        extras=struct.pack(">I", cur.flags),
        key=key,
        value=raw_of(value),
        cas=cur.cas,
        datatype=call.datatype(value, cur.flags),
    )


def _get_meta(call: KvCall, coll: Collection, now: float) -> Answer:
    cur = _read(coll, call.key, now)
    if cur is None:
        raise _missing(call)
    value = value_of(cur.doc)
    meta = _META.pack(0, cur.flags, cur.expiry, cur.seqno, call.datatype(value, cur.flags))
    return call.packet(extras=meta, cas=cur.cas)


# -- writes -----------------------------------------------------------------------------------------------


def _store(call: KvCall, coll: Collection, now: float) -> Change:
    if len(call.req.extras) != 8:
        raise KvError(p.EINVAL, "set, add and replace take 8 bytes of extras (flags, expiry)")
    if call.req.datatype & (p.DATATYPE_SNAPPY | p.DATATYPE_XATTR):
        raise KvError(p.EINVAL, "compressed values and values with extended attributes are not accepted")
    flags, expiry = _FLAGS_EXPIRY.unpack(call.req.extras)
    data = stored_body(
        call.req.value, flags, bool(call.req.datatype & p.DATATYPE_JSON) and _is_json(call.req.value)
    )
    absolute = p.absolute_expiry(expiry, now)
    preserve = p.FRAME_PRESERVE_TTL in call.req.frames
    op = call.base
    stored = coll.stored(call.key)

    def put(cur: StoredDocument | None) -> Write:
        cur = live(cur, now)
        if op == p.ADD and cur is not None:
            raise KvError(p.KEY_EEXISTS, f"document '{call.key}' exists in {call.ks}")
        if op == p.REPLACE and cur is None:
            raise _missing(call)
        call.check_cas(cur)
        keep = cur.expiry if (preserve and cur is not None) else absolute
        # A full-document set, add or replace keeps the document's XATTRs, user and system ones: kv_engine
        # copies the existing XATTRs into the new value (daemon/protocol/mcbp/mutation_context.cc,
        # "Preserve XATTRs with mutation commands", since 5.0); only a delete drops the user ones.
        return Write(stored, OP_UPDATE, data, keep, flags, xattrs=_kept(cur))

    return Change(stored, put, call.written(coll))


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
        return True
    except ValueError:
        return False
    except RecursionError:
        return True  # JSON nesting too deep to read: stored_body refuses it with one line (EINVAL)


def _delete(call: KvCall, coll: Collection, now: float) -> Change:
    stored = coll.stored(call.key)

    def remove(cur: StoredDocument | None) -> Write:
        cur = live(cur, now)
        if cur is None:
            raise _missing(call)
        call.check_cas(cur)
        return Write(stored, OP_DELETE)

    return Change(stored, remove, call.written(coll))


def _touch(call: KvCall, coll: Collection, now: float) -> Change:
    if len(call.req.extras) != 4:
        raise KvError(p.EINVAL, "touch and get-and-touch take 4 bytes of extras (expiry)")
    expiry = p.absolute_expiry(struct.unpack(">I", call.req.extras)[0], now)
    stored = coll.stored(call.key)

    def touch(cur: StoredDocument | None) -> Write:
        cur = live(cur, now)
        if cur is None:
            raise _missing(call)
        return Write(stored, OP_UPDATE, cur.doc, expiry, cur.flags, xattrs=cur.xattrs)

    def touched(done: Changed) -> Answer:
        after = done.after
        assert after is not None
        if call.base == p.TOUCH:
            return call.packet(cas=done.cas)
        value = value_of(after.doc)
        return call.packet(
            extras=struct.pack(">I", after.flags),
            value=raw_of(value),
            cas=done.cas,
            datatype=call.datatype(value, after.flags),
        )

    return Change(stored, touch, touched)


def _counter(call: KvCall, coll: Collection, now: float) -> Change:
    if len(call.req.extras) != 20:
        raise KvError(p.EINVAL, "increment and decrement take 20 bytes of extras (delta, initial, expiry)")
    delta, initial, expiry = _COUNTER.unpack(call.req.extras)
    increment = call.base == p.INCREMENT
    stored = coll.stored(call.key)
    result: list[int] = []

    def count(cur: StoredDocument | None) -> Write:
        cur = live(cur, now)
        if cur is None:
            if expiry == _NO_CREATE:
                raise _missing(call)
            result[:] = [initial]
            return Write(
                stored, OP_UPDATE, encode_document(str(initial).encode()), p.absolute_expiry(expiry, now), 0
            )
        call.check_cas(cur)
        value = value_of(cur.doc)
        text = value.strip() if isinstance(value, bytes) else b""
        if not text.isdigit() or int(text) > UINT64:
            raise KvError(
                p.DELTA_BADVAL, f"document '{call.key}' is not a counter (a whole number from 0 to {UINT64})"
            )
        number = (int(text) + delta) & UINT64 if increment else max(0, int(text) - delta)
        result[:] = [number]
        return Write(
            stored, OP_UPDATE, encode_document(str(number).encode()), cur.expiry, cur.flags, xattrs=cur.xattrs
        )

    def counted(done: Changed) -> Answer:
        if call.quiet:
            return call.silent()
        return call.packet(extras=call.token(coll, done), value=struct.pack(">Q", result[0]), cas=done.cas)

    return Change(stored, count, counted)


def _concat(call: KvCall, coll: Collection, now: float) -> Change:
    stored = coll.stored(call.key)
    append = call.base == p.APPEND

    def extend(cur: StoredDocument | None) -> Write:
        cur = live(cur, now)
        if cur is None:
            raise KvError(p.NOT_STORED, f"document '{call.key}' does not exist in {call.ks}")
        call.check_cas(cur)
        old = raw_of(value_of(cur.doc))
        raw = old + call.req.value if append else call.req.value + old
        return Write(
            stored, OP_UPDATE, stored_body(raw, cur.flags, False), cur.expiry, cur.flags, xattrs=cur.xattrs
        )

    return Change(stored, extend, call.written(coll))


# -- sub-document -----------------------------------------------------------------------------------------


def _json_of(cur: StoredDocument) -> tuple[bool, Any]:
    value = value_of(cur.doc)
    if isinstance(value, dict):
        return True, value
    try:
        return True, json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return False, None


def _vattr(call: KvCall, coll: Collection, cur: StoredDocument) -> dict[str, Any]:
    value = value_of(cur.doc)
    return {
        "CAS": f"0x{cur.cas:016x}",
        "vbucket_uuid": f"0x{vbucket_uuid(str(coll.bucket.uuid)):016x}",
        "seqno": f"0x{cur.seqno:016x}",
        "exptime": cur.expiry,
        "value_bytes": len(raw_of(value)),
        "datatype": ["json"] if call.datatype(value, cur.flags) or isinstance(value, dict) else ["raw"],
        "deleted": False,
        "flags": cur.flags,
        "last_modified": str(cur.cas // 1_000_000_000),
        "revid": str(cur.seqno),
        "value_crc32c": f"0x{xattr_codec.crc32c(raw_of(value)):08x}",
    }


def _specs(value: bytes, mutation: bool) -> list[tuple[int, int, str, bytes]]:
    out = []
    i = 0
    try:
        while i < len(value):
            if mutation:
                opcode, flags, plen, vlen = _SPEC_MUTATION.unpack_from(value, i)
                i += _SPEC_MUTATION.size
            else:
                (opcode, flags, plen), vlen = _SPEC_LOOKUP.unpack_from(value, i), 0
                i += _SPEC_LOOKUP.size
            path = value[i : i + plen].decode("utf-8")
            i += plen
            out.append((opcode, flags, path, value[i : i + vlen]))
            i += vlen
    except (struct.error, UnicodeDecodeError):
        raise KvError(p.EINVAL, "the sub-document specs are malformed") from None
    if not out or len(out) > 16:
        raise KvError(p.SUBDOC_INVALID_COMBO, "a sub-document request takes 1 to 16 specs")
    return out


def _lookup_in(call: KvCall, coll: Collection, now: float) -> Answer:
    specs = _specs(call.req.value, mutation=False)
    _check_specs(specs, mutation=False)
    cur = _read(coll, call.key, now)
    if cur is None:
        raise _missing(call)
    is_json, doc = _json_of(cur)
    xattrs = xattr_codec.decode(cur.xattrs)
    vattr: dict[str, Any] | None = None
    body = bytearray()
    failed = False
    for opcode, flags, path, _ in specs:
        status, out = p.SUCCESS, b""
        try:
            if opcode not in sd.LOOKUPS:
                raise sd.SubdocError(p.SUBDOC_INVALID_COMBO)
            if flags & sd.PATH_XATTR:
                if vattr is None:
                    vattr = _vattr(call, coll, cur)
                found: Any = xs.lookup(xattrs, vattr, path)
            elif opcode == sd.GET_DOC:
                found = None
                out = raw_of(value_of(cur.doc))
            else:
                if not is_json:
                    raise sd.SubdocError(p.SUBDOC_DOC_NOT_JSON)
                found = sd.lookup(doc, sd.parse_path(path))
            if opcode == sd.GET_COUNT:
                if not isinstance(found, (dict, list)):
                    raise sd.SubdocError(p.SUBDOC_PATH_MISMATCH)
                out = str(len(found)).encode()
            elif opcode in (sd.GET,):
                out = sd.dumps(found)
        except sd.SubdocError as exc:
            status, out, failed = exc.status, b"", True
        body += struct.pack(">HI", status, len(out)) + out
    return call.packet(p.SUBDOC_MULTI_PATH_FAILURE if failed else p.SUCCESS, value=bytes(body), cas=cur.cas)


def _check_specs(specs: list[tuple[int, int, str, bytes]], mutation: bool) -> None:
    try:
        xs.check_specs(specs, mutation)
    except xs.SpecRefused as exc:
        raise KvError(exc.status, str(exc)) from None


def _mutate_in(call: KvCall, coll: Collection, now: float) -> Change:
    specs = _specs(call.req.value, mutation=True)
    extras = call.req.extras
    doc_flags = extras[-1] if len(extras) in (1, 5, 9) else 0
    expiry = struct.unpack(">I", extras[:4])[0] if len(extras) >= 4 else None
    user_flags = struct.unpack(">I", extras[4:8])[0] if len(extras) >= 8 else None
    if len(extras) not in (0, 1, 4, 5, 8, 9):
        raise KvError(p.EINVAL, "a sub-document mutation takes 0, 1, 4, 5, 8 or 9 bytes of extras")
    if doc_flags & sd.DOC_MKDOC and doc_flags & sd.DOC_ADD:
        raise KvError(p.SUBDOC_INVALID_COMBO, "create and insert together are not allowed")
    for opcode, _, _, _ in specs:
        if opcode not in sd.MUTATIONS:
            raise KvError(p.SUBDOC_INVALID_COMBO, f"sub-document opcode 0x{opcode:02x} is no mutation")
    _check_specs(specs, mutation=True)
    body_specs = any(not flags & sd.PATH_XATTR for _, flags, _, _ in specs)
    absolute = p.absolute_expiry(expiry, now) if expiry is not None else None
    preserve = p.FRAME_PRESERVE_TTL in call.req.frames
    stored = coll.stored(call.key)
    results: list[tuple[int, Any]] = []

    def change(cur: StoredDocument | None) -> Write:
        cur = live(cur, now)
        if cur is None and not doc_flags & (sd.DOC_MKDOC | sd.DOC_ADD):
            raise _missing(call)
        if cur is not None and doc_flags & sd.DOC_ADD:
            raise KvError(p.KEY_EEXISTS, f"document '{call.key}' exists in {call.ks}")
        call.check_cas(cur)
        if cur is None:
            doc: Any = {}
        elif body_specs:
            is_json, parsed = _json_of(cur)
            if not is_json:
                raise MultiPathFailure(0, p.SUBDOC_DOC_NOT_JSON)
            doc = parsed  # decoded afresh from the stored bytes: nothing else holds it (no deep copy, which
            # recursed past Python's limit on a document a few hundred levels deep)
        xattrs = xattr_codec.decode(cur.xattrs if cur is not None else None)
        vattr = _vattr(call, coll, cur) if cur is not None else {}
        results.clear()
        delete = False
        for index, (opcode, flags, path, raw) in enumerate(specs):
            try:
                if flags & sd.PATH_XATTR:
                    outcome = xs.mutate(xattrs, vattr, (opcode, flags, path, raw))
                elif opcode == sd.DELETE_DOC:
                    delete = True
                    continue
                elif opcode == sd.SET_DOC:
                    doc = sd._values(raw, multi=False)[0]
                    continue
                else:
                    outcome = sd.mutate(doc, opcode, sd.parse_path(path), flags, raw)
            except sd.SubdocError as exc:
                raise MultiPathFailure(index, exc.status) from None
            except RecursionError:
                raise MultiPathFailure(index, p.SUBDOC_VALUE_ETOODEEP) from None
            if opcode == sd.COUNTER:
                results.append((index, outcome))
        if delete:  # the body and the user XATTRs go (this system keeps no deleted document's system ones)
            if cur is None:
                raise _missing(call)
            return Write(stored, OP_DELETE)
        flags_now = user_flags if user_flags is not None else (cur.flags if cur is not None else FLAGS_JSON)
        keep = absolute if absolute is not None else (cur.expiry if cur is not None and preserve else 0)
        if cur is not None and not body_specs:  # XATTRs alone: the body stays as it is, whatever it is
            data = cur.doc
            body = raw_of(value_of(cur.doc))
        else:
            try:
                body = sd.dumps(doc)
                data = stored_body(body, flags_now, True)
            except RecursionError:  # each value was readable, the document they make is not
                raise KvError(
                    p.SUBDOC_VALUE_ETOODEEP,
                    f"the document would nest more than about {NESTING_LIMIT} levels deep; flatten it",
                ) from None
        after = xs.finish(xattrs, body)
        if after is None and cur is not None and cur.xattrs is not None:
            after = xattr_codec.NONE  # the last XATTR removed (None would keep the document's)
        return Write(stored, OP_UPDATE, data, keep, flags_now, xattrs=after)

    def answer(done: Changed) -> Answer:
        body = b"".join(
            struct.pack(">BHI", i, p.SUCCESS, len(out)) + out
            for i, out in ((i, str(v).encode()) for i, v in results)
        )
        return call.packet(extras=call.token(coll, done), value=body, cas=done.cas)

    return Change(stored, change, answer)


_PLANS: dict[int, Callable[[KvCall, Collection, float], Answer | Change]] = {
    p.GET: _get,
    p.GETK: _get,
    p.GET_META: _get_meta,
    p.SET: _store,
    p.ADD: _store,
    p.REPLACE: _store,
    p.DELETE: _delete,
    p.TOUCH: _touch,
    p.GAT: _touch,
    p.INCREMENT: _counter,
    p.DECREMENT: _counter,
    p.APPEND: _concat,
    p.PREPEND: _concat,
    p.SUBDOC_MULTI_LOOKUP: _lookup_in,
    p.SUBDOC_MULTI_MUTATION: _mutate_in,
}
DOCUMENT_OPCODES = frozenset(_PLANS) | frozenset(k for k, v in p.QUIET.items() if v in _PLANS)

__all__ = ["DOCUMENT_OPCODES", "KvCall", "KvError", "MultiPathFailure", "decode_document"]
