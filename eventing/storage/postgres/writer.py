"""The write path of a PostgreSQL bucket (``LogWriter``): each write gets the next seqno of its vBucket, a
fresh cas and its transaction's arrival time, exactly as a bucket file's (eventing.storage.writes), and once
the transaction commits the workers owning the written vBuckets are told (eventing.storage.postgres.wake).

A write transaction is four statements whatever its size:

1. ``lock_heads``: the high seqno rows of the vBuckets it writes, locked in vBucket order (``FOR UPDATE``):
   writers of other vBuckets go on, writers of the same vBuckets wait for the commit, so a vBucket's
   seqnos are handed out in order and never twice, and a reader never sees seqno n + 1 before n;
2. for a batch holding deletes, whether each deleted key is live (a delete of nothing is not logged);
3. ``send_holds``: whether the bucket has any document with extended attributes, which its updates keep
   (one probe of a partial index; only where it has some, a fifth statement reads those of the batch's
   keys, in one more round trip);
4. ``insert_in``: the log rows, with the documents' new versions and the high seqnos derived from them by
   the server (each key's last version, each vBucket's last seqno), so the rows cross the wire once: one
   row as plain parameters, up to COPY_MIN_ROWS as arrays (``unnest``) in one statement, more by binary
   COPY and one statement after it.

Also the check-and-set behind the Data API (``change_documents``: every document read and written under
the locks of its vBuckets, so no other writer slips in between), expirations and imports.

Writes, the Data API's check-and-set and effects run pipelined (metadata.postgres.connection): BEGIN, the
locks and the reads made under them go in one round trip, the rows and COMMIT in a second, where each
statement waited for its answer before (five round trips for a single document). The reads still run
after the locks: the server runs a pipeline's statements in order, each with a snapshot of its own.

The lookups of several keys are one primary key lookup per key (``BY_KEYS``: each key joined LATERAL to its
row), not ``key = ANY(array)``: before the table's statistics exist (a new bucket, until autovacuum
analyzes it) the planner takes ``bucket = $1`` for a rare value and chose to scan the bucket's whole part of
the index, keeping the keys asked for, which cost 1-2 ms a lookup after a few thousand documents
(docs/benchmarks.md, "PostgreSQL store"). Likewise the high seqnos a batch moves are found through the index
by the batch's vBuckets (``vb = ANY`` beside the join): joined to the rows alone, the planner read all of the
bucket's 1,024 high seqnos (and their dead versions) into a hash, ~0.4 ms a write of a few rows.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import Any, TypeVar

from eventing.core import xattrs as xattr_codec
from eventing.core.keyspaces import COLLECTION_MARK, vbucket_of_stored
from eventing.core.mutation import OP_EXPIRE, OP_UPDATE
from eventing.core.xattrs import NONE as NO_XATTRS
from eventing.errors import InvalidKeyError
from eventing.storage.postgres.groups import groups_for
from eventing.storage.postgres.registry import BucketRef
from eventing.storage.postgres.wake import WakeSender
from eventing.storage.values import Changed, StoredDocument, Write
from eventing.storage.writes import _items, _reserve_cas, load_items
from metadata.postgres.arrays import Byteas, Int2s, Int8s, Texts
from metadata.postgres.connection import Cursor
from sharding import NUM_VBUCKETS

T = TypeVar("T")
Item = tuple[str, int, "bytes | None", int, int, "int | None"]  # (key, op, doc, expiry, flags, cas or None)
Written = set[int]  # the vBuckets a transaction logged writes in

_INSERT = """
WITH l AS (
    INSERT INTO bucket_log(bucket, vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms)
    SELECT %(bucket)s, r.vb, r.seqno, r.key, r.op, r.cas, r.doc, %(origin)s, r.expiry, r.flags, r.arrival_ms
    FROM unnest(%(vb)b::int2[], %(seqno)b::int8[], %(key)b::text[], %(op)b::int2[], %(cas)b::int8[],
                %(doc)b::bytea[], %(expiry)b::int8[], %(flags)b::int8[], %(arrival)b::int8[])
         AS r(vb, seqno, key, op, cas, doc, expiry, flags, arrival_ms)
    RETURNING vb, seqno, key, op, cas, doc, expiry, flags, arrival_ms
), d AS (
    INSERT INTO bucket_docs(bucket, key, vb, seqno, cas, deleted, doc, expiry, flags)
    SELECT DISTINCT ON (key) %(bucket)s, key, vb, seqno, cas, op <> 0, CASE WHEN op = 0 THEN doc END, expiry, flags
    FROM l ORDER BY key, seqno DESC
    ON CONFLICT (bucket, key) DO UPDATE SET vb = excluded.vb, seqno = excluded.seqno, cas = excluded.cas,
        deleted = excluded.deleted, doc = excluded.doc, expiry = excluded.expiry, flags = excluded.flags,
        xattrs = NULL
)
UPDATE bucket_high h SET seqno = m.seqno, arrival_ms = m.arrival_ms
FROM (SELECT vb, max(seqno) AS seqno, max(arrival_ms) AS arrival_ms FROM l GROUP BY vb) m
WHERE h.bucket = %(bucket)s AND h.vb = ANY(%(vb)b::int2[]) AND h.vb = m.vb
"""  # noqa: E501


# One row (a Data API write): the same three changes with plain parameters, no arrays to build or unpack.
_INSERT_ONE = """
WITH l AS (
    INSERT INTO bucket_log(bucket, vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms)
    VALUES (%(bucket)s, %(vb)s, %(seqno)s, %(key)s, %(op)s, %(cas)s, %(doc)s, %(origin)s, %(expiry)s, %(flags)s,
            %(arrival)s)
), d AS (
    INSERT INTO bucket_docs(bucket, key, vb, seqno, cas, deleted, doc, expiry, flags)
    VALUES (%(bucket)s, %(key)s, %(vb)s, %(seqno)s, %(cas)s, %(deleted)s, %(live_doc)s, %(expiry)s, %(flags)s)
    ON CONFLICT (bucket, key) DO UPDATE SET vb = excluded.vb, seqno = excluded.seqno, cas = excluded.cas,
        deleted = excluded.deleted, doc = excluded.doc, expiry = excluded.expiry, flags = excluded.flags,
        xattrs = NULL
)
UPDATE bucket_high SET seqno = %(seqno)s, arrival_ms = %(arrival)s WHERE bucket = %(bucket)s AND vb = %(vb)s
"""  # noqa: E501
# A batch of at least COPY_MIN_ROWS rows: the log rows by binary COPY (the client packs a row in ~1 us,
# a quarter of what building and sending the arrays costs), then the documents and high seqnos derived by
# the server from the rows just copied (each vBucket's new seqnos are one range of the log's key).
COPY_MIN_ROWS = 200
_COPY = (
    "COPY bucket_log(bucket, vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms) "
    "FROM STDIN (FORMAT BINARY)"
)
_COPY_TYPES = ["int4", "int2", "int8", "text", "int2", "int8", "bytea", "text", "int8", "int8", "int8"]
_AFTER_COPY = """
WITH u AS (
    SELECT * FROM unnest(%(vb)b::int2[], %(first)b::int8[], %(last)b::int8[], %(arrival)b::int8[])
        AS u(vb, first_seqno, last_seqno, arrival_ms)
), d AS (
    INSERT INTO bucket_docs(bucket, key, vb, seqno, cas, deleted, doc, expiry, flags)
    SELECT DISTINCT ON (l.key) %(bucket)s, l.key, l.vb, l.seqno, l.cas, l.op <> 0, CASE WHEN l.op = 0 THEN l.doc END,
        l.expiry, l.flags
    FROM u JOIN bucket_log l ON l.bucket = %(bucket)s AND l.vb = u.vb AND l.seqno BETWEEN u.first_seqno AND u.last_seqno
    ORDER BY l.key, l.seqno DESC
    ON CONFLICT (bucket, key) DO UPDATE SET vb = excluded.vb, seqno = excluded.seqno, cas = excluded.cas,
        deleted = excluded.deleted, doc = excluded.doc, expiry = excluded.expiry, flags = excluded.flags,
        xattrs = NULL
)
UPDATE bucket_high h SET seqno = u.last_seqno, arrival_ms = u.arrival_ms FROM u
WHERE h.bucket = %(bucket)s AND h.vb = ANY(%(vb)b::int2[]) AND h.vb = u.vb
"""  # noqa: E501


def _with_xattrs(sql: str, *changes: tuple[str, str]) -> str:
    """A write statement that also writes the rows' extended attributes (eventing.core.xattrs): the plain
    one with each (old, new) replaced, every one of which must be there. Only a batch holding a document
    with XATTRs runs these; the others leave the columns NULL as before they existed."""
    for old, new in changes:
        assert old in sql, old
        sql = sql.replace(old, new)
    return sql


_LOG_INTO = "INSERT INTO bucket_log(bucket, vb, seqno, key, op, cas, doc, origin, expiry, flags, arrival_ms"
_DOCS_INTO = "INSERT INTO bucket_docs(bucket, key, vb, seqno, cas, deleted, doc, expiry, flags"
_SET_X = ("xattrs = NULL", "xattrs = excluded.xattrs")
_INSERT_X = _with_xattrs(
    _INSERT,
    (_LOG_INTO, _LOG_INTO + ", xattrs"),
    ("r.flags, r.arrival_ms\n", "r.flags, r.arrival_ms, r.xattrs\n"),
    ("%(arrival)b::int8[])", "%(arrival)b::int8[], %(xattrs)b::bytea[])"),
    ("flags, arrival_ms)\n", "flags, arrival_ms, xattrs)\n"),
    (
        "RETURNING vb, seqno, key, op, cas, doc, expiry, flags, arrival_ms",
        "RETURNING vb, seqno, key, op, cas, doc, expiry, flags, arrival_ms, xattrs",
    ),
    (_DOCS_INTO, _DOCS_INTO + ", xattrs"),
    (
        "CASE WHEN op = 0 THEN doc END, expiry, flags\n",
        "CASE WHEN op = 0 THEN doc END, expiry, flags,\n    CASE WHEN op = 0 THEN xattrs END\n",
    ),
    _SET_X,
)
_INSERT_ONE_X = _with_xattrs(
    _INSERT_ONE,
    (_LOG_INTO, _LOG_INTO + ", xattrs"),
    ("%(flags)s,\n            %(arrival)s)", "%(flags)s,\n            %(arrival)s, %(xattrs)s)"),
    (_DOCS_INTO, _DOCS_INTO + ", xattrs"),
    ("%(live_doc)s, %(expiry)s, %(flags)s)", "%(live_doc)s, %(expiry)s, %(flags)s, %(live_xattrs)s)"),
    _SET_X,
)
_COPY_X = _with_xattrs(_COPY, ("arrival_ms)", "arrival_ms, xattrs)"))
_COPY_TYPES_X = [*_COPY_TYPES, "bytea"]
_AFTER_COPY_X = _with_xattrs(
    _AFTER_COPY,
    (_DOCS_INTO, _DOCS_INTO + ", xattrs"),
    ("        l.expiry, l.flags\n", "        l.expiry, l.flags, CASE WHEN l.op = 0 THEN l.xattrs END\n"),
    _SET_X,
)
_WRITE_UPDATES = (
    "SELECT eventing_write_updates(%s, %s, %s, %s, %b::int2[], %b::text[], %b::bytea[], %b::int8[], "
    "%b::int8[], %b::int8[])"
)
_LOCK = (
    "SELECT vb, seqno, arrival_ms FROM bucket_high WHERE bucket = %s AND vb = ANY(%b::int2[]) "
    "ORDER BY vb FOR UPDATE"
)
_LOCK_ONE = "SELECT vb, seqno, arrival_ms FROM bucket_high WHERE bucket = %s AND vb = %s FOR UPDATE"

# The rows of several keys, each found by the primary key whatever the table's statistics (see the module
# docstring): {columns} of bucket_docs as `d`, the keys an array parameter, then the bucket's id.
BY_KEYS = (
    "SELECT {columns} FROM unnest(%b::text[]) AS k(key) CROSS JOIN LATERAL "
    "(SELECT * FROM bucket_docs WHERE bucket = %s AND key = k.key LIMIT 1) d"
)
_DOCS = (
    BY_KEYS.format(columns="d.key, d.doc, d.cas, d.expiry, d.flags, d.vb, d.seqno, d.xattrs")
    + " WHERE NOT d.deleted"
)
_LIVE = BY_KEYS.format(columns="d.key, d.deleted")
# Whether the bucket has any document with extended attributes (a probe of the partial index
# bucket_docs_xattrs), sent with the locks; only then are the XATTRs that updates keep read (_KEPT).
_HOLDS_XATTRS = "SELECT EXISTS(SELECT 1 FROM bucket_docs WHERE bucket = %s AND xattrs IS NOT NULL)"
_KEPT = (
    BY_KEYS.format(columns="d.key, d.xattrs")
    + " WHERE d.xattrs IS NOT NULL AND NOT d.deleted AND (d.expiry = 0 OR d.expiry > %s)"
)
_DOCS_ONE = (
    "SELECT key, doc, cas, expiry, flags, vb, seqno, xattrs FROM bucket_docs "
    "WHERE bucket = %s AND key = %s AND NOT deleted"
)


class _Fetched:
    """The rows of a statement already answered (``send`` outside a pipeline)."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[Any]):
        self.rows = rows

    def fetchall(self) -> list[Any]:
        return self.rows


