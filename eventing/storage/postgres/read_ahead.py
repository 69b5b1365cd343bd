"""Reading a PostgreSQL bucket's log ahead of need (``ReadAhead``, held by each ``PostgresBucket``).

A worker whose source is a server's bucket looks at its vBuckets with one round trip: ``look`` sends, in one
pipeline, the high seqnos of the owned vBuckets and the next rows of every one of them that has any (each
vBucket's run a range scan of the log's primary key, up to LOOK_AHEAD_ROWS rows in all, in the order the
worker will take them), and ``read_vb_rows`` then takes the rows from the front of each vBucket's run
without a round trip. Before, a look was the high seqnos, then one statement per vBucket with work: a
caught-up worker woken for a few writes made a round trip for each vBucket they were in, and a worker that
was behind one per batch.

The rows of a run never change once written (the log only grows, and a vBucket's seqnos below its high
seqno are all committed: a writer logs them and moves the high seqno in one transaction), so the rows that
follow seqno ``after`` are what a plain read would answer; a read that does not start where the rows read
ahead start is made on the spot (a wrong guess costs a round trip, never a wrong answer), and rows read
ahead that no longer follow the worker's positions (a rewind, a vBucket that left) are dropped at the next
look. The rows statement runs after the high seqnos' (a pipeline's statements run in order, each with a
snapshot of its own), so it may find rows past those high seqnos: they stay for the next batch.
"""

from __future__ import annotations

import os
from itertools import groupby
from operator import itemgetter
from typing import Any

from eventing.storage.postgres.log_reader import _spans_sql, spans_highs
from eventing.storage.postgres.registry import BucketRef
from eventing.storage.postgres.schema import LOG_COLUMNS
from eventing.storage.values import Spans
from metadata.postgres.arrays import Int2s, Int8s
from sharding import NUM_VBUCKETS, vbucket_spans

# Rows held read ahead per worker at most (about 200 bytes each for small documents); a look reads more only
# once fewer than half are left, so a worker that is behind reads in statements of thousands of rows.
LOOK_AHEAD_ROWS = int(os.environ.get("EVENTING_PG_READ_AHEAD", "32000"))

# The next rows of each vBucket of the runs that has any: the runs in the caller's order (ordinality), each
# vBucket's high seqno from bucket_high (vBuckets with nothing new cost a row there, none in the log; the
# range of the runs' vBuckets keeps that a range of the bucket's own rows, whatever the plan and however
# many buckets the store holds), at most `lim` rows a vBucket and, over the runs in order, no run started
# past `total` rows.
_RUNS = f"""
WITH p AS (
    SELECT p.vb, p.after, p.ord, least(h.seqno - p.after, p.lim) AS n
    FROM unnest(%b::int2[], %b::int8[], %b::int8[]) WITH ORDINALITY AS p(vb, after, lim, ord)
    JOIN bucket_high h ON h.bucket = %s AND h.vb = p.vb
    WHERE h.seqno > p.after AND h.vb BETWEEN %s AND %s
), q AS (
    SELECT vb, after, n, sum(n) OVER (ORDER BY ord) - n AS before FROM p
)
SELECT l.* FROM q CROSS JOIN LATERAL (
    SELECT {LOG_COLUMNS} FROM bucket_log WHERE bucket = %s AND vb = q.vb AND seqno > q.after ORDER BY seqno LIMIT q.n
) l WHERE q.before < %s
"""  # noqa: E501

# A partial look (a few vBuckets a notification named) in one statement: each vBucket asked once with its
# high seqno (NULL log columns where it has no new row, or where its rows are held already: `lim` 0), then
# its next rows as _RUNS reads them. One statement where the high seqnos were a second one in a pipeline.
_ANNOUNCED = f"""
WITH p AS (
    SELECT p.vb, p.after, p.ord, h.seqno AS high, greatest(least(h.seqno - p.after, p.lim), 0) AS n
    FROM unnest(%b::int2[], %b::int8[], %b::int8[]) WITH ORDINALITY AS p(vb, after, lim, ord)
    JOIN bucket_high h ON h.bucket = %s AND h.vb = p.vb
    WHERE h.vb BETWEEN %s AND %s
), q AS (
    SELECT vb, after, n, high, ord, sum(n) OVER (ORDER BY ord) - n AS before FROM p
)
SELECT q.vb, q.high, l.* FROM q LEFT JOIN LATERAL (
    SELECT {LOG_COLUMNS} FROM bucket_log WHERE bucket = %s AND vb = q.vb AND seqno > q.after AND q.before < %s
    ORDER BY seqno LIMIT q.n
) l ON true ORDER BY q.ord, l.seqno
"""  # noqa: E501

_vb_of = itemgetter(0)


class _Run:
    """Rows of one vBucket read ahead: ``rows[i:]`` follow seqno ``after``; ``complete`` when the read took
    fewer than it asked for (the vBucket had no more then)."""

    __slots__ = ("after", "rows", "i", "complete")

    def __init__(self, after: int, rows: list[tuple], complete: bool):
        self.after, self.rows, self.i, self.complete = after, rows, 0, complete


