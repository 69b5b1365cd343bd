"""`rate_limit` and `max_in_flight` of URL bindings, shared by every worker of a function on this machine,
and a server's `Retry-After` (see docs/handler-api.md, "Rate limits and max_in_flight").

A binding's limit lives in small files under the machine's temporary folder, named by the function, the
source bucket's identity and the binding's settings, so every process that runs the function's handler
here (Ray workers, pool threads, `dlq replay`, the debugger, a sandbox's host) shares it:

- the rate: a token bucket (rate `per_second` times the share, `burst` tokens at most) in one 24-byte
  file (tokens, when they were counted, and a pause until which no request starts), read and written under
  an exclusive flock, about 10 us a request;
- in flight: `max_in_flight` slot files, each held by a flock while its request runs; a process killed
  mid-request loses its locks with it, so a slot is never leaked.

Across machines the limit is shared by division: a worker gets `share` = 1 / the number of machines that
run the function's workers (the supervisor counts them), so the machines together stay within the limit
without a round trip per request to anything shared (docs/handler-api.md gives the figures that decided
it). A request that has to wait does so inside the handler call, and the wait does not count against
execution_timeout: the call's deadline moves by the time waited (backpressure, never a dead letter).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

_STATE = struct.Struct(
    "<ddd"
)  # tokens, counted at (time.monotonic: one clock for every process), paused until
POLL_S = 0.005  # how often a request waiting for an in-flight slot looks again
MAX_SLEEP_S = 0.05  # a request waiting for a token sleeps at most this long before looking again


def limits_folder() -> Path:
    """Where this machine's binding limits live: $EVENTING_LIMITS_DIR, else a folder per user in the
    temporary folder."""
    given = os.environ.get("EVENTING_LIMITS_DIR")
    return Path(given) if given else Path(tempfile.gettempdir()) / f"eventing-limits-{os.getuid()}"


def retry_after_s(headers: dict[str, str], now: float | None = None) -> float:
    """Seconds a response's Retry-After asks to wait (a number of seconds or an HTTP date); 0 without one."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), "").strip()
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0
    return max(0.0, when - (time.time() if now is None else now))


