"""The write path of a local bucket (``FileWriter``, a collaborator of ``LocalBucket``): each write gets the
next seqno of its vBucket, a fresh cas and its transaction's arrival time, in a transaction of the file
(``BucketFile.transaction``: writers of one file take turns, and once it commits a running service is told
which vBuckets it wrote); a batch of updates is planned before the write lock (eventing.storage.write_plan).
Also the check-and-set behind the Data API (``change_document``, ``change_documents``), expirations, and
``chunked``, which cuts a stream of writes into batches.
"""

from __future__ import annotations

import itertools
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter

from eventing.core import xattrs as xattr_codec
from eventing.core.keyspaces import COLLECTION_MARK, vbucket_of_stored
from eventing.core.mutation import OP_DELETE, OP_EXPIRE, OP_UPDATE, encode_document
from eventing.core.xattrs import NONE as NO_XATTRS
from eventing.errors import NotFoundError
from eventing.storage.bucket_file import BucketFile
from eventing.storage.file_health import maps_file_errors
from eventing.storage.files import _DOCS_COLUMNS_PLAIN, _LOG_COLUMNS, _LOG_COLUMNS_PLAIN
from eventing.storage.values import Changed, EffectGroup, StoredDocument, Write
from eventing.storage.write_plan import Item, UpdatePlan
from sharding import NUM_VBUCKETS, validate_key

_by_vb = itemgetter(0)
# A live document as change_document hands it to its change (StoredDocument's fields after the key).
_LIVE_DOC = "SELECT doc, cas, expiry, flags, vb, seqno, xattrs FROM docs WHERE key=? AND deleted=0"
# Whether any document of the file has extended attributes: one probe of the partial index docs_xattrs
# (eventing.storage.files), ~1 us, made once a transaction; only then does a write that keeps a document's
# XATTRs (Write.xattrs None) read them.
_HOLDS_XATTRS = "SELECT 1 FROM docs WHERE xattrs IS NOT NULL LIMIT 1"
HEADS_BY_VB_MAX = 32  # up to this many vBuckets in a write, their heads are read one query each
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


CAS_BLOCK = 256  # cas values a CasSource reserves at a time


class CasSource:
    """The cas of the writes a handler makes, known when it makes them (Couchbase's insert/upsert answer the
    document's cas): values of this process's cas clock (`_reserve_cas`, nanoseconds since the epoch, never
    repeated within the process), reserved CAS_BLOCK at a time. The bucket writes a write's document with the
    cas it carries (Write.cas). On the hot path call `next` (a range iterator's C-level __next__, no lock)
    and `refill()` when it raises StopIteration; `source()` does both. Safe across threads: `next` holds the
    GIL; two threads finding the block spent at once each reserve one, and a value is still handed out
    once."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next: Callable[[], int] = iter(()).__next__

    def refill(self) -> int:
        first = _reserve_cas(CAS_BLOCK) + 1
        self.next = iter(range(first + 1, first + CAS_BLOCK)).__next__
        return first

    def __call__(self) -> int:
        try:
            return self.next()
        except StopIteration:
            return self.refill()


_xattrs_of = itemgetter(8)  # Write.xattrs


def _items(writes: Iterable[Write]) -> list[Item]:
    """(key, op, doc, expiry, flags, cas) of each write. In a batch where a write carries extended
    attributes, every item has a seventh element, its write's (None: it keeps the document's own): a batch
    without any is told by its first item alone."""
    writes = writes if isinstance(writes, list) else list(writes)
    if any(map(_xattrs_of, writes)):
        return [(*w[:6], w[8]) for w in writes]  # type: ignore[misc]
    return [w[:6] for w in writes]


def group_items(groups: Sequence[EffectGroup]) -> list[Item]:
    """_items of the groups' writes, in order. Groups that crossed processes and still hold their columns
    (EffectGroup.columns) give their items straight from the columns, no Write made."""
    if any(g.columns is None and g.writes for g in groups):
        return _items(w for g in groups for _, w in g.writes)
    items: list[Item] = []
    held = [c for g in groups if (c := g.columns) is not None]
    if any(any(c[9]) for c in held):  # Write.xattrs (its column follows the seqnos')
        for c in held:
            items.extend(zip(*c[1:7], c[9], strict=True))
    else:
        for c in held:
            items.extend(zip(*c[1:7], strict=True))
    return items


def load_items(rows: Sequence[tuple]) -> list[Item]:
    """Items of ``load_rows``'s rows: ``(key, op, doc, expiry)``, or with the XATTRs as a fifth element."""
    if any(len(row) > 4 for row in rows):
        return [(*row[:4], 0, None, row[4] if len(row) > 4 else None) for row in rows]  # type: ignore[misc]
    return [(key, op, doc, expiry, 0, None) for key, op, doc, expiry in rows]


