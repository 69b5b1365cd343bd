"""Where a PostgreSQL store is: its libpq URL parsed (our `schema=` parameter split off, libpq's defaults
set), shown without its password, and the server's errors as one line naming the server and the fix."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from metadata.errors import ConfigError

SCHEMES = ("postgresql", "postgres")
DEFAULT_CONNECT_TIMEOUT_S = "5"
POOL_SIZE_ENV = "EVENTING_PG_POOL_SIZE"
DEFAULT_POOL_SIZE = 8


def is_postgres_url(location: str) -> bool:
    scheme, sep, _ = str(location).strip().partition("://")
    return bool(sep) and scheme.lower() in SCHEMES  # a malformed rest is parse_postgres_url's to name


def _split(url: str) -> Any:
    """urlsplit, with a malformed authority (`[::1` unclosed) as one line that names no password."""
    try:
        return urlsplit(str(url))
    except ValueError as exc:
        scheme = str(url).partition("://")[0]
        raise ConfigError(
            f"the {scheme}:// URL is malformed ({exc}); write it as postgresql://user[:password]@host[:port]"
            "/database, an IPv6 host in brackets ([::1])"
        ) from None


@dataclass(frozen=True)
class PostgresTarget:
    """A PostgreSQL store's location: the libpq URL to connect with, its schema, and how to show it."""

    url: str  # given to libpq, without our own parameters
    schema: str | None
    shown: str  # the URL without its password, for messages and `eventing status`

    @property
    def endpoints(self) -> str:
        """The host:port list, for messages ("127.0.0.1:5432,10.0.0.2:5432")."""
        parts = urlsplit(self.url)
        hosts = parts.netloc.rpartition("@")[2] or "localhost:5432"
        query = dict(parse_qsl(parts.query))
        if "host" in query:
            hosts = query["host"] + (f":{query['port']}" if "port" in query else "")
        return hosts


