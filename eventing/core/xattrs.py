"""A document's extended attributes (XATTRs), as Couchbase has them (kv_engine's docs/ExtendedAttributes.md):
named JSON values kept beside the document, never part of its body. A name starting with `_` is a system
XATTR, one starting with `$` a virtual one (computed, never stored: `$document`, `$XTOC`), any other a user
XATTR. Buckets keep a document's XATTRs as one msgpack map (``encode``; None, not an empty map, when it has
none, so a document without XATTRs costs nothing), in its live row and in each log entry, so a handler sees
them as of that mutation.

Also the macros a sub-document mutation may ask the server to expand (`${Mutation.CAS}`,
`${Mutation.seqno}`): the KV port stores a marker (``CAS_MACRO``, ``SEQNO_MACRO``) in the value, and the
bucket replaces it with the write's own cas and seqno when it logs the write (``expand``).
"""

from __future__ import annotations

from typing import Any

import msgpack

MAX_NAME_BYTES = 16  # kv_engine's SUBDOC_MAX_XATTR_LENGTH: a name is shorter than this
VIRTUAL = ("$document", "$XTOC")

# What a macro is stored as until the write gets its cas and seqno: strings no JSON client sends (they start
# with a NUL character), replaced whole, as the msgpack values they are, by ``expand``.
CAS_MACRO = "\x00${Mutation.CAS}"
SEQNO_MACRO = "\x00${Mutation.seqno}"
_CAS_PACKED = msgpack.packb(CAS_MACRO)
_SEQNO_PACKED = msgpack.packb(SEQNO_MACRO)
_MARK = b"\x00${Mutation."


# What a write (eventing.storage.values.Write) carries to leave the document without XATTRs. A write that
# carries None keeps the document's own, as every full-document write does in Couchbase; this one (an
# empty map: ``decode`` reads it as {}) is stored as NULL.
NONE = msgpack.packb({})


def encode(xattrs: dict[str, Any]) -> bytes | None:
    """A document's XATTRs as stored: None when there are none."""
    return msgpack.packb(xattrs, use_bin_type=True) if xattrs else None


def for_write(xattrs: dict[str, Any]) -> bytes:
    """The XATTRs a write leaves the document with: ``NONE`` when there are none (not None, which keeps the
    document's own)."""
    return msgpack.packb(xattrs, use_bin_type=True) if xattrs else NONE


def decode(raw: bytes | None) -> dict[str, Any]:
    return {} if raw is None else msgpack.unpackb(raw, raw=False)


def user_xattrs(raw: bytes | None) -> dict[str, Any]:
    """The user XATTRs of stored ones (what Couchbase Eventing hands OnUpdate as its third argument)."""
    if raw is None or raw == NONE:
        return {}
    return {k: v for k, v in msgpack.unpackb(raw, raw=False).items() if not k.startswith("_")}


def is_system(name: str) -> bool:
    return name.startswith("_")


def name_of(path: str) -> str:
    """The XATTR a path names: everything before the first `.` or `[` (no backtick escapes in a name)."""
    for i, ch in enumerate(path):
        if ch in ".[":
            return path[:i]
    return path


def valid_name(name: str) -> bool:
    """kv_engine's key rules: 1 to 15 bytes of UTF-8, not starting with punctuation other than `_` or `$`
    (which need a second character), nor with a control character, and no NUL."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if not 0 < size < MAX_NAME_BYTES or "\x00" in name:
        return False
    first = name[0]
    if first in "_$":
        return size > 1
    return not (first.isascii() and not first.isalnum() and first != " ")  # C's ispunct() or iscntrl()


def has_macros(raw: bytes | None) -> bool:
    return raw is not None and _MARK in raw


def expand(raw: bytes, cas: int, seqno: int) -> bytes:
    """Stored XATTRs with their macros replaced by the write's cas and seqno, as kv_engine writes them: hex
    strings of 16 digits, the cas's bytes in network order read as a little-endian number (what
    `${Mutation.CAS}` has always given), the seqno as it is."""
    swapped = int.from_bytes(cas.to_bytes(8, "big"), "little")
    raw = raw.replace(_CAS_PACKED, msgpack.packb(f"0x{swapped:016x}"))
    return raw.replace(_SEQNO_PACKED, msgpack.packb(f"0x{seqno:016x}"))


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`: what `${Mutation.value_crc32c}` and `$document.value_crc32c` give of
    a document's body."""
    crc = 0xFFFFFFFF
    table = _CRC32C
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
