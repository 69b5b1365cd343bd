"""Knowing whether a transaction committed when the answer to its COMMIT never came.

The server may have committed or not: it went away (killed, restarted, failed over) or the connection
dropped after COMMIT was sent. Every transaction of a PostgreSQL store inserts a token of its own, a
UUID, into `eventing_commits` (in the same round trip as its BEGIN, or queued in its pipeline), so the
token is there exactly when the transaction committed. When the answer is lost, `commit_fate` asks the
server, once it answers again, by trying to insert the same token in a transaction it then rolls back:
the insert conflicts if the transaction committed, succeeds if it did not, and waits while the
transaction is still running (a server that committed locally and waits for its synchronous standby).
After a failover the new primary is asked: a commit it does not hold is lost, and running the
transaction again is right. On a standby the probe fails (read-only) and is tried again.

Tokens start with the time they were made (milliseconds, like a UUIDv7), so pruning the old ones walks
the primary key: every PRUNE_EVERY transactions a process deletes up to PRUNE_ROWS tokens older than
RETENTION_S (rows another process is deleting are skipped, so nobody waits).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

COMMITS_TABLE = "eventing_commits"
RETENTION_S = 600.0  # at least 4 x $EVENTING_STORE_WAIT_S (see retention_s)
PRUNE_EVERY = 256
PRUNE_ROWS = 1024
PROBE_LOCK_TIMEOUT = "2s"


def new_token(now: float | None = None) -> uuid.UUID:
    """A UUID whose first 48 bits are the time in milliseconds and the other 80 random."""
    ms = int((time.time() if now is None else now) * 1000)
    return uuid.UUID(int=(ms << 80) | int.from_bytes(os.urandom(10), "big"))


def retention_s(wait_s: float) -> float:
    return max(RETENTION_S, 4 * wait_s)


def create_sql() -> str:
    return f"CREATE TABLE IF NOT EXISTS {COMMITS_TABLE}(token UUID PRIMARY KEY)"


def insert_sql(token: uuid.UUID) -> str:
    """The token's insert with the token inlined (it is ours: a UUID), so it travels with BEGIN in one
    simple query."""
    return f"INSERT INTO {COMMITS_TABLE} VALUES('{token}')"


def prune_sql(wait_s: float) -> str:
    cutoff = uuid.UUID(int=int((time.time() - retention_s(wait_s)) * 1000) << 80)
    return (
        f"DELETE FROM {COMMITS_TABLE} WHERE token IN (SELECT token FROM {COMMITS_TABLE} WHERE token < "
        f"'{cutoff}' ORDER BY token LIMIT {PRUNE_ROWS} FOR UPDATE SKIP LOCKED)"
    )


def probe(conn: psycopg.Connection, token: uuid.UUID) -> bool:
    """True if the transaction that inserted `token` committed, False if it did not (it never will: a
    transaction still running makes this wait, up to PROBE_LOCK_TIMEOUT, then raise 55P03)."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(f"SET LOCAL lock_timeout = '{PROBE_LOCK_TIMEOUT}'")
            cur.execute(f"INSERT INTO {COMMITS_TABLE} VALUES(%s) ON CONFLICT DO NOTHING", (token,))
            inserted = cur.rowcount
        finally:
            cur.execute("ROLLBACK")
    return inserted == 0
