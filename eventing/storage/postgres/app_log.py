"""Application logs on a PostgreSQL store: one row per line in `app_log`, in the order written, kept to about
`app_log_max_size` x `app_log_max_files` bytes per function (the rotated files' budget on a directory).

A handler's `log()` lines are stamped when written and sent in batches by a background thread
(``RemoteAppLog``, the batching a worker that cannot see a data directory uses), so a call never waits for a
round trip per line; a worker flushes them by each checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from eventing.storage.app_logs import DEFAULT_MAX_FILES, DEFAULT_MAX_SIZE, RemoteAppLog, stamped
from metadata.postgres.connection import Cursor, PostgresDatabase, ensure_schema

SCHEMA_VERSION = 1
DDL = [
    "CREATE TABLE IF NOT EXISTS app_log(function TEXT NOT NULL, seq BIGSERIAL, line TEXT NOT NULL, "
    "PRIMARY KEY(function, seq))",
]
PRUNE_EVERY_BYTES = 1 << 20  # a writer trims its function's log after about this much new text


class PostgresAppLogs:
    """``AppLogs`` (eventing.storage.state) on a PostgreSQL store."""

    def __init__(self, db: PostgresDatabase):
        self.db = db
        self._ready = False

    def _schema(self) -> None:
        if not self._ready:
            ensure_schema(self.db, "app_log", SCHEMA_VERSION, DDL)
            self._ready = True

    def writer(
        self, function: str, max_size: int = DEFAULT_MAX_SIZE, max_files: int = DEFAULT_MAX_FILES
    ) -> PostgresAppLogWriter:
        self._schema()
        return PostgresAppLogWriter(self.db, function, max_size * max(1, max_files))

    def where(self, function: str) -> str | None:
        self._schema()
        if not self.db.read("SELECT 1 FROM app_log WHERE function=%s LIMIT 1", (function,)):
            return None
        return f"table app_log of {self.db.target.shown} (eventing log {function})"

    def tail(self, function: str, lines: int) -> list[str]:
        self._schema()
        if lines <= 0:
            return []
        rows = self.db.read(
            "SELECT line FROM app_log WHERE function=%s ORDER BY seq DESC LIMIT %s", (function, lines)
        )
        return [r[0] for r in reversed(rows)]

    def tail_bytes(self, function: str, size: int) -> bytes | None:
        self._schema()
        rows = self.db.read(
            "SELECT line FROM (SELECT seq, line, SUM(octet_length(line) + 1) OVER (ORDER BY seq DESC) AS "
            "upto FROM app_log WHERE function=%s) t WHERE upto - octet_length(line) - 1 < %s ORDER BY seq",
            (function, size),
        )
        if not rows:
            return None
        data = "".join(r[0] + "\n" for r in rows).encode()
        return data[-size:]

    def follow(self, function: str, poll_s: float = 0.2, stop: float | None = None) -> Iterator[str]:
        self._schema()
        last = self.db.read("SELECT COALESCE(MAX(seq), 0) FROM app_log WHERE function=%s", (function,))[0][0]
        while stop is None or time.monotonic() < stop:
            rows = self.db.read(
                "SELECT seq, line FROM app_log WHERE function=%s AND seq>%s ORDER BY seq", (function, last)
            )
            for seq, line in rows:
                last = seq
                yield line
            time.sleep(poll_s)


class PostgresAppLogWriter:
    """One function's log lines, batched to the server by a background thread (see the module docstring)."""

    def __init__(self, db: PostgresDatabase, function: str, budget_bytes: int):
        self.db, self.function, self.budget = db, function, budget_bytes
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"app-log-{function}")
        self._since_prune = 0
        self._lock = threading.Lock()
        self._batched = RemoteAppLog(self._submit)

    def _submit(self, lines: list[str]) -> Callable[[], object]:
        future = self._pool.submit(self.write_lines, lines)
        return future.result

    def write(self, text: str) -> None:
        self._batched.write(text)

    def flush(self) -> None:
        self._batched.flush()

    def write_lines(self, lines: list[str]) -> None:
        """Append lines already stamped (``stamped``), in one transaction; trim the log when due."""
        if not lines:
            return
        function = self.function

        def body(cur: Cursor) -> None:
            with cur.copy("COPY app_log(function, line) FROM STDIN") as copy:
                for line in lines:
                    copy.write_row((function, line))

        self.db.transaction(body)
        with self._lock:
            self._since_prune += sum(len(line) + 1 for line in lines)
            due = self._since_prune >= min(PRUNE_EVERY_BYTES, max(1, self.budget // 4))
            if due:
                self._since_prune = 0
        if due:
            self._prune()

    def _prune(self) -> None:
        self.db.transaction(
            lambda cur: cur.execute(
                "DELETE FROM app_log WHERE function=%s AND seq <= (SELECT seq FROM (SELECT seq, "
                "SUM(octet_length(line) + 1) OVER (ORDER BY seq DESC) AS upto FROM app_log WHERE "
                "function=%s) t WHERE upto > %s ORDER BY seq DESC LIMIT 1)",
                (self.function, self.function, self.budget),
            )
        )

    def close(self) -> None:
        try:
            self._batched.flush()
        finally:
            self._pool.shutdown(wait=True)


__all__ = ["PostgresAppLogs", "PostgresAppLogWriter", "stamped"]
