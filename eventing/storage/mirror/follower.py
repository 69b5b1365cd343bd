"""The follower of one mirror: the process that makes a collection follow a table (docs/architecture.md,
'Mirrors'). The leader service runs one per mirror (eventing.control.mirrors) as
``python -m eventing.storage.mirror.follower KEYSPACE``, with the state's location in $EVENTING_STORE.

Snapshot. A new slot is created on a replication connection with an exported snapshot; a transaction of
another connection takes that snapshot (``SET TRANSACTION SNAPSHOT``) and copies the table, so the copy
holds exactly the transactions committed before the slot's consistent point, and the slot streams exactly
those after it. A snapshot cut short (a crash) is taken again from a new slot; documents equal to the row
are not written again and documents of rows that are gone are deleted, so no row is doubled or lost.

Exactly once. The collection's bucket keeps the mirror's effect marks (eventing.storage.effects) under
``mirror:<collection id>``: ``MARK_LSN`` is the end LSN of the last source transaction applied, moved in
the bucket transaction that applies it; ``MARK_SNAPSHOT`` the generation of the last snapshot completed.
A source transaction is applied whole, in one bucket transaction (with the complete transactions received
after it, up to ``MAX_BATCH`` writes), transactions at or below the mark are skipped, and the slot is told
(flush position) only after the bucket committed. Each follower start raises the marks' epoch, so an
older follower still running is fenced.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

import msgpack

from eventing.core.mutation import MAX_DOCUMENT_BYTES, OP_DELETE, OP_UPDATE, decode_document, encode_document
from eventing.errors import EventingError, FencedError, NotFoundError, StoreError
from eventing.storage.keyspace import open_keyspace
from eventing.storage.mirror import definition as defs
from eventing.storage.mirror.definition import MARK_CHUNK, MARK_LSN, MARK_SNAPSHOT
from eventing.storage.mirror.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Relation,
    Truncate,
    Update,
    decode,
    lsn_text,
)
from eventing.storage.mirror.pgtypes import Convert, Types, is_text, scalar
from eventing.storage.mirror.source import Source, SourceError, Table, quote
from eventing.storage.state import State
from eventing.storage.values import EffectGroup, Write
from sharding import validate_key

log = logging.getLogger("eventing.mirror")

MAX_BATCH = 20_000  # writes of whole source transactions applied in one bucket transaction at most
MAX_DELAY_S = 0.1  # a batch waits at most this long for the stream to pause before it is applied (a busy
# stream: larger bucket transactions touch each log page of the 1,024 vBuckets fewer times a row)
SNAPSHOT_CHUNK = 5_000  # rows of the snapshot a bucket transaction
REPORT_S = 1.0  # how often the follower reports its position, lag and retained WAL
RECONNECT_S = (0.2, 5.0)  # the first and the longest wait before connecting to the source again
EXIT_STOPPED, EXIT_FAILED, EXIT_FENCED = 0, 3, 4
STOP_CHECK_EVERY = 1_000  # messages read between two looks at should_stop while the stream is busy
_pack = msgpack.Packer(use_bin_type=True).pack  # what encode_document packs with


class MirrorStopped(EventingError):
    """The mirror cannot go on without the user (the table dropped, the slot gone): one line with the fix."""


def key_part(value: str) -> str:
    """One column of a composite key as it goes into the document key, where `::` joins the columns: as
    it is, unless it holds `::`, starts or ends with `:`, or holds `%3A` or `%25` (any case); then with `%`
    written `%25` and `:` written `%3A`. An escaped column always holds `%3A` or `%25` and a column as it
    is never does, so no two rows share a key (`a::b` + `c` against `a` + `b::c`), and every key a mirror
    made before (a column without those) stays the same."""
    lowered = value.lower()
    if "::" in value or value[:1] == ":" or value[-1:] == ":" or "%3a" in lowered or "%25" in lowered:
        return value.replace("%", "%25").replace(":", "%3A")
    return value


class Shape:
    """A relation's columns as documents: names, converters and which columns make the key.

    Built once a relation, used for every row: a text column's value goes into the document as it is (no
    call), a one-column key is the column's value, and a document whose values can only be JSON values
    (numbers, finite floats, text, booleans: no json, jsonb or arrays) is packed without walking it again."""

    def __init__(self, names: list[str], converters: list[Convert], key: list[int]):
        self.names = names
        self.converters = converters
        self.key_at = key
        self._columns = [
            (name, None if is_text(convert) else convert)
            for name, convert in zip(names, converters, strict=True)
        ]
        self._one_key = key[0] if len(key) == 1 else None
        self._checked = all(
            scalar(convert) for convert in converters
        )  # its documents are JSON by construction

    def key(self, row: list) -> str:
        if self._one_key is not None:
            return str(row[self._one_key])
        return "::".join(key_part(str(row[i])) for i in self.key_at)

    def document(self, row: list, current: dict | None = None) -> dict:
        if UNCHANGED not in row:  # values are str or None (UNCHANGED only in an UPDATE with TOASTed columns)
            return {
                name: value if value is None or convert is None else convert(value)
                for (name, convert), value in zip(self._columns, row, strict=True)
            }
        doc: dict[str, Any] = {}
        for name, convert, value in zip(self.names, self.converters, row, strict=True):
            if value is None:
                doc[name] = None
            elif value is UNCHANGED:
                doc[name] = None if current is None else current.get(name)
            else:
                doc[name] = convert(value)
        return doc

    def encode(self, row: list, current: dict | None = None) -> bytes:
        """The row's document as stored (``encode_document`` of ``document``, the same bytes and errors)."""
        doc = self.document(row, current)
        if self._checked and current is None:
            data = _pack(doc)
            if len(data) <= MAX_DOCUMENT_BYTES:
                return data
        return encode_document(doc)  # a document to check, or one over the limit: its error