class ReadAhead:
    """One bucket object's rows read ahead and the high seqnos read with them (one worker's: not shared
    between threads)."""

    def __init__(self, ref: BucketRef):
        self.ref = ref
        self.runs: dict[int, _Run] = {}
        self.highs: list[int] | None = None  # read by the last look, until taken
        self._spans: tuple[tuple[int, ...], Spans] = ((), ())
        self.looks = 0  # statements of rows sent (for tests and figures)

    def held(self) -> int:
        return sum(len(r.rows) - r.i for r in self.runs.values())

    def forget(self, positions: dict[int, int]) -> None:
        for vb in [vb for vb, run in self.runs.items() if positions.get(vb) != run.after]:
            del self.runs[vb]

    def has(self, vb: int) -> bool:
        return vb in self.runs

    def look(self, wanted: list[tuple[int, int, int]], *, partial: bool = False) -> None:
        """The high seqnos of the runs' vBuckets and, while fewer than half of LOOK_AHEAD_ROWS are held, the
        next rows of the runs (vb, after_seqno, limit) not held already, in their order: one round trip.
        ``partial``: the runs are a few of the worker's vBuckets (those a notification named), looked at in
        one statement; the rows held for the others are kept."""
        asked = {vb: after for vb, after, _ in wanted}
        if partial:
            for vb in [vb for vb in asked if vb in self.runs and self.runs[vb].after != asked[vb]]:
                del self.runs[vb]
        else:
            self.forget(asked)
        held = self.held()
        runs = (
            [r for r in wanted if r[2] > 0 and r[0] not in self.runs] if held < LOOK_AHEAD_ROWS // 2 else []
        )
        if partial:
            self._look_announced(wanted, runs, held)
            return
        vbs = tuple(asked)
        if self._spans[0] != vbs:
            self._spans = (vbs, vbucket_spans(vbs))
        spans = self._spans[1]
        bucket = self.ref.id

        def fetch(conn: Any) -> tuple[tuple | None, list[tuple]]:
            with conn.pipeline():
                highs = conn.cursor(binary=True)
                if spans:
                    highs.execute(
                        _spans_sql(len(spans)), (bucket, *(v for span in spans for v in span)), prepare=True
                    )
                rows = conn.cursor(binary=True)
                if runs:
                    vbs_asked = [r[0] for r in runs]
                    rows.execute(
                        _RUNS,
                        (
                            Int2s(vbs_asked),
                            Int8s([r[1] for r in runs]),
                            Int8s([r[2] for r in runs]),
                            bucket,
                            min(vbs_asked),
                            max(vbs_asked),
                            bucket,
                            LOOK_AHEAD_ROWS - held,
                        ),
                        prepare=True,
                    )
                return (highs.fetchone() if spans else None), (rows.fetchall() if runs else [])

        high_row, rows = self.ref.db.run(fetch)
        self.highs = spans_highs(high_row)
        if runs:
            self.looks += 1
            self._keep(runs, rows)

    def _look_announced(
        self, wanted: list[tuple[int, int, int]], runs: list[tuple[int, int, int]], held: int
    ) -> None:
        """A partial look in one statement (_ANNOUNCED): the high seqnos of every vBucket asked, and the next
        rows of the runs not held already."""
        if not wanted:
            self.highs = spans_highs(None)
            return
        reading = {vb for vb, _, _ in runs}
        vbs = [vb for vb, _, _ in wanted]
        args = (
            Int2s(vbs),
            Int8s([after for _, after, _ in wanted]),
            Int8s([limit if vb in reading else 0 for vb, _, limit in wanted]),
            self.ref.id,
            min(vbs),
            max(vbs),
            self.ref.id,
            LOOK_AHEAD_ROWS - held,
        )

        def fetch(conn: Any) -> list[tuple]:
            with conn.cursor(binary=True) as cur:
                return cur.execute(_ANNOUNCED, args, prepare=True).fetchall()

        answer = self.ref.db.run(fetch)
        highs = [0] * NUM_VBUCKETS
        rows = []
        for row in answer:
            highs[row[0]] = row[1]
            if row[3] is not None:  # the log row's seqno: NULL where the vBucket has none to give
                rows.append(row[2:])
        self.highs = highs
        if runs:
            self.looks += 1
            self._keep(runs, rows)

    def _keep(self, runs: list[tuple[int, int, int]], rows: list[tuple]) -> None:
        asked = {vb: (after, limit) for vb, after, limit in runs}
        seen: set[int] = set()
        for vb, group in groupby(rows, _vb_of):
            part = list(group)
            after, limit = asked[vb]
            if vb in seen or not _follows(part, after):
                # Not one ordered run after `after` (the server returned a vBucket's rows in two pieces or out
                # of order): none of this vBucket is kept, its reads are made on the spot.
                self.runs.pop(vb, None)
                seen.add(vb)
                continue
            seen.add(vb)
            self.runs[vb] = _Run(after, part, len(part) < limit)

    def take(self, vb: int, after: int, limit: int) -> tuple[list[tuple], bool] | None:
        """Up to ``limit`` rows after ``after`` read ahead, and whether the read covered all that was asked
        of it (else the rest is to be read on the spot); None when nothing read ahead follows ``after``."""
        run = self.runs.get(vb)
        if run is None or run.after != after:
            return None
        taken = run.rows[run.i : run.i + limit]
        run.i += len(taken)
        if run.i >= len(run.rows):
            del self.runs[vb]
        elif taken:
            run.after = taken[-1][1]
        return taken, run.complete or len(taken) == limit


def _follows(rows: list[tuple], after: int) -> bool:
    """Whether the rows' seqnos rise strictly from above ``after``."""
    seqnos = [r[1] for r in rows]
    return seqnos[0] > after and all(a < b for a, b in zip(seqnos, seqnos[1:], strict=False))


__all__ = ["LOOK_AHEAD_ROWS", "ReadAhead"]
