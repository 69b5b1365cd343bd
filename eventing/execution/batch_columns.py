"""A batch's columns from a bulk read (eventing.storage.values.PackedUpdates, whose updates' documents are
msgpack values back to back): the whole documents (`docs_of`), or one top-level field of each (`field_of`),
which msgspec decodes without building the documents (about a seventh of their cost: a handler that needs
two fields of a thousand documents pays for two fields).

A bulk read is checked when it is taken (`well_formed`: every value complete, as many as its updates), so
decoding it later fails only on what that check does not look into (text that is not UTF-8): `docs_of` then
decodes the documents one by one and names each one that cannot be decoded.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from operator import attrgetter
from typing import Any

import msgspec

_ARRAY_HEADER = struct.Struct(">BI")  # msgpack array32: the documents back to back become one array
_decode_any = msgspec.msgpack.Decoder().decode
_decode_raws = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
_value = attrgetter("v")
_FIELD_DECODERS_MAX = 64  # field names a worker keeps a decoder for (a handler reads a few)
_field_decoders: dict[tuple[str, bool], Callable[[bytes], Any]] = {}


def as_array(packed: Any) -> bytes:
    """The updates' documents as one msgpack array."""
    return _ARRAY_HEADER.pack(0xDD, packed.update_count) + packed.docs


def well_formed(packed: Any) -> bool:
    """Each of the updates' documents is one complete msgpack value (their texts are not looked into)."""
    try:
        return len(_decode_raws(as_array(packed))) == packed.update_count
    except Exception:  # noqa: BLE001 - truncated or malformed: read the rows, which dead-letter it
        return False


def docs_of(packed: Any) -> tuple[list, dict[int, str]]:
    """The updates' documents, and {update index: why} for those that cannot be decoded (None in their
    place)."""
    array = as_array(packed)
    try:
        return _decode_any(array), {}
    except Exception:  # noqa: BLE001 - one document's text is not UTF-8: find which, keep the others
        pass
    docs: list = []
    bad: dict[int, str] = {}
    for j, raw in enumerate(_decode_raws(array)):
        try:
            docs.append(_decode_any(raw))
        except Exception as exc:  # noqa: BLE001 - that document's fault
            docs.append(None)
            bad[j] = f"{type(exc).__name__}: {exc}"
    return docs, bad


def field_of(packed: Any, name: str, default: Any) -> list | None:
    """Field `name` of each update's document (`default` where a document has none), or None when a
    document is not an object with text keys or the field's value cannot be decoded (take it from the
    decoded documents then)."""
    try:
        values = list(map(_value, _field_decoder(name, default is None)(as_array(packed))))
    except Exception:  # noqa: BLE001 - not the plain case: the caller decodes the documents
        return None
    if default is not None:
        unset = msgspec.UNSET
        values = [default if v is unset else v for v in values]
    return values


def _field_decoder(name: str, none_default: bool) -> Callable[[bytes], Any]:
    decoder = _field_decoders.get((name, none_default))
    if decoder is None:
        column = msgspec.defstruct(
            "Column", [("v", Any, None if none_default else msgspec.UNSET)], rename={"v": name}, gc=False
        )
        decoder = msgspec.msgpack.Decoder(list[column]).decode  # type: ignore[valid-type]
        if len(_field_decoders) >= _FIELD_DECODERS_MAX:
            _field_decoders.clear()
        _field_decoders[(name, none_default)] = decoder
    return decoder
