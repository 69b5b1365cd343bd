"""Reads of a PostgreSQL bucket's mutation log (``LogReader``): the high seqnos, a vBucket's entries as rows,
as columns or packed in bulk, the same entries less those a function's prefilter rules out (the condition
run by the server, ``_matching_sql``), and scans of the whole log for verify, stats and rewind. The answers
are the bucket files' (eventing.storage.reads), value for value.

Every read is one statement on a pooled connection, its rows in binary (no text parsing of numbers or
documents), prepared once per connection. A vBucket's run is a range scan of the log's primary key
(bucket, vb, seqno), so a worker's read of 1,000 entries costs the server one index descent.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from eventing.core.filters import Prefilter
from eventing.core.keyspaces import COLLECTION_MARK
from eventing.core.mutation import OP_UPDATE, Mutation
from eventing.storage.origins import SEPARATOR
from eventing.storage.postgres.registry import BucketRef
from eventing.storage.postgres.schema import LOG_COLUMNS
from eventing.storage.values import PackedUpdates, Spans
from sharding import NUM_VBUCKETS

# The first key after every key of a named collection (eventing.storage.reads._AFTER_COLLECTIONS).
_AFTER_COLLECTIONS = chr(ord(COLLECTION_MARK) + 1)
_OWN = "(origin = %s OR starts_with(origin, %s))"  # written by a deployment of a function (origins.py)


def _own_params(function: str) -> tuple[str, str]:
    return function, function + SEPARATOR


def _prefilter_sql(prefilter: Prefilter) -> tuple[str, list]:
    """eventing.storage.reads._prefilter_sql for PostgreSQL: the key prefixes, then (an update with a
    document only) each clause's byte strings searched in the document."""
    terms: list[str] = ["true"]
    params: list[str | bytes] = []
    for prefix in prefilter.key_prefixes:
        terms.append("starts_with(key, %s)")
        params.append(prefix)
    if prefilter.needles:
        clauses = []
        for alternatives in prefilter.needles:
            clauses.append("(" + " OR ".join("position(%s::bytea IN doc) > 0" for _ in alternatives) + ")")
            params += [bytes(a) for a in alternatives]
        terms.append(f"(op <> {OP_UPDATE} OR doc IS NULL OR ({' AND '.join(clauses)}))")
    return " AND ".join(terms), params


@functools.lru_cache(maxsize=64)
def _matching_sql(prefilter: Prefilter, origin: str) -> tuple[str, tuple]:
    """read_vb_matching's condition on a log row (eventing.storage.reads._matching_sql): written by a
    deployment of function ``origin``, of a named collection, or not ruled out by ``prefilter``."""
    sql, params = _prefilter_sql(prefilter)
    condition = f"((origin IS NOT NULL AND {_OWN}) OR (key < %s AND key >= %s) OR ({sql}))"
    return condition, (*_own_params(origin), _AFTER_COLLECTIONS, COLLECTION_MARK, *params)


@functools.lru_cache(maxsize=64)
def _spans_sql(count: int) -> str:
    """The high seqnos of the vBuckets in ``count`` spans (the bucket's id, then each span's first and last
    vBucket): one row of two arrays, the vBuckets and their seqnos (a worker's look read 256 rows of two
    numbers each time; as two values the client loads them in one go). NULLs where no row matched."""
    ranges = " OR ".join(["vb BETWEEN %s AND %s"] * count)
    return f"SELECT array_agg(vb), array_agg(seqno) FROM bucket_high WHERE bucket = %s AND ({ranges})"


def spans_highs(row: tuple | None) -> list[int]:
    """``_spans_sql``'s answer as high seqnos (index = vBucket; 0 for the vBuckets it did not name)."""
    highs = [0] * NUM_VBUCKETS
    if row is not None and row[0] is not None:
        for vb, seqno in zip(row[0], row[1], strict=True):
            highs[vb] = seqno
    return highs


