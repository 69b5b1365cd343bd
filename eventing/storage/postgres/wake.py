"""Write notifications through PostgreSQL: a committed write wakes the workers owning its vBuckets, on any
machine (the PostgreSQL store's counterpart of eventing.storage.wake's datagrams, which reach one machine).

After a write transaction commits, its process's ``WakeSender`` sends ``pg_notify`` on the store's channel
(``eventing_wake``, or ``eventing_wake_<schema>`` for a store in a schema of its own: a channel is
database-wide) with a payload naming the bucket and the vBuckets as ranges (``orders 0-3,17,900-1023``).
``PostgresWakeListener`` holds a connection of its own that LISTENs, and gives the service what
eventing.storage.wake.WakeListener gives it (``start``, ``take``, ``wait``, ``interrupt``, ``close``,
``on_notify`` with the same datagram bytes), so the service uses either.

Only buckets someone listens for are announced: a listener records its interest before it LISTENs
(``note_interest``: a row of ``eventing_wake_interest`` naming its bucket, or ``*`` for every bucket,
valid for INTEREST_S and renewed while it listens), and a sender looks up which buckets are listened for at
most every INTEREST_REFRESH_S (at once after a listener of its own process noted one). A binding's writes to
a bucket no function reads (most of them) then cost no notification: at 1,000 writes/s that was one
transaction in two for the server, and each listener read and passed over every one. A listener that a
sender has not seen yet misses at most INTEREST_REFRESH_S of notifications, which the workers' looks at
all their vBuckets (at start, then every second) find.

Why after the commit, from a thread of its own, rather than NOTIFY inside the write transaction: PostgreSQL
serialises the commits of notifying transactions (a lock on the notification queue, held through the
commit's WAL flush), so with fsync on, single-document writes from 16 threads fell from ~3,000 to ~900
transactions/s when each notified (docs/benchmarks.md). The sender's transaction commits asynchronously
(``synchronous_commit=off``: a notification need not be durable), and the notifications of the writes that
commit while one is being sent go together in the next. A notification is best effort, as a datagram is:
one lost (the process dies right after its commit, the server restarts) leaves the write to the workers'
poll. The writer never waits for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from eventing.storage import wake as file_wake
from eventing.storage.postgres import registry
from eventing.storage.postgres.schema import ensure_bucket_schema
from metadata.errors import StoreError
from metadata.postgres import PostgresDatabase
from sharding import NUM_VBUCKETS

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("eventing.storage.wake")

CHANNEL = "eventing_wake"
LISTEN_POLL_S = 0.2  # how often the listening thread looks up from the connection (to see close())
RECONNECT_MAX_S = 2.0
SENDER_IDLE_S = 10.0  # a sender's thread ends, closing its connection, after this long without a notification
INTEREST_S = 30.0  # how long a listener's noted interest lasts; renewed every INTEREST_S / 3 while it listens
INTEREST_REFRESH_S = 1.0  # how long a sender trusts what it last read of the listeners' interest
EVERY_BUCKET = "*"  # a listener's interest in every bucket (the service's)
_LISTENED = "SELECT bucket FROM eventing_wake_interest WHERE until > extract(epoch FROM clock_timestamp())"
_NOTE = (
    "INSERT INTO eventing_wake_interest VALUES (%s, extract(epoch FROM clock_timestamp()) + %s) "
    "ON CONFLICT (bucket) DO UPDATE SET until = greatest(eventing_wake_interest.until, excluded.until)"
)
_noted = 0  # interests noted by this process's listeners: its senders look again at once when it moves


def channel_of(db: PostgresDatabase) -> str:
    schema = db.target.schema
    return f"{CHANNEL}_{schema}" if schema else CHANNEL


def encode_payload(bucket: str, vbuckets: Iterable[int]) -> str:
    """``bucket first-last,vb,...``: the vBuckets as sorted ranges (at most ~2.5 KB for 1,024 vBuckets, under
    PostgreSQL's 8,000 bytes)."""
    parts: list[str] = []
    run: list[int] = []
    for vb in sorted(set(vbuckets)):
        if run and vb == run[-1] + 1:
            run.append(vb)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [vb]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return f"{bucket} {','.join(parts)}"


def decode_payload(payload: str) -> tuple[str, set[int]] | None:
    """(bucket, vBuckets) of a payload; None for one that is not a notification."""
    bucket, _, ranges = payload.partition(" ")
    if not bucket or not ranges:
        return None
    vbs: set[int] = set()
    try:
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            vbs.update(range(int(first), int(last or first) + 1))
    except ValueError:
        return None
    return bucket, {vb for vb in vbs if 0 <= vb < NUM_VBUCKETS}


# -- interest -------------------------------------------------------------------------------------------


def note_interest(conn: Any, bucket: str) -> None:
    """Record on ``conn`` that a listener wants ``bucket``'s notifications (EVERY_BUCKET: all) for the next
    INTEREST_S; made before it LISTENs, so a sender that sees it finds the listener there."""
    global _noted
    conn.execute(_NOTE, (bucket, INTEREST_S))
    _noted += 1


class InterestRenewal:
    """A listener's renewals of its interest, every INTEREST_S / 3, on a pooled connection (not its
    listening one, which only reads notifications); a failure is tried again at the next one."""

    def __init__(self, db: PostgresDatabase, bucket: str):
        self.db, self.bucket = db, bucket
        self.noted_at = time.monotonic()

    def due(self) -> None:
        if time.monotonic() - self.noted_at < INTEREST_S / 3:
            return
        self.noted_at = time.monotonic()
        try:
            self.db.transaction(lambda cur: note_interest(cur, self.bucket), retry=False)
        except StoreError as exc:
            log.debug("renewing the interest in %s's notifications failed: %s", self.bucket, exc)


# -- sending --------------------------------------------------------------------------------------------


class WakeSender:
    """A process's notifications to one store: ``notify`` records them and returns at once; a thread sends
    what has gathered, one statement for every bucket at a time."""

    def __init__(self, db: PostgresDatabase):
        self.db = db
        self.channel = channel_of(db)
        self._start()

    def _start(self) -> None:
        """A new sender's state (again in a forked child: the parent's thread and connection are not its
        own)."""
        self.sent = 0  # statements sent (each with one payload per bucket)
        self._pending: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection | None = None
        self._failed_at = 0.0
        self._busy = False  # a statement is being sent
        self._pid = os.getpid()
        self.skipped = 0  # buckets' notifications not sent: nobody listened for them
        # The buckets listened for (None: not known) as read at _listened_at, after _listened_noted interests
        # of this process.
        self._listened: set[str] | None = None
        self._listened_at = 0.0
        self._listened_noted = -1

    def notify(self, bucket: str, vbuckets: Iterable[int]) -> None:
        """Tell the store's listeners (after the commit of the write that logged in ``vbuckets``)."""
        if self._pid != os.getpid():
            self._start()
        with self._lock:
            pending = self._pending.get(bucket)
            if pending is None:
                self._pending[bucket] = set(vbuckets)
            else:
                pending.update(vbuckets)
            if self._thread is None:
                self._thread = threading.Thread(target=self._send_loop, name="eventing-pg-wake", daemon=True)
                self._thread.start()
        self._event.set()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until what was recorded so far is sent (tests); False when it was not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending and not self._busy:
                    return True
            time.sleep(0.001)
        return False

    def _send_loop(self) -> None:
        while True:
            if not self._event.wait(SENDER_IDLE_S):
                with self._lock:
                    if (
                        not self._event.is_set()
                    ):  # idle: the thread ends with its connection (notify starts another)
                        self._thread = None
                        self._drop_connection()
                        return
                continue
            with self._lock:
                pending, self._pending = self._pending, {}
                self._event.clear()
                self._busy = bool(pending)
            if pending:
                try:
                    self._send(pending)
                finally:
                    with self._lock:
                        self._busy = False

    def _send(self, pending: dict[str, set[int]]) -> None:
        """One statement with the payload of every bucket listened for. A connection found broken (the
        server restarted since the last notification) is replaced once at once; when no new one can be
        made, notifications are dropped for RECONNECT_MAX_S (the poll finds those writes) rather than held
        up."""
        import psycopg

        for _attempt in range(2):
            made = False
            if self._conn is None or self._conn.closed:
                if time.monotonic() - self._failed_at < RECONNECT_MAX_S:
                    return
                made = True
                try:
                    self._conn = self.db.connect()
                    self._conn.execute("SET synchronous_commit TO off")
                except (psycopg.Error, StoreError):
                    self._failed_at = time.monotonic()
                    self._drop_connection()
                    return
            try:
                listened = self._listened_for()
                payloads = [
                    encode_payload(bucket, vbs)
                    for bucket, vbs in pending.items()
                    if listened is None or bucket in listened or EVERY_BUCKET in listened
                ]
                self.skipped += len(pending) - len(payloads)
                if payloads:
                    self._conn.execute(
                        "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", (self.channel, payloads)
                    )
                    self.sent += 1
                return
            except psycopg.Error:
                self._drop_connection()
                if made:
                    self._failed_at = time.monotonic()
                    return

    def _listened_for(self) -> set[str] | None:
        """The buckets some listener wants notifications of, read again after INTEREST_REFRESH_S or once a
        listener of this process noted its interest; None (every bucket) where it cannot be read."""
        import psycopg

        if (
            self._listened is not None
            and time.monotonic() - self._listened_at < INTEREST_REFRESH_S
            and self._listened_noted == _noted
        ):
            return self._listened
        noted = _noted
        try:
            assert self._conn is not None
            rows = self._conn.execute(_LISTENED).fetchall()
        except psycopg.OperationalError:
            raise  # the connection: _send's retry
        except psycopg.Error:  # the table is missing (a store being made): everything is announced
            return None
        self._listened = {bucket for (bucket,) in rows}
        self._listened_at, self._listened_noted = time.monotonic(), noted
        return self._listened

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


_senders: dict[tuple[str, str, int], WakeSender] = {}
_senders_lock = threading.Lock()


def sender_for(db: PostgresDatabase) -> WakeSender:
    """This process's sender for the store (a forked child makes its own)."""
    key = (db.target.url, db.target.schema or "", os.getpid())
    with _senders_lock:
        sender = _senders.get(key)
        if sender is None:
            sender = _senders[key] = WakeSender(db)
        return sender


# -- listening ------------------------------------------------------------------------------------------


class PostgresWakeListener:
    """The service's end (eventing.storage.wake.WakeListener's interface): a connection of its own LISTENs
    on the store's channel, and a thread of its own collects the notifications. When the connection is
    lost it connects again, and since notifications sent meanwhile are lost, it then reports every
    vBucket of every bucket as written (the workers look once, as after their poll)."""

    def __init__(self, db: PostgresDatabase):
        self.db = db
        self.channel = channel_of(db)
        self.event = threading.Event()  # set when notifications are pending (or by `interrupt`)
        self.received = 0  # notifications
        self.reconnects = 0
        self._pending: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self._conn: Any = None
        self._thread: threading.Thread | None = None
        self._closing = False
        # Called on the listening thread with each notification as it arrives: (bucket, vBuckets, the
        # notification as eventing.storage.wake's datagram bytes, which the service forwards to workers).
        self.on_notify: Callable[[str, set[int], bytes], None] | None = None

    def start(self) -> bool:
        """Listen; False (and the poll alone) when the server cannot be reached."""
        try:
            self._conn = self._listen()
        except StoreError as exc:
            log.warning(
                "cannot listen for write notifications on %s (%s); caught-up workers are polled",
                self.db.target.shown,
                exc,
            )
            return False
        self._thread = threading.Thread(target=self._receive, name="eventing-pg-wake-listen", daemon=True)
        self._thread.start()
        return True

    def _listen(self) -> Any:
        ensure_bucket_schema(self.db)  # the interests' table
        conn = self.db.connect()
        try:
            note_interest(conn, EVERY_BUCKET)
            conn.execute(f'LISTEN "{self.channel}"')
        except BaseException:
            conn.close()
            raise
        return conn

    def _receive(self) -> None:
        import psycopg

        renewal = InterestRenewal(self.db, EVERY_BUCKET)
        while not self._closing:
            renewal.due()
            try:
                for note in self._conn.notifies(timeout=LISTEN_POLL_S):
                    self._deliver(note.payload)
                    if self._closing:
                        break
            except psycopg.Error:
                if self._closing:
                    break
                self._reconnect()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _reconnect(self) -> None:
        import psycopg

        try:
            self._conn.close()
        except psycopg.Error:
            pass
        delay = 0.05
        while not self._closing:
            try:
                self._conn = self._listen()
            except StoreError:
                time.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            self._wake_everything()
            self.reconnects += 1
            return

    def _wake_everything(self) -> None:
        """What a lost connection may have missed: every vBucket of every bucket."""
        try:
            buckets = registry.names(self.db)
        except StoreError:
            return
        every = set(range(NUM_VBUCKETS))
        for bucket in buckets:
            self._deliver(encode_payload(bucket, every))

    def _deliver(self, payload: str) -> None:
        found = decode_payload(payload)
        if found is None:
            return
        bucket, vbs = found
        on_notify = self.on_notify
        if on_notify is not None:
            try:
                on_notify(bucket, vbs, file_wake.encode(bucket, vbs))
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
        if self._thread is None:
            return
        self._closing = True
        self._thread.join(timeout=2 + LISTEN_POLL_S)
        self._thread = None


__all__ = [
    "EVERY_BUCKET",
    "InterestRenewal",
    "PostgresWakeListener",
    "WakeSender",
    "channel_of",
    "decode_payload",
    "encode_payload",
    "note_interest",
    "sender_for",
]
