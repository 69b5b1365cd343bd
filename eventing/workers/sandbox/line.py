"""The line between a sandboxed worker's host and its child process: length-prefixed frames over one
socket (`_send`, `_recv`), the unpickler the host reads the child's frames with, which accepts plain
values and an allow-list of value classes only, so the child cannot run code in the host (`_values`),
and errors carried across as a class name and a message (`_error`, `_raise`).
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!Q")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    """The next `n` bytes, each piece of up to 16 MiB waited for in one call (MSG_WAITALL): a frame larger
    than the socket's buffer would otherwise come in many reads, and the child's line thread takes the
    interpreter lock back after each, which holds its busy main thread up and keeps the host blocked
    sending meanwhile. A length the other end claims is never allocated before its bytes come."""
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 24), socket.MSG_WAITALL)  # fewer: a signal came meanwhile
        if not chunk:
            raise EOFError("the other end of the sandbox line closed")
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _recv(sock: socket.socket) -> bytes:
    return _recv_exact(sock, _HEADER.unpack(_recv_exact(sock, _HEADER.size))[0])


def _send(sock: socket.socket, payload: bytes) -> None:
    header = _HEADER.pack(len(payload))
    if len(payload) < _JOINED_MAX:
        sock.sendall(header + payload)
    else:  # a large frame (a read's rows, a batch's writes) is not copied to be joined to its header
        sock.sendall(header)
        sock.sendall(payload)


_JOINED_MAX = 1 << 16


# What the host accepts from a sandboxed process: plain values and these classes (no callables).
_SAFE_BUILTINS = frozenset({"set", "frozenset", "bytearray", "complex", "slice", "range"})
_SAFE_CLASSES = {
    "eventing.workers.worker": frozenset({"StepReport"}),
    "eventing.storage.values": frozenset({"Write", "EffectGroup", "EffectResult"}),
    "eventing.core.mutation": frozenset({"Mutation"}),
    "collections": frozenset({"Counter", "OrderedDict"}),
    "datetime": frozenset({"timedelta", "datetime", "date", "timezone"}),
}


class _ValuesOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if name in _SAFE_CLASSES.get(module, ()) or (module == "metadata.model" and name[:1].isupper()):
            found = super().find_class(module, name)
            if isinstance(found, type) and not issubclass(found, BaseException):
                return found
        raise pickle.UnpicklingError(f"a sandboxed worker sent a {module}.{name}, which is not a plain value")


def _values(data: bytes) -> Any:
    import io

    return _ValuesOnly(io.BytesIO(data)).load()


def _error(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def _raise(error: tuple[str, str]) -> None:
    from eventing import errors

    name, text = str(error[0]), str(error[1])
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.EventingError):
        raise cls(text)
    raise errors.EventingError(f"{name}: {text}" if text else name)
