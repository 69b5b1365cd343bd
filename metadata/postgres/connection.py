"""Connections to a PostgreSQL store (its location: location.py): a pool per process, transactions that
are retried while the server is away, and the schema's version.

    db = PostgresDatabase.open("postgresql://user@host:5432/db?schema=team_a")
    db.transaction(lambda cur: cur.execute("INSERT ..."))    # retried while the server restarts or fails over
    db.read("SELECT ... WHERE x=%s", (1,))

The URL is libpq's, with everything libpq takes (several hosts and ``target_session_attrs=read-write`` for
failover, ``sslmode``, ``$PGPASSWORD`` and ``~/.pgpass``); one parameter is ours: ``schema=NAME`` puts every
table of this store in that schema (created on first use), so several installations can share one
database. ``connect_timeout`` defaults to 5 s so an unreachable server is named within seconds.

Retries. A transaction whose statements fail because the connection went away (a restart, a failover, a
dropped connection), or that PostgreSQL aborted to resolve a conflict (serialization failure, deadlock),
is run again from the start on a new connection, for up to $EVENTING_STORE_WAIT_S seconds (60 by default):
its body must be safe to run again (its inputs in memory). A COMMIT whose answer is lost (the connection
went away after it was sent) may or may not have committed: every transaction carries a commit token
(metadata/postgres/commits.py), and once the server answers again it is asked whether that token was
committed. Committed: the transaction's result is returned; not: it is run again. Only when the server
does not answer within the wait does it raise ``StoreUnavailableError(ambiguous=True)``, and the caller
decides (a worker rewinds to its checkpoint, whose effects are guarded by marks; the Data API answers 503).
No error message ever holds the password.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from metadata.errors import StoreError, StoreUnavailableError
from metadata.postgres import commits
from metadata.postgres.location import (
    DEFAULT_POOL_SIZE,
    POOL_SIZE_ENV,
    PostgresTarget,
    describe_error,
    parse_postgres_url,
)

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("eventing.metadata")
# The pool logs every failed reconnection attempt; our own retry loop says it once, in one line.
logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)

T = TypeVar("T")

STORE_WAIT_ENV = "EVENTING_STORE_WAIT_S"
DEFAULT_WAIT_S = 60.0
FIRST_CONTACT_S = 6.0
POOL_WAIT_S = 1.0  # for a pooled connection, before trying one of its own (see PostgresDatabase._attempt)

# SQLSTATEs that mean "run the transaction again": the connection is gone or the server is going away,
# or PostgreSQL aborted this transaction to resolve a conflict with another.
_RETRY_STATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "57P01",  # admin_shutdown (a fast or immediate stop; a failover)
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up, or in recovery)
    "08000",
    "08003",
    "08006",
    "08001",
    "08004",  # connection exceptions
    "25006",  # read_only_sql_transaction: connected to a standby that is not promoted yet
    "57014",  # query_canceled (statement_timeout): run it again
    "53300",  # too_many_connections
}


def store_wait_s() -> float:
    try:
        return float(os.environ.get(STORE_WAIT_ENV, DEFAULT_WAIT_S))
    except ValueError:
        return DEFAULT_WAIT_S


def retriable(exc: BaseException) -> bool:
    """Whether running the whole transaction again may succeed (see the module docstring)."""
    import psycopg

    state = getattr(exc, "sqlstate", None)
    if state in _RETRY_STATES or (state or "").startswith("08"):
        return True
    if state is None and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        # A refused login carries no SQLSTATE in psycopg: told apart from a server that is away by its text.
        low = str(exc).lower()
        return not any(text in low for text in _LOGIN_REFUSALS)
    return False


_LOGIN_REFUSALS = (
    "password authentication failed",
    "does not exist",
    "no pg_hba.conf entry",
    "permission denied",
    "sslmode value",
    "invalid connection option",
    "invalid uri",
    "invalid sslmode",
    "no password supplied",
    "certificate",
    "unrecognized configuration parameter",
    "invalid value for parameter",
)


class Cursor:
    """What a transaction body gets: `execute` returning a cursor (fetchone/fetchall/rowcount, iteration),
    `executemany`, and `copy` for bulk loads. `?` placeholders are accepted as well as `%s`.

    In a pipelined transaction (`transaction(body, pipeline=True)`) each statement is sent without waiting
    for its answer; reading an answer (fetch*, rowcount, iterating) waits for it and those before it. A
    body that reads once and then writes costs two round trips, COMMIT included, however many statements
    it sends. Every `execute` then answers on a cursor of its own. `copy` leaves the pipeline for the rest
    of the transaction (psycopg runs no COPY in a pipeline)."""

    __slots__ = ("_cur", "_pipe")

    def __init__(self, cur: psycopg.Cursor, pipe: Pipe | None = None):
        self._cur = cur
        self._pipe = pipe

    def execute(self, sql: str, args: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
        if self._pipe is None or not self._pipe.active:
            return self._cur.execute(_placeholders(sql), args, prepare=None)
        cur = self._cur.connection.cursor()
        cur.execute(_placeholders(sql), args, prepare=None)
        return _Answer(cur, self._pipe)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> psycopg.Cursor:
        rows = list(rows)
        if rows:
            self._cur.executemany(_placeholders(sql), rows)
        return self._cur

    def copy(self, sql: str) -> Any:
        if self._pipe is not None:
            self._pipe.leave()
        return self._cur.copy(sql)

    @property
    def pipelined(self) -> bool:
        """Whether a statement executed now is sent without waiting for its answer."""
        return self._pipe is not None and self._pipe.active

    @property
    def raw(self) -> psycopg.Cursor:
        return self._cur


class Pipe:
    """A transaction's pipeline: entered after BEGIN, left (everything sent answered) before COMMIT's
    answer is read, or for a COPY."""

    __slots__ = ("_ctx", "_pipeline", "active")

    def __init__(self, conn: psycopg.Connection):
        self._ctx = conn.pipeline()
        self._pipeline = self._ctx.__enter__()
        self.active = True

    def sync(self) -> None:
        self._pipeline.sync()

    def leave(self) -> None:
        if self.active:
            self.active = False
            self._ctx.__exit__(None, None, None)


class _Answer:
    """A pipelined statement's cursor: its answer is waited for when it is read."""

    __slots__ = ("_cur", "_pipe")

    def __init__(self, cur: psycopg.Cursor, pipe: Pipe):
        self._cur = cur
        self._pipe = pipe

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def __iter__(self) -> Any:
        return iter(self._cur.fetchall())

    @property
    def rowcount(self) -> int:
        if self._pipe.active:
            self._pipe.sync()
        return self._cur.rowcount


