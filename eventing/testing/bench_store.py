"""The `--store` option of the benchmark scripts (scripts/bench.py, bench_latency.py, bench_dataapi.py): where
the PostgreSQL half of a run keeps its state.

    --store postgresql                      a throwaway server started for the run (fsync and full page
                                            writes on, as a production server), on this machine's cores
    --store postgresql://user@host/db       a server of your own: the run works in a schema of its own
                                            (``schema=eventing_bench_<hex>``, dropped at the end), or in
                                            the schema the URL names (left as it is)

    with BenchStore(args.store) as store:
        url = store.location("w1")          # a fresh database (throwaway) or schema (given URL) per name
        ...
        store.server_cpu_s()                # the throwaway server's CPU seconds so far (0.0 otherwise)
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

if TYPE_CHECKING:
    from eventing.testing.postgres import ThrowawayPostgres

THROWAWAY = ("postgresql", "postgres", "pg")


def is_throwaway(option: str) -> bool:
    return option.strip().lower() in THROWAWAY


def check_option(option: str) -> str | None:
    """Why ``option`` is not a --store a benchmark takes (one line), or None."""
    if is_throwaway(option):
        from eventing.testing.postgres import unavailable

        return unavailable()
    if urlsplit(option).scheme.lower() not in ("postgresql", "postgres"):
        return (
            f"--store {option!r}: give `postgresql` (a throwaway server for the run) or a URL "
            "postgresql://user@host:port/database"
        )
    return None


class BenchStore:
    """A PostgreSQL store for one benchmark run (see the module docstring)."""

    def __init__(self, option: str, *, settings: dict[str, str] | None = None):
        self.option = option
        self.server: ThrowawayPostgres | None = None
        self.settings = settings
        self._schemas: list[str] = []
        self._made: list[str] = []

    def __enter__(self) -> BenchStore:
        if is_throwaway(self.option):
            from eventing.testing.postgres import ThrowawayPostgres

            server = self.server = ThrowawayPostgres(fsync=True, settings=self.settings)
            server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.server is None and self._made:
                import psycopg

                with psycopg.connect(self._base_url(), autocommit=True) as conn:
                    for schema in self._made:
                        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            if self.server is not None:
                self.server.stop()
                self.server = None

    def _base_url(self) -> str:
        from metadata.postgres.location import parse_postgres_url

        return parse_postgres_url(self.option).url

    def location(self, name: str) -> str:
        """A store location with nothing in it yet: a new database of the throwaway server, or a new schema
        of the given server (unless the URL names its own schema: then that one, as it is)."""
        if self.server is not None:
            return self.server.create_database(f"{name}_{uuid.uuid4().hex[:6]}")
        query = dict(parse_qsl(urlsplit(self.option).query))
        if "schema" in query:
            return self.option
        schema = f"eventing_bench_{name}_{uuid.uuid4().hex[:6]}"
        self._made.append(schema)
        return self.option + ("&" if "?" in self.option else "?") + f"schema={schema}"

    def server_cpu_s(self) -> float:
        """CPU seconds used so far by the throwaway server's processes (0.0 for a server of your own)."""
        if self.server is None:
            return 0.0
        from eventing.testing.postgres import _children

        pid = self.server.pid()
        if pid is None:
            return 0.0
        total = 0
        for proc in [pid, *_children(pid)]:
            try:
                with open(f"/proc/{proc}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    def snapshot(self) -> dict[str, float]:
        """The throwaway server's counters so far ({} for a server of your own): CPU seconds of its
        processes, WAL flushes to disk (pg_stat_wal) and transactions committed (every database)."""
        if self.server is None:
            return {}
        syncs, commits = self.server.sql(
            "SELECT (SELECT wal_sync FROM pg_stat_wal), (SELECT sum(xact_commit) FROM pg_stat_database)"
        ).split("|")
        return {"cpu_s": self.server_cpu_s(), "wal_syncs": float(syncs), "commits": float(commits)}

    def since(self, before: dict[str, float], per: float) -> dict[str, float]:
        """What the server did since ``before`` (a snapshot), per item: CPU microseconds, WAL flushes and
        commits (each ``per`` items); {} for a server of your own."""
        now = self.snapshot()
        if not now or not before or per <= 0:
            return {}
        return {
            "server_cpu_us": round((now["cpu_s"] - before["cpu_s"]) / per * 1e6, 1),
            "wal_syncs": round((now["wal_syncs"] - before["wal_syncs"]) / per, 3),
            "commits": round((now["commits"] - before["commits"]) / per, 3),
        }

    def describe(self) -> str:
        if self.server is not None:
            return f"a throwaway PostgreSQL server on port {self.server.port} (fsync on)"
        from metadata.postgres.location import redact

        return redact(self.option)


__all__ = ["BenchStore", "check_option", "is_throwaway"]
