"""The source database of a mirror: connections (psycopg for queries and the snapshot, psycopg2's logical
replication connection for the slot), what `collection create --mirror` checks before it creates anything,
the publication, the slot, and each failure as one line that names the server and the fix, never the
password.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from eventing.errors import ConfigError, NotFoundError, StoreError
from eventing.storage.mirror.pgtypes import SESSION_OPTIONS

APPLICATION_NAME = "eventing-mirror"
SLOT_RELEASE_S = 10.0  # how long a follower waits for a slot another connection holds before ending that one


class SourceError(StoreError):
    """The source database refused or could not be reached (one line, no password)."""


@dataclass(frozen=True)
class Table:
    """A table as the source's catalog describes it now."""

    oid: int
    schema: str
    name: str
    identity: str  # relreplident: d, n, f, i
    key: list[str]  # the primary key's columns (or the replica identity index's), in index order

    @property
    def qualified(self) -> str:
        return f"{quote(self.schema)}.{quote(self.name)}"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Source:
    """The source database of one mirror, at ``url`` (the password's only holder)."""

    def __init__(self, url: str):
        from metadata.postgres.location import parse_postgres_url

        try:
            self.target = parse_postgres_url(url)
        except ConfigError as exc:
            raise ConfigError(f"--mirror: {exc}") from None
        self.url = url
        self.shown = self.target.shown

    # -- connections --------------------------------------------------------------------------------

    def connect(self, *, autocommit: bool = True) -> Any:
        """A psycopg connection to the source (session settings that make values read alike)."""
        import psycopg

        try:
            return psycopg.connect(
                self.target.url,
                autocommit=autocommit,
                options=SESSION_OPTIONS,
                application_name=APPLICATION_NAME,
            )
        except psycopg.Error as exc:
            raise SourceError(self.describe(exc)) from None

    def replication(self) -> Any:
        """psycopg2's logical replication connection (its cursor creates slots and streams them)."""
        import psycopg2
        import psycopg2.extras

        try:
            return psycopg2.connect(
                self.target.url,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                options=SESSION_OPTIONS,
                application_name=APPLICATION_NAME,
            )
        except psycopg2.Error as exc:
            raise SourceError(self.describe(exc, replication=True)) from None

    def describe(self, exc: BaseException, *, replication: bool = False) -> str:
        """One line for a failure of the source (the server, what went wrong, the fix; no password)."""
        from metadata.postgres.location import _first_clause

        text = " ".join(str(exc).split()).replace(self.target.url, self.shown)
        if self.url in text:
            text = text.replace(self.url, self.shown)
        clause = _first_clause(text)
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None) or ""
        low = text.lower()
        where = f"the mirror's source, PostgreSQL at {self.target.endpoints}"
        if "password authentication failed" in low or state == "28P01":
            return f"{where}, refused the password ({clause}); check the password in --mirror"
        if replication and ("no pg_hba.conf entry for replication" in low or "replication connection" in low):
            return (
                f"{where}, refused a replication connection ({clause}); add a `host replication USER ...` "
                "line to pg_hba.conf and reload the server"
            )
        if state == "28000" or "no pg_hba.conf entry" in low or ("role" in low and "does not exist" in low):
            return f"{where}, refused the login ({clause}); check the user in --mirror and pg_hba.conf"
        if state == "3D000" or ("database" in low and "does not exist" in low):
            return f"{where}: {clause}; check the database in --mirror"
        if (
            "must be superuser or replication role" in low
            or "permission denied to start" in low
            or ("replication" in low and "permission" in low)
        ):
            return (
                f"{where}: {clause}; the role needs the REPLICATION attribute: ALTER ROLE user WITH "
                "REPLICATION (as a superuser)"
            )
        if "connection" in low and (
            "refused" in low
            or "timeout" in low
            or "could not" in low
            or "closed" in low
            or "terminat" in low
            or "no route" in low
            or "translate host" in low
        ):
            return (
                f"{where}, is unreachable ({clause}); start the server or fix the host and port in --mirror"
            )
        return f"{where}: {clause}"

    def query(self, sql: str, args: Any = None) -> list[tuple]:
        import psycopg

        with self.connect() as conn:
            try:
                return conn.execute(sql, args).fetchall()
            except psycopg.Error as exc:
                raise SourceError(self.describe(exc)) from None

    # -- the table ----------------------------------------------------------------------------------

    def table(self, qualified: str, conn: Any = None) -> Table:
        """The table named ``schema.table`` (NotFoundError naming it and the tables of that schema)."""
        schema, _, name = qualified.partition(".")
        sql = (
            "SELECT c.oid, c.relkind, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = "
            "c.relnamespace WHERE n.nspname = %s AND c.relname = %s"
        )
        rows = (
            conn.execute(sql, (schema, name)).fetchall()
            if conn is not None
            else self.query(sql, (schema, name))
        )
        if not rows or rows[0][1] not in ("r", "p"):
            found = self.query(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY 1 LIMIT 20",
                (schema,),
            )
            listed = ", ".join(f"{schema}.{r[0]}" for r in found) or "none"
            raise NotFoundError(
                f"table {qualified} does not exist in the mirror's source ({self.shown}); "
                f"tables of schema {schema}: {listed}; check --table"
            )
        oid, _, identity = rows[0]
        key_sql = (
            "SELECT a.attname FROM pg_index i JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
            "ON true JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND {which} ORDER BY k.n"
        )
        args = (oid,)
        key = [
            r[0]
            for r in (
                conn.execute(key_sql.format(which="i.indisprimary"), args).fetchall()
                if conn is not None
                else self.query(key_sql.format(which="i.indisprimary"), args)
            )
        ]
        if not key and identity == "i":
            key = [
                r[0]
                for r in (
                    conn.execute(key_sql.format(which="i.indisreplident"), args).fetchall()
                    if conn is not None
                    else self.query(key_sql.format(which="i.indisreplident"), args)
                )
            ]
        return Table(int(oid), schema, name, identity, key)

    # -- what `collection create --mirror` checks ---------------------------------------------------

    def check(self, qualified: str, publication: str, slot: str, *, given_publication: bool) -> Table:
        """Everything a mirror needs of the source, checked before anything is created: one line for the
        first thing missing."""
        rows = self.query(
            "SELECT current_setting('wal_level'), r.rolreplication OR r.rolsuper, current_user, "
            "current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots), "
            "current_database() FROM pg_roles r WHERE r.rolname = current_user"
        )
        wal_level, can_replicate, user, max_slots, slots, database = rows[0]
        where = f"the mirror's source ({self.shown})"
        if wal_level != "logical":
            raise ConfigError(
                f"{where} has wal_level = {wal_level}; a mirror needs logical replication: set "
                "wal_level = logical (ALTER SYSTEM SET wal_level = logical) and restart the server"
            )
        table = self.table(qualified)
        if table.identity == "n":
            raise ConfigError(
                f"table {qualified} has REPLICA IDENTITY NOTHING, so its updates and deletes cannot be "
                f"followed; ALTER TABLE {table.qualified} REPLICA IDENTITY DEFAULT (or FULL)"
            )
        if not table.key:
            raise ConfigError(
                f"table {qualified} has no primary key, which a mirror uses as the documents' key; "
                f"add one (ALTER TABLE {table.qualified} ADD PRIMARY KEY (...)) or set REPLICA "
                "IDENTITY USING INDEX of a unique index"
            )
        (allowed,) = self.query("SELECT has_table_privilege(%s, 'SELECT')", (table.oid,))[0]
        if not allowed:
            raise ConfigError(
                f"role {user} may not read table {qualified} in {where}; GRANT SELECT ON "
                f"{table.qualified} TO {quote(user)}"
            )
        if not can_replicate:
            raise ConfigError(
                f"role {user} of {where} has no REPLICATION attribute, which following a slot needs; "
                f"ALTER ROLE {quote(user)} WITH REPLICATION (as a superuser)"
            )
        if self.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)):
            raise ConfigError(
                f"a replication slot named {slot} exists already in {where}; give another with --slot "
                f"(or drop it: SELECT pg_drop_replication_slot('{slot}'))"
            )
        if slots >= max_slots:
            raise ConfigError(
                f"{where} has all of its {max_slots} replication slots in use; raise "
                "max_replication_slots (and restart the server) or drop a slot no one uses"
            )
        published = self.query("SELECT puballtables FROM pg_publication WHERE pubname = %s", (publication,))
        if given_publication:
            if not published:
                raise NotFoundError(
                    f"publication {publication} does not exist in {where}; create it (CREATE "
                    f"PUBLICATION {publication} FOR TABLE {table.qualified}) or leave --publication "
                    "out to have one made"
                )
            if not self.query(
                "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND "
                "tablename = %s",
                (publication, table.schema, table.name),
            ):
                raise ConfigError(
                    f"publication {publication} does not publish table {qualified}; ALTER PUBLICATION "
                    f"{publication} ADD TABLE {table.qualified}"
                )
        elif published:
            raise ConfigError(
                f"a publication named {publication} exists already in {where}; name it with "
                "--publication (or give this mirror another keyspace)"
            )
        conn = self.replication()  # pg_hba.conf must let this role open a replication connection
        conn.close()
        del database
        return table

    def create_publication(self, publication: str, table: Table) -> None:
        import psycopg

        with self.connect() as conn:
            try:
                conn.execute(f"CREATE PUBLICATION {quote(publication)} FOR TABLE {table.qualified}")
            except psycopg.errors.InsufficientPrivilege:
                raise ConfigError(
                    f"the mirror's source ({self.shown}) refused to create publication {publication}: only "
                    f"the owner of table {table.schema}.{table.name} may; create it as the owner (CREATE "
                    f"PUBLICATION {publication} FOR TABLE {table.qualified}) and pass --publication "
                    f"{publication}"
                ) from None
            except psycopg.Error as exc:
                raise SourceError(self.describe(exc)) from None

    def drop_publication(self, publication: str) -> None:
        self._run(f"DROP PUBLICATION IF EXISTS {quote(publication)}")

    def _run(self, sql: str, args: Any = None) -> None:
        import psycopg

        with self.connect() as conn:
            try:
                conn.execute(sql, args)
            except psycopg.Error as exc:
                raise SourceError(self.describe(exc)) from None

    # -- the slot -----------------------------------------------------------------------------------

    def slot(self, slot: str) -> tuple[bool, int | None] | None:
        """(active, active pid) of the slot, or None when there is none."""
        rows = self.query("SELECT active, active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        return (bool(rows[0][0]), rows[0][1]) if rows else None

    def drop_slot(self, slot: str, *, wait_s: float = SLOT_RELEASE_S) -> bool:
        """Drop the slot (False when there was none). A slot still held by a connection (a follower that
        is ending, or one left behind) is waited for, then that connection is ended."""
        deadline = time.monotonic() + wait_s
        while True:
            found = self.slot(slot)
            if found is None:
                return False
            active, pid = found
            if not active:
                try:
                    self._run("SELECT pg_drop_replication_slot(%s)", (slot,))
                    return True
                except SourceError as exc:
                    if "is active" not in str(exc) and "does not exist" not in str(exc):
                        raise
                    continue
            if time.monotonic() > deadline and pid:
                self._run("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(0.1)

    def positions(self, slot: str, table: Table) -> dict[str, Any]:
        """The server's WAL position and the slot's, for lag and retained WAL; whether the table is still
        the one mirrored."""
        rows = self.query(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, "
            "(SELECT restart_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s), "
            "(SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s), "
            "(SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            " WHERE n.nspname = %s AND c.relname = %s)",
            (slot, slot, table.schema, table.name),
        )
        current, restart, confirmed, oid = rows[0]
        return {
            "server_lsn": int(current),
            "restart_lsn": None if restart is None else int(restart),
            "confirmed_lsn": None if confirmed is None else int(confirmed),
            "table_oid": None if oid is None else int(oid),
        }
