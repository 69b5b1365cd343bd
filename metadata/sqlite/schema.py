"""Every table of the SQLite metadata store, in one place.

A new table goes in SCHEMA (`CREATE TABLE IF NOT EXISTS`: a store file gets it at its next open); a new
column of an existing table also needs its `ALTER TABLE` in `apply_schema`, for files written before it.
The window coordinators' table (WINDOW_STATE_SCHEMA) is created by the first SqliteWindowStateStore.
"""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS functions(
    name TEXT PRIMARY KEY, definition TEXT NOT NULL, source TEXT NOT NULL,
    state TEXT NOT NULL, generation INTEGER NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints(
    function TEXT NOT NULL, vb INTEGER NOT NULL, seqno INTEGER NOT NULL, epoch INTEGER NOT NULL,
    owner TEXT, bucket_uuid TEXT NOT NULL, updated_at REAL NOT NULL, leased INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(function, vb)) WITHOUT ROWID;
-- Where each deployment's checkpoints started (its feed boundary), so `eventing verify` knows which
-- source mutations the function owes.
CREATE TABLE IF NOT EXISTS checkpoint_starts(
    function TEXT NOT NULL, vb INTEGER NOT NULL, seqno INTEGER NOT NULL,
    PRIMARY KEY(function, vb)) WITHOUT ROWID;
-- Every backwards move of a checkpoint, for `eventing verify`: 'refused' by commit (which raised
-- OrderViolationError and rolled back), or 'applied' by a write that bypassed commit (the trigger).
-- The trigger costs one comparison per updated checkpoint row.
CREATE TABLE IF NOT EXISTS checkpoint_regressions(
    function TEXT NOT NULL, vb INTEGER NOT NULL, epoch INTEGER NOT NULL, from_seqno INTEGER NOT NULL,
    to_seqno INTEGER NOT NULL, how TEXT NOT NULL, at REAL NOT NULL);
CREATE TRIGGER IF NOT EXISTS checkpoint_moved_backwards AFTER UPDATE OF seqno ON checkpoints
    WHEN NEW.seqno < OLD.seqno
    BEGIN
        INSERT INTO checkpoint_regressions VALUES(
            NEW.function, NEW.vb, NEW.epoch, OLD.seqno, NEW.seqno, 'applied',
            (julianday('now') - 2440587.5) * 86400.0);
    END;
CREATE TABLE IF NOT EXISTS counters(
    function TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL,
    PRIMARY KEY(function, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dlq(
    function TEXT NOT NULL, vb INTEGER NOT NULL, seqno INTEGER NOT NULL, key TEXT NOT NULL,
    reason TEXT NOT NULL, error TEXT NOT NULL, traceback TEXT NOT NULL, attempts INTEGER NOT NULL,
    first_failed_at REAL NOT NULL, last_failed_at REAL NOT NULL, mutation BLOB NOT NULL,
    replayed_at REAL, generation INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(function, vb, seqno));
CREATE TABLE IF NOT EXISTS services(id TEXT PRIMARY KEY, info TEXT NOT NULL, heartbeat_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes(
    name TEXT PRIMARY KEY, state TEXT NOT NULL, ray_node_id TEXT, added_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS leases(
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL, acquired_at REAL NOT NULL,
    term INTEGER NOT NULL, info TEXT NOT NULL);
-- Durable timers: one row per (function, callback, reference), partitioned by the vBucket of the
-- reference. fire_seq is set when the vBucket's owner claims a due timer; its effects are keyed by it.
CREATE TABLE IF NOT EXISTS timers(
    function TEXT NOT NULL, callback TEXT NOT NULL, reference TEXT NOT NULL, vb INTEGER NOT NULL,
    due_ms INTEGER NOT NULL, context TEXT NOT NULL, created_at REAL NOT NULL, fire_seq INTEGER,
    PRIMARY KEY(function, callback, reference)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS timers_due ON timers(function, due_ms);
-- Per (function, vBucket): the last fire_seq handed out; it never goes backwards within a deployment.
CREATE TABLE IF NOT EXISTS timer_seqs(
    function TEXT NOT NULL, vb INTEGER NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY(function, vb)) WITHOUT ROWID;
-- Per mutation, how often a worker's process died while the handler ran on it alone
-- (eventing.workers.crash_guard); dropped with the deployment's checkpoints.
CREATE TABLE IF NOT EXISTS deaths(
    function TEXT NOT NULL, vb INTEGER NOT NULL, seqno INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY(function, vb, seqno)) WITHOUT ROWID;
-- Users of the REST and Data APIs: a salted scrypt hash with its parameters (never a password), roles as JSON.
CREATE TABLE IF NOT EXISTS users(
    name TEXT PRIMARY KEY, hash TEXT NOT NULL, roles TEXT NOT NULL, created_at REAL NOT NULL);
"""  # noqa: E501


# -- window coordinator state: one fenced JSON state per function (SqliteWindowStateStore)
WINDOW_STATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS window_state(
    function TEXT PRIMARY KEY, fence INTEGER NOT NULL, state TEXT, updated_at REAL NOT NULL);
"""

# The tables a file must hold to be restored as a metadata store (metadata.sqlite.backup).
REQUIRED_TABLES = frozenset({"functions", "checkpoints", "checkpoint_starts"})


def apply_schema(db: sqlite3.Connection) -> None:
    """Create the missing tables and add the columns later versions introduced."""
    db.executescript(SCHEMA)
    columns = {r[1] for r in db.execute("PRAGMA table_info(dlq)")}
    if "generation" not in columns:  # a store written before dead letters recorded their deployment
        db.execute("ALTER TABLE dlq ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")
    # A worker's claim reads only its deployment's letters: old deployments' letters cost it nothing.
    db.execute("CREATE INDEX IF NOT EXISTS dlq_generation ON dlq(function, generation, vb, seqno)")
    # A store whose users were created before it kept the users' mark (metadata.model.USERS_MARK).
    if (
        db.execute("SELECT 1 FROM users LIMIT 1").fetchone()
        and not db.execute("SELECT 1 FROM kv WHERE key='users_created'").fetchone()
    ):
        db.execute("INSERT OR IGNORE INTO kv VALUES('users_created', '1')")
    columns = {r[1] for r in db.execute("PRAGMA table_info(functions)")}
    if "deployed_by" not in columns:  # a store written before deployments recorded their user (JSON or NULL)
        db.execute("ALTER TABLE functions ADD COLUMN deployed_by TEXT")
