"""Reads of a PostgreSQL bucket's documents (``DocumentReader``): one key's live version and its metadata, the
version before a seqno (functions with ``previous_version``, over the bucket's own key index), and live
documents in key order (keys are ``COLLATE "C"``: byte order, as the bucket files list them), by prefix and
counted.
"""

from __future__ import annotations

from collections.abc import Iterator

from eventing.core.mutation import decode_document
from eventing.storage.postgres.log_reader import LogReader
from eventing.storage.postgres.schema import key_index_name
from eventing.storage.postgres.writer import vb_of
from eventing.storage.reads import meta_of, scanned


def after_prefix(prefix: str) -> str | None:
    """The first string after every string starting with ``prefix`` (so a prefix scan is a range of the
    primary key), or None where there is none to name."""
    for cut in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[cut]) + 1
        if 0xD800 <= code <= 0xDFFF:  # surrogates are no characters of UTF-8 text
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:cut] + chr(code)
    return None


def _prefix_sql(prefix: str) -> tuple[str, list]:
    if not prefix:
        return "", []
    end = after_prefix(prefix)
    if end is None:
        return " AND key >= %s AND starts_with(key, %s)", [prefix, prefix]
    return " AND key >= %s AND key < %s", [prefix, end]


class DocumentReader:
    """Reads of one bucket's documents (through the log reader's statements)."""

    def __init__(self, log: LogReader):
        self.log = log
        self.ref = log.ref

    def _live(self, columns: str, key: str) -> tuple | None:
        if "\x00" in key:  # a PostgreSQL store holds no such key (eventing.storage.postgres.writer.check_key)
            return None
        rows = self.log.rows(
            f"SELECT {columns} FROM bucket_docs WHERE bucket = %s AND key = %s AND NOT deleted",
            (self.ref.id, key),
        )
        return rows[0] if rows else None

    def get(self, key: str) -> dict | None:
        raw = self.get_raw(key)
        return None if raw is None else decode_document(raw)

    def get_raw(self, key: str) -> bytes | None:
        row = self._live("doc", key)
        return None if row is None else row[0]

    def get_doc(self, key: str) -> tuple[bytes, int, int] | None:
        """(document bytes, cas, expiry) of a live document, else None."""
        row = self._live("doc, cas, expiry", key)
        return None if row is None else (row[0], row[1], row[2])

    def get_meta(self, key: str) -> dict | None:
        row = self._live("vb, seqno, cas, expiry, flags, xattrs", key)
        return None if row is None else meta_of(row)

    def ensure_key_index(self) -> None:
        """Index this bucket's log by key (a partial index of its rows alone), for previous_doc. Built
        CONCURRENTLY, outside any transaction, so writers of every bucket go on meanwhile; one left invalid
        by a build cut short is built again."""
        index = key_index_name(self.ref.id)
        valid = self.log.rows(
            "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)", (index,)
        )
        if valid and valid[0][0]:
            return
        db = self.ref.db
        if valid:
            db.run(lambda conn: conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index}"))
        db.run(
            lambda conn: conn.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON bucket_log(key, seqno) WHERE bucket = "
                f"{int(self.ref.id)}"
            )
        )

    def previous_doc(self, key: str, before_seqno: int) -> bytes | None:
        """The document bytes of ``key``'s newest log entry below ``before_seqno`` (None: none, or a delete).
        The bucket id is written into the statement so the planner can use the bucket's key index."""
        if "\x00" in key:
            return None
        rows = self.log.rows(
            f"SELECT doc FROM bucket_log WHERE bucket = {int(self.ref.id)} AND vb = %s AND key = %s AND "
            "seqno < %s ORDER BY seqno DESC LIMIT 1",
            (vb_of(key), key, before_seqno),
        )
        return rows[0][0] if rows else None

    def keys(self, prefix: str = "", limit: int | None = None) -> list[str]:
        return [row[0] for row in self.live_docs(prefix, limit, with_docs=False)]

    def scan(self, prefix: str = "", limit: int | None = None) -> Iterator[tuple[str, dict, dict]]:
        """(key, document, meta) of live documents in key order (eventing.storage.reads.scanned)."""
        return scanned(self.live_docs(prefix, limit, with_docs=True))

    def live_docs(
        self, prefix: str, limit: int | None, *, with_docs: bool, batch: int = 1000
    ) -> Iterator[tuple]:
        """Live documents in key order, read in batches (keyset paging, so a large bucket streams)."""
        columns = "key, vb, seqno, cas, expiry, flags" + (", doc, xattrs" if with_docs else "")
        range_sql, range_args = _prefix_sql(prefix)
        after: str | None = None
        left = limit
        while left is None or left > 0:
            take = batch if left is None else min(batch, left)
            sql = f"SELECT {columns} FROM bucket_docs WHERE bucket = %s AND NOT deleted{range_sql}"
            args: list[object] = [self.ref.id, *range_args]
            if after is not None:
                sql += " AND key > %s"
                args.append(after)
            rows = self.log.rows(f"{sql} ORDER BY key LIMIT %s", (*args, take))
            yield from rows
            if len(rows) < take:
                return
            after = rows[-1][0]
            if left is not None:
                left -= len(rows)

    def count(self, prefix: str = "") -> int:
        """Live documents (tombstones not counted), those whose key starts with ``prefix``."""
        range_sql, range_args = _prefix_sql(prefix)
        return int(
            self.log.one(
                f"SELECT count(*) FROM bucket_docs WHERE bucket = %s AND NOT deleted{range_sql}",
                (self.ref.id, *range_args),
            )[0]
        )
