"""Local buckets: a SQLite document store plus a per-vBucket mutation log with strictly increasing seqnos.

A local bucket is both the embedded source of mutations (workers stream their own vBuckets from it, as
Couchbase workers open DCP streams) and a target of handler bindings. WAL mode lets one writer and
readers in other processes work at once.

Every log entry keeps its **arrival time** (``arrival_ms``, epoch milliseconds UTC): when the bucket
assigned its seqno, one value per write transaction, never going backwards within a vBucket. It travels
with the mutation (``Mutation.arrival_ms``) so that time policies that depend on when data reached the
source (the window idle timeout) give the same answer on every replay, whenever the service happened to
run (docs/operations-run.md, 'Arrival time and the window idle timeout'). Bucket files written
before the column existed are upgraded when first opened: their entries get the time of their ``cas``
(nanoseconds since the epoch, taken at the same write), so no entry is left without an arrival time.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import os
import shutil
import sqlite3
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Self

from eventing.core.filters import Prefilter
from eventing.core.keyspaces import COLLECTION_MARK, vbucket_of_stored
from eventing.core.mutation import OP_DELETE, OP_EXPIRE, OP_UPDATE, Mutation, decode_document, encode_document
from eventing.core.names import check_bucket_name
from eventing.errors import ConfigError, EventingError, NotFoundError, StoreCorruptError, StoreError
from eventing.storage import wake, write_turns
from eventing.storage.write_plan import Item, UpdatePlan
from metadata.sqlite_io import no_space_left, retry_locked, run_transaction
from sharding import NUM_VBUCKETS, validate_key

if TYPE_CHECKING:
    from eventing.storage.protocol import FileBucket

SCHEMA = """
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS docs(
    key TEXT PRIMARY KEY, vb INTEGER NOT NULL, seqno INTEGER NOT NULL, cas INTEGER NOT NULL,
    deleted INTEGER NOT NULL, doc BLOB, expiry INTEGER NOT NULL, flags INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log(
    vb INTEGER NOT NULL, seqno INTEGER NOT NULL, key TEXT NOT NULL, op INTEGER NOT NULL,
    cas INTEGER NOT NULL, doc BLOB, origin TEXT, expiry INTEGER NOT NULL, flags INTEGER NOT NULL,
    arrival_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(vb, seqno)) WITHOUT ROWID;
-- Per vBucket: its high seqno and the arrival time of that entry (what the next entry may not go below),
-- so a write reads this small, always-cached table instead of a log page per vBucket.
CREATE TABLE IF NOT EXISTS high(vb INTEGER PRIMARY KEY, seqno INTEGER NOT NULL, arrival_ms INTEGER NOT NULL DEFAULT 0);
-- Per (function, source vBucket): the owner epoch and the last source seqno whose effects are applied.
-- Effects carry their source seqno, so a replay after a crash applies nothing twice, and a stale
-- owner (lower epoch) is rejected: this is what makes binding writes exactly-once and fenced.
CREATE TABLE IF NOT EXISTS effect_marks(
    function TEXT NOT NULL, vb INTEGER NOT NULL, epoch INTEGER NOT NULL, seqno INTEGER NOT NULL,
    PRIMARY KEY(function, vb)) WITHOUT ROWID;
"""

_LOG_COLUMNS = "vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms"


def _prefilter_sql(prefilter: Prefilter) -> tuple[str, list]:
    """A Prefilter as an SQL condition on a log row and its parameters."""
    terms, params = ["1"], []
    for prefix in prefilter.key_prefixes:
        terms.append("substr(key, 1, ?) = ?")
        params += [len(prefix), prefix]
    if prefilter.needles:
        clauses = []
        for alternatives in prefilter.needles:
            clauses.append("(" + " OR ".join("instr(doc, ?) > 0" for _ in alternatives) + ")")
            params += list(alternatives)
        terms.append(f"(op != {OP_UPDATE} OR doc IS NULL OR ({' AND '.join(clauses)}))")
    return " AND ".join(terms), params
_by_vb = itemgetter(0)
WAL_AUTOCHECKPOINT_PAGES = 10_000
# Workers writing one bucket wait for its write lock by trying every millisecond rather than in SQLite's
# busy handler, whose sleeps grow to 100 ms (see metadata.sqlite_io.begin_polling).
WRITE_LOCK_POLL_S = 0.001
HEADS_BY_VB_MAX = 32  # up to this many vBuckets in a write, their heads are read one query each
MAX_PARTITIONS = 64
_cas_lock = threading.Lock()
_last_cas = 0


def _reserve_cas(count: int) -> int:
    """Reserve ``count`` cas values at once: the caller uses the returned value + 1 .. + count. A cas only
    grows within this process (nanoseconds since the epoch, bumped on ties)."""
    global _last_cas
    with _cas_lock:
        first = max(time.time_ns(), _last_cas + 1)
        _last_cas = first + count - 1
        return first - 1


def _items(writes: Iterable[Write]) -> list[Item]:
    return [w[:5] for w in writes]  # (key, op, doc, expiry, flags)


def _plan(items: list[Item]) -> UpdatePlan | None:
    """A batch of updates planned before the write lock; None when it holds deletes (see write_plan)."""
    return UpdatePlan(items) if UpdatePlan.applies_to(items) else None


FIRST_COLLECTION_ID = 8  # as Couchbase numbers the collections a user creates


class StoredDocument(NamedTuple):
    """A live document as change_document sees and leaves it."""

    key: str
    doc: bytes
    cas: int
    expiry: int
    flags: int
    vb: int
    seqno: int


class Changed(NamedTuple):
    """One document's outcome in change_documents: its live version afterwards (None: none) and, when a
    write was logged (a delete too), that write's cas, vBucket and seqno (else 0)."""

    after: StoredDocument | None
    cas: int = 0
    vb: int = 0
    seqno: int = 0


class Write(NamedTuple):
    """One document write: an upsert (doc is msgpack bytes) or a delete (doc is None).

    A binding's advanced accessors add conditions checked when the write is applied (apply_effects):
    `expect_cas` > 0: the document must still have that cas; 0: it must not exist (insert). `delta`: a
    counter update, `{"count": current + delta}` computed from the stored document at that moment.

    A named tuple rather than a frozen dataclass: one is made per handler write, and a frozen dataclass's
    __init__ (one object.__setattr__ a field) cost ~0.6 us of a writing handler's ~12 us.
    """

    key: str
    op: int
    doc: bytes | None = None
    expiry: int = 0
    flags: int = 0
    expect_cas: int | None = None
    delta: int | None = None


@dataclass(frozen=True)
class PackedUpdates:
    """Log entries ``(after_seqno, last_seqno]`` of one vBucket (contiguous seqnos) in bulk: the seqnos of
    its deletes and expirations, then its updates' keys (UTF-8, joined by NUL bytes) and documents
    (msgpack values back to back), in seqno order."""

    vb: int
    after_seqno: int
    last_seqno: int
    other_seqnos: list[int]
    update_count: int
    keys: bytes
    docs: bytes
    # The updates' arrival times (epoch ms): their least and greatest, and each one in seqno order when
    # the reader asked for them (``read_vb_packed(exact_arrivals_over_ms=...)``), else None.
    arrival_min_ms: int = 0
    arrival_max_ms: int = 0
    arrivals: list[int] | None = None

    @property
    def count(self) -> int:
        return self.last_seqno - self.after_seqno


@dataclass
class EffectGroup:
    """Binding writes of one function caused by one source vBucket, in source seqno order."""

    vb: int
    epoch: int
    writes: list[tuple[int, Write]] = field(default_factory=list)  # (source seqno, write)
    conditional: bool = False  # holds writes with a cas condition or a counter delta


@dataclass
class EffectResult:
    applied: int = 0
    duplicates: int = 0  # already applied by an earlier attempt (replay after a crash)
    fenced_vbs: set[int] = field(default_factory=set)  # rejected: a newer owner holds the vBucket
    fenced_writes: int = 0
    # Sources (vb, seqno) whose cas condition failed when applied: none of their writes to this bucket
    # were applied (the caller dead-letters them as `cas_mismatch`).
    conflicts: list[tuple[int, int]] = field(default_factory=list)


def bucket_path(data_dir: str | os.PathLike[str], name: str) -> Path:
    return Path(data_dir) / "buckets" / f"{name}.sqlite3"


class LocalBucket:
    """A bucket stored in one SQLite file under `<data_dir>/buckets/`."""

    def __init__(self, path: Path, name: str, db: sqlite3.Connection):
        self.path = path
        self.name = name
        self._db = db
        self._closed = False
        _connections_opened(self)  # before any read: a failing read still closes
        self.uuid = self._info("uuid")
        # Cached high seqnos and the (data_version, own commits) they were read at: SQLite's data_version
        # counts other connections' commits, _commits this connection's.
        self._highs: list[int] = []
        self._highs_read_at: tuple[int, int] = (-1, -1)
        self._commits = 0
        # vBuckets the current transaction logged writes in: once it commits, a running service is told
        # (eventing.storage.wake), so the workers owning them need not wait for their next poll.
        self._written: set[int] = set()
        self._wake_path = wake.socket_path(wake.data_dir_of_bucket_file(path))

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    def create(cls, data_dir: str | os.PathLike[str], name: str, *, exist_ok: bool = False) -> LocalBucket:
        """Create a one-file bucket (any bucket, partitioned too: eventing.storage.factory.create_bucket)."""
        create_files(data_dir, name, exist_ok=exist_ok)
        return cls.open(data_dir, name)

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], name: str) -> LocalBucket:
        """Open a one-file bucket (any bucket, partitioned too: eventing.storage.factory.open_bucket)."""
        main = cls.open_main(data_dir, name)
        partitions = main.partitions()
        if partitions != 1:
            main.close()
            raise ConfigError(
                f"bucket '{name}' has {partitions} partitions; open it with eventing.storage.factory.open_bucket"
            )
        return main

    @classmethod
    def open_main(cls, data_dir: str | os.PathLike[str], name: str) -> LocalBucket:
        """A bucket's main file (partition 0 of a partitioned bucket; ``partitions`` says how many)."""
        check_bucket_name(name)
        path = bucket_path(data_dir, name)
        if not path.exists():
            raise NotFoundError(
                f"unknown bucket '{name}' (no {path}); create it with `eventing bucket create {name}`"
            )
        return cls._open_file(path, name)

    def partitions(self) -> int:
        """How many files the bucket of this main file has (1: this one)."""
        return int(self._info_or("partitions", "1"))

    @classmethod
    def open_partition(cls, data_dir: str | os.PathLike[str], name: str, part: int, partitions: int) -> LocalBucket:
        """Partition ``part`` (>= 1) of a bucket of ``partitions`` files."""
        part_path = partition_path(data_dir, name, part)
        if not part_path.exists():
            raise StoreError(
                f"bucket '{name}' has {partitions} partitions but {part_path} is missing; restore it "
                "from a backup or recreate the bucket"
            )
        return cls._open_file(part_path, name)

    @classmethod
    def _open_file(cls, path: Path, name: str) -> LocalBucket:
        problem = header_problem(path)
        if problem is not None:
            raise damaged_bucket_error(path, problem)

        def connect() -> sqlite3.Connection:
            db = _connect(path)
            try:
                _upgrade(db, path)
            except BaseException:
                db.close()
                raise
            return db

        # Opening writes too (the WAL and shared-memory files): on a full disk it waits for space as a
        # write does, then fails with the same line.
        return cls(path, name, _retry_locked(path, connect))

    def verify_integrity(self) -> None:
        """Fail with one line naming the file and the way out when the bucket file is damaged (SQLite's
        quick check: every page of the file is read, ~50 ms for 200,000 mutations)."""
        problem = header_problem(self.path)
        if problem is None:
            try:
                result = self._db.execute("PRAGMA quick_check").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                raise bucket_file_error(self.path, exc) from None
            problem = None if result == "ok" else f"failed its integrity check: {result}"
        if problem is not None:
            raise damaged_bucket_error(self.path, problem)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _connections_closed(self)
        self._db.close()

    def checkpoint_wal(self) -> None:
        """Move the WAL's pages into the file and empty the WAL (before the file is deleted or copied)."""
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def copy_to(self, data_dir: str | os.PathLike[str]) -> Path:
        """Copy this bucket, consistently even while it is written (SQLite's online backup), into another
        data directory under the same name; returns the new file's path."""
        return self._copy_file_to(bucket_path(data_dir, self.name))

    def _copy_file_to(self, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        copy = sqlite3.connect(target)
        try:
            self._db.backup(copy)
        finally:
            copy.close()
        return target

    def _info(self, key: str) -> str:
        row = self._db.execute("SELECT value FROM info WHERE key=?", (key,)).fetchone()
        if row is None:
            raise StoreError(f"bucket file {self.path} has no {key}; it is not a bucket")
        return row[0]

    def _info_or(self, key: str, default: str) -> str:
        row = self._db.execute("SELECT value FROM info WHERE key=?", (key,)).fetchone()
        return default if row is None else row[0]

    # -- writes -------------------------------------------------------------------------------------

    def write(
        self, writes: Iterable[Write], *, origin: str | None = None, arrival_ms: int | None = None
    ) -> list[tuple[int, int] | None]:
        """Apply writes in one transaction; each gets the next seqno of its vBucket, a fresh cas and the
        transaction's arrival time (``arrival_ms``, default now; tests and imports may give their own).

        Returns (vb, seqno) per write, or None for a delete of a missing document (nothing logged).
        """
        items = _items(writes)  # a retried transaction (locked, disk full) must see every write again
        plan = _plan(items)
        return _retry_locked(self.path, lambda: self._tx(lambda: self._log(items, origin, arrival_ms, plan)))

    def _tx(self, body):
        written = self._written
        written.clear()  # a retried transaction logs again
        with write_turns.turn(self.path):
            try:
                result = run_transaction(self._db, self.path, body, poll_lock_s=WRITE_LOCK_POLL_S)
            finally:
                self._commits += 1
                write_turns.keep_wal_short(self._db, self.path)
        if written:
            wake.notify(self._wake_path, self.name, written)
            written.clear()
        return result

    def load_rows(self, rows: Sequence[tuple[str, int, bytes | None, int]], *, arrival_ms: int | None = None) -> int:
        """``write`` for imports (``bucket load``): rows are ``(key, op, doc, expiry)`` with keys already
        validated, applied in one transaction with the same outcome as ``write`` of the same writes.
        Returns how many rows were logged."""
        items = [(key, op, doc, expiry, 0) for key, op, doc, expiry in rows]
        plan = _plan(items)
        logged = _retry_locked(self.path, lambda: self._tx(lambda: self._log(items, None, arrival_ms, plan)))
        return sum(1 for r in logged if r is not None)

    def _log(
        self, items: list[Item], origin: str | None, arrival_ms: int | None, plan: UpdatePlan | None = None
    ) -> list[tuple[int, int] | None]:
        """The one write path: items are ``(key, op, doc, expiry, flags)``. Each logged item gets the next
        seqno of its vBucket, a fresh cas and the transaction's arrival time; a delete of a document that
        does not exist (at that point of the batch) is skipped.

        Built for batches: the high seqnos, last arrival times and the existence of deleted keys are read
        with a few queries rather than one per vBucket or key, log rows go in in (vb, seqno) order and only
        each key's last version goes into ``docs``, in key order, so SQLite walks each B-tree once per
        transaction instead of jumping between random pages (random order costs ~3x once the docs table
        outgrows SQLite's page cache)."""
        arrival = int(time.time() * 1000) if arrival_ms is None else int(arrival_ms)
        if plan is not None:  # updates only, prepared before the lock (see eventing.storage.write_plan)
            highs, arrivals = self._heads({vb for vb, _ in plan.runs}, arrival)
            log_rows, docs_rows, placed = plan.rows(highs, arrivals, _reserve_cas(plan.count), origin)
            self._insert(log_rows, docs_rows, highs, arrivals)
            return placed  # type: ignore[return-value]
        vbs = [  # vbucket_of (a collection's stored key: of its own key, eventing.core.keyspaces)
            vbucket_of_stored(k) if (k := item[0]).startswith(COLLECTION_MARK)
            else ((zlib.crc32(k.encode()) >> 16) & 0x7FFF) % NUM_VBUCKETS
            for item in items
        ]
        highs, arrivals = self._heads(set(vbs), arrival)
        deleting = {item[0] for item in items if item[1] != OP_UPDATE}
        live = self._live(deleting)
        cas = _reserve_cas(len(items))
        log_rows = []
        docs: dict[str, tuple] = {}
        out: list[tuple[int, int] | None] = []
        for (key, op, doc, expiry, flags), vb in zip(items, vbs, strict=True):
            if op != OP_UPDATE:
                if not live.get(key, False):
                    out.append(None)
                    continue
                live[key] = False
            elif key in deleting:
                live[key] = True
            cas += 1
            seqno = highs[vb] = highs[vb] + 1
            log_rows.append((vb, seqno, key, op, cas, doc, origin, expiry, flags, arrivals[vb]))
            deleted = 0 if op == OP_UPDATE else 1
            docs[key] = (key, vb, seqno, cas, deleted, None if deleted else doc, expiry, flags)
            out.append((vb, seqno))
        log_rows.sort(key=_by_vb)  # stable: seqnos stay in order within a vBucket
        self._insert(log_rows, [docs[k] for k in sorted(docs)], highs, arrivals)
        return out

    def _insert(self, log_rows: list[tuple], docs_rows: list[tuple], highs: dict[int, int], arrivals: dict[int, int]) -> None:
        """Write log rows (in (vb, seqno) order), docs rows (in key order) and the moved high seqnos."""
        db = self._db
        db.executemany(f"INSERT INTO log({_LOG_COLUMNS}) VALUES(?,?,?,?,?,?,?,?,?,?)", log_rows)
        db.executemany("INSERT OR REPLACE INTO docs VALUES(?,?,?,?,?,?,?,?)", docs_rows)
        moved = sorted({row[0] for row in log_rows})
        self._written.update(moved)
        db.executemany("UPDATE high SET seqno=?, arrival_ms=? WHERE vb=?", [(highs[vb], arrivals[vb], vb) for vb in moved])

    def _heads(self, vbs: set[int], arrival: int) -> tuple[dict[int, int], dict[int, int]]:
        """High seqno and the arrival time new entries get (never below the vBucket's last one: readers find
        the earliest unread arrival first) of each vBucket in ``vbs``."""
        db = self._db
        if len(vbs) > HEADS_BY_VB_MAX:  # one read of the 1,024-row table beats hundreds of lookups from Python
            rows = [r for r in db.execute("SELECT vb, seqno, arrival_ms FROM high") if r[0] in vbs]
        else:
            rows = [(vb, *db.execute("SELECT seqno, arrival_ms FROM high WHERE vb=?", (vb,)).fetchone()) for vb in vbs]
        return {vb: seqno for vb, seqno, _ in rows}, {vb: max(arrival, last) for vb, _, last in rows}

    def _live(self, keys: set[str]) -> dict[str, bool]:
        """Whether each key has a live (not deleted) document; keys without a row are left out."""
        live: dict[str, bool] = {}
        for part in chunked(keys, 500):
            marks = ",".join("?" * len(part))
            for key, deleted in self._db.execute(f"SELECT key, deleted FROM docs WHERE key IN ({marks})", part):
                live[key] = not deleted
        return live

    def upsert(
        self, key: str, doc: dict, *, origin: str | None = None, expiry: int = 0, arrival_ms: int | None = None
    ) -> tuple[int, int]:
        validate_key(key)
        result = self.write(
            [Write(key, OP_UPDATE, encode_document(doc), expiry)], origin=origin, arrival_ms=arrival_ms
        )[0]
        assert result is not None
        return result

    def delete(self, key: str, *, origin: str | None = None) -> tuple[int, int]:
        validate_key(key)
        result = self.write([Write(key, OP_DELETE)], origin=origin)[0]
        if result is None:
            raise NotFoundError(f"document '{key}' does not exist in bucket '{self.name}'")
        return result

    def change_document(
        self, key: str, change: Callable[[StoredDocument | None], Write | None], *, origin: str | None = None
    ) -> StoredDocument | None:
        """Read ``key``'s live document and write what ``change`` makes of it, in one transaction: the
        check-and-set behind the Data API (insert, replace or delete under a cas, append, counters, touch).
        ``change`` gets the current version (None: no live document) and returns the write to make (None:
        nothing) or raises; it may run more than once (a locked file retries the transaction), so it must
        only compute. Returns the document's version afterwards (None when there is none)."""

        def body() -> StoredDocument | None:
            row = self._db.execute(
                "SELECT doc, cas, expiry, flags, vb, seqno FROM docs WHERE key=? AND deleted=0", (key,)
            ).fetchone()
            current = None if row is None else StoredDocument(key, *row)
            write = change(current)
            if write is None:
                return current
            placed = self._log(_items([write]), origin, None)[0]
            if placed is None or write.op != OP_UPDATE:
                return None
            cas = self._db.execute("SELECT cas FROM docs WHERE key=?", (key,)).fetchone()[0]
            return StoredDocument(key, write.doc or b"", cas, write.expiry, write.flags, *placed)

        return _retry_locked(self.path, lambda: self._tx(body))

    def change_documents(
        self, changes: Sequence[tuple[str, Callable[[StoredDocument | None], Write | None]]], *, origin: str | None = None
    ) -> list[Changed | Exception]:
        """``change_document`` for many documents in one transaction (a group commit: one commit for the
        concurrent writes of the Data API). Each change sees the document as the earlier ones in the list
        left it; a change that raises writes nothing and its exception takes its place in the answer,
        the others go on. Any other failure (SQLite, a write refused by ``_log``) fails them all."""

        def body() -> list[Changed | Exception]:
            db = self._db
            out: list[Changed | Exception] = []
            for key, change in changes:
                row = db.execute(
                    "SELECT doc, cas, expiry, flags, vb, seqno FROM docs WHERE key=? AND deleted=0", (key,)
                ).fetchone()
                current = None if row is None else StoredDocument(key, *row)
                try:
                    write = change(current)
                except Exception as exc:  # this document's condition failed: the others go on
                    out.append(exc)
                    continue
                if write is None:
                    out.append(Changed(current))
                    continue
                placed = self._log(_items([write]), origin, None)[0]
                if placed is None:  # a delete of nothing
                    out.append(Changed(None))
                    continue
                cas = db.execute("SELECT cas FROM docs WHERE key=?", (key,)).fetchone()[0]
                after = StoredDocument(key, write.doc or b"", cas, write.expiry, write.flags, *placed)
                out.append(Changed(after if write.op == OP_UPDATE else None, cas, *placed))
            return out

        return _retry_locked(self.path, lambda: self._tx(body))

    # -- scopes and collections (eventing.core.keyspaces) -------------------------------------------

    def collections(self) -> dict[tuple[str, str], int]:
        """The bucket's collections besides `_default._default` (id 0): (scope, collection) -> id. Ids are
        never reused, so a log entry of a dropped collection never reads as a later one's."""
        registry = json.loads(self._info_or("collections", "{}"))
        return {(scope, name): cid for scope, name, cid in registry.get("collections", [])}

    def create_collection(self, scope: str, collection: str) -> int:
        """Add a collection (its scope comes with it); returns its id. ConfigError if it exists."""

        def body() -> int:
            registry = json.loads(self._info_or("collections", "{}"))
            known = registry.setdefault("collections", [])
            if any(s == scope and c == collection for s, c, _ in known):
                raise ConfigError(f"collection {self.name}.{scope}.{collection} exists already")
            cid = int(registry.get("next_id", FIRST_COLLECTION_ID))
            known.append([scope, collection, cid])
            registry["next_id"] = cid + 1
            self._db.execute("INSERT OR REPLACE INTO info VALUES('collections', ?)", (json.dumps(registry),))
            return cid

        return _retry_locked(self.path, lambda: self._tx(body))

    def drop_collection(self, scope: str, collection: str) -> int:
        """Remove a collection and its documents (their log entries stay, readable as history of a collection
        no function reads any more); returns how many live documents went. NotFoundError if unknown."""

        def body() -> int:
            registry = json.loads(self._info_or("collections", "{}"))
            known = registry.get("collections", [])
            match = [entry for entry in known if entry[0] == scope and entry[1] == collection]
            if not match:
                raise NotFoundError(f"collection {self.name}.{scope}.{collection} does not exist; see "
                                    f"`eventing collection list {self.name}`")
            registry["collections"] = [entry for entry in known if entry not in match]
            self._db.execute("INSERT OR REPLACE INTO info VALUES('collections', ?)", (json.dumps(registry),))
            return self._drop_documents_of(match[0][2])

        return _retry_locked(self.path, lambda: self._tx(body))

    def drop_collection_documents(self, cid: int) -> int:
        """The documents of collection `cid` go (a partition's share of drop_collection)."""
        return _retry_locked(self.path, lambda: self._tx(lambda: self._drop_documents_of(cid)))

    def _drop_documents_of(self, cid: int) -> int:
        prefix = f"{COLLECTION_MARK}{cid:x}{COLLECTION_MARK}"
        end = prefix[:-1] + chr(ord(COLLECTION_MARK) + 1)
        live = self._db.execute(
            "SELECT COUNT(*) FROM docs WHERE key >= ? AND key < ? AND deleted=0", (prefix, end)
        ).fetchone()[0]
        self._db.execute("DELETE FROM docs WHERE key >= ? AND key < ?", (prefix, end))
        return int(live)

    def expire_due(self, now_s: float | None = None) -> int:
        """Turn documents whose expiry has passed into expiration mutations (on_delete with expired)."""
        now = int(time.time() if now_s is None else now_s)
        keys = [
            r[0]
            for r in self._db.execute(
                "SELECT key FROM docs WHERE deleted=0 AND expiry>0 AND expiry<=?", (now,)
            ).fetchall()
        ]
        self.write([Write(k, OP_EXPIRE) for k in keys])
        return len(keys)

    # -- reads --------------------------------------------------------------------------------------

    def get(self, key: str) -> dict | None:
        raw = self.get_raw(key)
        return None if raw is None else decode_document(raw)

    def get_raw(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT doc FROM docs WHERE key=? AND deleted=0", (key,)).fetchone()
        return None if row is None else row[0]

    def get_doc(self, key: str) -> tuple[bytes, int, int] | None:
        """(document bytes, cas, expiry) of a live document, else None."""
        row = self._db.execute("SELECT doc, cas, expiry FROM docs WHERE key=? AND deleted=0", (key,)).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def ensure_key_index(self) -> None:
        """Index the log by key, for previous_doc (functions with previous_version). Each logged write then
        also updates this index; see docs/handler-api.md for the measured cost."""
        _retry_locked(self.path, lambda: self._db.execute("CREATE INDEX IF NOT EXISTS log_key ON log(key, seqno)"))

    def previous_doc(self, key: str, before_seqno: int) -> bytes | None:
        """The document bytes of `key`'s newest log entry below `before_seqno` (None: none, or a delete)."""
        row = self._db.execute(
            "SELECT doc FROM log WHERE key=? AND seqno<? ORDER BY seqno DESC LIMIT 1", (key, before_seqno)
        ).fetchone()
        return None if row is None else row[0]

    def get_meta(self, key: str) -> dict | None:
        row = self._db.execute(
            "SELECT vb, seqno, cas, expiry, flags FROM docs WHERE key=? AND deleted=0", (key,)
        ).fetchone()
        return None if row is None else dict(zip(("vb", "seqno", "cas", "expiry", "flags"), row, strict=True))

    def high_seqnos(self, *, prefetched: bool = False) -> list[int]:
        """High seqno of every vBucket, index = vBucket. Workers ask at every step; the table is read
        again only when a commit happened since (SQLite's data_version, a few microseconds to check).
        ``prefetched`` changes nothing here: nothing is read ahead (see the Bucket protocol)."""
        # Taken before reading: a commit that lands during the read changes it, so the next call reads again.
        read_at = (self._db.execute("PRAGMA data_version").fetchone()[0], self._commits)
        if read_at != self._highs_read_at:
            highs = [0] * NUM_VBUCKETS
            for vb, seqno in self._db.execute("SELECT vb, seqno FROM high"):
                highs[vb] = seqno
            self._highs, self._highs_read_at = highs, read_at
        return list(self._highs)

    # Reading ahead is for buckets behind the data service (RemoteBucket): a read of the file costs no
    # round trip, so there is nothing to read ahead.
    reads_ahead = False

    def prefetch(self, runs: list[tuple[int, int, int]]) -> None:
        pass

    def has_ahead(self, vb: int) -> bool:
        return False

    def forget_prefetched(self, positions: dict[int, int]) -> None:
        pass

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]:
        """Mutations of one vBucket with seqno > after_seqno, in seqno order, at most `limit`."""
        return [Mutation(*r) for r in self.read_vb_rows(vb, after_seqno, limit)]

    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]:
        """read_vb's rows as plain tuples in Mutation's field order (what the data service ships)."""
        return self._db.execute(
            f"SELECT {_LOG_COLUMNS} FROM log WHERE vb=? AND seqno>? ORDER BY seqno LIMIT ?",
            (vb, after_seqno, limit),
        ).fetchall()

    def read_vb_matching(
        self, vb: int, after_seqno: int, limit: int, upto: int, prefilter: Prefilter, origin: str
    ) -> tuple[list[tuple], int, int]:
        """The next ``limit`` log entries of one vBucket after ``after_seqno`` (none past ``upto``) less the
        ones ``prefilter`` rules out (eventing.core.filters.Prefilter, checked by SQLite on the key and the
        document's bytes: those rows never become Python objects). Entries written by ``origin`` and
        entries of named collections are always returned. Returns (rows in seqno order, how many entries
        the range held, its last seqno)."""
        scanned, last = self._db.execute(
            "SELECT count(*), max(seqno) FROM (SELECT seqno FROM log WHERE vb = ?1 AND seqno > ?2 AND seqno <= ?3 "
            "ORDER BY seqno LIMIT ?4)",
            (vb, after_seqno, upto, limit),
        ).fetchone()
        if not scanned:
            return [], 0, after_seqno
        sql, params = _prefilter_sql(prefilter)
        rows = self._db.execute(
            f"SELECT {_LOG_COLUMNS} FROM log WHERE vb = ? AND seqno > ? AND seqno <= ? "
            f"AND (origin = ? OR substr(key, 1, 1) = ? OR ({sql})) ORDER BY seqno",
            (vb, after_seqno, last, origin, COLLECTION_MARK, *params),
        ).fetchall()
        return rows, scanned, last

    def read_vb_columns(self, vb: int, after_seqno: int, limit: int) -> tuple | None:
        """read_vb_rows's answer column by column, concatenated by SQLite (no Python object per entry: about
        half the cost of fetching the rows), for the data service to ship: ``(count, last_seqno, ops, keys,
        docs, doc_lengths, cas, arrivals)`` where ``ops`` lists the entries that are not updates as
        "seqno:op" (None when all are), keys are joined by NUL bytes, documents are back to back with their
        lengths (-1: no document) and the numbers are comma-separated text. None when the entries are not
        that plain case (a gap in the seqnos, an origin, an expiry or flags): read the rows then."""
        try:
            row = self._db.execute(
                "SELECT count(*), max(seqno), max(origin IS NOT NULL OR expiry != 0 OR flags != 0), "
                "group_concat(CASE WHEN op != 0 THEN seqno || ':' || op END), "
                "CAST(group_concat(key, char(0)) AS BLOB), CAST(group_concat(doc, '') AS BLOB), "
                "group_concat(ifnull(length(doc), -1)), group_concat(cas), group_concat(arrival_ms) "
                # One range scan of the primary key feeds every aggregate in (vb, seqno) order, as in
                # read_vb_packed.
                "FROM log WHERE vb = ?1 AND seqno > ?2 AND seqno <= ?2 + ?3",
                (vb, after_seqno, limit),
            ).fetchone()
        except sqlite3.DataError:  # over SQLite's length limit (huge documents)
            return None
        count, last, odd, ops, keys, docs, lengths, cas, arrivals = row
        if not count or odd or last - after_seqno != count:
            return None
        return count, last, ops, keys, docs or b"", lengths, cas, arrivals

    def read_vb_packed(
        self, vb: int, after_seqno: int, limit: int, origin: str, *, exact_arrivals_over_ms: int | None = None
    ) -> PackedUpdates | None:
        """The next ``limit`` log entries of one vBucket after ``after_seqno`` for a caller that wants the
        updates' documents and keys in bulk: SQLite concatenates them, so no Python object is made per
        entry (about half the cost of fetching the rows). None when the entries are not the plain case
        the caller can take whole: no entries, a gap in the seqnos, an entry written by ``origin``, an
        update without a document or a delete with one; read them with read_vb then.

        The updates' arrival times come as their least and greatest; each one is read as well (a second
        query, about as costly as the first) only when they spread over ``exact_arrivals_over_ms`` or more."""
        try:
            row = self._db.execute(
                "SELECT count(*), max(seqno), count(doc), max(origin = ?4), "
                "group_concat(CASE WHEN op != 0 THEN seqno END), "
                "CAST(group_concat(CASE WHEN op = 0 THEN key END, char(0)) AS BLOB), "
                "CAST(group_concat(doc, '') AS BLOB), "
                "min(CASE WHEN op = 0 THEN arrival_ms END), max(CASE WHEN op = 0 THEN arrival_ms END) "
                # A range scan of the primary key feeds the aggregates in (vb, seqno) order. (Before SQLite
                # 3.44 group_concat takes no ORDER BY; a sorted subquery would cost a third more.)
                "FROM log WHERE vb = ?1 AND seqno > ?2 AND seqno <= ?3",
                (vb, after_seqno, after_seqno + limit, origin),
            ).fetchone()
        except sqlite3.DataError:  # the concatenation is over SQLite's length limit (huge documents)
            return None
        count, last, docs_count, own, others, keys, docs, first_arrival, last_arrival = row
        if not count or last - after_seqno != count or own:
            return None
        other_seqnos = [int(s) for s in others.split(",")] if others else []
        if docs_count != count - len(other_seqnos):
            return None
        arrivals = None
        if docs_count and exact_arrivals_over_ms is not None and last_arrival - first_arrival >= exact_arrivals_over_ms:
            arrivals = [
                r[0]
                for r in self._db.execute(
                    "SELECT arrival_ms FROM log WHERE vb=? AND seqno>? AND seqno<=? AND op=? ORDER BY seqno",
                    (vb, after_seqno, last, OP_UPDATE),
                )
            ]
        return PackedUpdates(
            vb, after_seqno, last, other_seqnos, docs_count, keys or b"", docs or b"",
            first_arrival or 0, last_arrival or 0, arrivals,
        )

    def first_arrival_after(self, positions: dict[int, int]) -> int | None:
        """The earliest arrival time (epoch ms) of the log entries after ``positions[vb]`` in each given
        vBucket, or None when there are none: what a reader at those positions has still to read."""
        earliest: int | None = None
        for vb, after in positions.items():
            # Arrival times never go backwards within a vBucket: the first entry has the earliest.
            row = self._db.execute(
                "SELECT arrival_ms FROM log WHERE vb=? AND seqno>? ORDER BY seqno LIMIT 1", (vb, after)
            ).fetchone()
            if row is not None and (earliest is None or row[0] < earliest):
                earliest = row[0]
        return earliest

    def max_doc_bytes(self, vb: int, after_seqno: int, last_seqno: int) -> int:
        """Size of the largest document logged in one vBucket in ``(after_seqno, last_seqno]``."""
        row = self._db.execute(
            "SELECT max(length(doc)) FROM log WHERE vb=? AND seqno>? AND seqno<=?", (vb, after_seqno, last_seqno)
        ).fetchone()
        return row[0] or 0

    def scan_log(self, batch: int = 10_000) -> Iterable[list[Mutation]]:
        """The whole log in (vb, seqno) order, in batches."""
        last = (-1, 0)
        while True:
            rows = self._db.execute(
                f"SELECT {_LOG_COLUMNS} FROM log WHERE (vb, seqno) > (?, ?) ORDER BY vb, seqno LIMIT ?",
                (*last, batch),
            ).fetchall()
            if not rows:
                return
            yield [Mutation(*r) for r in rows]
            last = (rows[-1][0], rows[-1][1])

    def log_index(self, batch: int = 50_000) -> Iterable[list[tuple[int, int, str, str | None]]]:
        """(vb, seqno, key, origin) of the whole log in (vb, seqno) order, in batches, without documents."""
        last = (-1, 0)
        while True:
            rows = self._db.execute(
                "SELECT vb, seqno, key, origin FROM log WHERE (vb, seqno) > (?, ?) ORDER BY vb, seqno LIMIT ?",
                (*last, batch),
            ).fetchall()
            if not rows:
                return
            yield rows
            last = (rows[-1][0], rows[-1][1])

    def logged_writes(self, prefix: str) -> dict[str, int]:
        """How many upserts of each key starting with `prefix` the log holds (every version is kept)."""
        rows = self._db.execute(
            "SELECT key, COUNT(*) FROM log WHERE op=? AND substr(key, 1, ?)=? GROUP BY key",
            (OP_UPDATE, len(prefix), prefix),
        )
        return dict(rows.fetchall())

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """Keys of live documents in key order, those starting with `prefix`, at most `limit`."""
        return [key for key, *_ in self._live_docs(prefix, limit, with_docs=False)]

    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]:
        """(key, document, meta) of live documents in key order; meta has vb, seqno, cas, expiry, flags."""
        for key, vb, seqno, cas, expiry, flags, raw in self._live_docs(prefix, limit, with_docs=True):
            meta = {"vb": vb, "seqno": seqno, "cas": cas, "expiry": expiry, "flags": flags}
            yield key, decode_document(raw), meta

    def _live_docs(self, prefix: str, limit: int | None, *, with_docs: bool, batch: int = 1000) -> Iterator[tuple]:
        """Live documents in key order, read in batches (keyset paging, so a large bucket streams)."""
        columns = "key, vb, seqno, cas, expiry, flags" + (", doc" if with_docs else "")
        after: str | None = None
        left = limit
        while left is None or left > 0:
            take = batch if left is None else min(batch, left)
            clauses = ["deleted=0"]
            args: list[object] = []
            if prefix:  # a range scan of the primary key, then the exact prefix test
                clauses.append("key >= ? AND substr(key, 1, ?) = ?")
                args += [prefix, len(prefix), prefix]
            if after is not None:
                clauses.append("key > ?")
                args.append(after)
            rows = self._db.execute(
                f"SELECT {columns} FROM docs WHERE {' AND '.join(clauses)} ORDER BY key LIMIT ?", (*args, take)
            ).fetchall()
            yield from rows
            if len(rows) < take:
                return
            after = rows[-1][0]
            if left is not None:
                left -= len(rows)

    def count(self, prefix: str = "") -> int:
        """Live documents (deleted and expired-then-deleted ones are tombstones, not counted), those whose
        key starts with `prefix`."""
        if prefix:
            return self._db.execute(
                "SELECT COUNT(*) FROM docs WHERE deleted=0 AND key >= ? AND substr(key, 1, ?) = ?",
                (prefix, len(prefix), prefix),
            ).fetchone()[0]
        return self._db.execute("SELECT COUNT(*) FROM docs WHERE deleted=0").fetchone()[0]

    def flush(self, *, new_uuid: str | None = None) -> dict:
        """Empty the bucket: documents, mutation log, high seqnos and effect marks go, in one transaction,
        and the bucket gets a new identity (uuid), so checkpoints taken on its old contents never resume
        on the new ones (a worker refuses a checkpoint whose bucket uuid differs). Returns what went."""
        before = self.stats()
        new_uuid = new_uuid or uuid.uuid4().hex

        def body() -> None:
            for table in ("docs", "log", "effect_marks"):
                self._db.execute(f"DELETE FROM {table}")
            self._db.execute("UPDATE high SET seqno=0, arrival_ms=0")
            self._db.execute("UPDATE info SET value=? WHERE key='uuid'", (new_uuid,))

        _retry_locked(self.path, lambda: self._tx(body))
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.uuid = new_uuid
        return {
            "bucket": self.name, "documents": before["documents"], "tombstones": before["tombstones"],
            "mutations": before["mutations"], "old_uuid": before["uuid"], "uuid": new_uuid,
        }

    def stats(self) -> dict:
        docs, deleted = self._db.execute(
            "SELECT COALESCE(SUM(deleted=0),0), COALESCE(SUM(deleted=1),0) FROM docs"
        ).fetchone()
        mutations = self._db.execute("SELECT COALESCE(SUM(seqno),0) FROM high").fetchone()[0]
        return {
            "name": self.name,
            "uuid": self.uuid,
            "path": str(self.path),
            "documents": docs,
            "tombstones": deleted,
            "mutations": mutations,
            "vbuckets_with_data": self._db.execute("SELECT COUNT(*) FROM high WHERE seqno>0").fetchone()[0],
            "partitions": 1,
        }

    # -- effects from handler bindings ---------------------------------------------------------------

    def fence(self, function: str, epochs: dict[int, int]) -> None:
        """Raise the epoch mark of (function, vb) so that writes of any older owner are rejected."""

        def body() -> None:
            self._db.executemany(
                "INSERT INTO effect_marks VALUES(?,?,?,0) ON CONFLICT(function, vb) DO UPDATE SET "
                "epoch=MAX(epoch, excluded.epoch)",
                [(function, vb, e) for vb, e in epochs.items()],
            )

        _retry_locked(self.path, lambda: self._tx(body))

    def apply_effects(
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None, marks: bool = True
    ) -> EffectResult:
        """Apply binding writes exactly once: skip those at or below the (function, vb) mark, reject stale epochs.

        ``marks=False`` (a function with ``delivery: at_least_once``) applies every write as it comes, without
        reading or moving the marks: cheaper, but a replay applies its writes again and a zombie's are not
        rejected."""

        if not marks:
            items = _items(w for g in groups for _, w in g.writes)
            plan = _plan(items)

            def unmarked() -> EffectResult:
                self._log(items, origin or function, None, plan)
                return EffectResult(applied=len(items))

            return _retry_locked(self.path, lambda: self._tx(unmarked))

        # Prepared before the lock for the usual case, where no group is fenced or holds a write already
        # applied: the writes as one planned batch, and each group's (vb, epoch, lowest and highest source
        # seqno). The transaction checks that case against the marks, else takes the general path below.
        conditional = any(g.conditional for g in groups)
        if not conditional:
            ready = _items(w for g in groups for _, w in g.writes)
            ready_plan = _plan(ready)
            spans = [
                (g.vb, g.epoch, min(s for s, _ in g.writes) if g.writes else None, max(s for s, _ in g.writes) if g.writes else 0)
                for g in groups
            ]

        def body() -> EffectResult:
            if len(groups) > HEADS_BY_VB_MAX:  # one query for the function's marks (<= 2,048 rows)
                found = {vb: (e, s) for vb, e, s in self._db.execute(
                    "SELECT vb, epoch, seqno FROM effect_marks WHERE function=?", (function,))}
            else:
                found = {g.vb: row for g in groups if (row := self._db.execute(
                    "SELECT epoch, seqno FROM effect_marks WHERE function=? AND vb=?", (function, g.vb)
                ).fetchone())}
            if not conditional:
                marks = []
                for vb, epoch, lowest, highest in spans:
                    mark_epoch, mark_seqno = found.get(vb, (0, 0))
                    if mark_epoch > epoch or (lowest is not None and lowest <= mark_seqno):
                        break
                    marks.append((function, vb, epoch, max(mark_seqno, highest)))
                else:
                    self._log(ready, origin or function, None, ready_plan)
                    self._set_marks(marks)
                    return EffectResult(applied=len(ready))
            return general(found)

        def general(found: dict[int, tuple[int, int]]) -> EffectResult:
            result = EffectResult()
            writes: list[Write] = []
            marks = []
            pending: list[tuple[int, int, Write]] = []
            for g in groups:
                mark_epoch, mark_seqno = found.get(g.vb, (0, 0))
                if mark_epoch > g.epoch:
                    result.fenced_vbs.add(g.vb)
                    result.fenced_writes += len(g.writes)
                    continue
                top = mark_seqno
                for src_seqno, w in g.writes:
                    if src_seqno <= mark_seqno:
                        result.duplicates += 1
                        continue
                    if conditional:
                        pending.append((g.vb, src_seqno, w))
                    else:
                        writes.append(w)
                    top = max(top, src_seqno)
                marks.append((function, g.vb, g.epoch, top))
            if conditional:  # every write goes through the check, in order, so chains of writes are followed
                writes, result.conflicts = self._resolve(pending)
            # The writes carry the function as their origin (recursion guard); `function` also names
            # the marks, which a replay keeps apart from the live ones (origin stays the function).
            items = _items(writes)
            self._log(items, origin or function, None, _plan(items))
            result.applied = len(writes)
            self._set_marks(marks)
            return result

        return _retry_locked(self.path, lambda: self._tx(body))

    def _set_marks(self, marks: list[tuple[str, int, int, int]]) -> None:
        self._db.executemany(
            "INSERT INTO effect_marks VALUES(?,?,?,?) ON CONFLICT(function, vb) DO UPDATE SET "
            "epoch=excluded.epoch, seqno=MAX(seqno, excluded.seqno)",
            marks,
        )

    def _resolve(self, pending: list[tuple[int, int, Write]]) -> tuple[list[Write], list[tuple[int, int]]]:
        """Check cas conditions and compute counter deltas against the stored documents, in this
        transaction (so no other writer can slip in between). A source whose condition fails has none of
        its writes here applied; the rest are checked again without it, until no new failure appears."""
        conflicts: set[tuple[int, int]] = set()
        while True:
            # key -> (exists, version, doc): version is the stored cas, or for a document written earlier in
            # this transaction the provisional cas a handler saw for it (the identity of the written bytes).
            state: dict[str, tuple[bool, int, bytes | None]] = {}
            out: list[Write] = []
            failed: set[tuple[int, int]] = set()
            for vb, seqno, w in pending:
                source = (vb, seqno)
                if source in conflicts or source in failed:
                    continue
                if w.key not in state:
                    got = self.get_doc(w.key)
                    state[w.key] = (True, got[1], got[0]) if got else (False, 0, None)
                exists, cas, doc = state[w.key]
                if w.expect_cas is not None and (
                    (w.expect_cas == 0 and exists) or (w.expect_cas > 0 and (not exists or cas != w.expect_cas))
                ):
                    failed.add(source)
                    continue
                version = id(w.doc) if w.doc is not None else 0
                if w.delta is not None:
                    count = decode_document(doc).get("count") if exists and doc is not None else 0
                    if type(count) is not int:
                        failed.add(source)
                        continue
                    w = Write(w.key, OP_UPDATE, encode_document({"count": count + w.delta}), w.expiry, w.flags)
                elif w.expect_cas is not None:
                    w = Write(w.key, w.op, w.doc, w.expiry, w.flags)
                state[w.key] = (w.op == OP_UPDATE, version, w.doc)
                out.append(w)
            if not failed:
                return out, sorted(conflicts)
            # Start over without the failed sources: their earlier writes are dropped too, and later
            # conditions are checked against documents without them.
            conflicts |= failed

    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]:
        rows = self._db.execute("SELECT vb, epoch, seqno FROM effect_marks WHERE function=?", (function,))
        return {vb: (epoch, seqno) for vb, epoch, seqno in rows}

    def lower_effect_marks(self, function: str, seqnos: dict[int, int]) -> dict[int, int]:
        """Lower the (function, vb) effect marks to at most the given seqnos, so effects of the function's
        mutations after them apply again (a rewind with --reapply-effects); epochs are kept. Returns the
        vBuckets whose mark moved, with their old seqno."""

        def body() -> dict[int, int]:
            old = self.effect_marks(function)
            moved = {vb: old[vb][1] for vb, s in seqnos.items() if vb in old and old[vb][1] > s}
            self._db.executemany(
                "UPDATE effect_marks SET seqno=? WHERE function=? AND vb=? AND seqno>?",
                [(seqnos[vb], function, vb, seqnos[vb]) for vb in moved],
            )
            return moved

        return _retry_locked(self.path, lambda: self._tx(body))

    def seqnos_before(self, time_ns: int) -> dict[int, int]:
        """Per vBucket with a mutation logged at or after `time_ns`: the seqno right before the first such
        mutation. The time of a mutation is its arrival_ms where the log has that column, else its cas,
        the wall-clock time of its write in nanoseconds (see _reserve_cas)."""
        column, value = "cas", max(-(2**63), min(time_ns, 2**63 - 1))  # SQLite integers are 64-bit
        if "arrival_ms" in {r[1] for r in self._db.execute("PRAGMA table_info(log)")}:
            column, value = "arrival_ms", time_ns // 1_000_000  # the log's own arrival time, where it keeps one
        rows = self._db.execute(f"SELECT vb, MIN(seqno) - 1 FROM log WHERE {column} >= ? GROUP BY vb", (value,))
        return dict(rows.fetchall())

    def drop_effect_marks(self, function: str) -> None:
        _retry_locked(
            self.path,
            lambda: self._tx(lambda: self._db.execute("DELETE FROM effect_marks WHERE function=?", (function,))),
        )


