"""The extended-attribute (XATTR) side of the KV port's sub-document requests, as kv_engine serves them
(docs/SubDocument.md, docs/ExtendedAttributes.md, daemon/subdocument_validators.cc): which specs may be
sent together, which names are valid, the virtual attributes a lookup may read (`$document`, `$XTOC`) and
the macros a mutation may ask to have expanded. The XATTRs themselves are stored beside the document
(eventing.core.xattrs); the request handlers are eventing.kv.documents's `_lookup_in` and `_mutate_in`.
"""

from __future__ import annotations

import json
from typing import Any

from eventing.core import xattrs as xattr_codec
from eventing.kv import protocol as p
from eventing.kv import subdoc as sd

Spec = tuple[int, int, str, bytes]  # (opcode, path flags, path, value)

# What a mutation's EXPAND_MACROS value may be (the SDKs send the macro as a JSON string), and what it is
# stored as until the write has its cas and seqno (eventing.core.xattrs.expand). value_crc32c is of the
# document's new body, known once every spec is applied (``finish``).
CRC_MACRO = "\x00${Mutation.value_crc32c}"
_MACROS = {
    '"${Mutation.CAS}"': xattr_codec.CAS_MACRO,
    '"${Mutation.seqno}"': xattr_codec.SEQNO_MACRO,
    '"${Mutation.value_crc32c}"': CRC_MACRO,
}


class SpecRefused(Exception):
    """A request whose specs kv_engine refuses whole (before touching the document): its status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_specs(specs: list[Spec], mutation: bool) -> None:
    """Refuse what kv_engine's validator refuses: a macro without the XATTR flag, an XATTR spec after a body
    spec (XATTR specs come first), an invalid XATTR name, a mutation of a virtual XATTR, an unknown macro."""
    body_seen = False
    for _, flags, path, value in specs:
        xattr = bool(flags & sd.PATH_XATTR)
        if flags & sd.PATH_EXPAND_MACROS and not xattr:
            raise SpecRefused(
                p.SUBDOC_XATTR_INVALID_FLAG_COMBO, "EXPAND_MACROS flag requires XATTR flag to be set"
            )
        if not xattr:
            body_seen = True
            continue
        if body_seen:
            raise SpecRefused(p.SUBDOC_INVALID_XATTR_ORDER, "extended-attribute specs must come first")
        name = xattr_codec.name_of(path)
        if not xattr_codec.valid_name(name):
            raise SpecRefused(p.XATTR_EINVAL, f"{name!r} is not a valid extended-attribute name")
        if mutation and name.startswith("$"):
            raise SpecRefused(
                p.SUBDOC_XATTR_CANT_MODIFY_VATTR, f"virtual attribute {name!r} cannot be changed"
            )
        if flags & sd.PATH_EXPAND_MACROS:
            text = value.decode("utf-8", "replace")
            if text not in _MACROS and not text.startswith('"${$document'):
                raise SpecRefused(p.SUBDOC_XATTR_UNKNOWN_MACRO, f"unknown macro {text}")


def xtoc(xattrs: dict[str, Any]) -> list[str]:
    """`$XTOC`: the names of the document's XATTRs (system ones too: every caller here may read them)."""
    return list(xattrs)


def lookup(xattrs: dict[str, Any], vattr: dict[str, Any], path: str) -> Any:
    """The value at an XATTR path (sd.SubdocError as a spec's failure): a stored XATTR, `$document`'s
    fields (`vattr`) or `$XTOC`; any other virtual name is unknown."""
    parts = sd.parse_path(path)
    name = str(parts[0]) if parts else ""
    if name.startswith("$"):
        if name == "$document":
            return sd.lookup(vattr, parts[1:])
        if name == "$XTOC":
            return sd.lookup(xtoc(xattrs), parts[1:])
        raise sd.SubdocError(p.SUBDOC_XATTR_UNKNOWN_VATTR, f"unknown virtual attribute {name!r}")
    return sd.lookup(xattrs, parts)


def mutate(xattrs: dict[str, Any], vattr: dict[str, Any], spec: Spec) -> Any:
    """Apply one XATTR mutation spec to `xattrs` in place (a macro's value replaced first); returns what
    sd.mutate does (a counter's new value)."""
    opcode, flags, path, value = spec
    if flags & sd.PATH_EXPAND_MACROS:
        text = value.decode("utf-8", "replace")
        if text in _MACROS:
            value = json.dumps(_MACROS[text]).encode()
        else:  # "${$document}" or "${$document.field}": the document's virtual attribute before this write
            inner = text.strip('"')[2:-1]  # $document.field
            try:
                found = sd.lookup({"$document": vattr}, sd.parse_path(inner))
            except sd.SubdocError:
                raise sd.SubdocError(p.SUBDOC_XATTR_UNKNOWN_VATTR_MACRO, f"unknown macro {text}") from None
            value = sd.dumps(found)
    return sd.mutate(xattrs, opcode, sd.parse_path(path), flags, value)


def finish(xattrs: dict[str, Any], body: bytes) -> bytes | None:
    """The XATTRs as stored after a mutation: `${Mutation.value_crc32c}` replaced by the CRC-32C of the
    document's new body (the cas and seqno macros stay for the bucket, eventing.core.xattrs.expand)."""
    raw = xattr_codec.encode(xattrs)
    if raw is None or not xattr_codec.has_macros(raw):
        return raw
    import msgpack

    crc = msgpack.packb(f"0x{xattr_codec.crc32c(body):08x}")
    return raw.replace(msgpack.packb(CRC_MACRO), crc)
