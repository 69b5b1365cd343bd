"""SqlMetadataStore: the metadata store's logic over a SQL database, shared by the SQLite and PostgreSQL
backends: functions, users, checkpoints, commits, rewinds here; timers, counters, dead letters, services,
leases, nodes and settings in records.py. A backend supplies its transactions and the few places where
the two dialects differ (metadata/sql/base.py): IN lists over vBuckets, bulk updates of checkpoints, the
row lock a read-then-write SELECT takes (none in SQLite, whose transactions hold the write lock from
BEGIN IMMEDIATE), how a rewind's moves are told from regressions, the smaller of two values.

Every transaction body may be run again (SQLite retries while the file is locked, PostgreSQL while the
server is away or after a deadlock): its inputs are in memory, never a spent generator. Rows a
transaction reads and then writes depending on what it read are locked (LOCK, `lock=True`, in vBucket
order), so that of two PostgreSQL transactions one waits for the other, as SQLite's writers do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from metadata.errors import FencedError, LifecycleError, NotFoundError, OrderViolationError
from metadata.fencing import fenced_vbuckets, next_epoch
from metadata.model import (
    REWIND,
    REWIND_REAPPLY,
    USERS_MARK,
    Checkpoint,
    DlqRow,
    FunctionRecord,
    FunctionState,
    TimerChange,
    TimerDone,
    UserRecord,
    check_rewind_allowed,
    check_transition,
    owner_vb,
    plan_rewind,
)
from metadata.sql.records import SqlRecords
from metadata.sql.rows import (
    UPSERT_DLQ,
    SqlDb,
    checkpoint_of,
    dlq_values,
    write_counters,
    write_timers,
)

T = TypeVar("T")


class SqlMetadataStore(SqlRecords):
    """MetadataStore over SQL: functions, users, checkpoints and commits here, the other records in
    SqlRecords, what a backend supplies in SqlBackend (see the module docstring)."""

    # -- functions ----------------------------------------------------------------------------------

    @staticmethod
    def _function(row: tuple) -> FunctionRecord:
        name, definition, source, state, generation, updated_at, deployed_by = row
        return FunctionRecord(
            name,
            json.loads(definition),
            source,
            FunctionState(state),
            generation,
            updated_at,
            json.loads(deployed_by) if deployed_by else None,
        )

    def put_function(self, name: str, definition: dict, source: str) -> FunctionRecord:
        """Create a function (undeployed) or update the definition of an undeployed or paused one."""

        def body(db: SqlDb) -> FunctionRecord:
            now = time.time()
            while True:
                row = db.execute(f"SELECT state FROM functions WHERE name=?{self.LOCK}", (name,)).fetchone()
                if row is not None:
                    break
                # Of two processes creating it at once, one inserts; the other updates the row it made.
                if db.execute(
                    "INSERT INTO functions VALUES(?,?,?,?,0,?,NULL) ON CONFLICT(name) DO NOTHING",
                    (name, json.dumps(definition), source, FunctionState.UNDEPLOYED.value, now),
                ).rowcount:
                    return self._function(
                        db.execute("SELECT * FROM functions WHERE name=?", (name,)).fetchone()
                    )
            state = FunctionState(row[0])
            if state not in (FunctionState.UNDEPLOYED, FunctionState.PAUSED):
                raise LifecycleError(
                    f"cannot update function '{name}': it is {state.value}; pause or undeploy it first"
                )
            db.execute(
                "UPDATE functions SET definition=?, source=?, updated_at=? WHERE name=?",
                (json.dumps(definition), source, now, name),
            )
            return self._function(db.execute("SELECT * FROM functions WHERE name=?", (name,)).fetchone())

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
        def body(db: SqlDb) -> None:
            row = db.execute(f"SELECT state FROM functions WHERE name=?{self.LOCK}", (name,)).fetchone()
            if row is None:
                raise NotFoundError(f"unknown function '{name}'; see `eventing list`")
            if row[0] != FunctionState.UNDEPLOYED.value:
                raise LifecycleError(f"cannot delete function '{name}': it is {row[0]}; undeploy it first")
            db.execute("DELETE FROM functions WHERE name=?", (name,))
            for table in (
                "checkpoints",
                "counters",
                "dlq",
                "checkpoint_starts",
                "checkpoint_regressions",
                "timers",
                "timer_seqs",
            ):
                db.execute(f"DELETE FROM {table} WHERE function=?", (name,))

        self._tx(body)

    def transition(
        self, name: str, target: FunctionState, action: str, *, bump_generation: bool = False
    ) -> FunctionRecord:
        """Move a function to `target` atomically, or raise LifecycleError naming the state and the fix."""

        def body(db: SqlDb) -> FunctionRecord:
            row = db.execute(f"SELECT state FROM functions WHERE name=?{self.LOCK}", (name,)).fetchone()
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
        """Record who deploys or resumes a function over the API (None: the local CLI, trusted as an
        admin)."""

        def body(db: SqlDb) -> None:
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

        def body(db: SqlDb) -> UserRecord:
            db.execute(
                "INSERT INTO users VALUES(?,?,?,?) ON CONFLICT(name) DO UPDATE SET hash=excluded.hash, "
                "roles=excluded.roles",
                (name, password_hash, json.dumps(list(roles)), time.time()),
            )
            # Kept when users are deleted: a store that had users never takes callers without credentials.
            db.execute("INSERT INTO kv VALUES(?, '1') ON CONFLICT(key) DO NOTHING", (USERS_MARK,))
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
        def body(db: SqlDb) -> None:
            if not db.execute("DELETE FROM users WHERE name=?", (name,)).rowcount:
                raise NotFoundError(f"unknown user '{name}'; see `eventing user list`")

        self._tx(body)

    # -- checkpoints and ownership --------------------------------------------------------------------

    def init_checkpoints(
        self, function: str, positions: Mapping[int, int], bucket_uuid: str, epoch_base: int = 0
    ) -> None:
        """Start a deployment's checkpoints; epochs start at epoch_base so older deployments stay fenced."""
        now = time.time()

        def body(db: SqlDb) -> None:
            db.execute("DELETE FROM checkpoints WHERE function=?", (function,))
            db.executemany(
                "INSERT INTO checkpoints VALUES(?,?,?,?,NULL,?,?,0)",
                [(function, vb, seqno, epoch_base, bucket_uuid, now) for vb, seqno in positions.items()],
            )
            db.execute("DELETE FROM checkpoint_starts WHERE function=?", (function,))
            db.execute("DELETE FROM deaths WHERE function=?", (function,))  # the last deployment's
            db.executemany(
                "INSERT INTO checkpoint_starts VALUES(?,?,?)",
                [(function, vb, seqno) for vb, seqno in positions.items()],
            )

        self._tx(body)

    def drop_checkpoints(self, function: str) -> None:
        def body(db: SqlDb) -> None:
            db.execute("DELETE FROM checkpoints WHERE function=?", (function,))
            db.execute("DELETE FROM checkpoint_starts WHERE function=?", (function,))
            db.execute("DELETE FROM deaths WHERE function=?", (function,))

        self._tx(body)

    def checkpoints(self, function: str) -> dict[int, Checkpoint]:
        rows = self._read("SELECT * FROM checkpoints WHERE function=?", (function,))
        return {r[1]: checkpoint_of(r) for r in rows}

    def claim(
        self,
        function: str,
        vbuckets: Iterable[int],
        owner: str,
        *,
        min_epochs: Mapping[int, int] | None = None,
    ) -> dict[int, Checkpoint]:
        """Take ownership of vBuckets with a higher epoch; any previous owner is fenced from then on.

        min_epochs: per vBucket, an epoch the new one must reach at least (used when a bucket's effect
        marks show a higher epoch than this store holds, as after restoring the store from a backup).
        """
        vbs = list(vbuckets)
        now = time.time()
        floor = dict(min_epochs or {})

        def body(db: SqlDb) -> dict[int, Checkpoint]:
            stored = self._select_vbs(
                db,
                "SELECT vb, epoch FROM checkpoints WHERE function=? AND vb IN ({})",
                function,
                vbs,
                lock=True,
            )
            self._update_checkpoints(
                db,
                function,
                ("epoch", "owner", "leased", "updated_at"),
                [(vb, next_epoch(epoch, floor.get(vb, 0)), owner, 1, now) for vb, epoch in stored],
            )
            rows = self._select_vbs(
                db, "SELECT * FROM checkpoints WHERE function=? AND vb IN ({})", function, vbs
            )
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
        """Write DLQ rows, timers, counters and checkpoints in one transaction, conditional on the owner's
        epoch.

        Returns the vBuckets whose epoch moved on (the caller is a zombie for those): their checkpoints,
        DLQ rows, timer changes (by source vBucket) and fired timers (by the timer's vBucket) are rejected.
        A checkpoint that would move backwards raises OrderViolationError.
        """
        dlq = list(dlq_rows)
        changes = list(timer_changes)
        done = list(timers_done)
        now = time.time()
        refused: list[tuple] = []

        def body(db: SqlDb) -> set[int]:
            refused.clear()
            # Every held vBucket is checked, not only those that moved: a zombie learns at its next
            # commit that it lost them all, and stops working on them.
            vbs = list(
                set(epochs)
                | set(seqnos)
                | {owner_vb(r.vb) for r in dlq}
                | {c.source_vb for c in changes}
                | {d.vb for d in done}
            )
            current = {
                r[0]: (r[1], r[2])
                for r in self._select_vbs(
                    db,
                    "SELECT vb, epoch, seqno FROM checkpoints WHERE function=? AND vb IN ({})",
                    function,
                    vbs,
                    lock=True,
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
                updates.append((vb, seqno, now))
            self._update_checkpoints(db, function, ("seqno", "updated_at"), updates)
            db.executemany(UPSERT_DLQ, [dlq_values(r) for r in dlq if owner_vb(r.vb) not in fenced])
            write_timers(db, function, changes, done, fenced, now)
            rejected = sum(1 for vb in seqnos if vb in fenced)
            write_counters(db, function, dict(counters or {}, fenced_checkpoint_writes=rejected))
            return fenced

        try:
            return self._tx(body)
        except OrderViolationError:
            # The commit rolled back; the refusal is recorded on its own so `eventing verify` reports it.
            self._tx(
                lambda db: db.executemany("INSERT INTO checkpoint_regressions VALUES(?,?,?,?,?,?,?)", refused)
            )
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
        """Move a paused function's checkpoints back (see MetadataStore.rewind_checkpoints); one
        transaction."""
        now = time.time()
        how = REWIND_REAPPLY if reapply_effects else REWIND

        def body(db: SqlDb) -> dict[int, tuple[int, int]]:
            row = db.execute(f"SELECT state FROM functions WHERE name=?{self.LOCK}", (function,)).fetchone()
            if row is None:
                raise NotFoundError(f"unknown function '{function}'; see `eventing list`")
            check_rewind_allowed(function, FunctionState(row[0]))
            lock = f"{self.LOCK} OF c" if self.LOCK else ""
            current = {
                vb: (seqno, epoch, start)
                for vb, seqno, epoch, start in db.execute(
                    "SELECT c.vb, c.seqno, c.epoch, s.seqno FROM checkpoints c LEFT JOIN checkpoint_starts s "
                    f"ON s.function=c.function AND s.vb=c.vb WHERE c.function=? ORDER BY c.vb{lock}",
                    (function,),
                )
            }
            moves = plan_rewind(function, current, targets, reapply_effects)
            mark = self._label_moves(db, how)
            db.executemany(
                # epoch + 1 fences any owner from before the pause: its late commit cannot move it forward.
                "UPDATE checkpoints SET seqno=?, epoch=epoch+1, leased=0, updated_at=? WHERE function=? AND "
                "vb=?",
                [(to, now, function, vb) for vb, (_, to) in moves.items()],
            )
            self._relabel_moves(db, mark, how, now, function)
            db.executemany(
                f"UPDATE checkpoint_starts SET seqno={self.LEAST}(seqno, ?) WHERE function=? AND vb=?",
                [(to, function, vb) for vb, (_, to) in moves.items()],
            )
            return moves

        return self._tx(body)

    def release(self, function: str, epochs: Mapping[int, int]) -> set[int]:
        """Give vBuckets up (lease cleared; owner and epoch kept) after a final commit; returns fenced
        ones."""

        vbs = list(epochs)

        def body(db: SqlDb) -> set[int]:
            stored = dict(
                self._select_vbs(
                    db,
                    "SELECT vb, epoch FROM checkpoints WHERE function=? AND vb IN ({})",
                    function,
                    vbs,
                    lock=True,
                )
            )
            fenced = fenced_vbuckets(vbs, stored, epochs)
            self._update_checkpoints(db, function, ("leased",), [(vb, 0) for vb in vbs if vb not in fenced])
            return fenced

        return self._tx(body)
