"""A worker's wait for writes on a PostgreSQL store (``PostgresWriteWaiter``): the worker's own connection
LISTENs on the store's channel (eventing.storage.postgres.wake), so a caught-up worker waiting in its step
(eventing.workers.write_waiter) is woken by a write to one of its vBuckets from any machine, on any machine.

A data directory's workers are woken through the service: its listener forwards each write's datagram to
the waiting worker's socket, which only reaches workers on the service's machine. A worker of a server's
state may run on any node of a Ray cluster, so it listens itself; the notifications of other buckets and
other vBuckets are read and passed over (a payload is a bucket name and vBucket ranges). It answers what
eventing.workers.write_waiter.WriteWaiter answers (``drain``, ``wait``, ``close``). A lost connection
counts as a write (the worker looks once, as after its poll) and is made again at the next wait; while the
server is away, waits time out as a poll. Before it LISTENs, the connection notes the worker's interest in
its bucket (eventing.storage.postgres.wake.note_interest), renewed while it waits: writers announce only
the buckets listened for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container
from typing import Any

from eventing.storage.postgres.schema import ensure_bucket_schema
from eventing.storage.postgres.wake import InterestRenewal, channel_of, decode_payload, note_interest
from metadata.errors import StoreError
from metadata.postgres import PostgresDatabase

log = logging.getLogger("eventing.storage.wake")

RECONNECT_S = 1.0  # after a failed connection, no new attempt for this long


class PostgresWriteWaiter:
    """One worker's LISTEN connection; ``owned`` is the worker's vBuckets as they are at each wait."""

    def __init__(self, db: PostgresDatabase, bucket: str, owned: Container[int]):
        self.db = db
        self.bucket = bucket
        self.owned = owned
        self.channel = channel_of(db)
        self._conn: Any = None
        self._failed_at = 0.0
        self.received = 0  # notifications read (every bucket's)
        # The owned vBuckets named by the notifications read since the last take_woken; None: unknown (the
        # connection was lost, so writes may have gone unannounced).
        self._woken: set[int] | None = set()
        self._renewal = InterestRenewal(db, bucket)

    @classmethod
    def open(cls, db: PostgresDatabase, bucket: str, owned: Container[int]) -> PostgresWriteWaiter | None:
        """Listening; None (the worker is stepped by the service, as without a waiter) when the server
        cannot be reached."""
        waiter = cls(db, bucket, owned)
        if not waiter._connect():
            return None
        return waiter

    def _connect(self) -> bool:
        try:
            ensure_bucket_schema(self.db)  # the interests' table
            conn = self.db.connect()
        except StoreError as exc:
            self._failed_at = time.monotonic()
            log.warning("cannot listen for write notifications (%s); this worker is polled", exc)
            return False
        try:
            note_interest(conn, self.bucket)
            conn.execute(f'LISTEN "{self.channel}"')
        except Exception:  # noqa: BLE001 - the server went away between the two: as a failed connection
            conn.close()
            self._failed_at = time.monotonic()
            return False
        self._conn = conn
        return True

    def _mine(self, payload: str) -> bool:
        found = decode_payload(payload)
        if found is None:
            return False
        bucket, vbs = found
        if bucket != self.bucket:
            return False
        owned = self.owned
        mine = {vb for vb in vbs if vb in owned}
        if mine and self._woken is not None:
            self._woken |= mine
        return bool(mine)

    def take_woken(self) -> set[int] | None:
        """The owned vBuckets announced as written since the last call (None: any may have been)."""
        woken, self._woken = self._woken, set()
        return woken

    def _batch(self, timeout_s: float) -> tuple[bool, bool]:
        """The notifications of the next packet to arrive within ``timeout_s`` (0: one already here): (any
        arrived, any was a write to this worker's vBuckets). The packet is read whole: psycopg drops what
        is left of it when its generator is closed early."""
        got = mine = False
        for note in self._conn.notifies(timeout=timeout_s, stop_after=1):
            got = True
            self.received += 1
            if self._mine(note.payload):  # every one read: take_woken names all they announced
                mine = True
        return got, mine

    def _ready(self, timeout_s: float) -> bool:
        """A connection to read from (made again after a loss, at most every RECONNECT_S); else False
        after sleeping out ``timeout_s`` (up to RECONNECT_S), as a poll would."""
        if self._conn is not None:
            return True
        if time.monotonic() - self._failed_at >= RECONNECT_S and self._connect():
            return True
        if timeout_s > 0:
            time.sleep(min(timeout_s, RECONNECT_S))
        return False

    def drain(self) -> bool:
        """Read every notification queued; True if any was a write to this worker's vBuckets (or the
        connection was lost: writes may have gone unannounced)."""
        import psycopg

        if not self._ready(0.0):
            return False
        self._renewal.due()
        mine = False
        try:
            while True:
                got, found = self._batch(0.0)
                mine = mine or found
                if not got:
                    return mine
        except psycopg.Error:
            self._lost()
            return True

    def wait(self, timeout_s: float) -> bool:
        """Block until a write to this worker's vBuckets is announced or ``timeout_s`` passes; True if one
        was (the others queued are read too)."""
        import psycopg

        if timeout_s <= 0:
            return self.drain()
        if not self._ready(timeout_s):
            return False
        self._renewal.due()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                _, mine = self._batch(left)
                if mine:
                    self.drain()
                    return True
        except psycopg.Error:
            self._lost()
            return True

    def _lost(self) -> None:
        self._woken = None
        self.close()
        self._failed_at = time.monotonic()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass


__all__ = ["PostgresWriteWaiter"]