def parse_postgres_url(url: str) -> PostgresTarget:
    """Split our `schema=` parameter off a libpq URL and default its connect_timeout; ConfigError naming the
    mistake (never the password) when it is not a usable PostgreSQL URL."""
    parts = _split(url)
    shown = redact(url)
    if parts.scheme.lower() not in SCHEMES:
        raise ConfigError(
            f"{shown} is not a PostgreSQL URL; use postgresql://user[:password]@host[:port]/database"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = None
    kept = []
    for key, value in query:
        if key == "schema":
            schema = value
        else:
            kept.append((key, value))
    if schema is not None and not _plain_identifier(schema):
        raise ConfigError(
            f"{shown}: schema={schema!r} must be a plain name (letters, digits and _, not starting "
            "with a digit)"
        )
    if not any(k == "connect_timeout" for k, _ in kept):
        kept.append(("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S))
    if not any(k == "application_name" for k, _ in kept):
        kept.append(("application_name", "eventing"))
    # %20, not +, for a space: libpq decodes percent escapes only (options=-c%20statement_timeout%3D5000)
    libpq = urlunsplit(
        (parts.scheme, parts.netloc, parts.path, urlencode(kept, quote_via=quote), parts.fragment)
    )
    return PostgresTarget(libpq, schema, shown)


def redact(url: str) -> str:
    """The URL with any password (in the authority or as ?password=) replaced by ***."""
    parts = _split(url)
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hosts}"
    query = "&".join(
        f"{k}=***" if k == "password" else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def password_spans(text: str) -> list[tuple[int, int]]:
    """Where the passwords of a PostgreSQL URL are in `text` as written (the authority's, and ?password='s),
    as (start, end) indexes: `text` may be the URL or an option holding it (`--store=postgresql://...`)."""
    import re

    found = re.search(r"(?i)\b(postgresql|postgres)://", text)
    if found is None:
        return []
    spans = []
    begin = found.end()
    rest = text[begin:]
    stop = re.search(r"[/?#]", rest)
    netloc_end = begin + (stop.start() if stop else len(rest))
    at = text.rfind("@", begin, netloc_end)
    colon = text.find(":", begin, at) if at != -1 else -1
    if colon != -1 and colon + 1 < at:
        spans.append((colon + 1, at))
    query = text.find("?", begin)
    if query != -1:
        for pair in re.finditer(r"(?:^|&)password=([^&#]*)", text[query + 1 :]):
            if pair.group(1):
                spans.append((query + 1 + pair.start(1), query + 1 + pair.end(1)))
    return spans


def _plain_identifier(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] == "_") and all(c.isalnum() or c == "_" for c in name)


def describe_error(target: PostgresTarget, exc: BaseException) -> str:
    """One line naming the server, what went wrong and the fix (never the password)."""
    import psycopg

    text = " ".join(str(exc).split())
    text = text.replace(target.url, target.shown)
    state = getattr(exc, "sqlstate", None) or ""
    where = f"PostgreSQL at {target.endpoints}"
    low = text.lower()
    if "password authentication failed" in low or state == "28P01":
        return (
            f"{where} refused the password ({_first_clause(text)}); check the password in --store, "
            "$PGPASSWORD or ~/.pgpass"
        )
    if state == "28000" or "no pg_hba.conf entry" in low or "role" in low and "does not exist" in low:
        return f"{where} refused the login ({_first_clause(text)}); check the user in --store and pg_hba.conf"
    if state == "3D000" or ("database" in low and "does not exist" in low):
        return f"{where}: {_first_clause(text)}; create it first (createdb, or CREATE DATABASE)"
    if state == "42501":
        return (
            f"{where}: {_first_clause(text)}; grant the store's user the privilege (it creates and writes "
            f"its own tables: {_grant(target, low)})"
        )
    if state == "57014" or "statement timeout" in low:
        return (
            f"{where} canceled a statement at its statement_timeout ({_first_clause(text)}); raise it "
            "(?options=-c%20statement_timeout%3D60000 in --store, or ALTER ROLE ... SET statement_timeout) "
            "or end what holds the locks it waited for (pg_locks)"
        )
    if state == "55P03" or "lock timeout" in low:
        return (
            f"{where} canceled a statement at its lock_timeout ({_first_clause(text)}); raise it or end what "
            "holds the lock (pg_locks)"
        )
    if state == "53300" or "too many clients" in low or "remaining connection slots" in low:
        return (
            f"{where} has no connection slot left ({_first_clause(text)}); raise max_connections on the "
            f"server or lower ${POOL_SIZE_ENV} (each eventing process keeps up to {DEFAULT_POOL_SIZE})"
        )
    if state == "25006" or "read-only transaction" in low:
        return (
            f"{where} is read-only ({_first_clause(text)}): a standby; point --store at the primary, or list "
            "every host with ?target_session_attrs=read-write"
        )
    if state in ("53100",) or "no space left" in low or "could not extend file" in low:
        return (
            f"{where} is out of disk space ({_first_clause(text)}); free space on the server, then run the "
            "command again (everything committed is kept)"
        )
    if "configuration parameter" in low or "invalid value for parameter" in low:
        return f"{where} refused a setting ({_first_clause(text)}); fix options= in --store"
    if isinstance(exc, psycopg.OperationalError):
        return (
            f"{where} is unreachable ({_first_clause(text)}); start the server or fix the host and port in "
            "--store"
        )
    return f"{where}: {_first_clause(text)}"


def _grant(target: PostgresTarget, low: str) -> str:
    """The GRANT a refused store's user needs, with its names."""
    parts = urlsplit(target.url)
    user = parts.username or os.environ.get("PGUSER") or "USER"
    if "for database" in low:
        return f"GRANT CREATE ON DATABASE {parts.path.lstrip('/') or 'DATABASE'} TO {user}"
    return f"GRANT CREATE, USAGE ON SCHEMA {target.schema or 'public'} TO {user}"


def _first_clause(text: str) -> str:
    """The server's words without libpq's preamble (the host and port are named already) nor the statement
    quoted after them (`LINE 1: CREATE TABLE ... ^`)."""
    import re

    text = re.sub(r"\s+LINE \d+: .*$", "", text)
    text = re.sub(
        r'^(connection failed: )?connection to server at "[^"]*"(, port \d+)? failed: (FATAL: +)?', "", text
    )
    text = text.replace("Is the server running on that host and accepting TCP/IP connections?", "").strip()
    return text.split("\n")[0][:300]
