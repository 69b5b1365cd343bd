"""Rows a remote or sandboxed worker read ahead (``Ahead``), and the rows of a log read packed as columns
(``rows_of_columns``, the answer of ``LocalBucket.read_vb_columns``): what ``RemoteBucket`` holds between
the read of a vBucket's next rows and their handling.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any


class Ahead:
    """Rows of one vBucket read ahead: ``rows[i:]`` follow seqno ``after``; ``complete`` when the read ended
    before its limit (at the vBucket's end then). Rows that came as columns stay so until the first is taken
    (``rows``): a row tuple costs ~400 bytes, its share of the columns ~150."""

    __slots__ = ("after", "count", "i", "complete", "_rows", "_columns")

    def __init__(self, after: int, count: int, complete: bool, rows: tuple = (), columns: tuple = ()):
        self.after, self.count, self.i, self.complete = after, count, 0, complete
        self._rows, self._columns = rows, columns

    @property
    def rows(self) -> tuple:
        if self._columns:
            vb, start, columns = self._columns
            self._rows, self._columns = rows_of_columns(vb, start, columns) or (), ()
        return self._rows


def rows_of_columns(vb: int, after: int, columns: tuple) -> tuple | None:
    """read_vb_rows's rows (tuples in Mutation's field order) from ``LocalBucket.read_vb_columns``'s answer,
    built by C-level loops (numpy parses the numbers). None when a key holds a NUL byte."""
    import numpy as np

    count, last, ops, keys, docs, lengths, cas, arrivals = columns
    key_list = keys.decode().split("\0")
    if len(key_list) != count:
        return None
    sizes = np.fromstring(lengths, dtype=np.int64, sep=",")
    ends = np.cumsum(np.maximum(sizes, 0)).tolist()
    doc_list: list[bytes | None] = list(map(docs.__getitem__, map(slice, [0, *ends[:-1]], ends)))
    for i in np.flatnonzero(sizes < 0).tolist():
        doc_list[i] = None
    op_list: Any = repeat(0)
    if ops:
        op_list = [0] * count
        for entry in ops.split(","):
            seqno, op = entry.split(":")
            op_list[int(seqno) - after - 1] = int(op)
    return tuple(
        zip(
            repeat(vb),
            range(after + 1, last + 1),
            key_list,
            op_list,
            np.fromstring(cas, dtype=np.int64, sep=",").tolist(),
            doc_list,
            repeat(None),
            repeat(0),
            repeat(0),
            np.fromstring(arrivals, dtype=np.int64, sep=",").tolist(),
            repeat(None),  # no extended attributes (read_vb_columns leaves such entries to the rows)
            strict=False,  # repeat() is endless
        )
    )