class BindingLimit:
    """One URL binding's limits on this machine. `acquire` waits until a request may start and returns how
    long it waited and the slot it holds; `release` gives the slot back."""

    def __init__(
        self,
        folder: Path,
        name: str,
        per_second: float | None,
        burst: float,
        max_in_flight: int | None,
        share: float = 1.0,
    ):
        self.folder, self.name = folder, name
        self.rate = per_second * share if per_second else None
        self.capacity = max(1.0, burst * share) if per_second else 1.0
        self.slots = max(1, int(max_in_flight * share)) if max_in_flight else None
        self._fds: dict[int, int] = {}  # slot -> this process's descriptor of its file
        self._bucket_fd: int | None = None
        self._held: set[int] = set()  # slots threads of this process hold (flock does not tell them apart)
        self._lock = threading.Lock()
        self._state_lock = (
            threading.Lock()
        )  # the rate file's: its flock does not tell this process's threads apart

    @property
    def limited(self) -> bool:
        return self.rate is not None or self.slots is not None

    def _open(self, suffix: str) -> int:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(self.folder / f"{self.name}.{suffix}", os.O_RDWR | os.O_CREAT, 0o600)

    def acquire(self, before_sleep: Callable[[float], None] | None = None) -> tuple[float, int]:
        """Wait for a slot (max_in_flight), then for a token (rate_limit) and for any pause a server asked
        for. Returns (seconds waited, slot or -1). `before_sleep(s)` is told of each sleep before it starts
        (the handler call moves its deadline by it)."""
        start = time.monotonic()
        slot = self._take_slot(before_sleep) if self.slots is not None else -1
        try:
            while True:
                wait = self._take_token()
                if wait <= 0:
                    return time.monotonic() - start, slot
                wait = min(wait, MAX_SLEEP_S)
                if before_sleep is not None:
                    before_sleep(wait)
                time.sleep(wait)
        except BaseException:
            self.release(slot)
            raise

    def release(self, slot: int) -> None:
        if slot < 0:
            return
        with self._lock:
            fd = self._fds.get(slot)
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
            self._held.discard(slot)

    def pause(self, seconds: float) -> None:
        """A server answered 429 or 503 with Retry-After: no request of the binding starts on this machine
        for `seconds` (a longer pause already set stays)."""
        if seconds <= 0:
            return
        with self._locked_state() as (fd, state):
            tokens, at, paused = state
            until = time.monotonic() + seconds
            if until > paused:
                os.pwrite(fd, _STATE.pack(tokens, at, until), 0)

    def _take_slot(self, before_sleep: Callable[[float], None] | None) -> int:
        assert self.slots is not None
        while True:
            with self._lock:
                for slot in range(self.slots):
                    if slot in self._held:
                        continue
                    fd = self._fds.get(slot)
                    if fd is None:
                        fd = self._fds[slot] = self._open(f"slot{slot}")
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    self._held.add(slot)
                    return slot
            if before_sleep is not None:
                before_sleep(POLL_S)
            time.sleep(POLL_S)

    def _take_token(self) -> float:
        """Take a token if one is there (0.0), else the seconds until one is (or the pause ends)."""
        with self._locked_state() as (fd, state):
            tokens, at, paused = state
            now = time.monotonic()
            if now < paused:
                return paused - now
            if self.rate is None:
                return 0.0
            if at <= 0 or at > now:  # a new file (or one from before this machine's boot): a quiet time,
                tokens, at = self.capacity, now  # so the burst is there, as after any quiet time
            tokens = min(self.capacity, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                os.pwrite(fd, _STATE.pack(tokens - 1.0, now, paused), 0)
                return 0.0
            os.pwrite(fd, _STATE.pack(tokens, now, paused), 0)
            return (1.0 - tokens) / self.rate

    def _locked_state(self) -> _LockedState:
        with self._lock:
            if self._bucket_fd is None:
                self._bucket_fd = self._open("rate")
        return _LockedState(self._bucket_fd, self._state_lock)

    def close(self) -> None:
        with self._lock:
            for fd in [*self._fds.values(), *([self._bucket_fd] if self._bucket_fd is not None else [])]:
                os.close(fd)
            self._fds.clear()
            self._bucket_fd = None
            self._held.clear()


class _LockedState:
    """The rate file's state under its flock (a thread lock too: threads of a process share the descriptor,
    and flock would let them in together)."""

    def __init__(self, fd: int, threads: threading.Lock):
        self.fd, self._threads = fd, threads

    def __enter__(self) -> tuple[int, tuple[float, float, float]]:
        self._threads.acquire()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        raw = os.pread(self.fd, _STATE.size, 0)
        return self.fd, (_STATE.unpack(raw) if len(raw) == _STATE.size else (0.0, 0.0, 0.0))

    def __exit__(self, *exc: Any) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()


class Limits:
    """The binding limits of one function's handler in this process: made per binding on first use."""

    def __init__(self, function: str, scope: str, share: float = 1.0, folder: Path | None = None):
        self.function, self.scope, self.share = function, scope, share
        self.folder = folder or limits_folder()
        self._made: dict[str, BindingLimit] = {}
        self._lock = threading.Lock()

    def of(self, binding: Any) -> BindingLimit:
        """The limit of a UrlBinding (eventing.execution.curl): its settings name the files, so a changed
        limit starts afresh."""
        with self._lock:
            found = self._made.get(binding.alias)
            if found is None:
                per_second, burst = binding.rate_limit or (None, 1.0)
                settings = (
                    f"{self.function}\0{self.scope}\0{binding.alias}\0{binding.url}\0{per_second}\0{burst}\0"
                    f"{binding.max_in_flight}"
                )
                name = hashlib.sha256(settings.encode()).hexdigest()[:24]
                found = self._made[binding.alias] = BindingLimit(
                    self.folder, name, per_second, burst, binding.max_in_flight, self.share
                )
            return found

    def close(self) -> None:
        with self._lock:
            for limit in self._made.values():
                limit.close()
            self._made.clear()
