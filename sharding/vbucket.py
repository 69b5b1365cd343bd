"""Maps document keys to vBuckets with the hash every Couchbase client uses."""

from __future__ import annotations

import zlib

MAX_KEY_BYTES = 250


class InvalidKeyError(ValueError):
    """A document key that is empty, longer than 250 bytes or not UTF-8."""


def validate_key(key: str | bytes) -> bytes:
    """Return the key's UTF-8 bytes, or raise InvalidKeyError naming the problem and the fix."""
    if isinstance(key, bytes):
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidKeyError(
                f"key {key[:40]!r} is not valid UTF-8; keys must be UTF-8 text of 1..{MAX_KEY_BYTES} bytes"
            ) from None
        data = key
    elif isinstance(key, str):
        try:
            data = key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidKeyError(
                f"key {key[:40]!r} cannot be encoded as UTF-8 (lone surrogate?); "
                f"keys must be UTF-8 text of 1..{MAX_KEY_BYTES} bytes"
            ) from None
    else:
        raise InvalidKeyError(f"key {key!r} is a {type(key).__name__}; keys must be strings")
    if not data:
        raise InvalidKeyError(f"key is empty; keys must be UTF-8 text of 1..{MAX_KEY_BYTES} bytes")
    if len(data) > MAX_KEY_BYTES:
        raise InvalidKeyError(
            f"key {data[:40].decode('utf-8', 'replace')!r}... is {len(data)} bytes long; "
            f"the limit is {MAX_KEY_BYTES} bytes, use a shorter key"
        )
    return data


def vbucket_of(key: str | bytes, num_vbuckets: int = 1024) -> int:
    """((crc32(key) >> 16) & 0x7fff) % num_vbuckets, as in libcouchbase and every SDK. Never hash()."""
    data = key.encode("utf-8") if isinstance(key, str) else key
    return ((zlib.crc32(data) >> 16) & 0x7FFF) % num_vbuckets
