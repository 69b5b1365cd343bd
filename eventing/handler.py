"""The handler API: what a deployed function's module receives and may import.

A handler module defines `on_update(doc, meta)` and/or `on_delete(meta, options)`. Its bindings are
globals named by their alias (`dst[meta.id] = {...}`), as in Couchbase, plus constant bindings, `log`,
`create_timer` and `cancel_timer` (see docs/handler-api.md). The timer functions here stand in for the
ones a running function injects: importing them from this module is allowed, calling them outside a
deployed handler is an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from eventing.errors import CurlError, TimerError

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


def curl(method, binding, request=None):  # noqa: ARG001 - replaced at run time
    """HTTP call to a URL binding of the function (at least once): returns status, headers and body."""
    raise CurlError("curl works only inside a deployed handler with url_bindings")


def create_timer(callback, when, reference=None, context=None) -> str:  # noqa: ARG001 - replaced at run time
    """Fire `callback(context)` at or after `when` (a datetime or epoch seconds); returns the reference."""
    raise TimerError("create_timer works only inside a deployed handler (on_update, on_delete, a timer callback)")


def cancel_timer(callback, reference) -> bool:  # noqa: ARG001 - replaced at run time
    """Cancel the timer (callback, reference); True if there was one."""
    raise TimerError("cancel_timer works only inside a deployed handler (on_update, on_delete, a timer callback)")


__all__ = ["CurlError", "DeleteOptions", "DeployAction", "Meta", "TimerError", "curl", "cancel_timer", "create_timer", "log"]
