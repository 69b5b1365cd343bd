"""Failed logins, counted per key (`client:ADDR`, `user:NAME`) so that guessing a password is slow, and
what a lock holds back (eventing.http.auth.Authenticator):

- a user's password is checked only while its user name is not locked: MAX_FAILURES wrong passwords for
  one name lock that name (from any address), so a password cannot be guessed faster than that;
- a valid token, or a user's right password while the name is not locked, is accepted whatever else the
  client sent: a client's lock (MAX_FAILURES wrong credentials from one address) only turns that client's
  further wrong credentials into 429s. Every local process shares 127.0.0.1, so a lock per address that
  also held back right credentials would let any of them lock out the admin token and every user.

Tokens are at least 16 random characters: guessing one is hopeless at any rate, so no lock guards them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MAX_FAILURES = 5  # distinct failed credentials in FAILURE_WINDOW_S before a key is locked
FAILURE_WINDOW_S = 60.0
BASE_LOCK_S = 30.0  # the first lock; each further lock of the same key doubles it, up to MAX_LOCK_S
MAX_LOCK_S = 3600.0
MAX_TRACKED_KEYS = 100_000  # memory bound: the quietest keys are forgotten first


@dataclass
class _Failures:
    guesses: dict[bytes, float] = field(default_factory=dict)  # a digest of each failed credential -> when
    locks: int = 0
    locked_until: float = 0.0
    last: float = 0.0


class LoginThrottle:
    """Failed logins per key (`client:ADDR`, `user:NAME`): MAX_FAILURES distinct credentials failing within
    FAILURE_WINDOW_S lock the key for BASE_LOCK_S, doubling with each further lock (up to MAX_LOCK_S); a key
    quiet for MAX_LOCK_S starts over. The same wrong credential sent again is not another guess: a console or
    a script polling with a stale token would otherwise lock its client out, and then refuse the right token
    for BASE_LOCK_S. `clock` is monotonic seconds (a test moves its own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._keys: dict[str, _Failures] = {}
        self._lock = threading.Lock()

    def retry_after(self, keys: Sequence[str]) -> float | None:
        """Seconds until the most locked of `keys` may try again, or None when none is locked."""
        now = self.clock()
        with self._lock:
            waits = [f.locked_until - now for k in keys if (f := self._keys.get(k)) and f.locked_until > now]
        return max(waits) if waits else None

    def failed(self, keys: Sequence[str], guess: bytes = b"") -> None:
        """A login failed with the credential whose keyed digest is `guess` (never the credential itself)."""
        now = self.clock()
        with self._lock:
            if len(self._keys) >= MAX_TRACKED_KEYS:
                self._forget_quiet(now)
            for key in keys:
                f = self._keys.get(key)
                if f is None or now - f.last > MAX_LOCK_S:
                    f = self._keys[key] = _Failures()
                f.last = now
                if f.locked_until > now:
                    continue  # a locked key counts no guesses: its lock runs as it was set
                if guess not in f.guesses:
                    f.guesses = {g: t for g, t in f.guesses.items() if now - t <= FAILURE_WINDOW_S}
                f.guesses[guess] = now
                if len(f.guesses) >= MAX_FAILURES:
                    f.locked_until = now + min(BASE_LOCK_S * 2**f.locks, MAX_LOCK_S)
                    f.locks += 1
                    f.guesses.clear()

    def succeeded(self, key: str) -> None:
        """A right password for `key`: its pending guesses are forgotten; the number of locks it had stays,
        so a guesser who goes on after the user signed in meets a lock twice as long as the last."""
        with self._lock:
            f = self._keys.get(key)
            if f is not None:
                f.guesses.clear()

    def _forget_quiet(self, now: float) -> None:
        for key in sorted(self._keys, key=lambda k: self._keys[k].last)[: len(self._keys) // 2]:
            if self._keys[key].locked_until <= now:
                del self._keys[key]
