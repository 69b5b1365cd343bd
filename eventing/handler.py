"""The handler API: what a deployed function's module receives and may import.

A handler module defines `on_update(doc, meta)` and/or `on_delete(meta, options)`. Its bindings are
globals named by their alias (`dst[meta.id] = {...}`), as in Couchbase, plus constant bindings, `log`,
`create_timer` and `cancel_timer` (see docs/handler-api.md). The timer functions here stand in for the
ones a running function injects: importing them from this module is allowed, calling them outside a
deployed handler is an error.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from dataclasses import dataclass

from eventing.core.idempotency import mutation_key
from eventing.errors import CurlError, TimerError

_logger = logging.getLogger("eventing.handler")


class Meta:
    """Metadata of the mutation being handled (Couchbase's `meta`)."""

    __slots__ = ("id", "cas", "vb", "seq", "expiration", "flags", "datatype", "keyspace", "previous")
    previous: dict | None
    # What the function's idempotency keys derive from (eventing.core.idempotency.key_base): a running
    # function hands out metas of a subclass that sets it.
    key_base: bytes = b""

    def __init__(self, id, cas, vb, seq, expiration, flags, datatype, keyspace):  # noqa: A002
        self.id: str = id
        self.cas: int = cas
        self.vb: int = vb
        self.seq: int = seq
        self.expiration: int = expiration
        self.flags: int = flags
        self.datatype: str = datatype
        self.keyspace: dict = keyspace
        # `previous` (the document's previous version, None for a new one) is set only for a function with
        # previous_version; otherwise reading it falls through to __getattr__ (no cost per mutation).

    def __getattr__(self, name: str):
        if name == "previous":
            return None
        if name == "idempotency_key":  # made when asked: the same for every attempt of this mutation
            return mutation_key(self.key_base, self.vb, self.seq)
        raise AttributeError(f"meta has no attribute {name!r}")

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in Meta.__slots__}
        out["idempotency_key"] = self.idempotency_key
        return out

    def __repr__(self) -> str:
        return f"Meta(id={self.id!r}, vb={self.vb}, seq={self.seq}, cas={self.cas})"


@dataclass(frozen=True)
class DeployAction:
    """What `on_deploy(action)` receives (Couchbase 8.0's OnDeploy): why it runs."""

    reason: str  # "deploy" or "resume"
    delay: int = 0  # seconds the function was paused for (resume), else 0


@dataclass(frozen=True)
class DeleteOptions:
    expired: bool = False  # True when the document expired rather than being deleted


class HandlerLog:
    """`log(...)` inside a handler: lines go to the worker's log and to a debugger trace, if any."""

    def __init__(self) -> None:
        self.sink: list[str] | None = None

    def __call__(self, *parts: object) -> None:
        line = " ".join(str(p) for p in parts)
        if self.sink is not None:
            self.sink.append(line)
        _logger.info(line)


log = HandlerLog()

# Names the handler module gets from the system or defines for it: a binding alias or constant of the same
# name would hide them (name -> what it is, for the message that refuses such an alias).
RESERVED_NAMES: dict[str, str] = {
    "log": "log() (the application log)",
    "on_update": "on_update(doc, meta) entry point",
    "on_delete": "on_delete(meta, options) entry point",
    "on_deploy": "on_deploy(action) entry point",
    "create_timer": "create_timer()",
    "cancel_timer": "cancel_timer()",
    "curl": "curl()",
    "crc64": "crc64()",
    "crc_64_go_iso": "crc_64_go_iso()",
    "base64_encode": "base64_encode()",
    "base64_decode": "base64_decode()",
}


def _crc64_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0xD800000000000000 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC64_ISO = _crc64_table()


def _crc64_go_iso(data: bytes) -> str:
    crc = 0xFFFFFFFFFFFFFFFF
    for byte in data:
        crc = _CRC64_ISO[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return f"{crc ^ 0xFFFFFFFFFFFFFFFF:016x}"


def _json_text(value: object) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"value is not JSON ({exc}); pass dicts, lists, strings, numbers, booleans or None"
        ) from None


def crc64(value: object) -> str:
    """Couchbase's crc64(): the CRC-64 (Go ISO table) of the value as JSON text (a string keeps its quotes),
    as 16 hex digits."""
    return _crc64_go_iso(_json_text(value).encode())


def crc_64_go_iso(value: object) -> str:
    """As crc64(), but a string is hashed without its enclosing quotes (Couchbase 7.6)."""
    return _crc64_go_iso((value if isinstance(value, str) else _json_text(value)).encode())


def base64_encode(value: object) -> str:
    """Base64 of a string's UTF-8 bytes, of bytes, or of any other JSON value's JSON text."""
    if isinstance(value, bytes):
        data = value
    else:
        data = (value if isinstance(value, str) else _json_text(value)).encode()
    return base64.b64encode(data).decode()


def base64_decode(text: str) -> str:
    """The UTF-8 text a base64_encode() result holds."""
    if not isinstance(text, str):
        raise ValueError(f"base64_decode takes a string, not {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"base64_decode: {text[:40]!r} is not base64 of UTF-8 text ({exc})") from None


def curl(method, binding, request=None):  # noqa: ARG001 - replaced at run time
    """HTTP call to a URL binding of the function (at least once): returns status, headers and body."""
    raise CurlError("curl works only inside a deployed handler with url_bindings")


def create_timer(callback, when, reference=None, context=None) -> str:  # noqa: ARG001 - replaced at run time
    """Fire `callback(context)` at or after `when` (a datetime or epoch seconds); returns the reference."""
    raise TimerError(
        "create_timer works only inside a deployed handler (on_update, on_delete, a timer callback)"
    )


def cancel_timer(callback, reference) -> bool:  # noqa: ARG001 - replaced at run time
    """Cancel the timer (callback, reference); True if there was one."""
    raise TimerError(
        "cancel_timer works only inside a deployed handler (on_update, on_delete, a timer callback)"
    )


__all__ = [
    "RESERVED_NAMES",
    "CurlError",
    "DeleteOptions",
    "DeployAction",
    "Meta",
    "TimerError",
    "base64_decode",
    "base64_encode",
    "crc64",
    "crc_64_go_iso",
    "curl",
    "cancel_timer",
    "create_timer",
    "log",
]
