"""The Data API's `Idempotency-Key` header on writes (see docs/data-api.md, "Retried writes").

A write sent with `Idempotency-Key: K` is answered as usual and its answer recorded under (caller, K) for
the retention window (`eventing serve --idempotency-retention`, default 24 h). The same request sent again
with the same key (a client retrying after a timeout) gets the recorded answer, with `Idempotent-Replayed:
true`, and makes no second mutation. The same key with another request (another method, path, query or
body) is refused with 422, and while the first request with a key is being answered a second one with it
gets 409.

Records are small JSON files in the state's file area `idempotency/` (a folder of the data directory, or a
table of a PostgreSQL state: eventing.storage.file_area), written durably once the write has committed and
before the answer leaves. A server that dies between the two (the same instant) has no record: a retry then
makes the write again. Records past the window are deleted as new ones are written, at most every minute.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from eventing.http.dataapi.errors import ApiError, bad
from eventing.storage.state import State

Answer = tuple[int, dict[str, str], bytes, str | None]
HEADER = "idempotency-key"
MAX_KEY_CHARS = 255
DEFAULT_RETENTION_S = 24 * 3600.0
PRUNE_EVERY_S = 60.0
FOLDER = "idempotency"


class IdempotencyRecords:
    """The recorded answers of one state's Data API writes made with an Idempotency-Key."""

    def __init__(self, state: State, retention_s: float = DEFAULT_RETENTION_S):
        self.area = state.file_area(FOLDER)
        self.retention_s = retention_s
        self._running: set[str] = set()  # records whose first request is being answered (this process)
        self._lock = threading.Lock()
        self._pruned_at = 0.0

    async def answer(
        self,
        caller: str,
        key: str,
        request: tuple[str, str, str, bytes],
        make: Callable[[], Awaitable[Answer]],
    ) -> Answer:
        """The answer to `request` (method, path, query, body) sent by `caller` with Idempotency-Key `key`:
        the recorded one, or `make()`'s, recorded."""
        check_key(key)
        name = _record_name(caller, key)
        fingerprint = _fingerprint(*request)
        found = await asyncio.to_thread(self._read, name)
        if found is not None:
            return _replayed(found, fingerprint, key)
        with self._lock:
            if name in self._running:
                raise ApiError(
                    409,
                    "IdempotencyKeyInUse",
                    f"A request with Idempotency-Key '{key[:80]}' is still "
                    "being answered; retry once it has been",
                )
            self._running.add(name)
        try:
            try:
                status, headers, body, ctype = await make()
            except ApiError as exc:
                status, headers, body, ctype = (
                    exc.status,
                    exc.headers,
                    json.dumps(exc.body()).encode(),
                    "application/json",
                )
            if status < 500:  # a server fault is not an answer to keep: a retry tries again
                await asyncio.to_thread(self._write, name, fingerprint, (status, headers, body, ctype))
        finally:
            with self._lock:
                self._running.discard(name)
        return status, headers, body, ctype

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            record = json.loads(self.area.read(name))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # a damaged record is no record
        if not isinstance(record, dict) or time.time() - float(record.get("at", 0)) > self.retention_s:
            return None
        return record

    def _write(self, name: str, fingerprint: str, answer: Answer) -> None:
        status, headers, body, ctype = answer
        now = time.time()
        self.area.write(
            name,
            json.dumps(
                {
                    "at": now,
                    "fingerprint": fingerprint,
                    "status": status,
                    "headers": headers,
                    "body": base64.b64encode(body).decode("ascii"),
                    "content_type": ctype,
                }
            ).encode(),
        )
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            self.prune(now)

    def prune(self, now: float | None = None) -> int:
        """Delete the records past the retention window; returns how many went."""
        now = time.time() if now is None else now
        old = []
        for name in self.area.list(""):
            record = self._read_raw(name)
            if record is None or now - float(record.get("at", 0)) > self.retention_s:
                old.append(name)
        if old:
            self.area.delete_many(old)
        return len(old)

    def _read_raw(self, name: str) -> dict[str, Any] | None:
        try:
            record = json.loads(self.area.read(name))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None


def check_key(key: str) -> None:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not key.isprintable():
        raise bad(
            f"Idempotency-Key '{key[:60]}' is not valid; send 1 to {MAX_KEY_CHARS} printable characters, "
            "for example a UUID"
        )


def _record_name(caller: str, key: str) -> str:
    return hashlib.sha256(f"{caller}\0{key}".encode()).hexdigest() + ".json"


def _fingerprint(method: str, path: str, query: str, body: bytes) -> str:
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), query.encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    digest.update(body)
    return digest.hexdigest()


def _replayed(record: dict[str, Any], fingerprint: str, key: str) -> Answer:
    if record.get("fingerprint") != fingerprint:
        raise ApiError(
            422,
            "IdempotencyKeyReused",
            f"Idempotency-Key '{key[:80]}' was used for another request "
            "(another method, document or body) within the retention window; send each request its "
            "own key",
        )
    headers = dict(record.get("headers") or {})
    headers["Idempotent-Replayed"] = "true"
    return int(record["status"]), headers, base64.b64decode(record["body"]), record.get("content_type")
