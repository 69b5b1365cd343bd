"""Write notifications: a committed bucket write tells a running service which vBuckets it wrote.

A caught-up worker is asked again only every `supervisor.IDLE_POLL_S`, so without a notification a write
waits up to that long before its handler runs. So every bucket write transaction, once committed, sends
one datagram to the UNIX socket ``<data_dir>/run/wake.sock`` naming the bucket and the vBuckets it wrote;
the service listening there (`WakeListener`) steps at once the caught-up workers owning those vBuckets.

The sender never waits and never fails: the socket is non-blocking, and a missing socket (no service),
a stale one (the service is gone), a full queue (the service is busy) or any other error is ignored. The
poll stays as the fallback for what a datagram cannot carry: a write from another machine, a datagram
lost to a full queue. Sending costs one ``sendto`` a transaction (a few microseconds, figures in
docs/benchmarks.md, "Write to handler"), whatever the transaction's size.

Why a datagram rather than inotify on the bucket's WAL file: it names the vBuckets written, so only the
workers that own them are stepped (inotify would wake every worker of the bucket, and also for a
checkpoint of the WAL), it needs no watch per bucket file (a bucket may be one file per vBucket range),
and Python has no inotify binding of its own.

A datagram is ``<bucket name> 0x00 <vBuckets as uint16, native byte order>`` (at most 2 KB: one machine).
The service honours ``EVENTING_WAKE=0``: it does not listen, so every write falls back to the poll (the
benchmarks' baseline).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path

from eventing.core.keyspaces import NUM_VBUCKETS
from metadata.sqlite_io import private_folder

log = logging.getLogger("eventing.storage.wake")

RUN_DIR = "run"
SOCKET_NAME = "wake.sock"
WAKE_ENV = "EVENTING_WAKE"
_SUN_PATH_MAX = 107  # sockaddr_un's sun_path, less its terminating NUL


def enabled() -> bool:
    """Whether a service listens for write notifications (EVENTING_WAKE=0 turns it off)."""
    return os.environ.get(WAKE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def socket_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / RUN_DIR / SOCKET_NAME


def data_dir_of_bucket_file(path: Path) -> Path:
    """``<data_dir>/buckets/NAME.sqlite3`` or ``<data_dir>/buckets/NAME.partitions/I.sqlite3``."""
    buckets = path.parent.parent if path.parent.name.endswith(".partitions") else path.parent
    return buckets.parent


def encode(bucket: str, vbuckets: Iterable[int]) -> bytes:
    return bucket.encode() + b"\x00" + array("H", vbuckets).tobytes()


def decode(data: bytes) -> tuple[str, set[int]] | None:
    """(bucket, vBuckets) of a datagram; None for one that is not a notification."""
    i = next((at for at, byte in enumerate(data) if byte < 0x20), None)
    if i is None:
        return None
    name, kind, body = data[:i], data[i], data[i + 1 :]
    try:
        bucket = name.decode()
    except UnicodeDecodeError:
        return None
    if not bucket:
        return None
    if kind != 0 or len(body) % 2:
        return None
    vbs = array("H")
    vbs.frombytes(body)
    return bucket, {vb for vb in vbs if vb < NUM_VBUCKETS}


# -- sending --------------------------------------------------------------------------------------------

_sender: socket.socket | None = None
_sender_pid = 0
_dir_fds: dict[str, int] = {}  # run folder -> a descriptor of it, for socket paths too long to name


def _address(path: Path) -> str | None:
    """The address to send to or bind: the path itself, or for a path longer than a socket address can
    hold, the same file reached through a descriptor of its folder (/proc/self/fd/N/wake.sock)."""
    text = str(path)
    if len(text.encode()) <= _SUN_PATH_MAX:
        return text
    folder = str(path.parent)
    fd = _dir_fds.get(folder)
    if fd is None:
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        _dir_fds[folder] = fd
    return f"/proc/self/fd/{fd}/{path.name}"


def notify(path: Path, bucket: str, vbuckets: Iterable[int]) -> None:
    """Tell a service listening at ``path`` (if any) that ``bucket`` got committed writes in ``vbuckets``.
    Never blocks, never raises."""
    global _sender, _sender_pid
    try:
        pid = os.getpid()
        if _sender is None or _sender_pid != pid:
            _sender = socket.socket(
                socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
            )
            _sender_pid = pid
        address = _address(path)
        if address is not None:
            _sender.sendto(encode(bucket, vbuckets), address)
    except OSError:
        pass  # no service, a stale socket, a full queue: the poll finds the write


# -- listening ------------------------------------------------------------------------------------------


class WakeListener:
    """The service's end: binds ``<data_dir>/run/wake.sock`` and collects notifications on a thread of its
    own, so none waits for the service's loop (a UNIX datagram socket queues only a few). The loop takes
    them with `take` and blocks on `wait` when it has nothing in flight."""

    def __init__(self, data_dir: str | os.PathLike[str]):
        self.path = socket_path(data_dir)
        self.event = threading.Event()  # set when notifications are pending (or by `interrupt`)
        self.received = 0  # datagrams
        self._pending: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        # Called on the listening thread with each notification as it arrives (bucket, vBuckets, the
        # datagram): the service passes it on to workers waiting for writes (eventing.workers.write_waiter).
        self.on_notify: Callable[[str, set[int], bytes], None] | None = None

    def start(self) -> bool:
        """Listen; False (and the poll alone) when the socket cannot be made."""
        try:
            private_folder(self.path.parent)
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    # Left by a service that is gone (only the leader listens, and this service leads).
                    self.path.unlink()
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            address = _address(self.path)
            if address is None:
                sock.close()
                return False
            sock.bind(address)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self._inode = os.stat(self.path).st_ino
        except OSError as exc:
            log.warning(
                "cannot listen for write notifications at %s (%s); caught-up workers are polled",
                self.path,
                exc,
            )
            return False
        self._sock = sock
        self._thread = threading.Thread(target=self._receive, name="eventing-wake", daemon=True)
        self._thread.start()
        return True

    def _receive(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._closing:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            found = decode(data)
            if found is None:
                continue
            bucket, vbs = found
            on_notify = self.on_notify
            if on_notify is not None:
                try:
                    on_notify(bucket, vbs, data)
                except Exception:  # noqa: BLE001 - a forward that failed leaves the write to the loop below
                    log.debug("forwarding a write notification failed", exc_info=True)
            with self._lock:
                self.received += 1
                pending = self._pending.get(bucket)
                if pending is None:
                    self._pending[bucket] = vbs
                else:
                    pending |= vbs
            self.event.set()

    def take(self) -> dict[str, set[int]]:
        """The notifications received since the last take, by bucket."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self.event.clear()
        return pending

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)

    def interrupt(self) -> None:
        """Wake the loop blocked in `wait` (the service is stopping)."""
        self.event.set()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._closing = True
        try:  # recv on another thread is not interrupted by close(): send it a datagram to end on
            poke = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
            try:
                poke.sendto(b"", sock.getsockname())
            finally:
                poke.close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=2)
        sock.close()
        try:  # only our own socket: a later service may have bound the path meanwhile
            if os.stat(self.path).st_ino == self._inode:
                self.path.unlink()
        except OSError:
            pass


__all__ = ["WakeListener", "data_dir_of_bucket_file", "decode", "enabled", "encode", "notify", "socket_path"]
