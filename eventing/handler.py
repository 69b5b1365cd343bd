"""The handler API: what a deployed function's module receives and may import.

A handler module defines `on_update(doc, meta)` and/or `on_delete(meta, options)`. Its bindings are
globals named by their alias (`dst[meta.id] = {...}`), as in Couchbase, plus constant bindings and `log`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

_logger = logging.getLogger("eventing.handler")


class Meta:
    """Metadata of the mutation being handled (Couchbase's `meta`)."""

    __slots__ = ("id", "cas", "vb", "seq", "expiration", "flags", "datatype", "keyspace")

    def __init__(self, id, cas, vb, seq, expiration, flags, datatype, keyspace):  # noqa: A002
        self.id: str = id
        self.cas: int = cas
        self.vb: int = vb
        self.seq: int = seq
        self.expiration: int = expiration
        self.flags: int = flags
        self.datatype: str = datatype
        self.keyspace: dict = keyspace

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"Meta(id={self.id!r}, vb={self.vb}, seq={self.seq}, cas={self.cas})"


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
}

__all__ = ["RESERVED_NAMES", "DeleteOptions", "Meta", "log"]
