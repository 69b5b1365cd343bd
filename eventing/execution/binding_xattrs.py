"""A document's user extended attributes (XATTRs) through a bucket binding's sub-document accessors, as
Couchbase Eventing serves them (features/src/bucket_ops.cc): a `lookup_in` or `mutate_in` spec whose options
say `{"xattrs": True}` (JavaScript: `couchbase.LookupInSpec.get(path, {xattrs: true})`,
`couchbase.MutateInSpec.upsert(path, value, {xattrs: true})`) reads or changes the path in the document's
user XATTRs instead of its body. A name starting with `_` (a system XATTR) is refused, as Couchbase refuses
it, and so is one of 16 bytes or more, or a virtual one (`$document`).

A binding's writes are held until the batch is applied, so what an accessor sees is the version of the
document this worker sees: its last pending write, else the stored document. A mutate_in of XATTRs writes
the document with all of its XATTRs (Write.xattrs), the system ones as they were; a full-document write
keeps what the document has (Write.xattrs None: eventing.storage.writes). So that a pending full-document
write made after a pending XATTR write still shows that write's XATTRs, a buffer that holds an XATTR write
(`EffectBuffer.xattr_writes`) has its later writes carry the XATTRs of the pending write before them
(``carried``); other buffers pay one attribute test a write.
"""

from __future__ import annotations

import time
from typing import Any

from eventing.core import xattrs as xattr_codec
from eventing.errors import BindingError


def spec_options(spec: tuple, needs_value: bool, alias: str) -> bool:
    """Whether a sub-document spec (op, path[, value][, options]) names an XATTR path: its options dict's
    `xattrs`. The other options (`create_path`) are accepted as Couchbase's are; anything else is refused
    with the line Couchbase's runtime gives."""
    if len(spec) != (4 if needs_value else 3):
        return False
    options = spec[-1]
    if options is None:
        return False
    if not isinstance(options, dict):
        raise BindingError(f"binding '{alias}': the options of spec {spec!r} should be an object")
    xattr = options.get("xattrs", False)
    if not isinstance(xattr, bool):
        raise BindingError(f"binding '{alias}': xattrs must be a boolean value (spec {spec!r})")
    create_path = options.get("create_path", False)
    if not isinstance(create_path, bool):
        raise BindingError(f"binding '{alias}': create_path must be a boolean value (spec {spec!r})")
    if xattr:
        path = spec[1]
        if isinstance(path, str):
            name = xattr_codec.name_of(path)
            if name.startswith("_"):
                raise BindingError(f"binding '{alias}': XATTR path cannot start with underscore ({path!r})")
            if len(name.encode()) >= xattr_codec.MAX_NAME_BYTES:
                raise BindingError(
                    f"binding '{alias}': XATTR key size must be less than {xattr_codec.MAX_NAME_BYTES} "
                    f"characters ({name!r})"
                )
            if name.startswith("$"):
                raise BindingError(
                    f"binding '{alias}': {name!r} is a virtual XATTR, which bindings do not read; read it "
                    "with an SDK over the KV port"
                )
    return xattr


def carried(buf: Any, stored: str) -> bytes | None:
    """The XATTRs a new full-document write of `stored` carries in a buffer holding XATTR writes: those of
    the pending write before it (none after a delete), or None (it keeps the stored document's)."""
    prev = buf.current_overlay.get(stored)
    if prev is None:
        prev = buf.overlay.get(stored)
        if prev is None:
            prev = buf.flushing.get(stored)
            if prev is None:
                return None
    if prev.doc is None:
        return xattr_codec.NONE
    return prev.xattrs


def visible(binding: Any, stored: str) -> dict[str, Any]:
    """Every XATTR (system ones too) of the version of `stored` the binding sees: its last pending write's
    (none for a delete; a write that keeps them: as before it), else the stored, unexpired document's."""
    raw = carried(binding.buf, stored)
    if raw is not None:
        return xattr_codec.decode(raw) if raw != xattr_codec.NONE else {}
    meta = binding.bucket.get_meta(stored)
    if meta is None or (meta.get("expiry") and meta["expiry"] <= time.time()):
        return {}
    return xattr_codec.decode(meta.get("xattrs"))
