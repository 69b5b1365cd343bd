"""Local buckets: a SQLite document store plus a per-vBucket mutation log with strictly increasing seqnos.

A local bucket is both the embedded source of mutations (workers stream their own vBuckets from it, as
Couchbase workers open DCP streams) and a target of handler bindings. WAL mode lets one writer and
readers in other processes work at once.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eventing.core.mutation import OP_DELETE, OP_EXPIRE, OP_UPDATE, Mutation, decode_document, encode_document
from eventing.core.names import check_bucket_name
from eventing.errors import ConfigError, NotFoundError, StoreError
from metadata.sqlite_io import retry_locked, run_transaction
from sharding import NUM_VBUCKETS, validate_key, vbucket_of

SCHEMA = """
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS docs(
    key TEXT PRIMARY KEY, vb INTEGER NOT NULL, seqno INTEGER NOT NULL, cas INTEGER NOT NULL,
    deleted INTEGER NOT NULL, doc BLOB, expiry INTEGER NOT NULL, flags INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log(
    vb INTEGER NOT NULL, seqno INTEGER NOT NULL, key TEXT NOT NULL, op INTEGER NOT NULL,
    cas INTEGER NOT NULL, doc BLOB, origin TEXT, expiry INTEGER NOT NULL, flags INTEGER NOT NULL,
    PRIMARY KEY(vb, seqno)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS high(vb INTEGER PRIMARY KEY, seqno INTEGER NOT NULL);
-- Per (function, source vBucket): the owner epoch and the last source seqno whose effects are applied.
-- Effects carry their source seqno, so a replay after a crash applies nothing twice, and a stale
-- owner (lower epoch) is rejected: this is what makes binding writes exactly-once and fenced.
CREATE TABLE IF NOT EXISTS effect_marks(
    function TEXT NOT NULL, vb INTEGER NOT NULL, epoch INTEGER NOT NULL, seqno INTEGER NOT NULL,
    PRIMARY KEY(function, vb)) WITHOUT ROWID;
"""

_cas_lock = threading.Lock()
_last_cas = 0


def _next_cas() -> int:
    """A cas that only grows within this process (nanoseconds since the epoch, bumped on ties)."""
    global _last_cas
    with _cas_lock:
        _last_cas = max(time.time_ns(), _last_cas + 1)
        return _last_cas


@dataclass(frozen=True)
class Write:
    """One document write: an upsert (doc is msgpack bytes) or a delete (doc is None)."""

    key: str
    op: int
    doc: bytes | None = None
    expiry: int = 0
    flags: int = 0


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

    @property
    def count(self) -> int:
        return self.last_seqno - self.after_seqno


@dataclass
class EffectGroup:
    """Binding writes of one function caused by one source vBucket, in source seqno order."""

    vb: int
    epoch: int
    writes: list[tuple[int, Write]] = field(default_factory=list)  # (source seqno, write)


@dataclass
class EffectResult:
    applied: int = 0
    duplicates: int = 0  # already applied by an earlier attempt (replay after a crash)
    fenced_vbs: set[int] = field(default_factory=set)  # rejected: a newer owner holds the vBucket
    fenced_writes: int = 0


def bucket_path(data_dir: str | os.PathLike[str], name: str) -> Path:
    return Path(data_dir) / "buckets" / f"{name}.sqlite3"


class LocalBucket:
    """A bucket stored in one SQLite file under `<data_dir>/buckets/`."""

    def __init__(self, path: Path, name: str, db: sqlite3.Connection):
        self.path = path
        self.name = name
        self._db = db
        self.uuid = self._info("uuid")
        # Cached high seqnos and the (data_version, own commits) they were read at: SQLite's data_version
        # counts other connections' commits, _commits this connection's.
        self._highs: list[int] = []
        self._highs_read_at: tuple[int, int] = (-1, -1)
        self._commits = 0

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    def create(cls, data_dir: str | os.PathLike[str], name: str, *, exist_ok: bool = False) -> LocalBucket:
        check_bucket_name(name)
        path = bucket_path(data_dir, name)
        if path.exists():
            if exist_ok:
                return cls.open(data_dir, name)
            raise ConfigError(f"bucket '{name}' already exists in {path.parent}; pick another name")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".creating")
            tmp.unlink(missing_ok=True)
            db = _connect(tmp)
            db.executescript(SCHEMA)
            db.executemany(
                "INSERT INTO info VALUES(?,?)",
                [("uuid", uuid.uuid4().hex), ("name", name), ("created_at", str(time.time()))],
            )
            db.executemany("INSERT INTO high VALUES(?,0)", [(vb,) for vb in range(NUM_VBUCKETS)])
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
            os.replace(tmp, path)  # a bucket appears whole or not at all
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot create bucket '{name}' in {path.parent}: {exc}; check that the data directory is writable"
            ) from None
        return cls.open(data_dir, name)

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], name: str) -> LocalBucket:
        check_bucket_name(name)
        path = bucket_path(data_dir, name)
        if not path.exists():
            raise NotFoundError(
                f"unknown bucket '{name}' (no {path}); create it with `eventing bucket create {name}`"
            )
        try:
            db = _connect(path)
            return cls(path, name, db)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"bucket file {path} cannot be read ({exc}); restore it or recreate the bucket") from None

    def close(self) -> None:
        self._db.close()

    def copy_to(self, data_dir: str | os.PathLike[str]) -> Path:
        """Copy this bucket, consistently even while it is written (SQLite's online backup), into another
        data directory under the same name; returns the new file's path."""
        target = bucket_path(data_dir, self.name)
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

    # -- writes -------------------------------------------------------------------------------------

    def write(self, writes: Iterable[Write], *, origin: str | None = None) -> list[tuple[int, int] | None]:
        """Apply writes in one transaction; each gets the next seqno of its vBucket and a fresh cas.

        Returns (vb, seqno) per write, or None for a delete of a missing document (nothing logged).
        """
        batch = list(writes)  # a retried transaction (locked, disk full) must see every write again
        return _retry_locked(self.path, lambda: self._tx(lambda: self._apply(batch, origin)))

    def _tx(self, body):
        try:
            return run_transaction(self._db, self.path, body)
        finally:
            self._commits += 1

    def _apply(self, writes: Iterable[Write], origin: str | None) -> list[tuple[int, int] | None]:
        db = self._db
        highs: dict[int, int] = {}
        log_rows = []
        doc_rows = []
        out: list[tuple[int, int] | None] = []
        live: dict[str, bool] = {}  # keys written earlier in this transaction (rows not yet inserted)
        for w in writes:
            vb = vbucket_of(w.key)
            if w.op != OP_UPDATE:
                exists = live.get(w.key)
                if exists is None:
                    row = db.execute("SELECT deleted FROM docs WHERE key=?", (w.key,)).fetchone()
                    exists = row is not None and not row[0]
                if not exists:
                    out.append(None)
                    continue
            live[w.key] = w.op == OP_UPDATE
            if vb not in highs:
                highs[vb] = db.execute("SELECT seqno FROM high WHERE vb=?", (vb,)).fetchone()[0]
            seqno = highs[vb] = highs[vb] + 1
            cas = _next_cas()
            log_rows.append((vb, seqno, w.key, w.op, cas, w.doc, origin, w.expiry, w.flags))
            deleted = 0 if w.op == OP_UPDATE else 1
            doc_rows.append((w.key, vb, seqno, cas, deleted, w.doc if not deleted else None, w.expiry, w.flags))
            out.append((vb, seqno))
            if len(log_rows) >= 5000:
                db.executemany("INSERT INTO log VALUES(?,?,?,?,?,?,?,?,?)", log_rows)
                db.executemany("INSERT OR REPLACE INTO docs VALUES(?,?,?,?,?,?,?,?)", doc_rows)
                log_rows.clear()
                doc_rows.clear()
        db.executemany("INSERT INTO log VALUES(?,?,?,?,?,?,?,?,?)", log_rows)
        db.executemany("INSERT OR REPLACE INTO docs VALUES(?,?,?,?,?,?,?,?)", doc_rows)
        db.executemany("UPDATE high SET seqno=? WHERE vb=?", [(s, vb) for vb, s in highs.items()])
        return out

    def upsert(self, key: str, doc: dict, *, origin: str | None = None, expiry: int = 0) -> tuple[int, int]:
        validate_key(key)
        result = self.write([Write(key, OP_UPDATE, encode_document(doc), expiry)], origin=origin)[0]
        assert result is not None
        return result

    def delete(self, key: str, *, origin: str | None = None) -> tuple[int, int]:
        validate_key(key)
        result = self.write([Write(key, OP_DELETE)], origin=origin)[0]
        if result is None:
            raise NotFoundError(f"document '{key}' does not exist in bucket '{self.name}'")
        return result

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

    def get_meta(self, key: str) -> dict | None:
        row = self._db.execute(
            "SELECT vb, seqno, cas, expiry, flags FROM docs WHERE key=? AND deleted=0", (key,)
        ).fetchone()
        return None if row is None else dict(zip(("vb", "seqno", "cas", "expiry", "flags"), row, strict=True))

    def high_seqnos(self) -> list[int]:
        """High seqno of every vBucket, index = vBucket. Workers ask at every step; the table is read
        again only when a commit happened since (SQLite's data_version, a few microseconds to check)."""
        # Taken before reading: a commit that lands during the read changes it, so the next call reads again.
        read_at = (self._db.execute("PRAGMA data_version").fetchone()[0], self._commits)
        if read_at != self._highs_read_at:
            highs = [0] * NUM_VBUCKETS
            for vb, seqno in self._db.execute("SELECT vb, seqno FROM high"):
                highs[vb] = seqno
            self._highs, self._highs_read_at = highs, read_at
        return list(self._highs)

    def read_vb(self, vb: int, after_seqno: int, limit: int) -> list[Mutation]:
        """Mutations of one vBucket with seqno > after_seqno, in seqno order, at most `limit`."""
        return [Mutation(*r) for r in self.read_vb_rows(vb, after_seqno, limit)]

    def read_vb_rows(self, vb: int, after_seqno: int, limit: int) -> list[tuple]:
        """read_vb's rows as plain tuples in Mutation's field order (what the data service ships)."""
        return self._db.execute(
            "SELECT vb, seqno, key, op, cas, doc, origin, expiry, flags FROM log "
            "WHERE vb=? AND seqno>? ORDER BY seqno LIMIT ?",
            (vb, after_seqno, limit),
        ).fetchall()

    def read_vb_packed(self, vb: int, after_seqno: int, limit: int, origin: str) -> PackedUpdates | None:
        """The next ``limit`` log entries of one vBucket after ``after_seqno`` for a caller that wants the
        updates' documents and keys in bulk: SQLite concatenates them, so no Python object is made per
        entry (about half the cost of fetching the rows). None when the entries are not the plain case
        the caller can take whole: no entries, a gap in the seqnos, an entry written by ``origin``, an
        update without a document or a delete with one; read them with read_vb then."""
        try:
            row = self._db.execute(
                "SELECT count(*), max(seqno), count(doc), max(origin = ?4), "
                "group_concat(CASE WHEN op != 0 THEN seqno END), "
                "CAST(group_concat(CASE WHEN op = 0 THEN key END, char(0)) AS BLOB), "
                "CAST(group_concat(doc, '') AS BLOB) "
                # A range scan of the primary key feeds the aggregates in (vb, seqno) order. (Before SQLite
                # 3.44 group_concat takes no ORDER BY; a sorted subquery would cost a third more.)
                "FROM log WHERE vb = ?1 AND seqno > ?2 AND seqno <= ?3",
                (vb, after_seqno, after_seqno + limit, origin),
            ).fetchone()
        except sqlite3.DataError:  # the concatenation is over SQLite's length limit (huge documents)
            return None
        count, last, docs_count, own, others, keys, docs = row
        if not count or last - after_seqno != count or own:
            return None
        other_seqnos = [int(s) for s in others.split(",")] if others else []
        if docs_count != count - len(other_seqnos):
            return None
        return PackedUpdates(vb, after_seqno, last, other_seqnos, docs_count, keys or b"", docs or b"")

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
                "SELECT vb, seqno, key, op, cas, doc, origin, expiry, flags FROM log "
                "WHERE (vb, seqno) > (?, ?) ORDER BY vb, seqno LIMIT ?",
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

    def keys(self) -> list[str]:
        return [r[0] for r in self._db.execute("SELECT key FROM docs WHERE deleted=0 ORDER BY key")]

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
        self, function: str, groups: Sequence[EffectGroup], *, origin: str | None = None
    ) -> EffectResult:
        """Apply binding writes exactly once: skip those at or below the (function, vb) mark, reject stale epochs."""

        def body() -> EffectResult:
            result = EffectResult()
            writes: list[Write] = []
            marks = []
            for g in groups:
                row = self._db.execute(
                    "SELECT epoch, seqno FROM effect_marks WHERE function=? AND vb=?", (function, g.vb)
                ).fetchone()
                mark_epoch, mark_seqno = row if row else (0, 0)
                if mark_epoch > g.epoch:
                    result.fenced_vbs.add(g.vb)
                    result.fenced_writes += len(g.writes)
                    continue
                top = mark_seqno
                for src_seqno, w in g.writes:
                    if src_seqno <= mark_seqno:
                        result.duplicates += 1
                        continue
                    writes.append(w)
                    top = max(top, src_seqno)
                marks.append((function, g.vb, g.epoch, top))
            # The writes carry the function as their origin (recursion guard); `function` also names
            # the marks, which a replay keeps apart from the live ones (origin stays the function).
            self._apply(writes, origin or function)
            result.applied = len(writes)
            self._db.executemany(
                "INSERT INTO effect_marks VALUES(?,?,?,?) ON CONFLICT(function, vb) DO UPDATE SET "
                "epoch=excluded.epoch, seqno=MAX(seqno, excluded.seqno)",
                marks,
            )
            return result

        return _retry_locked(self.path, lambda: self._tx(body))

    def effect_marks(self, function: str) -> dict[int, tuple[int, int]]:
        rows = self._db.execute("SELECT vb, epoch, seqno FROM effect_marks WHERE function=?", (function,))
        return {vb: (epoch, seqno) for vb, epoch, seqno in rows}

    def drop_effect_marks(self, function: str) -> None:
        _retry_locked(
            self.path,
            lambda: self._tx(lambda: self._db.execute("DELETE FROM effect_marks WHERE function=?", (function,))),
        )


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=2.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def _retry_locked(path: Path, fn):
    return retry_locked(path, fn)


def list_buckets(data_dir: str | os.PathLike[str]) -> list[str]:
    folder = Path(data_dir) / "buckets"
    return sorted(p.stem for p in folder.glob("*.sqlite3")) if folder.exists() else []


def chunked(items: Iterable, size: int) -> Iterable[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk
