"""The reads of a local bucket (``FileReader``, a collaborator of ``LocalBucket``): documents by key and in
key order, the high seqnos (cached until a commit), a vBucket's log entries as rows, as columns or packed
in bulk for the data service and the window fast path, the same entries less those a function's prefilter
rules out (with the SQL that applies it, ``_prefilter_sql``), and scans of the whole log for verify, stats
and rewinds. SQLite's errors on every read are one line naming the file (``maps_file_errors``).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Iterator

from eventing.core.filters import Prefilter
from eventing.core.keyspaces import COLLECTION_MARK
from eventing.core.mutation import OP_UPDATE, Mutation, decode_document
from eventing.storage.bucket_file import BucketFile
from eventing.storage.file_health import maps_file_errors
from eventing.storage.files import _LOG_COLUMNS, _retry_locked
from eventing.storage.origins import of_function_params, of_function_sql
from eventing.storage.values import PackedUpdates, Spans
from sharding import NUM_VBUCKETS


def _prefilter_sql(prefilter: Prefilter) -> tuple[str, list]:
    """A Prefilter as an SQL condition on a log row and its parameters. The op and the document's presence
    are tested before the byte search, so a delete never reaches it."""
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


# The first key after every key of a named collection (those start with COLLECTION_MARK): comparing the key
# with both ends costs less per row than a substr() call, and a key of the default collection fails the
# first comparison.
_AFTER_COLLECTIONS = chr(ord(COLLECTION_MARK) + 1)


@functools.lru_cache(maxsize=64)
def _matching_sql(prefilter: Prefilter, origin: str) -> tuple[str, tuple]:
    """read_vb_matching's condition on a log row (true: the row is returned) and its parameters: written
    by a deployment of function ``origin`` (tested only when the row has an origin: most have none), of a
    named collection, or not ruled out by ``prefilter``. Every rejected row is tested on all three, so each
    test is the cheapest SQLite has for it."""
    sql, params = _prefilter_sql(prefilter)
    condition = f"((origin IS NOT NULL AND {of_function_sql()}) OR (key < ? AND key >= ?) OR ({sql}))"
    return condition, (*of_function_params(origin), _AFTER_COLLECTIONS, COLLECTION_MARK, *params)


def meta_of(row: tuple) -> dict:
    """get_meta's answer from (vb, seqno, cas, expiry, flags, xattrs)."""
    meta = dict(zip(("vb", "seqno", "cas", "expiry", "flags"), row, strict=False))
    if row[5] is not None:
        meta["xattrs"] = row[5]
    return meta


def scanned(rows: Iterable[tuple]) -> Iterator[tuple[str, dict, dict]]:
    """scan's (key, document, meta) from live_docs's rows with documents; meta has vb, seqno, cas, expiry
    and flags, and the document's extended attributes (``xattrs``, as get_meta's) when it has any."""
    for key, vb, seqno, cas, expiry, flags, raw, xattrs in rows:
        meta = {"vb": vb, "seqno": seqno, "cas": cas, "expiry": expiry, "flags": flags}
        if xattrs is not None:
            meta["xattrs"] = xattrs
        yield key, decode_document(raw), meta


