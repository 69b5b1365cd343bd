"""Application logs on a data directory: what a handler's `log(...)` writes, one file per function at
`<data-dir>/logs/<function>.log`, rotated by size as Couchbase rotates its application logs.

Every worker process of a function appends to the same file (one write per line, O_APPEND). When the file
reaches `app_log_max_size` bytes, the writer that notices takes a lock, shifts `<function>.log.1 ..
.log.(N-1)` up by one (the oldest, `.log.N` with N = app_log_max_files - 1, is dropped) and starts a new
file; the other writers notice the new file (its inode changed) and reopen. So at most app_log_max_files
files of about app_log_max_size bytes each are kept.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from metadata.sqlite_io import PRIVATE_FILE, private_folder

DEFAULT_MAX_SIZE = 40 * 1024 * 1024  # Couchbase's default application log size
DEFAULT_MAX_FILES = 10


def log_path(data_dir: str | os.PathLike[str], function: str) -> Path:
    return Path(data_dir) / "logs" / f"{function}.log"


class AppLogWriter:
    """Appends lines to one function's application log, rotating it by size (safe across processes)."""

    def __init__(self, path: Path, max_size: int = DEFAULT_MAX_SIZE, max_files: int = DEFAULT_MAX_FILES):
        self.path = path
        self.max_size = max_size
        self.max_files = max(1, max_files)
        self._fd: int | None = None
        self._ino = -1

    def _open(self) -> int:
        private_folder(self.path.parent)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
        self._fd, self._ino = fd, os.fstat(fd).st_ino
        return fd

    def write(self, text: str) -> None:
        self._append((stamped(text) + "\n").encode())

    def write_lines(self, lines: list[str]) -> None:
        """Append lines already stamped (``stamped``), as few writes as rotation allows: a batch from a
        worker that cannot see the data directory (RemoteAppLog), rotated exactly as line by line. The
        batch holds the rotation lock, so two writers of batches (the data service's actors) never both
        find room for a chunk in a file that has room for one."""
        private_folder(self.path.parent)
        lock = os.open(str(self.path) + ".lock", os.O_WRONLY | os.O_CREAT, PRIVATE_FILE)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                room = self.max_size - os.stat(self.path).st_size
            except FileNotFoundError:
                room = self.max_size
            chunk: list[bytes] = []
            size = 0
            for line in lines:
                data = (line + "\n").encode()
                if (
                    chunk and size + len(data) > room
                ):  # the file is full: _append rotates before the next chunk
                    self._append(b"".join(chunk), locked=True)
                    chunk, size, room = [], 0, self.max_size
                chunk.append(data)
                size += len(data)
            if chunk:
                self._append(b"".join(chunk), locked=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)

    def _append(self, data: bytes, *, locked: bool = False) -> None:
        fd = self._fd if self._fd is not None else self._open()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None or st.st_ino != self._ino:  # rotated (or removed) by another writer
            os.close(fd)
            fd = self._open()
            st = os.fstat(fd)
        if st.st_size + len(data) > self.max_size and st.st_size > 0:
            fd = self._rotate(fd, locked=locked)
        os.write(fd, data)

    def _rotate(self, fd: int, *, locked: bool = False) -> int:
        """Shift the files up by one under the rotation lock (``locked``: the caller holds it)."""
        lock = -1 if locked else os.open(str(self.path) + ".lock", os.O_WRONLY | os.O_CREAT, PRIVATE_FILE)
        try:
            if not locked:
                fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            if current is not None and current.st_ino == self._ino:  # nobody rotated it meanwhile
                keep = self.max_files - 1
                if keep == 0:
                    os.unlink(self.path)
                else:
                    for n in range(keep - 1, 0, -1):
                        older = Path(f"{self.path}.{n}")
                        if older.exists():
                            os.replace(older, f"{self.path}.{n + 1}")
                    os.replace(self.path, f"{self.path}.1")
            os.close(fd)
            return self._open()
        finally:
            if not locked:
                fcntl.flock(lock, fcntl.LOCK_UN)
                os.close(lock)

    def flush(self) -> None:
        pass  # every line is written through when it is logged

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def stamped(text: str) -> str:
    """One application log line (without its newline): ``<UTC time> [INFO] <text>``."""
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{stamp} [INFO] {text}"


REMOTE_BATCH_LINES = 2000  # a remote worker sends its log lines in batches of at most this many
REMOTE_BATCH_BYTES = 256 * 1024  # or this many bytes
REMOTE_FLUSH_S = 1.0  # and at least this often while it logs (also at every checkpoint)