class LogReader:
    """Reads of one bucket's log."""

    def __init__(self, ref: BucketRef):
        self.ref = ref
        self.db = ref.db

    def rows(self, sql: str, args: Sequence[Any]) -> list[tuple]:
        """One statement's rows, in binary, prepared on the connection, retried while the server is away."""

        def fetch(conn: Any) -> list[tuple]:
            with conn.cursor(binary=True) as cur:
                return cur.execute(sql, args, prepare=True).fetchall()

        return self.db.run(fetch)

    def one(self, sql: str, args: Sequence[Any]) -> tuple:
        return self.rows(sql, args)[0]

    def aggregated(self, sql: str, args: Sequence[Any]) -> tuple | None:
        """``one`` for a statement that concatenates documents: None when the concatenation is over the
        server's limit of 1 GB a value (huge documents; the caller reads the rows then)."""
        import psycopg

        try:
            return self.one(sql, args)
        except psycopg.errors.ProgramLimitExceeded:
            return None

    # -- high seqnos ----------------------------------------------------------------------------------

    def high_seqnos(self, spans: Spans | None = None) -> list[int]:
        """High seqno of every vBucket (index = vBucket); with ``spans``, only those ranges are read and the
        others answer 0. One row of 1,024 numbers (an array: one value to load rather than 1,024 rows)."""
        if spans is None:
            got = self.one(
                "SELECT array_agg(seqno ORDER BY vb) FROM bucket_high WHERE bucket = %s", (self.ref.id,)
            )[0]
            if got is None:
                raise self.ref.gone()
            return list(got)
        if not spans:
            return [0] * NUM_VBUCKETS
        return spans_highs(
            self.one(_spans_sql(len(spans)), (self.ref.id, *(v for span in spans for v in span)))
        )

    # -- a vBucket's entries --------------------------------------------------------------------------

    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]:
        """Entries of one vBucket with seqno > after_seqno, in seqno order, at most ``limit``, as tuples in
        Mutation's field order."""
        if limit <= 0:
            return []
        return self.rows(
            f"SELECT {LOG_COLUMNS} FROM bucket_log WHERE bucket = %s AND vb = %s AND seqno > %s "
            "ORDER BY seqno LIMIT %s",
            (self.ref.id, vb, after_seqno, limit),
        )

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]:
        return list(map(Mutation._make, self.read_vb_rows(vb, after_seqno, limit)))

    def read_vb_matching(
        self, vb: int, after_seqno: int, limit: int, upto: int, prefilter: Prefilter, origin: str
    ) -> tuple[list[tuple], int, int]:
        """LocalBucket.read_vb_matching: the next ``limit`` entries after ``after_seqno`` (none past ``upto``)
        less those ``prefilter`` rules out (checked by the server on the key and the document's bytes);
        (rows, how many entries the range held, its last seqno)."""
        last = min(upto, after_seqno + limit)
        if last <= after_seqno:
            return [], 0, after_seqno
        keep, params = _matching_sql(prefilter, origin)
        base = (
            f"SELECT {LOG_COLUMNS} FROM bucket_log WHERE bucket = %s AND vb = %s AND seqno > %s AND seqno <= "
            "%s"
        )
        rows = self.rows(
            f"{base} AND (seqno = %s OR {keep}) ORDER BY seqno",
            (self.ref.id, vb, after_seqno, last, last, *params),
        )
        if rows and rows[-1][1] == last:
            return rows, last - after_seqno, last
        scanned, found_last = self.one(
            "SELECT count(*), max(seqno) FROM (SELECT seqno FROM bucket_log WHERE bucket = %s AND vb = %s "
            "AND seqno > %s AND seqno <= %s ORDER BY seqno LIMIT %s) s",
            (self.ref.id, vb, after_seqno, upto, limit),
        )
        if not scanned:
            return [], 0, after_seqno
        rows = self.rows(
            f"{base} AND {keep} ORDER BY seqno", (self.ref.id, vb, after_seqno, found_last, *params)
        )
        return rows, int(scanned), int(found_last)

    def read_vb_columns(self, vb: int, after_seqno: int, limit: int) -> tuple | None:
        """LocalBucket.read_vb_columns: ``(count, last_seqno, ops, keys, docs, doc_lengths, cas, arrivals)``
        aggregated by the server, or None when the entries are not the plain case."""
        row = self.aggregated(
            "SELECT count(*), max(seqno), bool_or(origin IS NOT NULL OR expiry <> 0 OR flags <> 0 OR xattrs "
            "IS NOT NULL), string_agg(CASE WHEN op <> 0 THEN seqno || ':' || op END, ',' ORDER BY seqno), "
            "string_agg(convert_to(key, 'UTF8'), '\\x00'::bytea ORDER BY seqno), "
            "string_agg(doc, ''::bytea ORDER BY seqno), "
            "string_agg(coalesce(length(doc), -1)::text, ',' ORDER BY seqno), "
            "string_agg(cas::text, ',' ORDER BY seqno), string_agg(arrival_ms::text, ',' ORDER BY seqno) "
            "FROM bucket_log WHERE bucket = %s AND vb = %s AND seqno > %s AND seqno <= %s",
            (self.ref.id, vb, after_seqno, after_seqno + limit),
        )
        if row is None:
            return None
        count, last, odd, ops, keys, docs, lengths, cas, arrivals = row
        if not count or odd or last - after_seqno != count:
            return None
        return count, last, ops, bytes(keys), bytes(docs or b""), lengths, cas, arrivals

    def read_vb_packed(
        self, vb: int, after_seqno: int, limit: int, origin: str, *, exact_arrivals_over_ms: int | None = None
    ) -> PackedUpdates | None:
        """LocalBucket.read_vb_packed: the updates' keys and documents concatenated by the server (None, as
        there, for entries of this function's or with extended attributes)."""
        row = self.aggregated(
            f"SELECT count(*), max(seqno), count(doc), bool_or({_OWN} OR xattrs IS NOT NULL), "
            "string_agg(CASE WHEN op <> 0 THEN seqno::text END, ',' ORDER BY seqno), "
            "string_agg(CASE WHEN op = 0 THEN convert_to(key, 'UTF8') END, '\\x00'::bytea ORDER BY seqno), "
            "string_agg(doc, ''::bytea ORDER BY seqno), "
            "min(arrival_ms) FILTER (WHERE op = 0), max(arrival_ms) FILTER (WHERE op = 0) "
            "FROM bucket_log WHERE bucket = %s AND vb = %s AND seqno > %s AND seqno <= %s",
            (*_own_params(origin), self.ref.id, vb, after_seqno, after_seqno + limit),
        )
        if row is None:
            return None
        count, last, docs_count, own, others, keys, docs, first_arrival, last_arrival = row
        if not count or last - after_seqno != count or own:
            return None
        other_seqnos = [int(s) for s in others.split(",")] if others else []
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
                for r in self.rows(
                    "SELECT arrival_ms FROM bucket_log WHERE bucket = %s AND vb = %s AND seqno > %s AND "
                    "seqno <= %s AND op = %s ORDER BY seqno",
                    (self.ref.id, vb, after_seqno, last, OP_UPDATE),
                )
            ]
        return PackedUpdates(
            vb,
            after_seqno,
            last,
            other_seqnos,
            docs_count,
            bytes(keys or b""),
            bytes(docs or b""),
            first_arrival or 0,
            last_arrival or 0,
            arrivals,
        )

    def first_arrival_after(self, positions: dict[int, int]) -> int | None:
        """The earliest arrival time of the entries after ``positions[vb]`` in each given vBucket (the first
        entry of each has its vBucket's earliest: arrival times never go backwards), one statement."""
        if not positions:
            return None
        vbs = list(positions)
        return self.one(
            "SELECT min(x.arrival_ms) FROM unnest(%s::int2[], %s::int8[]) AS p(vb, after_seqno) "
            "CROSS JOIN LATERAL (SELECT arrival_ms FROM bucket_log l WHERE l.bucket = %s AND l.vb = p.vb "
            "AND l.seqno > p.after_seqno ORDER BY l.seqno LIMIT 1) x",
            (vbs, [positions[vb] for vb in vbs], self.ref.id),
        )[0]

    def max_doc_bytes(self, vb: int, after_seqno: int, last_seqno: int) -> int:
        got = self.one(
            "SELECT max(length(doc)) FROM bucket_log WHERE bucket = %s AND vb = %s AND seqno > %s AND seqno "
            "<= %s",
            (self.ref.id, vb, after_seqno, last_seqno),
        )[0]
        return int(got or 0)

    # -- the whole log --------------------------------------------------------------------------------

    def _pages(self, columns: str, batch: int) -> Iterable[list[tuple]]:
        """The whole log in (vb, seqno) order, ``batch`` rows a statement (keyset paging on the primary
        key)."""
        last = (-1, 0)
        while True:
            rows = self.rows(
                f"SELECT {columns} FROM bucket_log WHERE (bucket, vb, seqno) > (%s, %s, %s) AND bucket = %s "
                "ORDER BY bucket, vb, seqno LIMIT %s",
                (self.ref.id, *last, self.ref.id, batch),
            )
            if not rows:
                return
            yield rows
            last = (rows[-1][0], rows[-1][1])

    def scan_log(self, batch: int = 10_000) -> Iterable[list[Mutation]]:
        for rows in self._pages(LOG_COLUMNS, batch):
            yield list(map(Mutation._make, rows))

    def log_index(self, batch: int = 50_000) -> Iterable[list[tuple[int, int, str, str | None]]]:
        yield from self._pages("vb, seqno, key, origin", batch)

    def logged_writes(self, prefix: str) -> dict[str, int]:
        """How many upserts of each key starting with ``prefix`` the log holds."""
        return dict(
            self.rows(
                "SELECT key, count(*) FROM bucket_log WHERE bucket = %s AND op = %s AND starts_with(key, %s) "
                "GROUP BY key",
                (self.ref.id, OP_UPDATE, prefix),
            )
        )

    def seqnos_before(self, time_ns: int) -> dict[int, int]:
        """Per vBucket with an entry that arrived at or after ``time_ns``: the seqno right before the
        first."""
        return dict(
            self.rows(
                "SELECT vb, min(seqno) - 1 FROM bucket_log WHERE bucket = %s AND arrival_ms >= %s GROUP BY "
                "vb",
                (self.ref.id, time_ns // 1_000_000),
            )
        )

    def counts(self) -> tuple[int, int, int, int]:
        """(live documents, tombstones, mutations, vBuckets with data) for stats and flush."""
        docs, deleted = self.one(
            "SELECT count(*) FILTER (WHERE NOT deleted), count(*) FILTER (WHERE deleted) FROM bucket_docs "
            "WHERE bucket = %s",
            (self.ref.id,),
        )
        mutations, with_data = self.one(
            "SELECT coalesce(sum(seqno), 0), count(*) FILTER (WHERE seqno > 0) FROM bucket_high WHERE bucket "
            "= %s",
            (self.ref.id,),
        )
        return int(docs), int(deleted), int(mutations), int(with_data)
