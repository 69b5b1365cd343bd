"""A caught-up worker waits for its next write inside its step (``WriteWaiter``), instead of returning and
being asked again: the write reaches its handler without a call from the service to the worker.

Without it, a write's path to its handler is: the writer's datagram to the service (eventing.storage.wake),
the service's loop taking it, and a Ray call from the service to the worker's process (a few milliseconds
on a loaded machine, most of the write-to-effect time). With it, the service's listening thread forwards
the datagram to the worker's own socket as it arrives, and a worker already in a waiting step reads the
source at once; the Ray call that asks for the next waiting step is made after the write was handled, off
the write's path.

The socket is a UNIX datagram socket in Linux's abstract namespace (no file, so nothing is left behind by
a killed worker and no path length limit applies); its name is chosen by the supervisor for each start of
the worker and carried in its spec. Only a worker that reads the data directory itself (on the service's
machine) has one: a worker on another node learns of writes through the data service as before.
"""

from __future__ import annotations

import logging
import select
import socket
import uuid
from collections.abc import Container
from typing import Any

log = logging.getLogger("eventing.workers.write_waiter")

_PREFIX = "\0eventing-wake-"


def new_address() -> str:
    """A fresh abstract socket name for one start of one worker."""
    return _PREFIX + uuid.uuid4().hex


class WriteWaiter:
    """The worker's end: drained before each look at the source, waited on when there was nothing to do."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    @classmethod
    def open(cls, address: str) -> WriteWaiter | None:
        """Bind `address`; None (the worker is polled, as without a waiter) when it cannot be bound."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.bind(address)
        except OSError as exc:
            sock.close()
            log.warning("cannot listen for write notifications (%s); this worker is polled", exc)
            return None
        return cls(sock)

    def drain(self) -> bool:
        """Read every notification queued; True if there was any."""
        got = False
        recv = self._sock.recv
        while True:
            try:
                recv(4096)
            except (BlockingIOError, InterruptedError):
                return got
            except OSError:
                return got
            got = True

    def wait(self, timeout_s: float) -> bool:
        """Block until a notification arrives or `timeout_s` passes; True if one arrived (and drain it)."""
        if timeout_s <= 0:
            return self.drain()
        try:
            ready = self._poll.poll(timeout_s * 1000.0)
        except InterruptedError:
            ready = []
        return bool(ready) and self.drain()

    def take_woken(self) -> set[int] | None:
        """Which vBuckets the notifications named is not read from them here: None (any may be)."""
        return None

    def close(self) -> None:
        self._sock.close()


def open_waiter(state: Any, address: str, bucket: str, owned: Container[int]) -> Any:
    """The waiter of a worker whose state is `state` (opened here): the socket at `address`, to which the
    service forwards the datagrams of writes to a data directory; on a server's state (PostgreSQL), a LISTEN
    connection of its own, woken on any machine (eventing.storage.postgres.wake_wait). ``owned`` is the
    worker's vBuckets as they are at each wait. None: the worker is polled."""
    if state.directory is None:
        from eventing.storage.postgres.state import PostgresState
        from eventing.storage.postgres.wake_wait import PostgresWriteWaiter

        assert isinstance(state, PostgresState)
        return PostgresWriteWaiter.open(state.db, bucket, owned)
    return WriteWaiter.open(address)


def forward(sender: socket.socket, address: str, payload: bytes) -> None:
    """Pass one notification on to a worker's waiter. Never blocks, never raises: a worker that is gone or
    busy (its queue full) finds the write with its next look at the source."""
    try:
        sender.sendto(payload, address)
    except OSError:
        pass


def sender_socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)


__all__ = ["WriteWaiter", "forward", "new_address", "open_waiter", "sender_socket"]