class RemoteAppLog:
    """The application log of a worker that cannot see the data directory: lines are stamped when
    written, buffered, and handed to the data service in batches (one call per batch, at most one in
    flight), which appends them to ``<data-dir>/logs/<function>.log`` with the same rotation. Memory is
    bounded: a full buffer waits for the batch in flight before it is sent, so a handler that logs faster
    than the service writes is slowed down instead of growing the buffer."""

    def __init__(
        self,
        send: Callable[[list[str]], Callable[[], object]],
        max_lines: int = REMOTE_BATCH_LINES,
        max_bytes: int = REMOTE_BATCH_BYTES,
        flush_s: float = REMOTE_FLUSH_S,
    ):
        self.send = send  # starts one batch's write, returns a thunk that waits for it
        self.max_lines, self.max_bytes, self.flush_s = max_lines, max_bytes, flush_s
        self._lines: list[str] = []
        self._bytes = 0
        self._inflight: Callable[[], object] | None = None
        self._last_sent = time.monotonic()
        self.batches = 0  # sent so far (tests count them: lines travel in batches, not one call each)

    def write(self, text: str) -> None:
        line = stamped(text)
        self._lines.append(line)
        self._bytes += len(line) + 1
        if (
            len(self._lines) >= self.max_lines
            or self._bytes >= self.max_bytes
            or time.monotonic() - self._last_sent >= self.flush_s
        ):
            self._send()

    def write_lines(self, lines: list[str]) -> None:
        """Lines already stamped, sent with the next batch."""
        for line in lines:
            self._lines.append(line)
            self._bytes += len(line) + 1
        if len(self._lines) >= self.max_lines or self._bytes >= self.max_bytes:
            self._send()

    def _send(self) -> None:
        self._settle()
        if self._lines:
            lines, self._lines, self._bytes = self._lines, [], 0
            self._inflight = self.send(lines)
            self.batches += 1
        self._last_sent = time.monotonic()

    def _settle(self) -> None:
        if self._inflight is not None:
            wait, self._inflight = self._inflight, None
            wait()

    def flush(self) -> None:
        """Send what is buffered and wait until it is written (a checkpoint, a stop)."""
        self._send()
        self._settle()

    def close(self) -> None:
        self.flush()


def files_oldest_first(path: Path) -> list[Path]:
    rotated = sorted(path.parent.glob(path.name + ".*"), key=lambda p: p.name)
    numbered = [p for p in rotated if p.suffix[1:].isdigit()]
    numbered.sort(key=lambda p: int(p.suffix[1:]), reverse=True)
    return numbered + ([path] if path.exists() else [])


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines over the current file and its rotated predecessors."""
    out: list[str] = []
    for file in reversed(files_oldest_first(path)):  # newest first
        out = file.read_text(errors="replace").splitlines() + out
        if len(out) >= lines:
            break
    return out[-lines:] if lines > 0 else []


def follow(path: Path, poll_s: float = 0.2, stop: float | None = None) -> Iterator[str]:
    """New lines as they are written, across rotations; ends at time.monotonic() >= stop, if given."""
    handle = None
    ino = -1
    while stop is None or time.monotonic() < stop:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if st is not None and st.st_ino != ino:
            if handle is not None:
                yield from (line.rstrip("\n") for line in handle.readlines())  # the rest of the rotated file
                handle.close()
                handle = open(path, errors="replace")  # noqa: SIM115 - kept open across iterations
            else:
                handle = open(path, errors="replace")  # noqa: SIM115
                handle.seek(0, os.SEEK_END)
            ino = st.st_ino
        if handle is not None:
            for line in handle.readlines():
                yield line.rstrip("\n")
        time.sleep(poll_s)
    if handle is not None:
        handle.close()


class DirectoryAppLogs:
    """The application logs of a data directory (``AppLogs`` of a ``DirectoryState``)."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)

    def writer(
        self, function: str, max_size: int = DEFAULT_MAX_SIZE, max_files: int = DEFAULT_MAX_FILES
    ) -> AppLogWriter:
        return AppLogWriter(log_path(self.directory, function), max_size, max_files)

    def where(self, function: str) -> str | None:
        """Where the function's log is, for messages; None until it logged something."""
        path = log_path(self.directory, function)
        return str(path) if path.exists() else None

    def tail(self, function: str, lines: int) -> list[str]:
        return tail(log_path(self.directory, function), lines)

    def tail_bytes(self, function: str, size: int) -> bytes | None:
        """The last `size` bytes of the current file (Couchbase's /getAppLog); None before any line."""
        path = log_path(self.directory, function)
        try:
            with path.open("rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - size))
                return f.read()
        except FileNotFoundError:
            return None

    def follow(self, function: str, poll_s: float = 0.2, stop: float | None = None) -> Iterator[str]:
        return follow(log_path(self.directory, function), poll_s, stop)