_converted: dict[str, str] = {}


def _placeholders(sql: str) -> str:
    """SQLite-style `?` as psycopg's `%s` (and a literal % doubled), cached per statement text."""
    out = _converted.get(sql)
    if out is None:
        out = sql.replace("%", "%%").replace("?", "%s") if "?" in sql else sql
        if len(_converted) < 4096:
            _converted[sql] = out
    return out


class PostgresDatabase:
    """A pool of connections to one store (one per process and location; see `open`)."""

    _opened: dict[str, PostgresDatabase] = {}
    _opened_lock = threading.Lock()

    def __init__(self, target: PostgresTarget, *, pool_size: int | None = None):
        self.target = target
        self._pool_size = pool_size or int(os.environ.get(POOL_SIZE_ENV, DEFAULT_POOL_SIZE))
        self._pool: Any = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.wait_s: float | None = None  # None: $EVENTING_STORE_WAIT_S
        # Until a first connection succeeds, a server that does not answer is a mistake in --store (or a
        # server not started) rather than an outage: say so within FIRST_CONTACT_S instead of waiting.
        self._reached = False
        self._commits_ready = False
        self._transactions = 0
        self._refs = 0
        # What this process's transactions went through, for `eventing status` and tests: retries by
        # SQLSTATE ("connection" without one), and lost COMMIT answers by what the server then said.
        self.retried: collections.Counter[str] = collections.Counter()
        self.resolved: collections.Counter[str] = collections.Counter()
        self.failed_attempts = 0  # statements or connections that failed and were (or will be) tried again
        self._in_use = 0  # pooled connections lent out (the pool is this database's alone)
        self.pool_renewals = 0  # pools replaced after an outage (_renew_pool)
        self._checking = False  # a check of the pool's idle connections is running (_check_pool)

    @classmethod
    def open(cls, url: str) -> PostgresDatabase:
        """The process's pool for this location (made on first use; a forked child makes its own)."""
        target = parse_postgres_url(url)
        with cls._opened_lock:
            db = cls._opened.get(target.url + "|" + (target.schema or ""))
            if db is None or db._pid != os.getpid():
                db = cls._opened[target.url + "|" + (target.schema or "")] = cls(target)
            db._refs += 1
            return db

    # -- connections ----------------------------------------------------------------------------------

    def _configure(self, conn: psycopg.Connection) -> None:
        conn.autocommit = True
        if self.target.schema:
            # CREATE SCHEMA IF NOT EXISTS from several new connections at once can fail on the catalog's
            # unique index (PostgreSQL checks before it inserts): made under the schema lock, when missing.
            if (
                conn.execute(
                    "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.target.schema,)
                ).fetchone()
                is None
            ):
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext('eventing_schema'))")
                    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.target.schema}"')
            conn.execute(f'SET search_path TO "{self.target.schema}"')

    def pool(self) -> Any:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    from psycopg_pool import ConnectionPool

                    self._pool = ConnectionPool(
                        self.target.url,
                        min_size=1,
                        max_size=self._pool_size,
                        open=False,
                        configure=self._configure,
                        reconnect_timeout=store_wait_s(),
                        name="eventing",
                        timeout=store_wait_s(),
                    )
                    self._pool.open(wait=False)
        return self._pool

    def connect(self) -> psycopg.Connection:
        """A connection of its own (not pooled): LISTEN, long reads, replication; the caller closes it."""
        import psycopg

        try:
            conn = psycopg.connect(self.target.url, autocommit=True)
        except psycopg.Error as exc:
            raise StoreUnavailableError(describe_error(self.target, exc)) from None
        self._configure(conn)
        return conn

    def close(self) -> None:
        """Close the pool; one of several users of an `open`ed location only gives up its share (the pool
        closes with the last). A closed database opens a new pool if it is used again."""
        with self._opened_lock:
            if self._refs > 1:
                self._refs -= 1
                return
            self._refs = 0
            key = self.target.url + "|" + (self.target.schema or "")
            if self._opened.get(key) is self:
                del self._opened[key]
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    # -- transactions ---------------------------------------------------------------------------------

    def transaction(self, body: Callable[[Cursor], T], *, retry: bool = True, pipeline: bool = False) -> T:
        """BEGIN, body, COMMIT on a pooled connection; retried as the module docstring says. A COMMIT whose
        answer was lost is resolved (metadata.postgres.commits) before anything is retried or raised.
        `pipeline`: send the body's statements without waiting for each answer (see Cursor)."""
        return self._with_retries(lambda conn: self._once(conn, body, pipeline), retry=retry)

    def call(self, sql: str, args: Sequence[Any], *, committed: Callable[[], T]) -> T:
        """One statement that is a transaction of its own: a call of a function of the store that takes a
        commit token as its first argument and inserts it (metadata.postgres.commits) exactly when it
        commits changes. One round trip and one statement where BEGIN, the token and COMMIT are three. The
        first column of its answer; where that answer was lost and the token says the call committed,
        ``committed()`` (what it would have answered, found again). Retried as ``transaction`` is."""

        def once(conn: psycopg.Connection) -> T:
            import psycopg

            if not self._commits_ready:
                self._create_commits_table(conn)
            if self._prune_due():
                conn.execute(commits.prune_sql(self._wait_s()))
            token = commits.new_token()
            try:
                row = conn.execute(_placeholders(sql), (token, *args), prepare=None).fetchone()
            except psycopg.Error as exc:
                if _lost_answer(exc):
                    raise _Ambiguous(exc, token, None, then=committed) from None
                raise
            return row[0]  # type: ignore[index, no-any-return]

        return self._with_retries(once, retry=True)

    def read(self, sql: str, args: Sequence[Any] | None = None) -> list[tuple]:
        """One statement outside a transaction (autocommit), retried while the server is away."""
        params = args or None  # no arguments: the text is not scanned for placeholders
        return self._with_retries(
            lambda conn: conn.execute(_placeholders(sql), params).fetchall(), retry=True
        )

    def run(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """`fn(connection)` on a pooled connection, retried while the server is away (fn must be
        repeatable)."""
        return self._with_retries(fn, retry=True)

    def _once(self, conn: psycopg.Connection, body: Callable[[Cursor], T], pipeline: bool) -> T:
        import psycopg

        if not self._commits_ready:
            self._create_commits_table(conn)
        token = commits.new_token()
        prune = self._prune_due()
        pipe = None
        with conn.cursor() as cur:
            try:
                if pipeline and _pipeline_supported():
                    pipe = Pipe(conn)
                    cur.execute("BEGIN")
                    cur.execute(commits.insert_sql(token))
                    if prune:
                        cur.execute(commits.prune_sql(self._wait_s()))
                else:  # one simple query, one round trip
                    cur.execute(
                        "; ".join(
                            [
                                "BEGIN",
                                commits.insert_sql(token),
                                *([commits.prune_sql(self._wait_s())] if prune else []),
                            ]
                        )
                    )
                out = body(Cursor(cur, pipe))
            except BaseException:
                _roll_back(cur, pipe)
                raise
            try:
                cur.execute("COMMIT")
                if pipe is not None:
                    pipe.leave()
            except psycopg.Error as exc:
                if _lost_answer(exc):
                    raise _Ambiguous(exc, token, out) from None
                _roll_back(cur, None)
                raise
        return out

    def _prune_due(self) -> bool:
        self._transactions += 1
        return self._transactions % commits.PRUNE_EVERY == 0

    def _wait_s(self) -> float:
        return store_wait_s() if self.wait_s is None else self.wait_s

    def _create_commits_table(self, conn: psycopg.Connection) -> None:
        """The commit tokens' table (metadata.postgres.commits), made once per location and process."""
        found = conn.execute(f"SELECT to_regclass('{commits.COMMITS_TABLE}')").fetchone()
        if found is None or found[0] is None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('eventing_schema'))")
                conn.execute(commits.create_sql())
        self._commits_ready = True

    def _resolve(self, amb: _Ambiguous, started: float, wait_s: float) -> bool | None:
        """Whether the transaction whose COMMIT answer was lost committed (commits.probe), asked until the
        server answers or `wait_s` has passed since `started` (None then: nobody knows)."""
        import psycopg
        from psycopg_pool import PoolTimeout

        delay = 0.05
        while time.monotonic() - started < wait_s:
            try:
                return self._attempt(
                    lambda conn: commits.probe(conn, amb.token), wait_s - (time.monotonic() - started)
                )
            except (psycopg.Error, PoolTimeout) as exc:
                self.failed_attempts += 1
                if _lost_answer(exc):
                    self._check_pool()
                # Away, a standby (read-only), or the transaction is still running (lock_timeout): ask again.
                if not (
                    retriable(exc)
                    or getattr(exc, "sqlstate", None) == "55P03"
                    or isinstance(exc, PoolTimeout)
                ):
                    return None
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
        return None

    def _with_retries(self, fn: Callable[[psycopg.Connection], T], *, retry: bool) -> T:
        import psycopg
        from psycopg_pool import PoolTimeout

        started = time.monotonic()
        delay = 0.05
        warned = False
        wait_s = store_wait_s() if self.wait_s is None else self.wait_s
        if not self._reached:
            self._first_contact()
        while True:
            try:
                return self._attempt(fn, wait_s - (time.monotonic() - started))
            except _Ambiguous as amb:
                committed = self._resolve(amb, started, wait_s)
                self.resolved[{True: "committed", False: "not committed", None: "unknown"}[committed]] += 1
                if committed:
                    return amb.then() if amb.then is not None else amb.out  # type: ignore[no-any-return]
                if committed is None:
                    raise StoreUnavailableError(
                        describe_error(self.target, amb.cause) + "; the last write may or may not have been "
                        f"committed (the server did not say within {wait_s:.0f}s)",
                        ambiguous=True,
                    ) from None
                lost = amb.cause  # not committed: run it again, as after any lost connection
                self._check_pool()
                if not retry or time.monotonic() - started >= wait_s:
                    raise StoreUnavailableError(
                        describe_error(self.target, lost) + " (nothing was committed)"
                    ) from None
                self.retried["connection"] += 1
                if not warned:
                    log.warning("%s; retrying for up to %.0fs", describe_error(self.target, lost), wait_s)
                    warned = True
                continue
            except (psycopg.Error, PoolTimeout) as exc:
                reason: BaseException = exc
                if not retriable(reason):
                    raise translate(self.target, reason) from None
                if not retry or time.monotonic() - started >= wait_s:
                    raise StoreUnavailableError(
                        describe_error(self.target, reason) + f" (waited {time.monotonic() - started:.0f}s)"
                    ) from None
                self.retried[getattr(reason, "sqlstate", None) or "connection"] += 1
                self.failed_attempts += 1
                if _lost_answer(reason):
                    self._check_pool()
                if not warned:
                    log.warning("%s; retrying for up to %.0fs", describe_error(self.target, reason), wait_s)
                    warned = True
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)

    def _attempt(self, fn: Callable[[psycopg.Connection], T], timeout_s: float) -> T:
        """`fn` on a pooled connection. When the pool has none to give within POOL_WAIT_S although it is
        not all in use, it is waiting between reconnection attempts after an outage (psycopg_pool backs
        off, doubling the wait each time: after a 15 s outage its next attempt may be 16 s away): `fn`
        then runs on a connection of its own, which fails at once if the server is still away. Once such
        a connection succeeds, the server is back: the pool is replaced by a new one, which connects now
        (every transaction would otherwise wait POOL_WAIT_S for the old one until its next attempt).
        When every pooled connection is in use, it waits for one, up to `timeout_s`."""
        import psycopg
        from psycopg_pool import PoolTimeout

        pool = self.pool()
        try:
            conn = pool.getconn(timeout=min(POOL_WAIT_S, max(0.1, timeout_s)))
        except PoolTimeout:
            if self._in_use < self._pool_size:
                direct = psycopg.connect(self.target.url, autocommit=True)
                self._renew_pool(pool)
                try:
                    self._configure(direct)
                    return fn(direct)
                finally:
                    direct.close()
            conn = pool.getconn(timeout=max(0.1, timeout_s - POOL_WAIT_S))
        with self._lock:
            self._in_use += 1
        try:
            return fn(conn)
        finally:
            with self._lock:
                self._in_use -= 1
            pool.putconn(conn)

    def _check_pool(self) -> None:
        """A connection was lost: the pool's idle ones (from before a restart, a failover, or a server that
        ended them) are likely gone too, and a retry handed each in turn would fail again, backing off
        each time. psycopg_pool's check takes them all out at once, keeps those that answer and replaces
        the others; on a thread of its own (one at a time), so the retry waits for no dead peer."""
        pool = self._pool
        with self._lock:
            if pool is None or self._checking:
                return
            self._checking = True

        def check() -> None:
            try:
                pool.check()
            except Exception:  # noqa: BLE001 - a closed pool, or a server gone again: the retries go on
                log.debug("checking the pool's connections failed", exc_info=True)
            finally:
                self._checking = False

        threading.Thread(target=check, name="eventing-pool-check", daemon=True).start()

    def _renew_pool(self, stale: Any) -> None:
        """Replace `stale` (a pool waiting out its reconnection backoff while the server answers again) by
        a new pool; the old one closes on a thread of its own once its lent connections are back."""
        with self._lock:
            if self._pool is not stale:
                return  # another thread renewed it already
            self._pool = None
            self.pool_renewals += 1
        threading.Thread(
            target=stale.close, kwargs={"timeout": 30.0}, name="eventing-pool-close", daemon=True
        ).start()

    def _probe(self) -> BaseException | None:
        """Why a new connection cannot be made now (the pool only says it timed out), or None."""
        import psycopg

        try:
            conn = psycopg.connect(self.target.url, autocommit=True)
            try:
                self._configure(conn)  # a schema it may not create fails here, not as a pool timeout
            finally:
                conn.close()
        except psycopg.Error as exc:
            return exc
        return None

    def reached_before(self) -> None:
        """This process belongs to a deployment whose service reached the server (a worker started or
        restarted by it): a server that does not answer is waited for as in any outage, for the whole
        $EVENTING_STORE_WAIT_S, instead of being named as a mistake within FIRST_CONTACT_S."""
        self._reached = True

    def _first_contact(self) -> None:
        """This process's first connection, made directly so that its error is the server's own: a wrong
        password or a missing database at once, a server that does not answer within FIRST_CONTACT_S."""
        started = time.monotonic()
        while True:
            reason = self._probe()
            if reason is None:
                self._reached = True
                return
            if not retriable(reason):
                raise translate(self.target, reason) from None
            if time.monotonic() - started >= FIRST_CONTACT_S:
                raise StoreUnavailableError(describe_error(self.target, reason)) from None
            time.sleep(0.25)