class Follower:
    """Follows one mirror (see the module docstring); ``run`` returns when stopped, raises MirrorStopped
    or FencedError."""

    def __init__(self, state: State, keyspace: str, *, should_stop: Any = None):
        self.state = state
        self.keyspace = keyspace
        self.defn = defs.require(state.metadata, keyspace)
        self.source = Source(self.defn.source)
        self.collection = open_keyspace(state, keyspace)
        self.bucket = self.collection.bucket
        self.prefix = self.collection.prefix
        self.marks = defs.marks_name(self.collection.cid)
        self.should_stop = should_stop or (lambda: False)
        self.types = Types()
        self.shapes: dict[int, Shape] = {}
        self.table: Table | None = None
        self.pk: list[str] = []
        self.epoch = 0
        self.applied_lsn = 0
        self.chunk = 0
        self.snapshot_generation = 0
        # the stream: the transaction being received, the complete ones not applied yet, documents they
        # leave (stored key -> msgpack bytes, None: deleted) for TOASTed columns and TRUNCATE
        self.tx: list[Write] | None = None
        self.tx_begin: Begin | None = None
        self.ready: list[tuple[int, int, list[Write]]] = []  # (end lsn, commit us, writes)
        self.ready_writes = 0
        self.ready_since = 0.0
        self.latest: dict[str, bytes | None] = {}
        self.side: Any = None  # a plain connection to the source: types, keys, positions
        self.counts = {"applied_changes": 0, "applied_transactions": 0, "snapshot_rows": 0, "skipped": 0}
        self.last_commit_us = 0
        self.state_name = "starting"
        self.error: str | None = None
        self._last_report = 0.0

    # -- claiming -----------------------------------------------------------------------------------

    def claim(self) -> None:
        """Raise the epoch of the mirror's marks: a follower that still runs from before is fenced."""
        marks = self.bucket.effect_marks(self.marks)
        self.epoch = max((epoch for epoch, _ in marks.values()), default=0) + 1
        self.bucket.fence(
            self.marks, {MARK_LSN: self.epoch, MARK_CHUNK: self.epoch, MARK_SNAPSHOT: self.epoch}
        )
        self.applied_lsn = marks.get(MARK_LSN, (0, 0))[1]
        self.chunk = marks.get(MARK_CHUNK, (0, 0))[1]
        self.snapshot_generation = marks.get(MARK_SNAPSHOT, (0, 0))[1]

    def _apply(self, groups: list[EffectGroup]) -> None:
        result = self.bucket.apply_effects(self.marks, groups)
        if result.fenced_vbs:
            raise FencedError(
                f"mirror {self.keyspace}: another follower took over (epoch above {self.epoch}); "
                "this one stops"
            )

    # -- running ------------------------------------------------------------------------------------

    def run(self) -> None:
        self.claim()
        self.side = self.source.connect()
        try:
            if self.snapshot_generation < self.defn.generation:
                conn, start = self.snapshot()
            else:
                conn, start = self._connect(), self.applied_lsn
            self.stream(conn, start)
        finally:
            self._close_side()
            self.collection.close()

    def _close_side(self) -> None:
        if self.side is not None:
            try:
                self.side.close()
            except Exception:  # noqa: BLE001 - a connection to a server that went away
                pass
            self.side = None

    def _side(self) -> Any:
        if self.side is None or self.side.closed:
            self.side = self.source.connect()
        return self.side

    def _connect(self) -> Any:
        try:
            self.table = self.source.table(self.defn.table)
        except NotFoundError:  # dropped (or renamed) while the mirror was not running: for good, as below
            raise self._table_gone() from None
        self.pk = self.table.key
        return self.source.replication()

    # -- the snapshot -------------------------------------------------------------------------------

    def snapshot(self) -> tuple[Any, int]:
        """Copy the table as of a new slot's consistent point (see the module docstring); the replication
        connection to stream from, and that point."""
        import psycopg
        import psycopg2

        self.state_name = "snapshot"
        self._report(force=True)
        slot = self.defn.slot
        self.source.drop_slot(slot)  # the slot of a snapshot cut short, or of before a resync
        rep = self.source.replication()
        cur = rep.cursor()
        try:
            cur.execute(f"CREATE_REPLICATION_SLOT {quote(slot)} LOGICAL pgoutput EXPORT_SNAPSHOT")
            _, consistent_text, snapshot_name, _ = cur.fetchone()
        except psycopg2.Error as exc:
            rep.close()
            raise SourceError(self.source.describe(exc, replication=True)) from None
        consistent = _lsn(consistent_text)
        copy_conn = self.source.connect()
        try:
            copy_conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            copy_conn.execute(
                psycopg.sql.SQL("SET TRANSACTION SNAPSHOT {}").format(psycopg.sql.Literal(snapshot_name))
            )
            self.table = table = self.source.table(self.defn.table, copy_conn)
            self.pk = table.key
            columns = copy_conn.execute(
                "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT "
                "attisdropped AND attgenerated = '' ORDER BY attnum",
                (table.oid,),
            ).fetchall()
            self._learn([oid for _, oid in columns], copy_conn)
            names = [name for name, _ in columns]
            shape = Shape(
                names, [self.types.converter(oid) for _, oid in columns], [names.index(k) for k in table.key]
            )
            existing = self._existing()
            seen: set[str] = set()
            writes: list[Write] = []
            select_list = ", ".join(quote(n) for n in names)
            with copy_conn.cursor().copy(
                f"COPY (SELECT {select_list} FROM {table.qualified}) TO STDOUT"
            ) as copy:
                for row in copy.rows():
                    row = list(row)
                    stored = self._stored(shape.key(row))
                    if stored is None:
                        continue
                    raw = shape.encode(row)
                    self.counts["snapshot_rows"] += 1
                    if existing:
                        seen.add(stored)
                        if existing.get(stored) == raw:
                            continue
                    writes.append(Write(stored, OP_UPDATE, raw))
                    if len(writes) >= SNAPSHOT_CHUNK:
                        self._chunk(writes)
                        writes = []
                    if self.should_stop():
                        raise _Interrupted()
            copy_conn.execute("COMMIT")
        except psycopg.Error as exc:
            rep.close()
            raise SourceError(self.source.describe(exc)) from None
        except BaseException:
            rep.close()
            raise
        finally:
            copy_conn.close()
        writes += [Write(stored, OP_DELETE) for stored in existing if stored not in seen]
        self.chunk += 1
        self._apply(
            [
                EffectGroup(MARK_CHUNK, self.epoch, [(self.chunk, w) for w in writes]),
                EffectGroup(MARK_LSN, self.epoch, [], upto=consistent),
                EffectGroup(MARK_SNAPSHOT, self.epoch, [], upto=self.defn.generation),
            ]
        )
        self.applied_lsn = max(self.applied_lsn, consistent)
        self.snapshot_generation = self.defn.generation
        log.info(
            "mirror %s: snapshot of %s: %d rows; following the slot from %s",
            self.keyspace,
            self.defn.table,
            self.counts["snapshot_rows"],
            lsn_text(consistent),
        )
        return rep, consistent

    def _chunk(self, writes: list[Write]) -> None:
        self.chunk += 1
        self._apply([EffectGroup(MARK_CHUNK, self.epoch, [(self.chunk, w) for w in writes])])

    def _existing(self) -> dict[str, bytes]:
        """The collection's documents (stored key -> bytes) when it has any (a snapshot taken again)."""
        if not self.bucket.count(self.prefix):
            return {}
        found = {}
        for key in self.bucket.keys(self.prefix):
            raw = self.bucket.get_raw(key)
            if raw is not None:
                found[key] = raw
        return found

    def _stored(self, key: str) -> str | None:
        try:
            validate_key(key)
        except EventingError as exc:
            self.counts["skipped"] += 1
            log.warning(
                "mirror %s: a row's key cannot be a document key (%s); the row is left out",
                self.keyspace,
                exc,
            )
            return None
        return self.prefix + key

    def _learn(self, oids: Iterable[int], conn: Any = None) -> None:
        unknown = self.types.unknown(oids)
        if unknown:
            rows = (
                (conn or self._side())
                .execute(
                    "SELECT oid::int8, typelem::int8, typcategory, typbasetype::int8 FROM pg_type WHERE oid "
                    "= ANY(%s)",
                    (unknown,),
                )
                .fetchall()
            )
            self.types.learn(rows)

    # -- the stream ---------------------------------------------------------------------------------

    def stream(self, conn: Any, start: int) -> None:
        """Follow the slot from ``start`` until stopped; reconnects while the source is away."""
        import psycopg2

        wait = RECONNECT_S[0]
        while not self.should_stop():
            try:
                self._follow(conn, start)
                return
            except (
                psycopg2.OperationalError,
                psycopg2.InterfaceError,
                psycopg2.DatabaseError,
                SourceError,
            ) as exc:
                message = exc if isinstance(exc, SourceError) else self.source.describe(exc, replication=True)
                if "does not exist" in str(message) and "slot" in str(message):
                    raise self._slot_gone() from None
                self._flush(None)  # the transactions received whole are applied; a partial one comes again
                self.tx, self.tx_begin = None, None
                self.state_name, self.error = "reconnecting", str(message)
                self._report(force=True)
                log.warning("mirror %s: %s; connecting again", self.keyspace, message)
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - the connection is gone already
                pass
            self._close_side()
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not self.should_stop():
                time.sleep(0.05)
            wait = min(wait * 2, RECONNECT_S[1])
            try:
                conn = self._connect()
                start = self.applied_lsn
                wait = RECONNECT_S[0]
            except (SourceError, StoreError) as exc:
                self.error = str(exc)
                conn = _Closed()

    def _slot_gone(self) -> MirrorStopped:
        return MirrorStopped(
            f"the replication slot {self.defn.slot} of mirror {self.keyspace} is gone from "
            f"{self.source.shown} (dropped by hand?); the mirror cannot resume without a new snapshot: run "
            f"`eventing collection resync {self.keyspace}`"
        )

    def _follow(self, conn: Any, start: int) -> None:
        import psycopg2
        import psycopg2.extras

        if isinstance(conn, _Closed):
            raise SourceError(self.error or "not connected")
        cur = conn.cursor()
        try:
            cur.start_replication(
                slot_name=self.defn.slot,
                slot_type=psycopg2.extras.REPLICATION_LOGICAL,
                decode=False,
                start_lsn=start,
                options={"proto_version": "1", "publication_names": self.defn.publication},
                status_interval=1,
            )
        except psycopg2.ProgrammingError as exc:
            if "does not exist" in str(exc):
                raise self._slot_gone() from None
            raise
        self.state_name, self.error = "following", None
        self._report(force=True)
        fileno = conn.fileno()
        read, on = cur.read_message, self._on
        received = 0
        while True:
            msg = read()
            if msg is not None:
                on(decode(msg.payload))
                if self.ready and (
                    self.ready_writes >= MAX_BATCH or time.monotonic() - self.ready_since > MAX_DELAY_S
                ):
                    self._flush(cur)
                received += 1
                if (
                    received % STOP_CHECK_EVERY or not self.should_stop()
                ):  # (a system call: not every message)
                    continue
                break
            if self.should_stop():
                break
            if self.ready:
                self._flush(cur)
            elif self.tx is None:
                wal_end = getattr(cur, "wal_end", 0) or 0
                if wal_end > self.applied_lsn:
                    # Everything the server sent is applied: confirm up to where it has decoded, so the slot
                    # keeps no WAL for other tables' changes (what PostgreSQL's own subscribers do).
                    cur.send_feedback(flush_lsn=wal_end)
            if time.monotonic() - self._last_report >= REPORT_S:
                self._report()
            select.select([fileno], [], [], 0.2)
        self._flush(cur)

    def _on(self, message: Any) -> None:
        kind = type(message)
        if kind is Begin:
            self.tx, self.tx_begin = [], message
        elif kind is Commit:
            writes, self.tx = self.tx or [], None
            if message.end_lsn <= self.applied_lsn:
                return  # applied before (the slot sends again what it was not told of)
            if not self.ready:
                self.ready_since = time.monotonic()
            self.ready.append((message.end_lsn, message.commit_us, writes))
            self.ready_writes += len(writes)
        elif kind is Relation:
            self._relation(message)
        elif kind is Insert:
            shape = self.shapes[message.oid]
            self._write(shape, message.new, None)
        elif kind is Update:
            shape = self.shapes[message.oid]
            self._write(shape, message.new, message.old)
        elif kind is Delete:
            shape = self.shapes[message.oid]
            stored = self._stored(shape.key(message.old))
            if stored is not None:
                self._add(Write(stored, OP_DELETE))
        elif kind is Truncate:
            if self.table is None or self.table.oid in message.oids:
                self._truncate()

    def _relation(self, rel: Relation) -> None:
        self._learn([c.type_oid for c in rel.columns])
        names = [c.name for c in rel.columns]
        if rel.identity == "f":  # every column is flagged: the key is the primary key's columns
            self.pk = self.source.table(f"{rel.schema}.{rel.name}", self._side()).key or self.pk
            key = [names.index(k) for k in self.pk if k in names]
        else:
            key = [i for i, c in enumerate(rel.columns) if c.key]
        self.shapes[rel.oid] = Shape(names, [self.types.converter(c.type_oid) for c in rel.columns], key)

    def _write(self, shape: Shape, new: list, old: list | None) -> None:
        stored = self._stored(shape.key(new))
        if stored is None:
            return
        before = stored
        if old is not None:
            old_stored = self._stored(shape.key(old))
            if old_stored is not None and old_stored != stored:
                before = old_stored
        current = self._current(before) if UNCHANGED in new else None
        if before != stored:  # the primary key changed: the old key's document goes
            self._add(Write(before, OP_DELETE))
        self._add(Write(stored, OP_UPDATE, shape.encode(new, current)))

    def _add(self, write: Write) -> None:
        if self.tx is None:
            self.tx = []
        self.tx.append(write)
        self.latest[write.key] = write.doc if write.op == OP_UPDATE else None

    def _current(self, stored: str) -> dict | None:
        raw = self.latest[stored] if stored in self.latest else self.bucket.get_raw(stored)
        return None if raw is None else decode_document(raw)

    def _truncate(self) -> None:
        live = set(self.bucket.keys(self.prefix))
        for key, raw in self.latest.items():
            if raw is None:
                live.discard(key)
            else:
                live.add(key)
        for key in sorted(live):
            self._add(Write(key, OP_DELETE))

    def _flush(self, cur: Any) -> None:
        """Apply the complete transactions received, in one bucket transaction, then tell the slot."""
        if not self.ready:
            return
        ready, self.ready, self.ready_writes = self.ready, [], 0
        end = ready[-1][0]
        writes = [(lsn, w) for lsn, _, tx in ready for w in tx]
        self._apply([EffectGroup(MARK_LSN, self.epoch, writes, upto=end)])
        self.applied_lsn = end
        self.last_commit_us = ready[-1][1]
        self.counts["applied_transactions"] += len(ready)
        self.counts["applied_changes"] += len(writes)
        if self.tx is None:
            self.latest.clear()
        if cur is not None:
            cur.send_feedback(flush_lsn=end, write_lsn=end)

    # -- reporting ----------------------------------------------------------------------------------

    def _report(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_report < REPORT_S:
            return
        self._last_report = now
        values: dict[str, Any] = {
            "pid": os.getpid(),
            "state": self.state_name,
            "error": self.error,
            "epoch": self.epoch,
            "applied_lsn": lsn_text(self.applied_lsn),
            "generation": self.snapshot_generation,
            **self.counts,
            "last_commit_ms": self.last_commit_us // 1000,
        }
        if self.table is not None and self.state_name == "following":
            try:
                where = self.source.positions(self.defn.slot, self.table)
            except SourceError as exc:
                where = {}
                values["error"] = str(exc)
            if where:
                server = where["server_lsn"]
                confirmed = max(where["confirmed_lsn"] or 0, self.applied_lsn)
                values["lag_bytes"] = max(0, server - confirmed) if self.ready or self.tx is not None else 0
                values["retained_bytes"] = max(0, server - (where["restart_lsn"] or server))
                values["lag_s"] = (
                    round(max(0.0, time.time() - self.ready[0][1] / 1e6), 3) if self.ready else 0.0
                )
                if where["table_oid"] != self.table.oid:
                    self._flush(None)
                    raise self._table_gone()
        defs.report(self.state.metadata, self.keyspace, values)

    def _table_gone(self) -> MirrorStopped:
        return MirrorStopped(
            f"table {self.defn.table} was dropped from {self.source.shown}; mirror {self.keyspace} stopped "
            "(the documents it mirrored stay in the collection); drop the mirror with `eventing collection "
            f"drop {self.keyspace}`"
        )


class _Interrupted(Exception):
    pass


class _Closed:
    def close(self) -> None:
        pass


def _lsn(text: str) -> int:
    from eventing.storage.mirror.pgoutput import parse_lsn

    return parse_lsn(text)


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM when the service that started this process dies (kill -9 included)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    from eventing.storage.state import default_location, open_state

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m eventing.storage.mirror.follower KEYSPACE (the state in $EVENTING_STORE)",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    keyspace = args[0]
    parent = os.getppid()
    _die_with_parent()
    stopping = {"now": False}

    def stop(*_: object) -> None:
        stopping["now"] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    state = open_state(default_location())
    follower: Follower | None = None
    try:
        follower = Follower(state, keyspace, should_stop=lambda: stopping["now"] or os.getppid() != parent)
        follower.run()
        follower.state_name = "stopped"
        follower._report(force=True)
        return EXIT_STOPPED
    except _Interrupted:
        return EXIT_STOPPED
    except FencedError as exc:
        log.warning("%s", exc)
        return EXIT_FENCED
    except EventingError as exc:
        log.error("mirror %s: %s", keyspace, exc)
        try:
            defs.report(
                state.metadata,
                keyspace,
                {
                    "pid": os.getpid(),
                    "state": "failed",
                    "error": str(exc),
                    "generation": follower.defn.generation if follower else 0,
                    "permanent": isinstance(exc, MirrorStopped) or follower is None,
                },
            )
        except EventingError:
            pass
        return EXIT_FAILED
    finally:
        state.close()


if __name__ == "__main__":
    raise SystemExit(main())
