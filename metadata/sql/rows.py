"""Row conversions and the writes a commit shares with the window coordinators' commit, in SQL that SQLite
and PostgreSQL both run (an upsert's existing row is named by its table: PostgreSQL finds a bare column
name ambiguous beside `excluded`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from metadata.model import Checkpoint, DlqRow, TimerChange, TimerDone


class SqlDb(Protocol):
    """What a transaction body writes through: a sqlite3 connection, or a PostgreSQL store's cursor
    (metadata.postgres.connection.Cursor, which takes the same `?` placeholders). `execute` returns a
    cursor (fetchone, fetchall, rowcount, iteration)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, parameters: Any, /) -> Any: ...


def node_of(row: tuple) -> dict:
    name, state, ray_node_id, added_at = row
    return {"name": name, "state": state, "ray_node_id": ray_node_id, "added_at": added_at}


def checkpoint_of(row: tuple) -> Checkpoint:
    function, vb, seqno, epoch, owner, bucket_uuid, updated_at, leased = row
    return Checkpoint(function, vb, seqno, epoch, owner, bucket_uuid, updated_at, bool(leased))


def dlq_values(r: DlqRow) -> tuple:
    return (
        r.function,
        r.vb,
        r.seqno,
        r.key,
        r.reason,
        r.error,
        r.traceback,
        r.attempts,
        r.first_failed_at,
        r.last_failed_at,
        r.mutation,
        r.generation,
    )


# Keyed by (function, vb, seqno): the same failure written again after a crash is a no-op, but a mutation
# that fails again after its letter was replayed, or under a later deployment, gets the letter back with
# the new failure (attempts add up).
UPSERT_DLQ = (
    "INSERT INTO dlq VALUES(?,?,?,?,?,?,?,?,?,?,?,NULL,?) ON CONFLICT(function, vb, seqno) DO UPDATE SET "
    "reason=excluded.reason, error=excluded.error, traceback=excluded.traceback, "
    "attempts=dlq.attempts+excluded.attempts, last_failed_at=excluded.last_failed_at, "
    "mutation=excluded.mutation, replayed_at=NULL, generation=excluded.generation "
    "WHERE dlq.replayed_at IS NOT NULL OR dlq.generation < excluded.generation"
)

# A window coordinator's late rows: inserted once, keyed like the workers' dead letters.
INSERT_DLQ_ONCE = (
    "INSERT INTO dlq(function, vb, seqno, key, reason, error, traceback, attempts, first_failed_at, "
    "last_failed_at, mutation, generation) VALUES(?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(function, vb, seqno) "
    "DO NOTHING"
)


def write_counters(db: SqlDb, function: str, counters: Mapping[str, int | float]) -> None:
    # In name order: two transactions adding to the same counters lock their rows in the same order.
    db.executemany(
        "INSERT INTO counters VALUES(?,?,?) ON CONFLICT(function, name) DO UPDATE SET "
        "value=counters.value+excluded.value",
        [(function, k, v) for k, v in sorted(counters.items()) if v],
    )


def write_timers(
    db: SqlDb,
    function: str,
    changes: list[TimerChange],
    done: list[TimerDone],
    fenced: set[int],
    now: float,
) -> None:
    """Fired timers first (only while they hold the claimed fire_seq), then creates and cancels in the
    order the handlers made them, so a callback that sets its own timer again keeps the new one."""
    db.executemany(
        "DELETE FROM timers WHERE function=? AND callback=? AND reference=? AND fire_seq=?",
        [(function, d.callback, d.reference, d.fire_seq) for d in done if d.vb not in fenced],
    )
    for c in changes:
        if c.source_vb in fenced:
            continue
        if c.due_ms is None:
            db.execute(
                "DELETE FROM timers WHERE function=? AND callback=? AND reference=?",
                (function, c.callback, c.reference),
            )
        else:
            db.execute(
                "INSERT INTO timers VALUES(?,?,?,?,?,?,?,NULL) ON CONFLICT(function, callback, reference) DO "
                "UPDATE SET vb=excluded.vb, due_ms=excluded.due_ms, context=excluded.context, "
                "created_at=excluded.created_at, fire_seq=NULL",
                (function, c.callback, c.reference, c.vb, c.due_ms, c.context, now),
            )


def dlq_filter(
    function: str,
    vb: int | None,
    seqno: int | None,
    key: str | None,
    reason: str | None,
    include_replayed: bool,
    replayed_only: bool,
    generation: int | None = None,
) -> tuple[str, tuple]:
    clauses: list[str] = ["function=?"]
    args: list[str | int] = [function]
    for column, value in (
        ("vb", vb),
        ("seqno", seqno),
        ("key", key),
        ("reason", reason),
        ("generation", generation),
    ):
        if value is not None:
            clauses.append(f"{column}=?")
            args.append(value)
    if replayed_only:
        clauses.append("replayed_at IS NOT NULL")
    elif not include_replayed:
        clauses.append("replayed_at IS NULL")
    return " AND ".join(clauses), tuple(args)