class _Ambiguous(Exception):
    """A COMMIT sent and its answer lost; `out` is what the body returned (or `then()` finds it), `token` its
    commit token."""

    def __init__(
        self, cause: BaseException, token: uuid.UUID, out: Any, *, then: Callable[[], Any] | None = None
    ):
        super().__init__(str(cause))
        self.cause = cause
        self.token = token
        self.out = out
        self.then = then  # once it committed: finds what it answered (a call's answer lost with it)


def _lost_answer(exc: BaseException) -> bool:
    """The COMMIT's answer never came: the connection broke, or the server went away (a fast or immediate
    shutdown, a crash). Any other error is the server's answer: the transaction did not commit."""
    import psycopg

    state = getattr(exc, "sqlstate", None)
    if state is None:
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _roll_back(cur: psycopg.Cursor, pipe: Pipe | None) -> None:
    """End a failed transaction (its statements' errors, read now, are the failure's own consequence)."""
    import psycopg

    try:
        if pipe is not None:
            pipe.leave()
    except psycopg.Error:
        pass
    try:
        cur.execute("ROLLBACK")
    except psycopg.Error:
        pass  # the connection is gone; the server rolled back


_pipeline_ok: bool | None = None


def _pipeline_supported() -> bool:
    global _pipeline_ok
    if _pipeline_ok is None:
        import psycopg

        _pipeline_ok = psycopg.Pipeline.is_supported()
    return _pipeline_ok