if TYPE_CHECKING:

    def _implements_the_protocol(bucket: LocalBucket) -> FileBucket:
        return bucket  # mypy checks every FileBucket method is here with a compatible signature


def create_files(
    data_dir: str | os.PathLike[str], name: str, *, exist_ok: bool = False, partitions: int = 1
) -> None:
    """Create a bucket's files. ``partitions`` > 1 spreads its vBuckets over that many files (see
    eventing.storage.partitions): writers of different vBucket ranges then never wait for each other. With
    ``exist_ok`` an existing bucket of that name is kept as it is."""
    check_bucket_name(name)
    path = bucket_path(data_dir, name)
    if path.exists():
        if exist_ok:
            return
        raise ConfigError(f"bucket '{name}' already exists in {path.parent}; pick another name")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"a bucket has 1 to {MAX_PARTITIONS} partitions, not {partitions}")
    info = [("uuid", uuid.uuid4().hex), ("name", name), ("created_at", str(time.time()))]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Partition files without their main file belong to no bucket (a drop cut short, a main file
        # deleted by hand): they, and above all their WAL files, must never meet the new bucket.
        leftovers = partition_path(data_dir, name, 1).parent
        if leftovers.is_dir():
            shutil.rmtree(leftovers)
        if partitions > 1:
            info.append(("partitions", str(partitions)))
            for part in range(1, partitions):
                part_path = partition_path(data_dir, name, part)
                part_path.parent.mkdir(exist_ok=True)
                _create_file(part_path, [*info, ("partition", str(part))])
        _create_file(path, info)  # the main file last: a bucket appears whole or not at all
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(
            f"cannot create bucket '{name}' in {path.parent}: {exc}; check that the data directory is writable"
        ) from None


def partition_path(data_dir: str | os.PathLike[str], name: str, part: int) -> Path:
    """Partition ``part`` (>= 1) of a partitioned bucket; partition 0 is the bucket's own file."""
    return Path(data_dir) / "buckets" / f"{name}.partitions" / f"{part}.sqlite3"


def _create_file(path: Path, info: list[tuple[str, str]]) -> None:
    tmp = path.with_suffix(".creating")
    tmp.unlink(missing_ok=True)
    db = _connect(tmp)
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO info VALUES(?,?)", info)
    db.executemany("INSERT INTO high VALUES(?,0,0)", [(vb,) for vb in range(NUM_VBUCKETS)])
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    os.replace(tmp, path)


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=2.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    # Checkpoint the WAL every ~40 MB instead of SQLite's ~4 MB: a batch of writes dirties pages all over
    # the docs B-tree, and each checkpoint copies (and syncs) every page changed since the last one, so
    # fewer checkpoints copy the same hot pages fewer times (measured 1.3x CPU, 1.5x wall on effect writes).
    # Several writers take turns so that it completes (eventing.storage.write_turns).
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
    return db


def _upgrade(db: sqlite3.Connection, path: Path) -> None:
    """Bring a bucket file written by an earlier version up to date: the log's ``arrival_ms`` column
    (existing entries get the time of their cas, nanoseconds since the epoch taken when the entry was
    written), then the high table's (each vBucket's last entry's arrival time)."""
    if not {r[1] for r in db.execute("PRAGMA table_info(log)")}:
        return  # not a bucket: the caller's read reports it

    def body() -> None:
        # Checked again inside the transaction: another process may have upgraded the file first.
        if "arrival_ms" not in {r[1] for r in db.execute("PRAGMA table_info(log)")}:
            db.execute("ALTER TABLE log ADD COLUMN arrival_ms INTEGER NOT NULL DEFAULT 0")
            db.execute("UPDATE log SET arrival_ms = cas / 1000000")
        if "arrival_ms" not in {r[1] for r in db.execute("PRAGMA table_info(high)")}:
            db.execute("ALTER TABLE high ADD COLUMN arrival_ms INTEGER NOT NULL DEFAULT 0")
            db.execute(
                "UPDATE high SET arrival_ms = COALESCE("
                "(SELECT arrival_ms FROM log WHERE log.vb = high.vb AND log.seqno = high.seqno), 0)"
            )

    if all("arrival_ms" in {r[1] for r in db.execute(f"PRAGMA table_info({t})")} for t in ("log", "high")):
        return
    _retry_locked(path, lambda: run_transaction(db, path, body))


def _retry_locked(path: Path, fn):
    try:
        return retry_locked(path, fn)
    except sqlite3.DatabaseError as exc:
        raise bucket_file_error(path, exc) from None


# -- damaged files and full disks ----------------------------------------------------------------------

_SQLITE_MAGIC = b"SQLite format 3\x00"


def bucket_name_of(path: Path) -> str:
    """The bucket a file belongs to: ``buckets/NAME.sqlite3`` or ``buckets/NAME.partitions/I.sqlite3``."""
    folder = path.parent.name
    return folder[: -len(".partitions")] if folder.endswith(".partitions") else path.stem


# Connections this process has open, per bucket file. SQLite locks its files with POSIX advisory locks,
# which the kernel drops when the process closes *any* descriptor of the file: reading a file's header with
# open() while one of our own connections holds it left that connection without its locks (another
# process then checkpointed and reset the WAL under it, and a running service stopped seeing new writes).
# Counted, not held weakly: held weakly, a Ray worker read a header under a connection that was still live
# and stopped seeing new writes (a connection can outlive the bucket object that opened it). A bucket never
# closed keeps the raw check of its file off in this process for good, leaving damage to SQLite's own
# checks: never unsafe.
_open_connections: dict[Path, int] = {}
_open_lock = threading.Lock()


def _connections_opened(bucket: LocalBucket) -> None:
    with _open_lock:
        _open_connections[bucket.path] = _open_connections.get(bucket.path, 0) + 1


def _connections_closed(bucket: LocalBucket) -> None:
    with _open_lock:
        left = _open_connections.get(bucket.path, 0) - 1
        if left > 0:
            _open_connections[bucket.path] = left
        else:
            _open_connections.pop(bucket.path, None)


def header_problem(path: Path) -> str | None:
    """What is wrong with a bucket file that its first 100 bytes and its size show (cut short, not a SQLite
    file), without opening it; None when nothing shows. SQLite itself would read an empty file as an empty
    database and a truncated one as zeros past the end, so a damaged bucket would look empty or partial.
    Not read while this process has a connection to the file (see _open_connections): SQLite's own checks
    and errors speak for it then."""
    if _open_connections.get(path):
        return None
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = f.read(100)
    except FileNotFoundError:
        return None  # the caller reports a missing file
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if size == 0:
        return "truncated to 0 bytes"
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        return "not a SQLite file: its header is overwritten" if len(header) == 100 else f"truncated to {size} bytes"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return "its header is overwritten (page size)"
    pages = int.from_bytes(header[28:32], "big")
    # The page count is valid while the change counter matches (offsets 24 and 92): SQLite's own rule. A
    # checkpoint in another process writes the first page (the new count) before the pages that grow the
    # file, so the count is compared only while no WAL is there to be checkpointed.
    if header[24:28] == header[92:96] and pages and size < pages * page_size and not _has_wal(path):
        return f"truncated to {size:,} of {pages * page_size:,} bytes"
    if size % page_size:
        return f"truncated to {size:,} bytes, not a whole number of {page_size}-byte pages"
    return None


def _has_wal(path: Path) -> bool:
    try:
        return os.stat(f"{path}-wal").st_size > 0
    except OSError:
        return False


def damaged_bucket_error(path: Path, detail: object) -> StoreCorruptError:
    name = bucket_name_of(path)
    return StoreCorruptError(
        f"bucket file {path} is damaged ({_one_line(detail)}); stop eventing, then put back a backup copy of "
        f"the file, or drop the bucket (`eventing bucket drop {name}`) and create and load it again; "
        "see 'Faults and recovery' in docs/operations.md"
    )


def disk_full_error(path: Path, detail: object) -> StoreError:
    folder = path.parent
    return StoreError(
        f"cannot write {path}: the disk is full ({_one_line(detail)}); free space on the file system of "
        f"{folder} (see `df {folder}`), then run the command again (everything committed is kept)"
    )


def bucket_file_error(path: Path, exc: sqlite3.DatabaseError) -> EventingError:
    """One line for SQLite's error on a bucket file: damage (the way out), a full disk (free space: SQLite
    says "disk I/O error" when it cannot grow its shared-memory file), or the file unusable otherwise."""
    message = str(exc)
    if type(exc) is sqlite3.DatabaseError or "malformed" in message or "not a database" in message:
        return damaged_bucket_error(path, message)
    if "full" in message or no_space_left(path.parent):
        return disk_full_error(path, message)
    return StoreError(
        f"cannot use bucket file {path} ({_one_line(message)}); check the permissions and the free space of "
        f"{path.parent}, then run the command again"
    )


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def _mapping_errors(method):
    """Wrap a reading method so that SQLite's errors on a damaged or unusable file become one line naming
    the file (bucket_file_error) wherever the read happens: a CLI command, a worker, the data service."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(self, *args, **kwargs):
            try:
                yield from method(self, *args, **kwargs)
            except sqlite3.DatabaseError as exc:
                raise bucket_file_error(self.path, exc) from None

        return generator

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            raise bucket_file_error(self.path, exc) from None

    return wrapper


for _name in (
    "get_raw", "get_doc", "get_meta", "previous_doc", "high_seqnos", "read_vb_rows", "read_vb_columns",
    "read_vb_packed", "first_arrival_after", "max_doc_bytes", "scan_log", "log_index", "logged_writes",
    "_live_docs", "count", "stats", "effect_marks", "seqnos_before", "expire_due", "_info", "_info_or",
):
    setattr(LocalBucket, _name, _mapping_errors(getattr(LocalBucket, _name)))


def drop_damaged(data_dir: str | os.PathLike[str], name: str) -> Path:
    """Delete the files of a bucket that cannot be opened (a file of it damaged): its partitions' folder,
    then its main file, each with its WAL, shared-memory and write-turn files."""
    path = bucket_path(data_dir, name)
    partitions = partition_path(data_dir, name, 1).parent
    files = sorted(partitions.glob("*.sqlite3")) if partitions.is_dir() else []
    for file in [*files, path]:
        write_turns.forget(file)
        for suffix in ("-wal", "-shm", write_turns.TURN_SUFFIX):
            Path(f"{file}{suffix}").unlink(missing_ok=True)
        file.unlink(missing_ok=True)
    if partitions.is_dir():
        shutil.rmtree(partitions)
    return path


def list_buckets(data_dir: str | os.PathLike[str]) -> list[str]:
    folder = Path(data_dir) / "buckets"
    return sorted(p.stem for p in folder.glob("*.sqlite3")) if folder.exists() else []


def chunked(items: Iterable, size: int) -> Iterable[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk
