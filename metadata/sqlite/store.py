"""SqliteMetadataStore: the embedded default metadata store, one WAL file shared by every process."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Self, TypeVar

from metadata.errors import (
    FencedError,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
    StoreCorruptError,
)
from metadata.fencing import fenced_vbuckets, holds, next_epoch
from metadata.model import (
    REWIND,
    REWIND_REAPPLY,
    USERS_MARK,
    Checkpoint,
    DlqRow,
    FunctionRecord,
    FunctionState,
    Lease,
    TimerChange,
    TimerDone,
    TimerRecord,
    UserRecord,
    check_rewind_allowed,
    check_transition,
    next_lease,
    owner_vb,
    plan_rewind,
)
from metadata.sqlite._rows import (
    CORRUPT_RECOVERY,
    checkpoint_of,
    dlq_filter,
    node_of,
    one_line,
    select_vbs,
    write_counters,
    write_timers,
)
from metadata.sqlite.backup import write_backup
from metadata.sqlite.schema import apply_schema
from metadata.sqlite.store_file import connect_store_file
from metadata.sqlite.window_state import SqliteWindowStateStore
from metadata.sqlite_io import retry_locked, run_transaction

T = TypeVar("T")

# How long one statement waits for another process's write lock before we log and retry.
BUSY_TIMEOUT_MS = 2000


class SqliteMetadataStore:
    """MetadataStore on one SQLite file in WAL mode: a writer and readers in other processes at once.

    Writes that find the file locked for longer than BUSY_TIMEOUT_MS are retried with a warning for up to
    `lock_wait_s`, then fail with StoreLockedError: processing waits, it never skips a checkpoint.
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_wait_s: float | None = None, create: bool = True):
        self.path = Path(path)
        self.lock_wait_s = lock_wait_s  # None: $EVENTING_STORE_WAIT_S, default 60s (see retry_locked)
        # A file without a store is damaged, never made a new one (metadata.sqlite.store_file).
        self._db = connect_store_file(self.path, create=create, timeout_s=BUSY_TIMEOUT_MS / 1000)
        try:
            self._retry(self._setup)
        except sqlite3.DatabaseError as exc:
            raise StoreCorruptError(
                f"metadata store {self.path} is not a valid SQLite database ({one_line(exc)}); {CORRUPT_RECOVERY}"
            ) from None

    def _setup(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        apply_schema(self._db)

    def verify_integrity(self) -> None:
        """Fail closed on a truncated or corrupted file rather than resume from a wrong checkpoint."""
        try:
            result = self._db.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            result = str(exc)
        if result != "ok":
            raise StoreCorruptError(
                f"metadata store {self.path} failed its integrity check ({one_line(result)}); {CORRUPT_RECOVERY}"
            )

    # -- transactions -------------------------------------------------------------------------------

    def _retry(self, fn: Callable[[], T]) -> T:
        try:
            return retry_locked(self.path, fn, self.lock_wait_s)
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:  # a subclass: a bug or a constraint, not damage
                raise
            raise StoreCorruptError(f"metadata store {self.path} is damaged ({one_line(exc)}); {CORRUPT_RECOVERY}") from None

    def _tx(self, body: Callable[[sqlite3.Connection], T]) -> T:
        return self._retry(lambda: run_transaction(self._db, self.path, lambda: body(self._db)))

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._retry(lambda: self._db.execute(sql, args).fetchall())

    def window_states(self) -> SqliteWindowStateStore:
        """The window coordinators' fenced state, in this store's file and transactions."""
        return SqliteWindowStateStore(self)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def backup(self, target: str | os.PathLike[str]) -> None:
        """A consistent copy of the store at `target`, even while other processes write (see write_backup)."""
        write_backup(self._db, self.path, target, self._retry)

    # -- functions ----------------------------------------------------------------------------------

    @staticmethod
    def _function(row: tuple) -> FunctionRecord:
        name, definition, source, state, generation, updated_at, deployed_by = row
        return FunctionRecord(name, json.loads(definition), source, FunctionState(state), generation, updated_at,
                              json.loads(deployed_by) if deployed_by else None)

    def put_function(self, name: str, definition: dict, source: str) -> FunctionRecord:
        """Create a function (undeployed) or update the definition of an undeployed or paused one."""

        def body(db: sqlite3.Connection) -> FunctionRecord:
            row = db.execute("SELECT state FROM functions WHERE name=?", (name,)).fetchone()
            now = time.time()
            if row is None:
                db.execute(
                    "INSERT INTO functions VALUES(?,?,?,?,0,?,NULL)",
                    (name, json.dumps(definition), source, FunctionState.UNDEPLOYED.value, now),
                )
            else:
                state = FunctionState(row[0])
                if state not in (FunctionState.UNDEPLOYED, FunctionState.PAUSED):
                    raise LifecycleError(
                        f"cannot update function '{name}': it is {state.value}; pause or undeploy it first"
                    )
                db.execute(
                    "UPDATE functions SET definition=?, source=?, updated_at=? WHERE name=?",
                    (json.dumps(definition), source, now, name),
                )
            return self._function(
                db.execute("SELECT * FROM functions WHERE name=?", (name,)).fetchone()
            )

        return self._tx(body)

    def get_function(self, name: str) -> FunctionRecord:
        rows = self._read("SELECT * FROM functions WHERE name=?", (name,))
        if not rows:
            known = ", ".join(r[0] for r in self._read("SELECT name FROM functions ORDER BY name")) or "none"
            raise NotFoundError(f"unknown function '{name}' (known: {known}); see `eventing list`")
        return self._function(rows[0])

    def list_functions(self) -> list[FunctionRecord]:
        return [self._function(r) for r in self._read("SELECT * FROM functions ORDER BY name")]

    def delete_function(self, name: str) -> None:
        def body(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT state FROM functions WHERE name=?", (name,)).fetchone()
            if row is None:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")
            if row[0] != FunctionState.UNDEPLOYED.value:
                raise LifecycleError(f"cannot delete function '{name}': it is {row[0]}; undeploy it first")
            for table in ("functions",):
                db.execute(f"DELETE FROM {table} WHERE name=?", (name,))
            for table in ("checkpoints", "counters", "dlq", "checkpoint_starts", "checkpoint_regressions", "timers",
                          "timer_seqs"):
                db.execute(f"DELETE FROM {table} WHERE function=?", (name,))

        self._tx(body)

    def transition(
        self, name: str, target: FunctionState, action: str, *, bump_generation: bool = False
    ) -> FunctionRecord:
        """Move a function to `target` atomically, or raise LifecycleError naming the state and the fix."""

        def body(db: sqlite3.Connection) -> FunctionRecord:
            row = db.execute("SELECT state FROM functions WHERE name=?", (name,)).fetchone()
            if row is None:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")
            check_transition(name, FunctionState(row[0]), target, action)
            db.execute(
                "UPDATE functions SET state=?, generation=generation+?, updated_at=? WHERE name=?",
                (target.value, 1 if bump_generation else 0, time.time(), name),
            )
            return self._function(db.execute("SELECT * FROM functions WHERE name=?", (name,)).fetchone())

        return self._tx(body)

    def set_deployed_by(self, name: str, deployed_by: dict | None) -> None:
        """Record who deploys or resumes a function over the API (None: the local CLI, trusted as an admin)."""

        def body(db: sqlite3.Connection) -> None:
            value = json.dumps(deployed_by) if deployed_by is not None else None
            if not db.execute("UPDATE functions SET deployed_by=? WHERE name=?", (value, name)).rowcount:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")

        self._tx(body)

    # -- users of the APIs ----------------------------------------------------------------------------

    @staticmethod
    def _user(row: tuple) -> UserRecord:
        name, password_hash, roles, created_at = row
        return UserRecord(name, password_hash, tuple(json.loads(roles)), created_at)

    def put_user(self, name: str, password_hash: str, roles: Sequence[str]) -> UserRecord:
        """Create a user, or replace the hash and roles of an existing one (keeping when it was created)."""

        def body(db: sqlite3.Connection) -> UserRecord:
            db.execute(
                "INSERT INTO users VALUES(?,?,?,?) ON CONFLICT(name) DO UPDATE SET hash=excluded.hash, "
                "roles=excluded.roles",
                (name, password_hash, json.dumps(list(roles)), time.time()),
            )
            db.execute("INSERT OR IGNORE INTO kv VALUES(?, '1')", (USERS_MARK,))  # kept when users are deleted
            return self._user(db.execute("SELECT * FROM users WHERE name=?", (name,)).fetchone())

        return self._tx(body)

    def get_user(self, name: str) -> UserRecord:
        rows = self._read("SELECT * FROM users WHERE name=?", (name,))
        if not rows:
            raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")
        return self._user(rows[0])

    def list_users(self) -> list[UserRecord]:
        return [self._user(r) for r in self._read("SELECT * FROM users ORDER BY name")]

    def delete_user(self, name: str) -> None:
        def body(db: sqlite3.Connection) -> None:
            if not db.execute("DELETE FROM users WHERE name=?", (name,)).rowcount:
                raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")

        self._tx(body)

    # -- checkpoints and ownership --------------------------------------------------------------------

    def init_checkpoints(
        self, function: str, positions: Mapping[int, int], bucket_uuid: str, epoch_base: int = 0
    ) -> None:
        """Start a deployment's checkpoints; epochs start at epoch_base so older deployments stay fenced."""
        now = time.time()

        def body(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM checkpoints WHERE function=?", (function,))
            db.executemany(
                "INSERT INTO checkpoints VALUES(?,?,?,?,NULL,?,?,0)",
                [(function, vb, seqno, epoch_base, bucket_uuid, now) for vb, seqno in positions.items()],
            )
            db.execute("DELETE FROM checkpoint_starts WHERE function=?", (function,))
            db.execute("DELETE FROM deaths WHERE function=?", (function,))
            db.executemany(
                "INSERT INTO checkpoint_starts VALUES(?,?,?)",
                [(function, vb, seqno) for vb, seqno in positions.items()],
            )

        self._tx(body)

    def drop_checkpoints(self, function: str) -> None:
        def body(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM checkpoints WHERE function=?", (function,))
            db.execute("DELETE FROM checkpoint_starts WHERE function=?", (function,))
            db.execute("DELETE FROM deaths WHERE function=?", (function,))

        self._tx(body)

    def checkpoints(self, function: str) -> dict[int, Checkpoint]:
        rows = self._read("SELECT * FROM checkpoints WHERE function=?", (function,))
        return {r[1]: checkpoint_of(r) for r in rows}

    def claim(
        self, function: str, vbuckets: Iterable[int], owner: str, *, min_epochs: Mapping[int, int] | None = None
    ) -> dict[int, Checkpoint]:
        """Take ownership of vBuckets with a higher epoch; any previous owner is fenced from then on.

        min_epochs: per vBucket, an epoch the new one must reach at least (used when a bucket's effect
        marks show a higher epoch than this store holds, as after restoring the store from a backup).
        """
        vbs = list(vbuckets)
        now = time.time()
        floor = dict(min_epochs or {})

        def body(db: sqlite3.Connection) -> dict[int, Checkpoint]:
            stored = select_vbs(db, "SELECT vb, epoch FROM checkpoints WHERE function=? AND vb IN ({})", function, vbs)
            db.executemany(
                "UPDATE checkpoints SET epoch=?, owner=?, leased=1, updated_at=? WHERE function=? AND vb=?",
                [(next_epoch(epoch, floor.get(vb, 0)), owner, now, function, vb) for vb, epoch in stored],
            )
            rows = select_vbs(db, "SELECT * FROM checkpoints WHERE function=? AND vb IN ({})", function, vbs)
            return {r[1]: checkpoint_of(r) for r in rows}

        claimed = self._tx(body)
        missing = set(vbs) - set(claimed)
        if missing:
            raise FencedError(
                f"function '{function}' has no checkpoints for {len(missing)} vBuckets; "
                "it was undeployed while starting; deploy it again"
            )
        return claimed

    def commit(
        self,
        function: str,
        epochs: Mapping[int, int],
        seqnos: Mapping[int, int],
        dlq_rows: Iterable[DlqRow] = (),
        counters: Mapping[str, int] | None = None,
        timer_changes: Iterable[TimerChange] = (),
        timers_done: Iterable[TimerDone] = (),
    ) -> set[int]:
        """Write DLQ rows, timers, counters and checkpoints in one transaction, conditional on the owner's epoch.

        Returns the vBuckets whose epoch moved on (the caller is a zombie for those): their checkpoints,
        DLQ rows, timer changes (by source vBucket) and fired timers (by the timer's vBucket) are rejected.
        A checkpoint that would move backwards raises OrderViolationError.
        """
        dlq = list(dlq_rows)
        changes = list(timer_changes)
        done = list(timers_done)
        now = time.time()
        refused: list[tuple] = []

        def body(db: sqlite3.Connection) -> set[int]:
            refused.clear()
            # Every held vBucket is checked, not only those that moved: a zombie learns at its next
            # commit that it lost them all, and stops working on them.
            vbs = list(set(epochs) | set(seqnos) | {owner_vb(r.vb) for r in dlq} | {c.source_vb for c in changes}
                       | {d.vb for d in done})
            current = {
                r[0]: (r[1], r[2])
                for r in select_vbs(
                    db, "SELECT vb, epoch, seqno FROM checkpoints WHERE function=? AND vb IN ({})", function, vbs
                )
            }
            fenced = fenced_vbuckets(vbs, {vb: epoch for vb, (epoch, _) in current.items()}, epochs)
            updates = []
            for vb, seqno in seqnos.items():
                if vb in fenced:
                    continue
                if seqno < current[vb][1]:
                    refused.append((function, vb, epochs.get(vb, 0), current[vb][1], seqno, "refused", now))
                    raise OrderViolationError(
                        f"checkpoint of function '{function}' vBucket {vb} would move backwards "
                        f"from {current[vb][1]} to {seqno}"
                    )
                updates.append((seqno, now, function, vb))
            db.executemany("UPDATE checkpoints SET seqno=?, updated_at=? WHERE function=? AND vb=?", updates)
            db.executemany(
                # Keyed by (function, vb, seqno): the same failure written again after a crash is a no-op,
                # but a mutation that fails again after its letter was replayed, or under a later
                # deployment, gets the letter back with the new failure (attempts add up).
                "INSERT INTO dlq VALUES(?,?,?,?,?,?,?,?,?,?,?,NULL,?) ON CONFLICT(function, vb, seqno) DO UPDATE SET "
                "reason=excluded.reason, error=excluded.error, traceback=excluded.traceback, "
                "attempts=attempts+excluded.attempts, last_failed_at=excluded.last_failed_at, "
                "mutation=excluded.mutation, replayed_at=NULL, generation=excluded.generation "
                "WHERE replayed_at IS NOT NULL OR generation < excluded.generation",
                [
                    (r.function, r.vb, r.seqno, r.key, r.reason, r.error, r.traceback, r.attempts,
                     r.first_failed_at, r.last_failed_at, r.mutation, r.generation)
                    for r in dlq
                    if owner_vb(r.vb) not in fenced
                ],
            )
            write_timers(db, function, changes, done, fenced, now)
            rejected = sum(1 for vb in seqnos if vb in fenced)
            write_counters(db, function, dict(counters or {}, fenced_checkpoint_writes=rejected))
            return fenced

        try:
            return self._tx(body)
        except OrderViolationError:
            # The commit rolled back; the refusal is recorded on its own so `eventing verify` reports it.
            self._tx(lambda db: db.executemany("INSERT INTO checkpoint_regressions VALUES(?,?,?,?,?,?,?)", refused))
            raise

    def checkpoint_starts(self, function: str) -> dict[int, int]:
        """Per vBucket, the seqno the current deployment started after (its feed boundary)."""
        return dict(self._read("SELECT vb, seqno FROM checkpoint_starts WHERE function=?", (function,)))  # type: ignore[arg-type]

    def checkpoint_regressions(self, function: str, *, min_epoch: int = 0) -> list[dict]:
        """Backwards moves of the function's checkpoints (refused by commit, or applied behind its back),
        oldest first; min_epoch limits them to one deployment (epochs start at generation << 32).
        Deliberate rewinds (rewind_checkpoints) are not regressions; see checkpoint_rewinds."""
        return self._moves(function, min_epoch, "NOT IN")

    def checkpoint_rewinds(self, function: str, *, min_epoch: int = 0) -> list[dict]:
        """The moves rewind_checkpoints made, oldest first: how is REWIND (effect marks kept) or
        REWIND_REAPPLY (effects of the rewound range apply again)."""
        return self._moves(function, min_epoch, "IN")

    def _moves(self, function: str, min_epoch: int, op: str) -> list[dict]:
        rows = self._read(
            "SELECT vb, epoch, from_seqno, to_seqno, how, at FROM checkpoint_regressions "
            f"WHERE function=? AND epoch>=? AND how {op} (?, ?) ORDER BY at, vb",
            (function, min_epoch, REWIND, REWIND_REAPPLY),
        )
        keys = ("vb", "epoch", "from_seqno", "to_seqno", "how", "at")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def rewind_checkpoints(
        self, function: str, targets: Mapping[int, int], *, reapply_effects: bool = False
    ) -> dict[int, tuple[int, int]]:
        """Move a paused function's checkpoints back (see MetadataStore.rewind_checkpoints); one transaction."""
        now = time.time()
        how = REWIND_REAPPLY if reapply_effects else REWIND

        def body(db: sqlite3.Connection) -> dict[int, tuple[int, int]]:
            row = db.execute("SELECT state FROM functions WHERE name=?", (function,)).fetchone()
            if row is None:
                raise NotFoundError(f"unknown function '{function}'; see `eventing list`")
            check_rewind_allowed(function, FunctionState(row[0]))
            current = {
                vb: (seqno, epoch, start)
                for vb, seqno, epoch, start in db.execute(
                    "SELECT c.vb, c.seqno, c.epoch, s.seqno FROM checkpoints c LEFT JOIN checkpoint_starts s "
                    "ON s.function=c.function AND s.vb=c.vb WHERE c.function=?",
                    (function,),
                )
            }
            moves = plan_rewind(function, current, targets, reapply_effects)
            # The trigger logs every backwards UPDATE as 'applied'; the rows it adds here are relabelled.
            mark = db.execute("SELECT COALESCE(MAX(rowid), 0) FROM checkpoint_regressions").fetchone()[0]
            db.executemany(
                # epoch + 1 fences any owner from before the pause: its late commit cannot move it forward.
                "UPDATE checkpoints SET seqno=?, epoch=epoch+1, leased=0, updated_at=? WHERE function=? AND vb=?",
                [(to, now, function, vb) for vb, (_, to) in moves.items()],
            )
            db.execute(
                "UPDATE checkpoint_regressions SET how=?, at=? WHERE rowid>? AND function=?", (how, now, mark, function)
            )
            db.executemany(
                "UPDATE checkpoint_starts SET seqno=MIN(seqno, ?) WHERE function=? AND vb=?",
                [(to, function, vb) for vb, (_, to) in moves.items()],
            )
            return moves

        return self._tx(body)

    def release(self, function: str, epochs: Mapping[int, int]) -> set[int]:
        """Give vBuckets up (lease cleared; owner and epoch kept) after a final commit; returns fenced ones."""

        vbs = list(epochs)

        def body(db: sqlite3.Connection) -> set[int]:
            stored = dict(select_vbs(db, "SELECT vb, epoch FROM checkpoints WHERE function=? AND vb IN ({})", function, vbs))
            fenced = fenced_vbuckets(vbs, stored, epochs)
            db.executemany(
                "UPDATE checkpoints SET leased=0 WHERE function=? AND vb=?",
                [(function, vb) for vb in vbs if vb not in fenced],
            )
            return fenced

        return self._tx(body)

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
        marks = ",".join("?" * len(vbs))
        due_sql = (
            f"SELECT * FROM timers WHERE function=? AND due_ms<=? AND fire_seq IS NULL AND vb IN ({marks}) "
            "ORDER BY due_ms, vb, callback, reference LIMIT ?"
        )
        if not again and (
            # The common case (nothing due anywhere) costs one index probe: no vBucket list, no write.
            not self._read("SELECT 1 FROM timers WHERE function=? AND due_ms<=? AND fire_seq IS NULL LIMIT 1",
                           (function, now_ms))
            or not self._read(due_sql, (function, now_ms, *vbs, 1))
        ):
            return []

        def body(db: sqlite3.Connection) -> list[TimerRecord]:
            current = dict(select_vbs(db, "SELECT vb, epoch FROM checkpoints WHERE function=? AND vb IN ({})", function, vbs))
            valid = [vb for vb in vbs if holds(current.get(vb), epochs[vb])]
            if not valid:
                return []
            keep = ",".join("?" * len(valid))
            out: list[TimerRecord] = []
            valid_set = set(valid)
            mine = [vb for vb in again if vb in valid_set]
            if mine:
                rows = db.execute(
                    f"SELECT * FROM timers WHERE function=? AND fire_seq IS NOT NULL AND vb IN ({','.join('?' * len(mine))}) "
                    "ORDER BY vb, fire_seq",
                    (function, *mine),
                ).fetchall()
                out.extend(TimerRecord(*r) for r in rows)
            rows = db.execute(
                f"SELECT * FROM timers WHERE function=? AND due_ms<=? AND fire_seq IS NULL AND vb IN ({keep}) "
                "ORDER BY due_ms, vb, callback, reference LIMIT ?",
                (function, now_ms, *valid, limit),
            ).fetchall()
            if not rows:
                return out
            touched = sorted({r[3] for r in rows})
            seqs = dict(select_vbs(db, "SELECT vb, seq FROM timer_seqs WHERE function=? AND vb IN ({})", function, touched))
            updates = []
            touched_set = set(touched)
            for r in rows:
                seq = seqs[r[3]] = seqs.get(r[3], 0) + 1
                updates.append((seq, function, r[1], r[2]))
                out.append(TimerRecord(r[0], r[1], r[2], r[3], r[4], r[5], r[6], seq))
            db.executemany("UPDATE timers SET fire_seq=? WHERE function=? AND callback=? AND reference=?", updates)
            db.executemany(
                "INSERT INTO timer_seqs VALUES(?,?,?) ON CONFLICT(function, vb) DO UPDATE SET seq=excluded.seq",
                [(function, vb, seq) for vb, seq in seqs.items() if vb in touched_set],
            )
            return out

        return self._tx(body)

    def get_timer(self, function: str, callback: str, reference: str) -> TimerRecord | None:
        rows = self._read(
            "SELECT * FROM timers WHERE function=? AND callback=? AND reference=?", (function, callback, reference)
        )
        return TimerRecord(*rows[0]) if rows else None

    def timer_backlog(self, function: str, now_ms: int) -> dict[str, int]:
        """Timers waiting (`pending`) and, of those, already due but not fired (`due`)."""
        pending, due = self._read(
            "SELECT COUNT(*), COALESCE(SUM(due_ms<=?), 0) FROM timers WHERE function=?", (now_ms, function)
        )[0]
        return {"pending": int(pending), "due": int(due)}

    def drop_timers(self, function: str) -> None:
        def body(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM timers WHERE function=?", (function,))
            db.execute("DELETE FROM timer_seqs WHERE function=?", (function,))

        self._tx(body)

    # -- counters, DLQ, services --------------------------------------------------------------------

    def add_counters(self, function: str, counters: Mapping[str, int | float]) -> None:
        self._tx(lambda db: write_counters(db, function, counters))

    def set_gauges(self, function: str, gauges: Mapping[str, float]) -> None:
        self._tx(
            lambda db: db.executemany(
                "INSERT INTO counters VALUES(?,?,?) ON CONFLICT(function, name) DO UPDATE SET value=excluded.value",
                [(function, k, v) for k, v in gauges.items()],
            )
        )

    def counters(self, function: str) -> dict[str, float]:
        return dict(self._read("SELECT name, value FROM counters WHERE function=?", (function,)))  # type: ignore[arg-type]

    def count_death(self, function: str, vb: int, seqno: int) -> int:
        def body(db: sqlite3.Connection) -> int:
            db.execute("INSERT INTO deaths VALUES(?,?,?,1) ON CONFLICT(function, vb, seqno) DO UPDATE SET "
                       "count=count+1", (function, vb, seqno))
            return db.execute("SELECT count FROM deaths WHERE function=? AND vb=? AND seqno=?",
                              (function, vb, seqno)).fetchone()[0]

        return self._tx(body)

    def deaths(self, function: str) -> dict[tuple[int, int], int]:
        return {(vb, seqno): n for vb, seqno, n in self._read(
            "SELECT vb, seqno, count FROM deaths WHERE function=?", (function,))}

    def reset_counters(self, function: str, *, keep_prefixes: tuple[str, ...] = ()) -> None:
        """Drop the function's counters (Couchbase's resetStatsCounters), but those whose name starts with
        one of `keep_prefixes`."""

        def body(db: sqlite3.Connection) -> None:
            names = [n for (n,) in db.execute("SELECT name FROM counters WHERE function=?", (function,))]
            db.executemany("DELETE FROM counters WHERE function=? AND name=?",
                           [(function, n) for n in names if not n.startswith(keep_prefixes)])

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
        where, args = dlq_filter(function, vb, seqno, key, reason, include_replayed, replayed_only, generation)
        sql = f"SELECT * FROM dlq WHERE {where} ORDER BY vb, seqno"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [DlqRow(*r) for r in self._read(sql, args)]

    def mark_replayed(self, function: str, keys: Iterable[tuple[int, int]]) -> int:
        """Set replayed_at on the (vBucket, seqno) rows not yet replayed; returns how many changed."""
        now = time.time()
        rows = list(keys)  # the transaction may be retried; a generator would be spent

        def body(db: sqlite3.Connection) -> int:
            changed = 0
            for vb, seqno in rows:
                cur = db.execute(
                    "UPDATE dlq SET replayed_at=? WHERE function=? AND vb=? AND seqno=? AND replayed_at IS NULL",
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

        def body(db: sqlite3.Connection) -> int:
            if selected is None:
                return db.execute(f"DELETE FROM dlq WHERE {where}", args).rowcount
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

        The check and the write are one IMMEDIATE transaction, so of two racing takers exactly one wins.
        `take_from`: a holder the caller knows is dead (its process is gone); its lease is taken at once.
        """

        def body(db: sqlite3.Connection) -> Lease | None:
            now = time.time()
            row = db.execute("SELECT * FROM leases WHERE name=?", (name,)).fetchone()
            current = Lease(*row) if row else None
            new = next_lease(current, name, holder, ttl_s, info, take_from, now)
            if new is not None:
                db.execute(
                    "INSERT OR REPLACE INTO leases VALUES(?,?,?,?,?,?)",
                    (new.name, new.holder, new.expires_at, new.acquired_at, new.term, new.info),
                )
            return new

        return self._tx(body)

    def lease(self, name: str) -> Lease | None:
        rows = self._read("SELECT * FROM leases WHERE name=?", (name,))
        return Lease(*rows[0]) if rows else None

    def release_lease(self, name: str, holder: str) -> bool:
        """Expire the lease now if `holder` holds it (its term stays, so the next holder's is higher)."""
        return bool(
            self._tx(
                lambda db: db.execute(
                    "UPDATE leases SET expires_at=0 WHERE name=? AND holder=? AND expires_at>0", (name, holder)
                ).rowcount
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
                "ray_node_id=COALESCE(excluded.ray_node_id, ray_node_id)",
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
