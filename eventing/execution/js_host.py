"""The `__host` object a JavaScript handler calls (eventing.execution.javascript): bucket-map accesses,
Couchbase's `couchbase.*` accessors with the result objects Couchbase gives (`{doc, meta, success, error}`,
its error codes), curl, timers, log and the built-ins, each on the function's real BucketBinding,
TimerTable, CurlClient and log; and the crossing of documents between Python and V8 (JSON text, binary
documents as ArrayBuffers)."""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import time
from typing import TYPE_CHECKING, Any

import msgspec

from eventing import handler as handler_api
from eventing.errors import HandlerLoadError
from eventing.execution import binding_xattrs
from eventing.execution.wildcard_bindings import WildcardBinding

if TYPE_CHECKING:
    from eventing.execution.javascript import JsHandler


def _make_host(STPyV8: Any, h: JsHandler) -> Any:
    """The `__host` object JavaScript sees (an STPyV8.JSClass: its methods are callable synchronously)."""
    guarded = h.guarded

    def get(alias: str, key: str) -> str | None:
        value = h.binding(alias).get(key)
        return None if value is None else _json_text(_js_doc(value)[0])

    def set_(alias: str, key: str, text: str) -> None:
        h.binding(alias)[key] = _stored(_json_value(text))

    def remove(alias: str, key: str) -> None:
        del h.binding(alias)[key]

    def log(text: str) -> None:
        h.log(text)

    def create_timer(name: str, when: float, reference: str | None, context: str) -> str:
        if h.create_timer is None:
            raise HandlerLoadError("createTimer is used at load time; use it inside OnUpdate/OnDelete")
        return h.create_timer(h.module.__dict__.get(name), when, reference, json.loads(context))

    def cancel_timer(name: str, reference: str) -> str:
        if h.cancel_timer is None:
            raise HandlerLoadError("cancelTimer is used at load time; use it inside OnUpdate/OnDelete")
        return json.dumps(h.cancel_timer(h.module.__dict__.get(name), reference))

    def curl(method: str, alias: str, request: str) -> str:
        if h.curl_client is None:
            raise HandlerLoadError("curl is used at load time; use it inside OnUpdate/OnDelete")
        r = h.curl_client(method, h.url_bindings[alias], _curl_request(_json_value(request)))
        return _json_text({"status": r.status, "headers": r.headers, "body": _as_json(r.body)})

    class Host(STPyV8.JSClass):
        def get(self, alias, key):
            return guarded(get, alias, key)

        def set(self, alias, key, text):
            return guarded(set_, alias, key, text)

        def remove(self, alias, key):
            return guarded(remove, alias, key)

        def op(self, name, alias, key, cas, expiry, doc, extra, keyspace):
            return guarded(_advanced, h.binding, name, alias, key, cas, expiry, doc, extra, keyspace)

        def log(self, text):
            return guarded(log, text)

        def create_timer(self, name, when, reference, context):
            return guarded(create_timer, name, when, reference, context)

        def cancel_timer(self, name, reference):
            return guarded(cancel_timer, name, reference)

        def curl(self, method, alias, request):
            return guarded(curl, method, alias, request)

        def builtin(self, name, text):
            return guarded(_builtin, name, text)

        def key(self, vb, seq):
            return guarded(_idempotency_key, h.key_base, vb, seq)

    return Host()


_msgspec_encode = msgspec.json.Encoder().encode
_msgspec_decode = msgspec.json.Decoder().decode


def _json_text(value: Any) -> str:
    """`value` as JSON text for JavaScript's JSON.parse: msgspec's (~5x faster than json.dumps on a host
    call's values); json.dumps for what msgspec refuses."""
    try:
        return _msgspec_encode(value).decode()
    except (TypeError, ValueError, OverflowError):
        return json.dumps(value)


def _json_value(text: Any) -> Any:
    """JSON text from JavaScript (JSON.stringify's) as Python values: msgspec's decoder, json.loads for what
    it refuses (the same value, or json's error)."""
    if type(text) is str:
        try:
            return _msgspec_decode(text)
        except (msgspec.DecodeError, ValueError):
            pass
    return json.loads(text)