def send(cur: Cursor, sql: str, args: Any) -> Any:
    """Execute ``sql``; what it returns answers ``fetchall()``. In a pipeline the statement goes with the next
    round trip (several sent before the first is read cost one); otherwise it is answered at once."""
    answer = cur.execute(sql, args)
    return answer if cur.pipelined else _Fetched(answer.fetchall())


def vb_of(key: str) -> int:
    """sharding.vbucket_of, inlined (a collection's stored key: the vBucket of its own key)."""
    if key.startswith(COLLECTION_MARK):
        return vbucket_of_stored(key)
    return ((zlib.crc32(key.encode()) >> 16) & 0x7FFF) % NUM_VBUCKETS


def check_key(key: str) -> None:
    """PostgreSQL text holds no NUL character: a key with one is refused (a bucket file takes it)."""
    if "\x00" in key:
        raise InvalidKeyError(
            f"key {key[:40]!r} holds a NUL character, which a PostgreSQL store cannot keep; use a key "
            "without it"
        )


def items_of(writes: Iterable[Write]) -> list[Item]:
    """(key, op, doc, expiry, flags, cas), and the XATTRs as a seventh element where a write of the batch
    has some (eventing.storage.writes._items)."""
    return _items(writes)


def plain_updates(items: Sequence[Item]) -> bool:
    """Whether the server's functions can log these writes (eventing.storage.postgres.functions): updates
    that give no extended attributes of their own, fewer than a COPY's worth. A key PostgreSQL cannot hold
    is refused here, as log_in refuses it."""
    if not items or len(items) >= COPY_MIN_ROWS or len(items[0]) > 6:
        return False
    for item in items:
        check_key(item[0])
        if item[1] != OP_UPDATE:
            return False
    return True