def translate(target: PostgresTarget, exc: BaseException) -> BaseException:
    """A non-retriable psycopg error as the project's error: StoreError with one line, or the original
    error for a bug (a syntax error or a constraint the code should have prevented)."""
    import psycopg

    state = getattr(exc, "sqlstate", None) or ""
    if state[:2] in ("28", "3D", "42", "53", "58", "XX") and state not in (
        "42601",
        "42703",
        "42P01",
        "42804",
    ):
        return StoreError(describe_error(target, exc))
    if not state and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return StoreError(describe_error(target, exc))
    return exc


SCHEMA_TABLE = "eventing_schema"


def ensure_schema(db: PostgresDatabase, component: str, version: int, ddl: Sequence[str]) -> None:
    """Create `component`'s tables on first use (one transaction, serialised across processes by an
    advisory lock) and record its schema version; a store written by a newer version of this component is
    refused with one line. `ddl`: statements safe to run again (CREATE ... IF NOT EXISTS, ALTER ... ADD
    COLUMN IF NOT EXISTS), run when the stored version is older than `version`."""

    def body(cur: Cursor) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('eventing_schema'))")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE}(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        row = cur.execute(f"SELECT version FROM {SCHEMA_TABLE} WHERE component=%s", (component,)).fetchone()
        stored = row[0] if row else 0
        if stored > version:
            raise StoreError(
                f"the store at {db.target.shown} was written by a newer version of eventing ({component} "
                f"schema {stored}; this one knows {version}); upgrade eventing on this machine"
            )
        if stored < version:
            cur.execute(";\n".join(ddl))  # one round trip
            cur.execute(
                f"INSERT INTO {SCHEMA_TABLE} VALUES(%s, %s) ON CONFLICT(component) DO UPDATE SET "
                "version=excluded.version",
                (component, version),
            )

    db.transaction(body)