def _curl_request(request: Any) -> Any:
    """A curl request as Couchbase sends it: a body that is not a string goes as JSON.stringify writes it
    (compact) with Content-Type application/json unless the request names one."""
    if not isinstance(request, dict) or request.get("body") is None or isinstance(request["body"], str):
        return request
    headers = dict(request.get("headers") or {})
    if not any(str(k).lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    body = json.dumps(request["body"], separators=(",", ":"), ensure_ascii=False).encode()
    return {**request, "headers": headers, "body": body}


# -- Couchbase's couchbase.* result objects over BucketBinding's OpResult --------------------------------

# outcome -> (code, name, desc, flag): Couchbase's error objects (features/src/bucket_ops.cc), the code being
# the Data Service's status (1 key not found, 2 key exists, also on a cas mismatch; 0xC0, 0xC9 sub-document)
_ERRORS = {
    "key_not_found": (1, "LCB_KEY_ENOENT", "The document key does not exist on the server", "key_not_found"),
    "key_exists": (
        2,
        "LCB_KEY_EEXISTS",
        "The document key already exists in the server.",
        "key_already_exists",
    ),
    "cas_mismatch": (
        2,
        "LCB_KEY_EEXISTS",
        "The document key exists with a CAS value different than specified",
        "cas_mismatch",
    ),
    "path_not_found": (
        192,
        "LCB_ERR_SUBDOC_PATH_NOT_FOUND",
        "The document key does not exist on the server",
        "field_not_found",
    ),
    "path_exists": (201, "LCB_ERR_SUBDOC_PATH_EXISTS", "The document path already exist", "field_exists"),
}


def _advanced(
    binding_of: Any,
    name: str,
    alias: str,
    key: str,
    cas: str | None,
    expiry: float,
    doc: str,
    extra: str,
    keyspace: str = "null",
) -> str:
    """One couchbase.* call as the JSON text of Couchbase's result object, keys in Couchbase's order:
    `{doc, meta: {id, cas, expiry_date, datatype}, success}` for get and lookupIn (lookupIn's doc lists
    `{value, success}` per spec), `{doc: {count}, meta, success}` for the counters, `{meta: {id, cas,
    expiry_date}, success}` for the writes, `{error: {code, name, desc, <flag>: true}, success: false}` on
    failure. A write's cas is the one the next read of the document sees (see BucketBinding); its
    expiry_date the expiry it set (none for touch and delete), a read's the document's. `keyspace` (the
    meta's, as JSON) picks the collection of a wildcard binding (eventing.execution.wildcard_bindings); a
    binding of one collection goes by its own, whatever the meta says."""
    b = binding_of(alias)
    if isinstance(b, WildcardBinding):
        named = json.loads(keyspace)
        if named is not None:
            b = b.in_keyspace(named)
    body = _stored(json.loads(doc))
    cas_value = int(cas) if cas is not None else None
    ttl: Any = expiry if expiry else 0
    deleted = None
    specs: list = []
    if name == "get":
        r = b.get_result(key)
    elif name == "insert":
        r = b.insert(key, body, expiry=ttl)
    elif name == "upsert":
        r = b.upsert(key, body, expiry=ttl)
    elif name == "replace":
        r = b.replace(key, body, cas=cas_value, expiry=ttl)
    elif name == "delete":
        deleted = _seen(b, key)
        r = b.delete(key, cas=cas_value)
    elif name in ("increment", "decrement"):
        r = getattr(b, name)(key)
    elif name == "touch":
        r = b.touch(key, ttl)
    elif name == "lookupIn":
        specs = json.loads(extra) or []
        r = b.lookup_in(key, [(s["op"], s["path"], *_options(s)) for s in specs])
    elif name == "mutateIn":
        specs = json.loads(extra) or []
        r = b.mutate_in(
            key,
            [
                (s["op"], s["path"], *_options(s))
                if s["op"] == "remove"
                else (s["op"], s["path"], s.get("value"), *_options(s))
                for s in specs
            ],
            cas=cas_value,
            expiry=ttl,
        )
    else:
        raise ValueError(f"couchbase.{name} is not an operation")
    if not r.success:
        code, error_name, desc, flag = _ERRORS.get(r.error, (0, r.error, r.error, r.error))
        return json.dumps(
            {"error": {"code": code, "name": error_name, "desc": desc, flag: True}, "success": False}
        )
    out: dict[str, Any] = {}
    datatype = "json"
    if name == "get":
        out["doc"], datatype = _js_doc(r.doc)
    elif name == "lookupIn":
        xattrs = (
            binding_xattrs.visible(b, getattr(b, "prefix", "") + key)
            if any((s.get("options") or {}).get("xattrs") for s in specs)
            else None
        )
        out["doc"] = [
            _lookup_entry(xattrs if (s.get("options") or {}).get("xattrs") else r.doc, s["op"], s["path"])
            for s in specs
        ]
    elif name in ("increment", "decrement"):
        out["doc"] = {"count": r.value}
    if name in ("get", "lookupIn"):
        seen = r.meta
    else:
        seen = deleted if name == "delete" else _seen(b, key)
    meta: dict[str, Any] = {"id": key, "cas": str(seen.cas) if seen is not None else "0"}
    if name in ("get", "lookupIn"):
        expiry_s = seen.expiry if seen is not None else 0
    elif name in ("touch", "delete") or not ttl:
        expiry_s = 0
    else:  # the expiry the write asked for, in whole seconds as the Data Service keeps it
        expiry_s = int(ttl) if ttl >= 30 * 24 * 3600 else int(time.time() + ttl)
    if expiry_s:
        meta["expiry_date"] = expiry_s
    if name in ("get", "lookupIn"):
        meta["datatype"] = datatype
    out["meta"] = meta
    out["success"] = True
    return json.dumps(out)


def _options(spec: dict) -> tuple:
    """A spec's options, as the binding takes them (eventing.execution.binding_xattrs), when it has any."""
    options = spec.get("options")
    return () if options is None else (options,)


def _seen(binding: Any, key: str) -> Any:
    """The meta (DocMeta: cas, expiry) of the version of `key` the binding sees now, pending writes first."""
    visible = getattr(binding, "_visible", None)
    found = visible(key) if visible is not None else None
    return None if found is None else found[1]


BINARY = (
    "\0binary"  # {BINARY: [bytes]}: a binary document on its way to or from JavaScript (an ArrayBuffer there)
)


def _js_doc(doc: Any) -> tuple[Any, str]:
    """A stored document as JavaScript gets it, with its datatype. A document stored as bytes (a binary
    document, or a JSON value other than an object, which buckets keep as its text) is that JSON value when
    the bytes are JSON text ("json"), else binary ("binary": an ArrayBuffer in JavaScript)."""
    if type(doc) is not bytes:
        return doc, "json"
    try:
        return json.loads(doc.decode("utf-8")), "json"
    except (UnicodeDecodeError, ValueError):
        return {BINARY: list(doc)}, "binary"


def _stored(value: Any) -> Any:
    """A document from JavaScript as a binding stores it: an object as it is, a binary document as its bytes,
    any other JSON value (Couchbase keeps strings, numbers, arrays ... as documents) as its JSON text."""
    if isinstance(value, dict):
        if len(value) == 1 and BINARY in value:
            return bytes(value[BINARY])
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _lookup_entry(doc: Any, op: str, path: str) -> dict[str, Any]:
    """One entry of lookupIn's result: `{value, success: true}`, or `{success: false}` for a missing path
    (`exists` gives whether the path is there)."""
    node = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return {"value": False, "success": True} if op == "exists" else {"success": False}
        node = node[part]
    return {"value": True if op == "exists" else node, "success": True}


def _builtin(name: str, text: str) -> str:
    """Couchbase's built-in functions (features/src/utils.cc) on what the prelude sends: the text to hash or
    encode exactly as JavaScript made it (or a binary document's bytes), a base64 string, or a list of
    numbers (non-finite ones as their names). A decode answers JSON: its value, or null / an error's text."""
    value = json.loads(text)
    if name in ("crc64", "crc_64_go_iso"):
        data = (
            bytes(value[BINARY]) if isinstance(value, dict) else str(value).encode("utf-8", "surrogatepass")
        )
        return handler_api._crc64_go_iso(data)
    if name == "base64_encode":
        return base64.b64encode(str(value).encode("utf-8", "surrogatepass")).decode()
    if name == "base64_decode":
        try:
            return json.dumps(base64.b64decode(value, validate=True).decode("utf-8", "replace"))
        except (binascii.Error, ValueError):
            return "null"
    if name in ("f32_encode", "f64_encode"):
        fmt = "f" if name == "f32_encode" else "d"
        numbers = [float(v) for v in value]
        try:
            return base64.b64encode(struct.pack(f"<{len(numbers)}{fmt}", *numbers)).decode()
        except OverflowError:  # a float32 out of range is infinite, as a C++ cast makes it
            return base64.b64encode(b"".join(struct.pack("<f", _f32(v)) for v in numbers)).decode()
    if name in ("f32_decode", "f64_decode"):
        fmt, size = ("f", 4) if name == "f32_decode" else ("d", 8)
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return json.dumps("Invalid input")
        if len(raw) % size:
            return json.dumps("Incorrect base64 string provided")
        return json.dumps(
            [
                v if math.isfinite(v) else str(v).replace("inf", "Infinity").replace("nan", "NaN")
                for v in struct.unpack(f"<{len(raw) // size}{fmt}", raw)
            ]
        )
    raise ValueError(f"{name} is not a built-in function")


def _f32(value: float) -> float:
    try:
        struct.pack("<f", value)
        return value
    except OverflowError:
        return math.copysign(math.inf, value)


# -- what the runner calls ---------------------------------------------------------------------------------


def _idempotency_key(base: bytes, vb: Any, seq: Any) -> str:
    from eventing.core.idempotency import mutation_key

    return mutation_key(base, int(vb), int(seq))


def _as_json(value: Any) -> Any:
    """A runner argument as the JSON value JavaScript receives (Couchbase's shapes)."""
    from eventing.handler import DeleteOptions, DeployAction, Meta

    if isinstance(value, Meta):
        out = {
            "cas": str(value.cas),
            "id": value.id,
            "expiration": value.expiration,
            "flags": value.flags,
            "vb": value.vb,
            "seq": value.seq,
            "datatype": value.datatype,
            "keyspace": value.keyspace,
        }
        previous = value.previous
        if previous is not None:
            out["previous"] = previous
        return out
    if isinstance(value, DeleteOptions):
        return {"expired": value.expired}
    if isinstance(value, DeployAction):
        return {"reason": value.reason, "delay": value.delay}
    if isinstance(value, bytes):
        return _js_doc(value)[0]
    return value