class FileReader:
    """Reads of one bucket file. A collaborator of LocalBucket (eventing.storage.bucket)."""

    def __init__(self, file: BucketFile):
        self.file = file

    def get(self, key: str) -> dict | None:
        raw = self.get_raw(key)
        return None if raw is None else decode_document(raw)

    @maps_file_errors
    def get_raw(self, key: str) -> bytes | None:
        row = self.file.db.execute("SELECT doc FROM docs WHERE key=? AND deleted=0", (key,)).fetchone()
        return None if row is None else row[0]

    @maps_file_errors
    def get_doc(self, key: str) -> tuple[bytes, int, int] | None:
        """(document bytes, cas, expiry) of a live document, else None."""
        row = self.file.db.execute(
            "SELECT doc, cas, expiry FROM docs WHERE key=? AND deleted=0", (key,)
        ).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def ensure_key_index(self) -> None:
        """Index the log by key, for previous_doc (functions with previous_version). Each logged write then
        also updates this index; see docs/handler-api.md for the measured cost."""
        db = self.file.db
        _retry_locked(
            self.file.path, lambda: db.execute("CREATE INDEX IF NOT EXISTS log_key ON log(key, seqno)")
        )

    @maps_file_errors
    def previous_doc(self, key: str, before_seqno: int) -> bytes | None:
        """The document bytes of `key`'s newest log entry below `before_seqno` (None: none, or a delete)."""
        row = self.file.db.execute(
            "SELECT doc FROM log WHERE key=? AND seqno<? ORDER BY seqno DESC LIMIT 1", (key, before_seqno)
        ).fetchone()
        return None if row is None else row[0]

    @maps_file_errors
    def get_meta(self, key: str) -> dict | None:
        """vb, seqno, cas, expiry and flags of a live document, and its extended attributes (``xattrs``,
        eventing.core.xattrs) when it has any."""
        row = self.file.db.execute(
            "SELECT vb, seqno, cas, expiry, flags, xattrs FROM docs WHERE key=? AND deleted=0", (key,)
        ).fetchone()
        return None if row is None else meta_of(row)

    @maps_file_errors
    def high_seqnos(self, spans: Spans | None = None) -> list[int]:
        """High seqno of every vBucket, index = vBucket. Workers ask at every step; the table is read
        again only when a commit happened since (SQLite's data_version, a few microseconds to check).
        ``spans``: only these (first, last) vBucket ranges are read, the others answer 0; a worker reads
        its own (a quarter of the table for one of four workers: under a steady trickle of writes the
        table changes between any two steps, and reading all of it was a third of a caught-up step)."""
        file = self.file
        db = file.db
        # Taken before reading: a commit that lands during the read changes it, so the next call reads again.
        read_at = (db.execute("PRAGMA data_version").fetchone()[0], file.commits, spans)
        if read_at != file.highs_read_at:
            highs = [0] * NUM_VBUCKETS
            if spans is None:
                for vb, seqno in db.execute("SELECT vb, seqno FROM high"):
                    highs[vb] = seqno
            else:
                for first, last in spans:
                    for vb, seqno in db.execute(
                        "SELECT vb, seqno FROM high WHERE vb BETWEEN ? AND ?", (first, last)
                    ):
                        highs[vb] = seqno
            file.highs, file.highs_read_at = highs, read_at
        return list(file.highs)

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]:
        """Mutations of one vBucket with seqno > after_seqno, in seqno order, at most `limit`."""
        return [Mutation(*r) for r in self.read_vb_rows(vb, after_seqno, limit)]

    @maps_file_errors
    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]:
        """read_vb's rows as plain tuples in Mutation's field order (what the data service ships)."""
        return self.file.db.execute(
            f"SELECT {_LOG_COLUMNS} FROM log WHERE vb=? AND seqno>? ORDER BY seqno LIMIT ?",
            (vb, after_seqno, limit),
        ).fetchall()

    def read_vb_matching(
        self, vb: int, after_seqno: int, limit: int, upto: int, prefilter: Prefilter, origin: str
    ) -> tuple[list[tuple], int, int]:
        """The next ``limit`` log entries of one vBucket after ``after_seqno`` (none past ``upto``) less the
        ones ``prefilter`` rules out (eventing.core.filters.Prefilter, checked by SQLite on the key and the
        document's bytes: those rows never become Python objects). Entries written by any deployment of
        function ``origin`` (the worker's recursion guard decides on them, eventing.storage.origins) and
        entries of named collections are always returned, and so may be an entry the prefilter rules out
        (the range's last): the caller's exact filter decides on every row returned. Returns (rows in seqno
        order, how many entries the range held, its last seqno).

        One scan of the range: a vBucket's seqnos are consecutive (each write takes its high seqno + 1,
        eventing.storage.writes), so the next ``limit`` entries are the seqnos up to ``after_seqno + limit``
        and the range holds as many as its seqnos span. Its last entry is always returned, as the check:
        without it (a log emptied by a flush since ``upto`` was read) the range is counted by a second
        query, as the entries are wherever they do not follow each other."""
        last = min(upto, after_seqno + limit)
        if last <= after_seqno:
            return [], 0, after_seqno
        keep, params = _matching_sql(prefilter, origin)
        rows = self.file.db.execute(
            f"SELECT {_LOG_COLUMNS} FROM log WHERE vb = ? AND seqno > ? AND seqno <= ? AND (seqno = ? OR "
            f"{keep}) ORDER BY seqno",
            (vb, after_seqno, last, last, *params),
        ).fetchall()
        if rows and rows[-1][1] == last:
            return rows, last - after_seqno, last
        scanned, last = self.file.db.execute(
            "SELECT count(*), max(seqno) FROM (SELECT seqno FROM log WHERE vb = ?1 AND seqno > ?2 AND seqno "
            "<= ?3 ORDER BY seqno LIMIT ?4)",
            (vb, after_seqno, upto, limit),
        ).fetchone()
        if not scanned:
            return [], 0, after_seqno
        rows = self.file.db.execute(
            f"SELECT {_LOG_COLUMNS} FROM log WHERE vb = ? AND seqno > ? AND seqno <= ? AND {keep} ORDER BY "
            "seqno",
            (vb, after_seqno, last, *params),
        ).fetchall()
        return rows, scanned, last

    @maps_file_errors
    def read_vb_columns(self, vb: int, after_seqno: int, limit: int) -> tuple | None:
        """read_vb_rows's answer column by column, concatenated by SQLite (no Python object per entry: about
        half the cost of fetching the rows), for the data service to ship: ``(count, last_seqno, ops, keys,
        docs, doc_lengths, cas, arrivals)`` where ``ops`` lists the entries that are not updates as
        "seqno:op" (None when all are), keys are joined by NUL bytes, documents are back to back with their
        lengths (-1: no document) and the numbers are comma-separated text. None when the entries are not
        that plain case (a gap in the seqnos, an origin, an expiry, flags or extended attributes): read the
        rows then."""
        try:
            row = self.file.db.execute(
                "SELECT count(*), max(seqno), max(origin IS NOT NULL OR expiry != 0 OR flags != 0 OR xattrs "
                "IS NOT NULL), group_concat(CASE WHEN op != 0 THEN seqno || ':' || op END), "
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

    @maps_file_errors
    def read_vb_packed(
        self, vb: int, after_seqno: int, limit: int, origin: str, *, exact_arrivals_over_ms: int | None = None
    ) -> PackedUpdates | None:
        """The next ``limit`` log entries of one vBucket after ``after_seqno`` for a caller that wants the
        updates' documents and keys in bulk: SQLite concatenates them, so no Python object is made per
        entry (about half the cost of fetching the rows). None when the entries are not the plain case
        the caller can take whole: no entries, a gap in the seqnos, an entry written by a deployment of
        function ``origin`` (eventing.storage.origins), an
        update without a document or a delete with one, an entry with extended attributes; read them with
        read_vb then.

        The updates' arrival times come as their least and greatest; each one is read as well (a second
        query, about as costly as the first) only when they spread over ``exact_arrivals_over_ms`` or more."""
        try:
            row = self.file.db.execute(
                "SELECT count(*), max(seqno), count(doc), max(origin), count(xattrs), "
                "CAST(group_concat(CASE WHEN op = 0 THEN key END, char(0)) AS BLOB), "
                "CAST(group_concat(doc, '') AS BLOB), "
                "min(CASE WHEN op = 0 THEN arrival_ms END), max(CASE WHEN op = 0 THEN arrival_ms END), "
                # The deletes and expiries as "seqno,op,key", joined by NUL bytes: one CASE a row, not three.
                "CAST(group_concat(CASE WHEN op != 0 THEN seqno || ',' || op || ',' || key END, char(0)) "
                "AS BLOB) "
                # A range scan of the primary key feeds the aggregates in (vb, seqno) order. (Before SQLite
                # 3.44 group_concat takes no ORDER BY; a sorted subquery would cost a third more.)
                "FROM log WHERE vb = ?1 AND seqno > ?2 AND seqno <= ?3",
                (vb, after_seqno, after_seqno + limit),
            ).fetchone()
        except sqlite3.DataError:  # the concatenation is over SQLite's length limit (huge documents)
            return None
        count, last, docs_count, any_origin, with_xattrs, keys, docs, first_arrival, last_arrival, others = (
            row
        )
        if not count or last - after_seqno != count or with_xattrs:
            return None
        # Entries written by bindings carry an origin: only then is it looked at whether they are this
        # function's (a second, rarer query; most sources hold none).
        if (
            any_origin is not None
            and self.file.db.execute(
                "SELECT 1 FROM log WHERE vb = ?1 AND seqno > ?2 AND seqno <= ?3 "
                "AND (origin = ?4 OR substr(origin, 1, ?5) = ?6) LIMIT 1",
                (vb, after_seqno, last, *of_function_params(origin)),
            ).fetchone()
        ):
            return None
        other_seqnos: list[int] = []
        other_keys: list[str] = []
        other_ops: list[int] = []
        if others:
            for entry in others.decode().split("\0"):
                seqno, op, key = entry.split(",", 2)
                other_seqnos.append(int(seqno))
                other_ops.append(int(op))
                other_keys.append(key)
        if docs_count != count - len(other_seqnos):
            return None
        arrivals = None
        if (
            docs_count
            and exact_arrivals_over_ms is not None
            and last_arrival - first_arrival >= exact_arrivals_over_ms
        ):
            arrivals = [
                r[0]
                for r in self.file.db.execute(
                    "SELECT arrival_ms FROM log WHERE vb=? AND seqno>? AND seqno<=? AND op=? ORDER BY seqno",
                    (vb, after_seqno, last, OP_UPDATE),
                )
            ]
        return PackedUpdates(
            vb,
            after_seqno,
            last,
            other_seqnos,
            docs_count,
            keys or b"",
            docs or b"",
            first_arrival or 0,
            last_arrival or 0,
            arrivals,
            "\0".join(other_keys).encode(),
            other_ops or None,
        )

    @maps_file_errors
    def first_arrival_after(self, positions: dict[int, int]) -> int | None:
        """The earliest arrival time (epoch ms) of the log entries after ``positions[vb]`` in each given
        vBucket, or None when there are none: what a reader at those positions has still to read."""
        earliest: int | None = None
        for vb, after in positions.items():
            # Arrival times never go backwards within a vBucket: the first entry has the earliest.
            row = self.file.db.execute(
                "SELECT arrival_ms FROM log WHERE vb=? AND seqno>? ORDER BY seqno LIMIT 1", (vb, after)
            ).fetchone()
            if row is not None and (earliest is None or row[0] < earliest):
                earliest = row[0]
        return earliest

    @maps_file_errors
    def max_doc_bytes(self, vb: int, after_seqno: int, last_seqno: int) -> int:
        """Size of the largest document logged in one vBucket in ``(after_seqno, last_seqno]``."""
        row = self.file.db.execute(
            "SELECT max(length(doc)) FROM log WHERE vb=? AND seqno>? AND seqno<=?",
            (vb, after_seqno, last_seqno),
        ).fetchone()
        return row[0] or 0

    @maps_file_errors
    def seqnos_before(self, time_ns: int) -> dict[int, int]:
        """Per vBucket with a mutation logged at or after `time_ns`: the seqno right before the first such
        mutation. The time of a mutation is its arrival_ms where the log has that column, else its cas,
        the wall-clock time of its write in nanoseconds (see eventing.storage.writes._reserve_cas)."""
        db = self.file.db
        column, value = "cas", max(-(2**63), min(time_ns, 2**63 - 1))  # SQLite integers are 64-bit
        if "arrival_ms" in {r[1] for r in db.execute("PRAGMA table_info(log)")}:
            column, value = (
                "arrival_ms",
                time_ns // 1_000_000,
            )  # the log's own arrival time, where it keeps one
        rows = db.execute(f"SELECT vb, MIN(seqno) - 1 FROM log WHERE {column} >= ? GROUP BY vb", (value,))
        return dict(rows.fetchall())

    @maps_file_errors
    def scan_log(self, batch: int = 10_000) -> Iterable[list[Mutation]]:
        """The whole log in (vb, seqno) order, in batches."""
        last = (-1, 0)
        while True:
            rows = self.file.db.execute(
                f"SELECT {_LOG_COLUMNS} FROM log WHERE (vb, seqno) > (?, ?) ORDER BY vb, seqno LIMIT ?",
                (*last, batch),
            ).fetchall()
            if not rows:
                return
            yield [Mutation(*r) for r in rows]
            last = (rows[-1][0], rows[-1][1])

    @maps_file_errors
    def log_index(self, batch: int = 50_000) -> Iterable[list[tuple[int, int, str, str | None]]]:
        """(vb, seqno, key, origin) of the whole log in (vb, seqno) order, in batches, without documents."""
        last = (-1, 0)
        while True:
            rows = self.file.db.execute(
                "SELECT vb, seqno, key, origin FROM log WHERE (vb, seqno) > (?, ?) ORDER BY vb, seqno LIMIT "
                "?",
                (*last, batch),
            ).fetchall()
            if not rows:
                return
            yield rows
            last = (rows[-1][0], rows[-1][1])

    @maps_file_errors
    def logged_writes(self, prefix: str) -> dict[str, int]:
        """How many upserts of each key starting with `prefix` the log holds (every version is kept)."""
        rows = self.file.db.execute(
            "SELECT key, COUNT(*) FROM log WHERE op=? AND substr(key, 1, ?)=? GROUP BY key",
            (OP_UPDATE, len(prefix), prefix),
        )
        return dict(rows.fetchall())

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """Keys of live documents in key order, those starting with `prefix`, at most `limit`."""
        return [key for key, *_ in self.live_docs(prefix, limit, with_docs=False)]

    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]:
        """(key, document, meta) of live documents in key order (see ``scanned``)."""
        return scanned(self.live_docs(prefix, limit, with_docs=True))

    @maps_file_errors
    def live_docs(
        self, prefix: str, limit: int | None, *, with_docs: bool, batch: int = 1000
    ) -> Iterator[tuple]:
        """Live documents in key order, read in batches (keyset paging, so a large bucket streams)."""
        columns = "key, vb, seqno, cas, expiry, flags" + (", doc, xattrs" if with_docs else "")
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
            rows = self.file.db.execute(
                f"SELECT {columns} FROM docs WHERE {' AND '.join(clauses)} ORDER BY key LIMIT ?",
                (*args, take),
            ).fetchall()
            yield from rows
            if len(rows) < take:
                return
            after = rows[-1][0]
            if left is not None:
                left -= len(rows)

    @maps_file_errors
    def count(self, prefix: str = "") -> int:
        """Live documents (deleted and expired-then-deleted ones are tombstones, not counted), those whose
        key starts with `prefix`."""
        if prefix:
            return self.file.db.execute(
                "SELECT COUNT(*) FROM docs WHERE deleted=0 AND key >= ? AND substr(key, 1, ?) = ?",
                (prefix, len(prefix), prefix),
            ).fetchone()[0]
        return self.file.db.execute("SELECT COUNT(*) FROM docs WHERE deleted=0").fetchone()[0]
