"""The memcached binary protocol as Couchbase's data service speaks it (kv_engine's docs/BinaryProtocol.md):
the 24-byte header, flexible framing extras, the opcodes, status codes, HELLO features and datatypes this
server uses, collection ids as unsigned LEB128 before the key, and packing a response.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

HEADER = struct.Struct(
    ">BBHBBHIIQ"
)  # magic, opcode, key length, extras length, datatype, vb/status, body, opaque, cas
HEADER_SIZE = 24
MAX_BODY = 21 * 1024 * 1024  # a 20 MiB document, its key, extras and sub-document specs

MAGIC_REQUEST = 0x80
MAGIC_ALT_REQUEST = 0x08  # with flexible framing extras (durability, preserve TTL, ...)
MAGIC_RESPONSE = 0x81

# opcodes
GET, SET, ADD, REPLACE, DELETE, INCREMENT, DECREMENT, QUIT = 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07
GETQ, NOOP, VERSION, GETK, GETKQ, APPEND, PREPEND, STAT = 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10
SETQ, ADDQ, REPLACEQ, DELETEQ, INCREMENTQ, DECREMENTQ, QUITQ = 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17
APPENDQ, PREPENDQ, TOUCH, GAT, GATQ, HELLO = 0x19, 0x1A, 0x1C, 0x1D, 0x1E, 0x1F
SASL_LIST_MECHS, SASL_AUTH, SASL_STEP = 0x20, 0x21, 0x22
SELECT_BUCKET, OBSERVE_SEQNO, OBSERVE, GET_LOCKED, UNLOCK_KEY = 0x89, 0x91, 0x92, 0x94, 0x95
GET_META, GET_CLUSTER_CONFIG = 0xA0, 0xB5
GET_COLLECTIONS_MANIFEST, GET_COLLECTION_ID, GET_SCOPE_ID = 0xBA, 0xBB, 0xBC
SUBDOC_MULTI_LOOKUP, SUBDOC_MULTI_MUTATION = 0xD0, 0xD1
GET_ERROR_MAP = 0xFE

# The quiet variants answer only a failure (a GetQ only a hit).
QUIET = {
    GETQ: GET,
    GETKQ: GETK,
    SETQ: SET,
    ADDQ: ADD,
    REPLACEQ: REPLACE,
    DELETEQ: DELETE,
    INCREMENTQ: INCREMENT,
    DECREMENTQ: DECREMENT,
    APPENDQ: APPEND,
    PREPENDQ: PREPEND,
    GATQ: GAT,
    QUITQ: QUIT,
}

# status codes (kv_engine include/mcbp/protocol/status.h)
SUCCESS = 0x00
KEY_ENOENT = 0x01
KEY_EEXISTS = 0x02
E2BIG = 0x03
EINVAL = 0x04
NOT_STORED = 0x05
DELTA_BADVAL = 0x06
NOT_MY_VBUCKET = 0x07
NO_BUCKET = 0x08
AUTH_ERROR = 0x20
AUTH_CONTINUE = 0x21
EACCESS = 0x24
UNKNOWN_FRAME_INFO = 0x80
UNKNOWN_COMMAND = 0x81
NOT_SUPPORTED = 0x83
EINTERNAL = 0x84
ETMPFAIL = 0x86
UNKNOWN_COLLECTION = 0x88
UNKNOWN_SCOPE = 0x8C
DURABILITY_INVALID_LEVEL = 0xA0
SUBDOC_PATH_ENOENT = 0xC0
SUBDOC_PATH_MISMATCH = 0xC1
SUBDOC_PATH_EINVAL = 0xC2
SUBDOC_DOC_NOT_JSON = 0xC6
SUBDOC_NUM_ERANGE = 0xC7
SUBDOC_DELTA_EINVAL = 0xC8
SUBDOC_PATH_EEXISTS = 0xC9
SUBDOC_VALUE_CANTINSERT = 0xC5
SUBDOC_VALUE_ETOODEEP = 0xCA
SUBDOC_INVALID_COMBO = 0xCB
SUBDOC_MULTI_PATH_FAILURE = 0xCC
SUBDOC_XATTR_INVALID_FLAG_COMBO = 0xCE
SUBDOC_XATTR_UNKNOWN_MACRO = 0xD0
SUBDOC_XATTR_UNKNOWN_VATTR = 0xD1
SUBDOC_XATTR_CANT_MODIFY_VATTR = 0xD2
SUBDOC_INVALID_XATTR_ORDER = 0xD4
SUBDOC_XATTR_UNKNOWN_VATTR_MACRO = 0xD5
XATTR_EINVAL = 0x87

# HELLO features (kv_engine include/mcbp/protocol/feature.h): what this server agrees to when asked.
FEATURE_TCP_NODELAY = 0x03
FEATURE_MUTATION_SEQNO = 0x04
FEATURE_XATTR = 0x06
FEATURE_XERROR = 0x07
FEATURE_SELECT_BUCKET = 0x08
FEATURE_JSON = 0x0B
FEATURE_ALT_REQUEST = 0x10
FEATURE_SYNC_REPLICATION = 0x11
FEATURE_COLLECTIONS = 0x12
FEATURE_PRESERVE_TTL = 0x14
FEATURE_VATTR = 0x15
SUPPORTED_FEATURES = frozenset(
    {
        FEATURE_TCP_NODELAY,
        FEATURE_MUTATION_SEQNO,
        FEATURE_XATTR,
        FEATURE_XERROR,
        FEATURE_SELECT_BUCKET,
        FEATURE_JSON,
        FEATURE_ALT_REQUEST,
        FEATURE_SYNC_REPLICATION,
        FEATURE_COLLECTIONS,
        FEATURE_PRESERVE_TTL,
        FEATURE_VATTR,
    }
)  # not snappy, duplex, unordered execution, tracing or clustermap notifications

DATATYPE_JSON = 0x01
DATATYPE_SNAPPY = 0x02
DATATYPE_XATTR = 0x04

# frame infos of a request's flexible framing extras
FRAME_BARRIER, FRAME_DURABILITY, FRAME_STREAM_ID, FRAME_IMPERSONATE, FRAME_PRESERVE_TTL = 0, 1, 2, 4, 5

RELATIVE_EXPIRY_LIMIT = (
    30 * 24 * 3600
)  # memcached's rule: up to 30 days an expiry is relative, above it absolute


class Request(NamedTuple):
    opcode: int
    datatype: int
    vbucket: int
    opaque: int
    cas: int
    frames: dict[int, bytes]
    extras: bytes
    key: bytes
    value: bytes


class ProtocolError(Exception):
    """A packet this server cannot read: the connection is closed."""


def parse_request(header: bytes, body: bytes) -> Request:
    magic, opcode, keylen, extlen, datatype, vbucket, total, opaque, cas = HEADER.unpack(header)
    framelen = 0
    if magic == MAGIC_ALT_REQUEST:
        framelen, keylen = keylen >> 8, keylen & 0xFF
    elif magic != MAGIC_REQUEST:
        raise ProtocolError(f"magic 0x{magic:02x} is not a client request")
    if framelen + extlen + keylen > total:
        raise ProtocolError("the header's lengths exceed the body")
    frames = parse_frames(body[:framelen])
    extras = body[framelen : framelen + extlen]
    key = body[framelen + extlen : framelen + extlen + keylen]
    return Request(
        opcode, datatype, vbucket, opaque, cas, frames, extras, key, body[framelen + extlen + keylen :]
    )


def parse_frames(data: bytes) -> dict[int, bytes]:
    frames: dict[int, bytes] = {}
    i = 0
    while i < len(data):
        ident, size = data[i] >> 4, data[i] & 0x0F
        i += 1
        try:
            if ident == 15:
                ident, i = 15 + data[i], i + 1
            if size == 15:
                size, i = 15 + data[i], i + 1
        except IndexError:
            raise ProtocolError("a flexible frame's escaped id or size is cut off") from None
        if i + size > len(data):
            raise ProtocolError("a flexible frame is longer than the framing extras")
        frames[ident] = data[i : i + size]
        i += size
    return frames


def response(
    opcode: int,
    opaque: int,
    status: int = SUCCESS,
    *,
    extras: bytes = b"",
    key: bytes = b"",
    value: bytes = b"",
    cas: int = 0,
    datatype: int = 0,
) -> bytes:
    return (
        HEADER.pack(
            MAGIC_RESPONSE,
            opcode,
            len(key),
            len(extras),
            datatype,
            status,
            len(extras) + len(key) + len(value),
            opaque,
            cas,
        )
        + extras
        + key
        + value
    )


def split_collection(key: bytes, collections: bool) -> tuple[int, bytes]:
    """(collection id, the key itself) of a request's key: with collections negotiated the key starts with
    its collection's id as unsigned LEB128."""
    if not collections:
        return 0, key
    cid = shift = 0
    for i, byte in enumerate(key):
        cid |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return cid, key[i + 1 :]
        shift += 7
        if shift > 28:
            break
    raise ProtocolError("the key's collection id (LEB128) is not valid")


def absolute_expiry(expiry: int, now: float) -> int:
    """A request's expiry as absolute Unix seconds (0: none)."""
    if expiry == 0:
        return 0
    return int(now) + expiry if expiry <= RELATIVE_EXPIRY_LIMIT else expiry