def update_columns(items: Sequence[Item], vbs: Sequence[int]) -> tuple:
    """The columns eventing_log_updates takes for ``items`` (plain_updates) and their vBuckets: each write's
    cas its own where it has one, else a fresh one."""
    cas = _reserve_cas(len(items))
    return (
        Int2s(vbs),
        Texts([item[0] for item in items]),
        Byteas([item[2] for item in items]),
        Int8s([item[3] for item in items]),
        Int8s([item[4] for item in items]),
        Int8s([cas + 1 + i if item[5] is None else item[5] for i, item in enumerate(items)]),
    )


NOTHING_KEPT = _Fetched([(False,)])  # log_in's ``holds`` where no update is in the batch (expirations)


def _kept_keys(items: Sequence[Item]) -> list[str]:
    """The keys of the updates that keep their document's XATTRs (giving none of their own)."""
    return [item[0] for item in items if item[1] == OP_UPDATE and (len(item) < 7 or item[6] is None)]  # type: ignore[misc]


class Rows:
    """Log rows being assembled, column by column (what ``insert`` sends as arrays)."""

    __slots__ = ("vb", "seqno", "key", "op", "cas", "doc", "expiry", "flags", "arrival", "xattrs")

    def __init__(self) -> None:
        # row index -> its extended attributes, for the rows that have some (None: no row has any)
        self.xattrs: dict[int, bytes] | None = None
        self.vb: list[int] = []
        self.seqno: list[int] = []
        self.key: list[str] = []
        self.op: list[int] = []
        self.cas: list[int] = []
        self.doc: list[bytes | None] = []
        self.expiry: list[int] = []
        self.flags: list[int] = []
        self.arrival: list[int] = []

    def add(
        self,
        vb: int,
        seqno: int,
        key: str,
        op: int,
        cas: int,
        doc: bytes | None,
        expiry: int,
        flags: int,
        arrival: int,
    ) -> None:
        self.vb.append(vb)
        self.seqno.append(seqno)
        self.key.append(key)
        self.op.append(op)
        self.cas.append(cas)
        self.doc.append(doc)
        self.expiry.append(expiry)
        self.flags.append(flags)
        self.arrival.append(arrival)

    def __len__(self) -> int:
        return len(self.vb)

    def set_xattrs(self, xattrs: bytes | None) -> None:
        """The extended attributes of the row added last (a delete's are dropped with its document)."""
        if xattrs is not None and self.op[-1] == OP_UPDATE:
            if self.xattrs is None:
                self.xattrs = {}
            self.xattrs[len(self.vb) - 1] = xattrs

    def xattrs_column(self) -> list[bytes | None]:
        extra = self.xattrs or {}
        return [extra.get(i) for i in range(len(self.vb))]


