"""SQLite backend of the metadata store: the embedded default, one WAL file shared by every process."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from metadata.errors import (
    FencedError,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
)
from metadata.model import Checkpoint, DlqRow, FunctionRecord, FunctionState, check_transition

log = logging.getLogger("eventing.metadata")

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS functions(
    name TEXT PRIMARY KEY, definition TEXT NOT NULL, source TEXT NOT NULL,
    state TEXT NOT NULL, generation INTEGER NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints(
    function TEXT NOT NULL, vb INTEGER NOT NULL, seqno INTEGER NOT NULL, epoch INTEGER NOT NULL,
    owner TEXT, bucket_uuid TEXT NOT NULL, updated_at REAL NOT NULL, leased INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(function, vb)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters(
    function TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL,
    PRIMARY KEY(function, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dlq(
    function TEXT NOT NULL, vb INTEGER NOT NULL, seqno INTEGER NOT NULL, key TEXT NOT NULL,
    reason TEXT NOT NULL, error TEXT NOT NULL, traceback TEXT NOT NULL, attempts INTEGER NOT NULL,
    first_failed_at REAL NOT NULL, last_failed_at REAL NOT NULL, mutation BLOB NOT NULL,
    replayed_at REAL, PRIMARY KEY(function, vb, seqno));
CREATE TABLE IF NOT EXISTS services(id TEXT PRIMARY KEY, info TEXT NOT NULL, heartbeat_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# How long one statement waits for another process's write lock before we log and retry.
BUSY_TIMEOUT_MS = 2000


class SqliteMetadataStore:
    """MetadataStore on one SQLite file in WAL mode: a writer and readers in other processes at once.

    Writes that find the file locked for longer than BUSY_TIMEOUT_MS are retried with a warning for up to
    `lock_wait_s`, then fail with StoreLockedError: processing waits, it never skips a checkpoint.
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_wait_s: float = 60.0, create: bool = True):
        self.path = Path(path)
        self.lock_wait_s = lock_wait_s
        if not self.path.exists() and not create:
            raise NotFoundError(
                f"metadata store {self.path} does not exist; deploy a function first or pass the right --data-dir"
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open metadata store {self.path}: {exc}; check that the data directory is writable"
            ) from None
        try:
            self._retry(self._setup)
        except sqlite3.DatabaseError as exc:
            raise StoreCorruptError(
                f"metadata store {self.path} is not a valid SQLite database ({exc}); "
                "restore it from a backup, or move it aside and redeploy the functions "
                "(checkpoints restart from each function's feed boundary)"
            ) from None

    def _setup(self) -> None:
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def verify_integrity(self) -> None:
        """Fail closed on a truncated or corrupted file rather than resume from a wrong checkpoint."""
        try:
            result = self._db.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            result = str(exc)
        if result != "ok":
            raise StoreCorruptError(
                f"metadata store {self.path} failed its integrity check ({result}); "
                "restore it from a backup, or move it aside and redeploy the functions "
                "(checkpoints restart from each function's feed boundary)"
            )

    # -- transactions -------------------------------------------------------------------------------

    def _retry(self, fn: Callable[[], T]) -> T:
        return retry_locked(self.path, fn, self.lock_wait_s)

    def _tx(self, body: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = body(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

        return self._retry(run)

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._retry(lambda: self._db.execute(sql, args).fetchall())

    def close(self) -> None:
        self._db.close()

    # -- functions ----------------------------------------------------------------------------------

    @staticmethod
    def _function(row: tuple) -> FunctionRecord:
        name, definition, source, state, generation, updated_at = row
        return FunctionRecord(name, json.loads(definition), source, FunctionState(state), generation, updated_at)

    def put_function(self, name: str, definition: dict, source: str) -> FunctionRecord:
        """Create a function (undeployed) or update the definition of an undeployed or paused one."""

        def body(db: sqlite3.Connection) -> FunctionRecord:
            row = db.execute("SELECT state FROM functions WHERE name=?", (name,)).fetchone()
            now = time.time()
            if row is None:
                db.execute(
                    "INSERT INTO functions VALUES(?,?,?,?,0,?)",
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
            for table in ("checkpoints", "counters", "dlq"):
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

        self._tx(body)

    def drop_checkpoints(self, function: str) -> None:
        self._tx(lambda db: db.execute("DELETE FROM checkpoints WHERE function=?", (function,)))

    def checkpoints(self, function: str) -> dict[int, Checkpoint]:
        rows = self._read("SELECT * FROM checkpoints WHERE function=?", (function,))
        return {r[1]: _checkpoint(r) for r in rows}

    def claim(self, function: str, vbuckets: Iterable[int], owner: str) -> dict[int, Checkpoint]:
        """Take ownership of vBuckets with a higher epoch; any previous owner is fenced from then on."""
        vbs = list(vbuckets)
        now = time.time()

        def body(db: sqlite3.Connection) -> dict[int, Checkpoint]:
            db.executemany(
                "UPDATE checkpoints SET epoch=epoch+1, owner=?, leased=1, updated_at=? WHERE function=? AND vb=?",
                [(owner, now, function, vb) for vb in vbs],
            )
            rows = _select_vbs(db, "SELECT * FROM checkpoints WHERE function=? AND vb IN ({})", function, vbs)
            return {r[1]: _checkpoint(r) for r in rows}

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
    ) -> set[int]:
        """Write DLQ rows, counters and checkpoints in one transaction, conditional on the owner's epoch.

        Returns the vBuckets whose epoch moved on (the caller is a zombie for those): their checkpoints
        and DLQ rows are rejected. A checkpoint that would move backwards raises OrderViolationError.
        """
        dlq = list(dlq_rows)
        now = time.time()

        def body(db: sqlite3.Connection) -> set[int]:
            # Every held vBucket is checked, not only those that moved: a zombie learns at its next
            # commit that it lost them all, and stops working on them.
            vbs = list(set(epochs) | set(seqnos) | {r.vb for r in dlq})
            current = {
                r[0]: (r[1], r[2])
                for r in _select_vbs(
                    db, "SELECT vb, epoch, seqno FROM checkpoints WHERE function=? AND vb IN ({})", function, vbs
                )
            }
            fenced = {vb for vb in vbs if vb not in current or current[vb][0] != epochs.get(vb)}
            updates = []
            for vb, seqno in seqnos.items():
                if vb in fenced:
                    continue
                if seqno < current[vb][1]:
                    raise OrderViolationError(
                        f"checkpoint of function '{function}' vBucket {vb} would move backwards "
                        f"from {current[vb][1]} to {seqno}"
                    )
                updates.append((seqno, now, function, vb))
            db.executemany("UPDATE checkpoints SET seqno=?, updated_at=? WHERE function=? AND vb=?", updates)
            db.executemany(
                "INSERT OR IGNORE INTO dlq VALUES(?,?,?,?,?,?,?,?,?,?,?,NULL)",
                [
                    (r.function, r.vb, r.seqno, r.key, r.reason, r.error, r.traceback, r.attempts,
                     r.first_failed_at, r.last_failed_at, r.mutation)
                    for r in dlq
                    if r.vb not in fenced
                ],
            )
            rejected = sum(1 for vb in seqnos if vb in fenced)
            _add_counters(db, function, dict(counters or {}, fenced_checkpoint_writes=rejected))
            return fenced

        return self._tx(body)

    def release(self, function: str, epochs: Mapping[int, int]) -> set[int]:
        """Give vBuckets up (lease cleared; owner and epoch kept) after a final commit; returns fenced ones."""

        def body(db: sqlite3.Connection) -> set[int]:
            fenced = set()
            for vb, epoch in epochs.items():
                cur = db.execute(
                    "UPDATE checkpoints SET leased=0 WHERE function=? AND vb=? AND epoch=?",
                    (function, vb, epoch),
                )
                if cur.rowcount == 0:
                    fenced.add(vb)
            return fenced

        return self._tx(body)

    # -- counters, DLQ, services --------------------------------------------------------------------

    def add_counters(self, function: str, counters: Mapping[str, int | float]) -> None:
        self._tx(lambda db: _add_counters(db, function, counters))

    def set_gauges(self, function: str, gauges: Mapping[str, float]) -> None:
        self._tx(
            lambda db: db.executemany(
                "INSERT INTO counters VALUES(?,?,?) ON CONFLICT(function, name) DO UPDATE SET value=excluded.value",
                [(function, k, v) for k, v in gauges.items()],
            )
        )

    def counters(self, function: str) -> dict[str, float]:
        return dict(self._read("SELECT name, value FROM counters WHERE function=?", (function,)))  # type: ignore[arg-type]

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

    def get_kv(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM kv WHERE key=?", (key,))
        return rows[0][0] if rows else None

    def set_kv(self, key: str, value: str) -> None:
        self._tx(
            lambda db: db.execute(
                "INSERT INTO kv VALUES(?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value)
            )
        )


def retry_locked(path: Path, fn: Callable[[], T], lock_wait_s: float = 60.0) -> T:
    """Run fn; while SQLite says the file is locked, warn once and retry for up to lock_wait_s."""
    deadline = time.monotonic() + lock_wait_s
    warned = False
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            msg = str(exc)
            if "locked" not in msg and "busy" not in msg:
                if "readonly" in msg or "unable to open" in msg or "disk" in msg:
                    raise StoreError(
                        f"cannot write {path}: {msg}; check permissions and free space of the data directory"
                    ) from None
                raise
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"{path} stayed locked by another process for {lock_wait_s:.0f}s; "
                    f"stop the process holding it (see `fuser {path}`)"
                ) from None
            if not warned:
                log.warning("%s is locked by another process; waiting (up to %.0fs)", path, lock_wait_s)
                warned = True
            time.sleep(0.05)


def _checkpoint(row: tuple) -> Checkpoint:
    function, vb, seqno, epoch, owner, bucket_uuid, updated_at, leased = row
    return Checkpoint(function, vb, seqno, epoch, owner, bucket_uuid, updated_at, bool(leased))


def _add_counters(db: sqlite3.Connection, function: str, counters: Mapping[str, int | float]) -> None:
    db.executemany(
        "INSERT INTO counters VALUES(?,?,?) ON CONFLICT(function, name) DO UPDATE SET value=value+excluded.value",
        [(function, k, v) for k, v in counters.items() if v],
    )


def _select_vbs(db: sqlite3.Connection, sql: str, function: str, vbs: list[int]) -> list[tuple]:
    """Run `sql` with an IN (...) over vbs, in chunks that stay under SQLite's variable limit."""
    out: list[tuple] = []
    for i in range(0, len(vbs), 500):
        chunk = vbs[i : i + 500]
        out.extend(db.execute(sql.format(",".join("?" * len(chunk))), (function, *chunk)).fetchall())
    return out
