"""SqlRecords: the metadata store's records besides functions and checkpoints (timers, counters, dead
letters, services, leases, nodes, settings), over SQL; the shared logic's second half (see store.py)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from metadata.fencing import holds
from metadata.model import DlqRow, Lease, TimerRecord, next_lease
from metadata.sql.base import SqlBackend
from metadata.sql.rows import SqlDb, dlq_filter, node_of, write_counters


class SqlRecords(SqlBackend):
    # -- timers ---------------------------------------------------------------------------------------

    def claim_timers(
        self,
        function: str,
        epochs: Mapping[int, int],
        now_ms: int,
        limit: int,
        *,
        reclaim: Iterable[int] = (),
    ) -> list[TimerRecord]:
        """Hand the owner of `epochs` up to `limit` due timers of its vBuckets, each with the next fire_seq
        of its vBucket, oldest due first; vBuckets whose epoch moved on get none. `reclaim` vBuckets also
        return timers claimed before and not done (a previous owner crashed after claiming them), first,
        in fire_seq order, with their old fire_seq: their effects were keyed by it, so firing again
        applies nothing twice."""
        again = sorted(set(reclaim) & set(epochs))
        vbs = sorted(epochs)
        if not vbs:
            return []
        marks, vb_args = self._in_vbs(vbs)
        due_sql = (
            f"SELECT * FROM timers WHERE function=? AND due_ms<=? AND fire_seq IS NULL AND vb IN ({marks}) "
            "ORDER BY due_ms, vb, callback, reference LIMIT ?"
        )
        if not again and (
            # The common case (nothing due anywhere) costs one index probe: no vBucket list, no write.
            not self._read(
                "SELECT 1 FROM timers WHERE function=? AND due_ms<=? AND fire_seq IS NULL LIMIT 1",
                (function, now_ms),
            )
            or not self._read(due_sql, (function, now_ms, *vb_args, 1))
        ):
            return []

        def body(db: SqlDb) -> list[TimerRecord]:
            current = dict(
                self._select_vbs(
                    db,
                    "SELECT vb, epoch FROM checkpoints WHERE function=? AND vb IN ({})",
                    function,
                    vbs,
                    lock=True,
                )
            )
            valid = [vb for vb in vbs if holds(current.get(vb), epochs[vb])]
            if not valid:
                return []
            keep, keep_args = self._in_vbs(valid)
            out: list[TimerRecord] = []
            valid_set = set(valid)
            mine = [vb for vb in again if vb in valid_set]
            if mine:
                marks, args = self._in_vbs(mine)
                rows = db.execute(
                    f"SELECT * FROM timers WHERE function=? AND fire_seq IS NOT NULL AND vb IN ({marks}) "
                    f"ORDER BY vb, fire_seq{self.LOCK}",
                    (function, *args),
                ).fetchall()
                out.extend(TimerRecord(*r) for r in rows)
            rows = db.execute(
                "SELECT * FROM timers WHERE function=? AND due_ms<=? AND fire_seq IS NULL AND vb IN "
                f"({keep}) ORDER BY due_ms, vb, callback, reference LIMIT ?{self.LOCK}",
                (function, now_ms, *keep_args, limit),
            ).fetchall()
            if not rows:
                return out
            touched = sorted({r[3] for r in rows})
            seqs = dict(
                self._select_vbs(
                    db,
                    "SELECT vb, seq FROM timer_seqs WHERE function=? AND vb IN ({})",
                    function,
                    touched,
                    lock=True,
                )
            )
            updates = []
            touched_set = set(touched)
            for r in rows:
                seq = seqs[r[3]] = seqs.get(r[3], 0) + 1
                updates.append((seq, function, r[1], r[2]))
                out.append(TimerRecord(r[0], r[1], r[2], r[3], r[4], r[5], r[6], seq))
            db.executemany(
                "UPDATE timers SET fire_seq=? WHERE function=? AND callback=? AND reference=?", updates
            )
            db.executemany(
                "INSERT INTO timer_seqs VALUES(?,?,?) ON CONFLICT(function, vb) DO UPDATE SET "
                "seq=excluded.seq",
                [(function, vb, seq) for vb, seq in seqs.items() if vb in touched_set],
            )
            return out

        return self._tx(body)

    def get_timer(self, function: str, callback: str, reference: str) -> TimerRecord | None:
        rows = self._read(
            "SELECT * FROM timers WHERE function=? AND callback=? AND reference=?",
            (function, callback, reference),
        )
        return TimerRecord(*rows[0]) if rows else None

    def timer_backlog(self, function: str, now_ms: int) -> dict[str, int]:
        """Timers waiting (`pending`) and, of those, already due but not fired (`due`)."""
        pending, due = self._read(
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN due_ms<=? THEN 1 ELSE 0 END), 0) FROM timers WHERE "
            "function=?",
            (now_ms, function),
        )[0]
        return {"pending": int(pending), "due": int(due)}

    def drop_timers(self, function: str) -> None:
        def body(db: SqlDb) -> None:
            db.execute("DELETE FROM timers WHERE function=?", (function,))
            db.execute("DELETE FROM timer_seqs WHERE function=?", (function,))

        self._tx(body)

    # -- counters, DLQ, services --------------------------------------------------------------------

    def add_counters(self, function: str, counters: Mapping[str, int | float]) -> None:
        self._tx(lambda db: write_counters(db, function, counters))

    def set_gauges(self, function: str, gauges: Mapping[str, float]) -> None:
        self._tx(
            lambda db: db.executemany(
                "INSERT INTO counters VALUES(?,?,?) ON CONFLICT(function, name) DO UPDATE SET "
                "value=excluded.value",
                [(function, k, v) for k, v in sorted(gauges.items())],
            )
        )

    def counters(self, function: str) -> dict[str, float]:
        return dict(self._read("SELECT name, value FROM counters WHERE function=?", (function,)))  # type: ignore[arg-type]

    # -- deaths of a worker on one mutation (eventing.workers.crash_guard) ---------------------------------

    def count_death(self, function: str, vb: int, seqno: int) -> int:
        def body(db: SqlDb) -> int:
            db.execute(
                "INSERT INTO deaths VALUES(?,?,?,1) ON CONFLICT(function, vb, seqno) DO UPDATE SET "
                "count=deaths.count+1",
                (function, vb, seqno),
            )
            return int(
                db.execute(
                    "SELECT count FROM deaths WHERE function=? AND vb=? AND seqno=?", (function, vb, seqno)
                ).fetchone()[0]
            )

        return self._tx(body)

    def deaths(self, function: str) -> dict[tuple[int, int], int]:
        return {
            (vb, seqno): n
            for vb, seqno, n in self._read(
                "SELECT vb, seqno, count FROM deaths WHERE function=?", (function,)
            )
        }

    def reset_counters(self, function: str, *, keep_prefixes: tuple[str, ...] = ()) -> None:
        """Drop the function's counters (Couchbase's resetStatsCounters), but those whose name starts with
        one of `keep_prefixes`."""

        def body(db: SqlDb) -> None:
            names = [
                n for (n,) in db.execute("SELECT name FROM counters WHERE function=?", (function,)).fetchall()
            ]
            db.executemany(
                "DELETE FROM counters WHERE function=? AND name=?",
                [(function, n) for n in sorted(names) if not n.startswith(keep_prefixes)],
            )

        self._tx(body)

    def dlq_rows(
        self, function: str, *, limit: int | None = None, include_replayed: bool = False
    ) -> list[DlqRow]:
        sql = "SELECT * FROM dlq WHERE function=?"
        if not include_replayed:
            sql += " AND replayed_at IS NULL"
        sql += " ORDER BY vb, seqno"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [DlqRow(*r) for r in self._read(sql, (function,))]

    # -- DLQ inspection, replay and purge (eventing.ops.dlq) ----------------------------------------------

    def dlq_row(self, function: str, vb: int, seqno: int) -> DlqRow | None:
        """The dead letter of (function, vBucket, seqno), replayed or not; None if there is none."""
        rows = self._read("SELECT * FROM dlq WHERE function=? AND vb=? AND seqno=?", (function, vb, seqno))
        return DlqRow(*rows[0]) if rows else None

    def find_dlq_rows(
        self,
        function: str,
        *,
        vb: int | None = None,
        seqno: int | None = None,
        key: str | None = None,
        reason: str | None = None,
        include_replayed: bool = False,
        replayed_only: bool = False,
        generation: int | None = None,
        limit: int | None = None,
    ) -> list[DlqRow]:
        """Dead letters matching every given filter, in (vBucket, seqno) order: per-document order.
        ``generation``: only the letters of that deployment."""
        where, args = dlq_filter(
            function, vb, seqno, key, reason, include_replayed, replayed_only, generation
        )
        sql = f"SELECT * FROM dlq WHERE {where} ORDER BY vb, seqno"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [DlqRow(*r) for r in self._read(sql, args)]

    def mark_replayed(self, function: str, keys: Iterable[tuple[int, int]]) -> int:
        """Set replayed_at on the (vBucket, seqno) rows not yet replayed; returns how many changed."""
        now = time.time()
        rows = list(keys)  # the transaction may be retried; a generator would be spent

        def body(db: SqlDb) -> int:
            changed = 0
            for vb, seqno in rows:
                cur = db.execute(
                    "UPDATE dlq SET replayed_at=? WHERE function=? AND vb=? AND seqno=? AND replayed_at IS "
                    "NULL",
                    (now, function, vb, seqno),
                )
                changed += cur.rowcount
            return changed

        return self._tx(body)

    def record_replay_failure(
        self, function: str, vb: int, seqno: int, reason: str, error: str, traceback: str
    ) -> None:
        """A replay of the row failed again: attempts + 1, and the newest reason, error and traceback."""
        self._tx(
            lambda db: db.execute(
                "UPDATE dlq SET reason=?, error=?, traceback=?, attempts=attempts+1, last_failed_at=? "
                "WHERE function=? AND vb=? AND seqno=? AND replayed_at IS NULL",
                (reason, error, traceback, time.time(), function, vb, seqno),
            )
        )

    def purge_dlq(
        self,
        function: str,
        reason: str | None = None,
        replayed_only: bool = False,
        *,
        keys: Iterable[tuple[int, int]] | None = None,
    ) -> int:
        """Delete dead letters (all of the function's, or those matching reason / replayed_only, or the
        given (vBucket, seqno) keys among them); returns how many rows were removed."""
        where, args = dlq_filter(function, None, None, None, reason, True, replayed_only)
        selected = None if keys is None else list(keys)

        def body(db: SqlDb) -> int:
            if selected is None:
                return int(db.execute(f"DELETE FROM dlq WHERE {where}", args).rowcount)
            return sum(
                db.execute(f"DELETE FROM dlq WHERE {where} AND vb=? AND seqno=?", (*args, vb, seqno)).rowcount
                for vb, seqno in selected
            )

        return self._tx(body)

    def heartbeat(self, service_id: str, info: str) -> None:
        self._tx(
            lambda db: db.execute(
                "INSERT INTO services VALUES(?,?,?) ON CONFLICT(id) DO UPDATE SET "
                "info=excluded.info, heartbeat_at=excluded.heartbeat_at",
                (service_id, info, time.time()),
            )
        )

    def remove_service(self, service_id: str) -> None:
        self._tx(lambda db: db.execute("DELETE FROM services WHERE id=?", (service_id,)))

    def live_services(self, max_age_s: float) -> list[str]:
        rows = self._read("SELECT id FROM services WHERE heartbeat_at>=?", (time.time() - max_age_s,))
        return [r[0] for r in rows]

    # -- leases -------------------------------------------------------------------------------------------

    def acquire_lease(
        self, name: str, holder: str, ttl_s: float, *, info: str = "", take_from: str | None = None
    ) -> Lease | None:
        """Take or renew lease `name` for `ttl_s` seconds; None if someone else holds it unexpired.

        A compare-and-set: the check and the write are one transaction holding the lease's row (SQLite:
        the write lock from BEGIN IMMEDIATE; PostgreSQL: the row lock of SELECT ... FOR UPDATE, and for a
        lease nobody took yet, the insert that only one taker makes), so of two racing takers exactly one
        wins. `take_from`: a holder the caller knows is dead (its process is gone); its lease is taken at
        once.
        """

        def body(db: SqlDb) -> Lease | None:
            while True:
                now = time.time()
                row = db.execute(f"SELECT * FROM leases WHERE name=?{self.LOCK}", (name,)).fetchone()
                current = Lease(*row) if row else None
                new = next_lease(current, name, holder, ttl_s, info, take_from, now)
                if new is None:
                    return None
                values = (new.name, new.holder, new.expires_at, new.acquired_at, new.term, new.info)
                if current is not None:
                    db.execute(
                        "UPDATE leases SET holder=?, expires_at=?, acquired_at=?, term=?, info=? WHERE "
                        "name=?",
                        (*values[1:], name),
                    )
                    return new
                if db.execute(
                    "INSERT INTO leases VALUES(?,?,?,?,?,?) ON CONFLICT(name) DO NOTHING", values
                ).rowcount:
                    return new
                # Another taker created it since the SELECT: look again, now at its row.

        return self._tx(body)

    def lease(self, name: str) -> Lease | None:
        rows = self._read("SELECT * FROM leases WHERE name=?", (name,))
        return Lease(*rows[0]) if rows else None

    def release_lease(self, name: str, holder: str) -> bool:
        """Expire the lease now if `holder` holds it (its term stays, so the next holder's is higher)."""
        return bool(
            self._tx(
                lambda db: (
                    db.execute(
                        "UPDATE leases SET expires_at=0 WHERE name=? AND holder=? AND expires_at>0",
                        (name, holder),
                    ).rowcount
                )
            )
        )

    # -- eventing nodes -----------------------------------------------------------------------------------

    def nodes(self) -> list[dict]:
        """Eventing nodes in the order they were added; state is active, joining or leaving."""
        return [node_of(r) for r in self._read("SELECT * FROM nodes ORDER BY added_at, name")]

    def put_node(self, name: str, state: str, ray_node_id: str | None = None) -> None:
        self._tx(
            lambda db: db.execute(
                "INSERT INTO nodes VALUES(?,?,?,?) ON CONFLICT(name) DO UPDATE SET state=excluded.state, "
                "ray_node_id=COALESCE(excluded.ray_node_id, nodes.ray_node_id)",
                (name, state, ray_node_id, time.time()),
            )
        )

    def delete_node(self, name: str) -> None:
        self._tx(lambda db: db.execute("DELETE FROM nodes WHERE name=?", (name,)))

    def get_kv(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM kv WHERE key=?", (key,))
        return rows[0][0] if rows else None

    def set_kv(self, key: str, value: str) -> None:
        self._tx(
            lambda db: db.execute(
                "INSERT INTO kv VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value)
            )
        )
