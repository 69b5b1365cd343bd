"""Row conversions and SQL helpers shared by the SQLite store's modules (private to metadata/sqlite/)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from metadata.model import Checkpoint, TimerChange, TimerDone

CORRUPT_RECOVERY = (
    "stop every eventing process, then restore it from a backup (replays after the restored checkpoints "
    "apply no effect twice), or move it aside and redeploy the functions (they restart from their feed "
    "boundary); see 'Damaged metadata store' in docs/operations.md"
)


def node_of(row: tuple) -> dict:
    name, state, ray_node_id, added_at = row
    return {"name": name, "state": state, "ray_node_id": ray_node_id, "added_at": added_at}


def one_line(value: object) -> str:
    """SQLite's integrity reports span lines; an error message is one line."""
    return " ".join(str(value).split())


def checkpoint_of(row: tuple) -> Checkpoint:
    function, vb, seqno, epoch, owner, bucket_uuid, updated_at, leased = row
    return Checkpoint(function, vb, seqno, epoch, owner, bucket_uuid, updated_at, bool(leased))


def write_counters(db: sqlite3.Connection, function: str, counters: Mapping[str, int | float]) -> None:
    db.executemany(
        "INSERT INTO counters VALUES(?,?,?) ON CONFLICT(function, name) DO UPDATE SET value=value+excluded.value",
        [(function, k, v) for k, v in counters.items() if v],
    )


def write_timers(
    db: sqlite3.Connection,
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
                "DELETE FROM timers WHERE function=? AND callback=? AND reference=?", (function, c.callback, c.reference)
            )
        else:
            db.execute(
                "INSERT INTO timers VALUES(?,?,?,?,?,?,?,NULL) ON CONFLICT(function, callback, reference) DO UPDATE "
                "SET vb=excluded.vb, due_ms=excluded.due_ms, context=excluded.context, "
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
    for column, value in (("vb", vb), ("seqno", seqno), ("key", key), ("reason", reason), ("generation", generation)):
        if value is not None:
            clauses.append(f"{column}=?")
            args.append(value)
    if replayed_only:
        clauses.append("replayed_at IS NOT NULL")
    elif not include_replayed:
        clauses.append("replayed_at IS NULL")
    return " AND ".join(clauses), tuple(args)


def select_vbs(db: sqlite3.Connection, sql: str, function: str, vbs: list[int]) -> list[tuple]:
    """Run `sql` with an IN (...) over vbs, in chunks that stay under SQLite's variable limit."""
    out: list[tuple] = []
    for i in range(0, len(vbs), 500):
        chunk = vbs[i : i + 500]
        out.extend(db.execute(sql.format(",".join("?" * len(chunk))), (function, *chunk)).fetchall())
    return out