class LogWriter:
    """Writes to one bucket's rows. Every ``*_in`` method runs inside a transaction ``run`` opened and adds
    the vBuckets it logged writes in to ``written``."""

    def __init__(self, ref: BucketRef, wake: WakeSender):
        self.ref = ref
        self.wake = wake

    # -- transactions ---------------------------------------------------------------------------------

    def run(self, body: Callable[[Cursor, Written], T], *, pipeline: bool = False) -> T:
        """``body`` in one transaction (run again from the start where the server went away, so it must
        only compute from its inputs); once committed, the written vBuckets' owners are told. ``pipeline``:
        the body's statements are sent without waiting for each answer (see the module docstring)."""
        written: Written = set()

        def once(cur: Cursor) -> T:
            written.clear()  # a transaction run again logs again
            return body(cur, written)

        out = self.ref.db.transaction(once, pipeline=pipeline)
        if written:
            self.wake.notify(self.ref.name, written)
        return out

    # -- the one write path ---------------------------------------------------------------------------

    def lock_heads(self, cur: Cursor, vbs: Iterable[int]) -> tuple[dict[int, int], dict[int, int]]:
        """Lock the high seqno rows of ``vbs`` (in vBucket order: two writers never wait for each other in
        a cycle); their high seqnos and last arrival times."""
        return self.heads_of(self.send_lock(cur, vbs))

    def send_lock(self, cur: Cursor, vbs: Iterable[int]) -> tuple[list[int], Any]:
        """lock_heads's statement, sent (in a pipeline: answered with the next round trip); ``heads_of``
        reads its answer."""
        wanted = sorted(set(vbs))
        if not wanted:
            return wanted, None
        if len(wanted) == 1:
            return wanted, send(cur, _LOCK_ONE, (self.ref.id, wanted[0]))
        return wanted, send(cur, _LOCK, (self.ref.id, wanted))

    def heads_of(self, sent: tuple[list[int], Any]) -> tuple[dict[int, int], dict[int, int]]:
        wanted, answer = sent
        if answer is None:
            return {}, {}
        rows = answer.fetchall()
        if len(rows) != len(wanted):
            raise self.ref.missing_rows()
        return {vb: seqno for vb, seqno, _ in rows}, {vb: last for vb, _, last in rows}

    def live_in(self, cur: Cursor, keys: Iterable[str]) -> dict[str, bool]:
        """Whether each key has a live document; keys without a row are left out."""
        return self.live_of(self.send_live(cur, keys))

    def send_live(self, cur: Cursor, keys: Iterable[str]) -> Any:
        wanted = list(keys)
        if not wanted:
            return None
        return send(cur, _LIVE, (wanted, self.ref.id))

    @staticmethod
    def live_of(answer: Any) -> dict[str, bool]:
        return {} if answer is None else {key: not deleted for key, deleted in answer.fetchall()}

    def log_in(
        self,
        cur: Cursor,
        written: Written,
        items: Sequence[Item],
        origin: str | None,
        arrival_ms: int | None,
        *,
        live: dict[str, bool] | None = None,
        heads: tuple[dict[int, int], dict[int, int]] | None = None,
        holds: Any = None,
    ) -> list[tuple[int, int] | None]:
        """Log ``items`` ``(key, op, doc, expiry, flags, cas)``: each gets the next seqno of its vBucket, its
        cas (a fresh one when None) and the transaction's arrival time (never below its vBucket's last one); a
        delete of a document that does not exist (at that point of the batch) is skipped. Returns (vb, seqno)
        per item, None for a skipped delete. ``live``: what the caller read already of the deleted keys (under
        the locks); ``heads``: lock_heads's answer for the items' vBuckets, when the caller took the locks
        already.

        An update keeps the extended attributes of its live, unexpired document (as the batch left it)
        unless its item gives them (a seventh element: eventing.core.xattrs); a delete drops them. They are
        read only when the bucket holds any (``send_holds``, sent with the locks; ``holds``: the caller's,
        sent after its locks), in one more round trip."""
        if not items:
            return []
        arrival = int(time.time() * 1000) if arrival_ms is None else int(arrival_ms)
        for item in items:
            check_key(item[0])
        vbs = [vb_of(item[0]) for item in items]
        locked = self.send_lock(cur, vbs) if heads is None else None
        deleting = {item[0] for item in items if item[1] != OP_UPDATE}
        # Read after the lock (in a pipeline, in the same round trip): a document another writer of these
        # vBuckets changed before the lock was granted is seen as that writer left it.
        asked = self.send_live(cur, deleting) if deleting and live is None else None
        if holds is None:
            holds = self.send_holds(cur)
        highs, lasts = self.heads_of(locked) if locked is not None else heads or ({}, {})
        arrivals = {vb: max(arrival, last) for vb, last in lasts.items()}
        if asked is not None:
            live = self.live_of(asked)
        live = dict(live or {})
        kept = self.kept_in(cur, holds, items)
        cas = _reserve_cas(len(items))
        order = sorted(range(len(items)), key=vbs.__getitem__)  # stable: a vBucket's seqnos follow the items
        rows = Rows()
        out: list[tuple[int, int] | None] = [None] * len(items)
        with_xattrs = kept is not None or len(items[0]) > 6
        current: dict[str, bytes | None] = dict(kept or {})  # each key's XATTRs as the batch leaves them
        for i in order:
            key, op, doc, expiry, flags, given = items[i][:6]
            if op != OP_UPDATE:
                if not live.get(key, False):
                    continue
                live[key] = False
                doc = None
            elif deleting and key in deleting:
                live[key] = True
            vb = vbs[i]
            seqno = highs[vb] = highs[vb] + 1
            rows.add(
                vb, seqno, key, op, cas + 1 + i if given is None else given, doc, expiry, flags, arrivals[vb]
            )
            if with_xattrs:  # a delete drops the XATTRs; an update keeps them or sets its own
                if op != OP_UPDATE:
                    xattrs = None
                else:
                    xattrs = items[i][6] if len(items[i]) > 6 else None  # type: ignore[misc]
                    xattrs = current.get(key) if xattrs is None else None if xattrs == NO_XATTRS else xattrs
                    rows.set_xattrs(xattrs)
                current[key] = xattrs
            out[i] = (vb, seqno)
        self.insert_in(cur, written, rows, origin)
        return out

    def send_holds(self, cur: Cursor) -> Any:
        """Whether the bucket holds any document with extended attributes, sent (in a pipeline: answered
        with the next round trip); ``kept_in`` reads its answer. Sent after the locks, it sees every
        document of their vBuckets as their last writer left it."""
        return send(cur, _HOLDS_XATTRS, (self.ref.id,))

    def kept_in(self, cur: Cursor, holds: Any, items: Sequence[Item]) -> dict[str, bytes] | None:
        """The XATTRs of the live, unexpired documents the updates of ``items`` keep (key -> XATTRs), or
        None when there are none; read only where ``holds`` (send_holds's answer) says the bucket has any."""
        if not holds.fetchall()[0][0]:
            return None
        keys = _kept_keys(items)
        if not keys:
            return None
        rows = cur.execute(_KEPT, (keys, self.ref.id, int(time.time()))).fetchall()
        return {key: bytes(xattrs) for key, xattrs in rows} or None

    def insert_in(self, cur: Cursor, written: Written, rows: Rows, origin: str | None) -> None:
        """The log rows (their vBuckets locked by ``lock_heads``), the documents' new versions and the moved
        high seqnos, in one statement."""
        if not rows:
            return
        with_xattrs = rows.xattrs is not None
        if len(rows) == 1:
            live = rows.op[0] == OP_UPDATE
            xattrs = rows.xattrs_column()[0] if with_xattrs else None
            cur.execute(
                _INSERT_ONE_X if with_xattrs else _INSERT_ONE,
                {
                    "xattrs": xattrs,
                    "live_xattrs": xattrs if live else None,
                    "bucket": self.ref.id,
                    "origin": origin,
                    "vb": rows.vb[0],
                    "seqno": rows.seqno[0],
                    "key": rows.key[0],
                    "op": rows.op[0],
                    "cas": rows.cas[0],
                    "doc": rows.doc[0],
                    "expiry": rows.expiry[0],
                    "flags": rows.flags[0],
                    "arrival": rows.arrival[0],
                    "deleted": not live,
                    "live_doc": rows.doc[0] if live else None,
                },
            )
        elif len(rows) >= COPY_MIN_ROWS:
            self._copy_in(cur, rows, origin)
        else:
            cur.execute(
                _INSERT_X if with_xattrs else _INSERT,
                {
                    "xattrs": rows.xattrs_column() if with_xattrs else None,
                    "bucket": self.ref.id,
                    "origin": origin,
                    "vb": rows.vb,
                    "seqno": rows.seqno,
                    "key": rows.key,
                    "op": rows.op,
                    "cas": rows.cas,
                    "doc": rows.doc,
                    "expiry": rows.expiry,
                    "flags": rows.flags,
                    "arrival": rows.arrival,
                },
            )
        written.update(rows.vb)

    def _copy_in(self, cur: Cursor, rows: Rows, origin: str | None) -> None:
        bucket = self.ref.id
        with_xattrs = rows.xattrs is not None
        with cur.copy(_COPY_X if with_xattrs else _COPY) as copy:
            copy.set_types(_COPY_TYPES_X if with_xattrs else _COPY_TYPES)
            write_row = copy.write_row
            for row in zip(
                repeat(bucket),
                rows.vb,
                rows.seqno,
                rows.key,
                rows.op,
                rows.cas,
                rows.doc,
                repeat(origin),
                rows.expiry,
                rows.flags,
                rows.arrival,
                *([rows.xattrs_column()] if with_xattrs else []),
                strict=False,
            ):  # repeat() is endless
                write_row(row)
        runs: dict[int, list[int]] = {}  # vb -> [first seqno, last seqno, arrival]
        for vb, seqno, arrival in zip(rows.vb, rows.seqno, rows.arrival, strict=True):
            run = runs.get(vb)
            if run is None:
                runs[vb] = [seqno, seqno, arrival]
            else:
                run[1] = seqno
        vbs = sorted(runs)
        cur.execute(
            _AFTER_COPY_X if with_xattrs else _AFTER_COPY,
            {
                "bucket": bucket,
                "vb": vbs,
                "first": [runs[vb][0] for vb in vbs],
                "last": [runs[vb][1] for vb in vbs],
                "arrival": [runs[vb][2] for vb in vbs],
            },
        )

    # -- what the bucket offers -----------------------------------------------------------------------

    def write(
        self, writes: Iterable[Write], origin: str | None, arrival_ms: int | None
    ) -> list[tuple[int, int] | None]:
        items = items_of(writes)  # a transaction run again must see every write again
        if arrival_ms is not None:
            return self._write_items(items, origin, arrival_ms)
        for item in items:
            check_key(item[0])  # a key refused fails its own call only, not the group it would join
        return groups_for(self.ref.db, self.ref.id, origin).run(
            items, lambda group: self._write_items(group, origin, None)
        )

    def _write_items(
        self, items: Sequence[Item], origin: str | None, arrival_ms: int | None
    ) -> list[tuple[int, int] | None]:
        if plain_updates(items):
            placed = self._write_updates(items, origin, arrival_ms)
            if placed is not None:
                return placed
        return self.run(
            lambda cur, written: self.log_in(cur, written, items, origin, arrival_ms), pipeline=True
        )

    def _write_updates(
        self, items: Sequence[Item], origin: str | None, arrival_ms: int | None
    ) -> list[tuple[int, int] | None] | None:
        """Plain updates as one statement, its own transaction (eventing_write_updates); None where a
        vBucket's high seqno row is missing (log_in says so)."""
        vbs = [vb_of(item[0]) for item in items]
        columns = update_columns(items, vbs)
        arrival = int(time.time() * 1000) if arrival_ms is None else int(arrival_ms)
        seqnos = self.ref.db.call(
            _WRITE_UPDATES,
            (self.ref.id, origin, arrival, *columns),
            committed=lambda: self._placed(vbs, columns[-1]),
        )
        if seqnos is None:
            return None
        self.wake.notify(self.ref.name, set(vbs))
        return list(zip(vbs, seqnos, strict=True))

    def _placed(self, vbs: list[int], cas: list[int]) -> list[int]:
        """The seqnos the writes of these cas values got (a call whose answer was lost, but which committed):
        each found from its vBucket's end of the log (a cas is this process's own, never given twice)."""
        rows = self.ref.db.read(
            "SELECT l.seqno FROM unnest(%b::int2[], %b::int8[]) WITH ORDINALITY AS w(vb, cas, ord) "
            "CROSS JOIN LATERAL (SELECT seqno FROM bucket_log WHERE bucket = %s AND vb = w.vb "
            "AND cas = w.cas ORDER BY seqno DESC LIMIT 1) l ORDER BY w.ord",
            (Int2s(vbs), Int8s(cas), self.ref.id),
        )
        return [seqno for (seqno,) in rows]

    def load_rows(self, rows: Sequence[tuple], arrival_ms: int | None) -> int:
        items = load_items(rows)
        placed = self.run(
            lambda cur, written: self.log_in(cur, written, items, None, arrival_ms), pipeline=True
        )
        return sum(1 for p in placed if p is not None)

    def expire_due(self, now_s: float | None) -> int:
        """Documents whose expiry has passed become expirations (on_delete with expired), in one
        transaction."""
        now = int(time.time() if now_s is None else now_s)

        def body(cur: Cursor, written: Written) -> int:
            due = (
                "SELECT key FROM bucket_docs WHERE bucket = %s AND expiry > 0 AND NOT deleted AND expiry <= "
                "%s"
            )
            candidates = [r[0] for r in cur.execute(due, (self.ref.id, now)).fetchall()]
            if not candidates:
                return 0
            # Read again under the locks of their vBuckets: a document deleted or touched meanwhile stays so.
            self.lock_heads(cur, map(vb_of, candidates))
            keys = [
                r[0]
                for r in cur.execute(
                    BY_KEYS.format(columns="d.key")
                    + " WHERE d.expiry > 0 AND NOT d.deleted AND d.expiry <= %s",
                    (candidates, self.ref.id, now),
                ).fetchall()
            ]
            self.log_in(
                cur,
                written,
                [(k, OP_EXPIRE, None, 0, 0, None) for k in keys],
                None,
                None,
                live=dict.fromkeys(keys, True),
                holds=NOTHING_KEPT,
            )
            return len(keys)

        return self.run(body)

    def change_documents(
        self,
        changes: Sequence[tuple[str, Callable[[StoredDocument | None], Write | None]]],
        origin: str | None,
    ) -> list[Changed | Exception]:
        """LocalBucket.change_documents: one transaction for all; each change sees the document as the earlier
        ones left it; a change that raises writes nothing and its exception takes its place."""

        def body(cur: Cursor, written: Written) -> list[Changed | Exception]:
            keys = {key for key, _ in changes if "\x00" not in key}
            (highs, lasts), state = self._lock_and_read(cur, keys)
            arrival = int(time.time() * 1000)
            now = arrival // 1000
            rows = Rows()
            out: list[Changed | Exception] = []
            for key, change in changes:
                try:
                    check_key(key)
                    write = change(state.get(key))
                    if write is not None:
                        check_key(write.key)
                except Exception as exc:  # this document's condition failed: the others go on
                    out.append(exc)
                    continue
                if write is None:
                    out.append(Changed(state.get(key)))
                    continue
                target = write.key
                vb = vb_of(target)
                if vb not in highs:  # a change that writes another key than its own
                    more_highs, more_lasts = self.lock_heads(cur, [vb])
                    highs.update(more_highs)
                    lasts.update(more_lasts)
                if target not in state and target not in keys:
                    state.update(self._live_docs_in(cur, {target}))
                    keys.add(target)
                if write.op != OP_UPDATE and state.get(target) is None:  # a delete of nothing
                    out.append(Changed(None))
                    continue
                cas = _reserve_cas(1) + 1
                seqno = highs[vb] = highs[vb] + 1
                doc = write.doc if write.op == OP_UPDATE else None
                rows.add(
                    vb, seqno, target, write.op, cas, doc, write.expiry, write.flags, max(arrival, lasts[vb])
                )
                xattrs = write.xattrs
                if xattrs is None:  # kept: the live, unexpired document's (as the earlier changes left it)
                    before = state.get(target)
                    xattrs = before.xattrs if before is not None and not 0 < before.expiry <= now else None
                elif xattrs == NO_XATTRS:
                    xattrs = None
                elif xattr_codec.has_macros(xattrs):  # the cas and seqno macros of a sub-document mutation
                    xattrs = xattr_codec.expand(xattrs, cas, seqno)
                if write.op == OP_UPDATE:
                    rows.set_xattrs(xattrs)
                after = (
                    StoredDocument(
                        target, write.doc or b"", cas, write.expiry, write.flags, vb, seqno, xattrs
                    )
                    if write.op == OP_UPDATE
                    else None
                )
                state[target] = after
                out.append(Changed(after, cas, vb, seqno))
            self.insert_in(cur, written, rows, origin)
            return out

        return self.run(body, pipeline=True)

    def _lock_and_read(
        self, cur: Cursor, keys: set[str]
    ) -> tuple[tuple[dict[int, int], dict[int, int]], dict[str, StoredDocument | None]]:
        """Lock the high seqnos of the keys' vBuckets, then read their live documents. The documents are read
        by a statement of their own, after the locks are held: a statement's snapshot is taken when it
        starts, so a document read by the locking statement itself could be the version from before a
        writer it waited for."""
        if not keys:
            return ({}, {}), {}
        locked = self.send_lock(cur, (vb_of(key) for key in keys))
        if len(keys) == 1:
            asked = send(cur, _DOCS_ONE, (self.ref.id, next(iter(keys))))
        else:
            asked = send(cur, _DOCS, (list(keys), self.ref.id))
        heads = self.heads_of(locked)  # in a pipeline: the locks and the documents in one round trip
        return heads, {row[0]: StoredDocument(*row) for row in asked.fetchall()}

    def _live_docs_in(self, cur: Cursor, keys: Iterable[str]) -> dict[str, StoredDocument | None]:
        wanted = list(keys)
        if not wanted:
            return {}
        rows: list[Any] = cur.execute(_DOCS, (wanted, self.ref.id)).fetchall()
        return {row[0]: StoredDocument(*row) for row in rows}