def _plan(items: list[Item]) -> UpdatePlan | None:
    """A batch of updates planned before the write lock; None when it holds deletes or extended attributes
    (see write_plan)."""
    if items and len(items[0]) > 6:
        return None
    return UpdatePlan(items) if UpdatePlan.applies_to(items) else None


class FileWriter:
    """The write path of one bucket file. A collaborator of LocalBucket (eventing.storage.bucket)."""

    def __init__(self, file: BucketFile):
        self.file = file

    def write(
        self, writes: Iterable[Write], *, origin: str | None = None, arrival_ms: int | None = None
    ) -> list[tuple[int, int] | None]:
        """Apply writes in one transaction; each gets the next seqno of its vBucket, a fresh cas and the
        transaction's arrival time (``arrival_ms``, default now; tests and imports may give their own).

        Returns (vb, seqno) per write, or None for a delete of a missing document (nothing logged).
        """
        items = _items(writes)  # a retried transaction (locked, disk full) must see every write again
        plan = _plan(items)
        return self.file.transaction(lambda: self.log(items, origin, arrival_ms, plan))

    def load_rows(self, rows: Sequence[tuple], *, arrival_ms: int | None = None) -> int:
        """``write`` for imports (``bucket load``): rows are ``(key, op, doc, expiry)`` with keys already
        validated, or ``(key, op, doc, expiry, xattrs)`` (Write.xattrs), applied in one transaction with
        the same outcome as ``write`` of the same writes. Returns how many rows were logged."""
        items = load_items(rows)
        plan = _plan(items)
        logged = self.file.transaction(lambda: self.log(items, None, arrival_ms, plan))
        return sum(1 for r in logged if r is not None)

    def log(
        self, items: list[Item], origin: str | None, arrival_ms: int | None, plan: UpdatePlan | None = None
    ) -> list[tuple[int, int] | None]:
        """The one write path, inside a transaction of the file: items are ``(key, op, doc, expiry, flags,
        cas)``. Each logged item gets the next seqno of its vBucket, its cas (a fresh one when None) and the
        transaction's arrival time; a delete of a document that does not exist (at that point of the batch) is
        skipped. An update keeps the extended attributes its document has (unexpired, as the batch left it)
        unless its item gives them (a seventh element: eventing.core.xattrs); a delete drops them. Those are
        read only where the file holds any (``_kept``), so a bucket without XATTRs writes as it did before
        they existed.

        Built for batches: the high seqnos, last arrival times and the existence of deleted keys are read
        with a few queries rather than one per vBucket or key, log rows go in in (vb, seqno) order and only
        each key's last version goes into ``docs``, in key order, so SQLite walks each B-tree once per
        transaction instead of jumping between random pages (random order costs ~3x once the docs table
        outgrows SQLite's page cache)."""
        arrival = int(time.time() * 1000) if arrival_ms is None else int(arrival_ms)
        kept = self._kept(items)  # key -> XATTRs an update keeps; None: nothing to keep
        if kept is not None:
            plan = None
        if plan is not None:  # updates only, prepared before the lock (see eventing.storage.write_plan)
            highs, arrivals = self._heads({vb for vb, _ in plan.runs}, arrival)
            log_rows, docs_rows, placed = plan.rows(highs, arrivals, _reserve_cas(plan.count), origin)
            self._insert(log_rows, docs_rows, highs, arrivals)
            return placed  # type: ignore[return-value]
        vbs = [  # vbucket_of (a collection's stored key: of its own key, eventing.core.keyspaces)
            vbucket_of_stored(k)
            if (k := item[0]).startswith(COLLECTION_MARK)
            else ((zlib.crc32(k.encode()) >> 16) & 0x7FFF) % NUM_VBUCKETS
            for item in items
        ]
        highs, arrivals = self._heads(set(vbs), arrival)
        deleting = {item[0] for item in items if item[1] != OP_UPDATE}
        live = self._live(deleting)
        fresh = _reserve_cas(len(items))
        log_rows = []
        docs: dict[str, tuple] = {}
        out: list[tuple[int, int] | None] = []
        with_xattrs = kept is not None or (len(items[0]) > 6 if items else False)
        current: dict[str, bytes | None] = dict(kept or {})  # each key's XATTRs as the batch leaves them
        for item, vb in zip(items, vbs, strict=True):
            key, op, doc, expiry, flags, given = item[:6]
            if op != OP_UPDATE:
                if not live.get(key, False):
                    out.append(None)
                    continue
                live[key] = False
            elif key in deleting:
                live[key] = True
            fresh += 1
            cas = fresh if given is None else given
            seqno = highs[vb] = highs[vb] + 1
            deleted = 0 if op == OP_UPDATE else 1
            if with_xattrs:  # a delete drops the document's XATTRs; an update keeps them or sets its own
                if deleted:
                    xattrs = None
                else:
                    xattrs = item[6] if len(item) > 6 else None  # type: ignore[misc]
                    xattrs = current.get(key) if xattrs is None else None if xattrs == NO_XATTRS else xattrs
                current[key] = xattrs
                log_rows.append((vb, seqno, key, op, cas, doc, origin, expiry, flags, arrivals[vb], xattrs))
                docs[key] = (key, vb, seqno, cas, deleted, None if deleted else doc, expiry, flags, xattrs)
            else:
                log_rows.append((vb, seqno, key, op, cas, doc, origin, expiry, flags, arrivals[vb]))
                docs[key] = (key, vb, seqno, cas, deleted, None if deleted else doc, expiry, flags)
            out.append((vb, seqno))
        log_rows.sort(key=_by_vb)  # stable: seqnos stay in order within a vBucket
        self._insert(log_rows, [docs[k] for k in sorted(docs)], highs, arrivals)
        return out

    def _kept(self, items: list[Item]) -> dict[str, bytes] | None:
        """The extended attributes of the live, unexpired documents the batch's updates that give none of
        their own keep (key -> XATTRs), or None when there are none: then the batch needs nothing more."""
        db = self.file.db
        if not items or db.execute(_HOLDS_XATTRS).fetchone() is None:
            return None
        keys = {item[0] for item in items if item[1] == OP_UPDATE and (len(item) < 7 or item[6] is None)}
        now = int(time.time())
        kept: dict[str, bytes] = {}
        for part in chunked(keys, 500):
            marks = ",".join("?" * len(part))
            kept.update(
                db.execute(
                    f"SELECT key, xattrs FROM docs WHERE key IN ({marks}) AND xattrs IS NOT NULL "
                    "AND deleted=0 AND (expiry=0 OR expiry>?)",
                    (*part, now),
                )
            )
        return kept or None

    def _insert(
        self, log_rows: list[tuple], docs_rows: list[tuple], highs: dict[int, int], arrivals: dict[int, int]
    ) -> None:
        """Write log rows (in (vb, seqno) order), docs rows (in key order) and the moved high seqnos. Rows
        without extended attributes leave the xattrs columns out (NULL), so a write of documents without any
        runs the statements it ran before the columns existed."""
        db = self.file.db
        if log_rows and len(log_rows[0]) > 10:
            db.executemany(f"INSERT INTO log({_LOG_COLUMNS}) VALUES(?,?,?,?,?,?,?,?,?,?,?)", log_rows)
            db.executemany(
                f"INSERT OR REPLACE INTO docs({_DOCS_COLUMNS_PLAIN}, xattrs) VALUES(?,?,?,?,?,?,?,?,?)",
                docs_rows,
            )
        else:
            db.executemany(f"INSERT INTO log({_LOG_COLUMNS_PLAIN}) VALUES(?,?,?,?,?,?,?,?,?,?)", log_rows)
            db.executemany(
                f"INSERT OR REPLACE INTO docs({_DOCS_COLUMNS_PLAIN}) VALUES(?,?,?,?,?,?,?,?)", docs_rows
            )
        moved = sorted({row[0] for row in log_rows})
        self.file.written.update(moved)
        db.executemany(
            "UPDATE high SET seqno=?, arrival_ms=? WHERE vb=?",
            [(highs[vb], arrivals[vb], vb) for vb in moved],
        )

    def _heads(self, vbs: set[int], arrival: int) -> tuple[dict[int, int], dict[int, int]]:
        """High seqno and the arrival time new entries get (never below the vBucket's last one: readers find
        the earliest unread arrival first) of each vBucket in ``vbs``."""
        db = self.file.db
        if (
            len(vbs) > HEADS_BY_VB_MAX
        ):  # one read of the 1,024-row table beats hundreds of lookups from Python
            rows = [r for r in db.execute("SELECT vb, seqno, arrival_ms FROM high") if r[0] in vbs]
        else:
            rows = [
                (vb, *db.execute("SELECT seqno, arrival_ms FROM high WHERE vb=?", (vb,)).fetchone())
                for vb in vbs
            ]
        return {vb: seqno for vb, seqno, _ in rows}, {vb: max(arrival, last) for vb, _, last in rows}

    def _live(self, keys: set[str]) -> dict[str, bool]:
        """Whether each key has a live (not deleted) document; keys without a row are left out."""
        live: dict[str, bool] = {}
        for part in chunked(keys, 500):
            marks = ",".join("?" * len(part))
            for key, deleted in self.file.db.execute(
                f"SELECT key, deleted FROM docs WHERE key IN ({marks})", part
            ):
                live[key] = not deleted
        return live

    def upsert(
        self,
        key: str,
        doc: dict,
        *,
        origin: str | None = None,
        expiry: int = 0,
        arrival_ms: int | None = None,
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
            raise NotFoundError(f"document '{key}' does not exist in bucket '{self.file.name}'")
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
            row = self.file.db.execute(_LIVE_DOC, (key,)).fetchone()
            current = None if row is None else StoredDocument(key, *row)
            write = change(current)
            if write is None:
                return current
            placed = self.log(_items([self._expanded(write)]), origin, None)[0]
            if placed is None or write.op != OP_UPDATE:
                return None
            cas, xattrs = self.file.db.execute("SELECT cas, xattrs FROM docs WHERE key=?", (key,)).fetchone()
            return StoredDocument(key, write.doc or b"", cas, write.expiry, write.flags, *placed, xattrs)

        return self.file.transaction(body)

    def change_documents(
        self,
        changes: Sequence[tuple[str, Callable[[StoredDocument | None], Write | None]]],
        *,
        origin: str | None = None,
    ) -> list[Changed | Exception]:
        """``change_document`` for many documents in one transaction (a group commit: one commit for the
        concurrent writes of the Data API). Each change sees the document as the earlier ones in the list
        left it; a change that raises writes nothing and its exception takes its place in the answer,
        the others go on. Any other failure (SQLite, a write refused by ``log``) fails them all."""

        def body() -> list[Changed | Exception]:
            db = self.file.db
            out: list[Changed | Exception] = []
            for key, change in changes:
                row = db.execute(_LIVE_DOC, (key,)).fetchone()
                current = None if row is None else StoredDocument(key, *row)
                try:
                    write = change(current)
                except Exception as exc:  # this document's condition failed: the others go on
                    out.append(exc)
                    continue
                if write is None:
                    out.append(Changed(current))
                    continue
                placed = self.log(_items([self._expanded(write)]), origin, None)[0]
                if placed is None:  # a delete of nothing
                    out.append(Changed(None))
                    continue
                cas, xattrs = db.execute("SELECT cas, xattrs FROM docs WHERE key=?", (key,)).fetchone()
                after = StoredDocument(key, write.doc or b"", cas, write.expiry, write.flags, *placed, xattrs)
                out.append(Changed(after if write.op == OP_UPDATE else None, cas, *placed))
            return out

        return self.file.transaction(body)

    def _expanded(self, write: Write) -> Write:
        """``write`` with the macros of its extended attributes (eventing.core.xattrs) replaced by the cas
        and seqno it gets: the cas is reserved now, the seqno is its vBucket's next (read in the
        transaction that logs it)."""
        if not xattr_codec.has_macros(write.xattrs):
            return write
        vb = vbucket_of_stored(write.key)
        seqno = self.file.db.execute("SELECT seqno FROM high WHERE vb=?", (vb,)).fetchone()[0] + 1
        cas = write.cas if write.cas is not None else _reserve_cas(1) + 1
        assert write.xattrs is not None
        return write._replace(cas=cas, xattrs=xattr_codec.expand(write.xattrs, cas, seqno))

    @maps_file_errors
    def expire_due(self, now_s: float | None = None) -> int:
        """Turn documents whose expiry has passed into expiration mutations (on_delete with expired)."""
        now = int(time.time() if now_s is None else now_s)
        keys = [
            r[0]
            for r in self.file.db.execute(
                "SELECT key FROM docs WHERE deleted=0 AND expiry>0 AND expiry<=?", (now,)
            ).fetchall()
        ]
        self.write([Write(k, OP_EXPIRE) for k in keys])
        return len(keys)


def chunked(items: Iterable, size: int) -> Iterable[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk
