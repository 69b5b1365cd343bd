"""Opens the metadata store a process is configured for: SQLite under the data directory by default,
PostgreSQL when the location is a postgresql:// URL (the whole state on a server: see
metadata.postgres.connection for the URL), or Couchbase when $EVENTING_METADATA_URL names a cluster.

    EVENTING_METADATA_URL=couchbase://host[:port][,host2...]/bucket[?username=..&password=..&timeout=5&prefix=eventing]
    EVENTING_COUCHBASE_USERNAME, EVENTING_COUCHBASE_PASSWORD   credentials when the URL carries none

`couchbases://` connects with TLS. Other query parameters go to the SDK's connection string once the installed
SDK is known to take them (metadata.couchbase.adapter.check_connection_options); it would drop unknown ones
silently. Every process of a deployment (CLI, service, Ray workers) must see the same variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from metadata.errors import StoreError
from metadata.postgres import is_postgres_url
from metadata.sqlite import SqliteMetadataStore

if TYPE_CHECKING:
    from metadata.couchbase import CouchbaseMetadataStore
    from metadata.postgres import PostgresMetadataStore

METADATA_URL_ENV = "EVENTING_METADATA_URL"
USERNAME_ENV = "EVENTING_COUCHBASE_USERNAME"
PASSWORD_ENV = "EVENTING_COUCHBASE_PASSWORD"
SQLITE_FILE = "metadata.sqlite3"
SCHEMES = ("couchbase", "couchbases")
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_PREFIX = "eventing"


@dataclass(frozen=True)
class CouchbaseTarget:
    """Where a Couchbase metadata store lives, parsed from a metadata URL."""

    connection_string: str  # couchbase://host:port?sdk-options, without bucket or credentials
    bucket: str
    username: str
    password: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    prefix: str = DEFAULT_PREFIX


def open_store(
    data_dir: str | os.PathLike[str], *, create: bool = True, environ: Mapping[str, str] | None = None
) -> SqliteMetadataStore | CouchbaseMetadataStore | PostgresMetadataStore:
    """The metadata store for this process. `data_dir` is a data directory or a PostgreSQL store's URL
    (postgresql://...): the URL opens the PostgreSQL store (no directory is read or written). A data
    directory: $EVENTING_METADATA_URL's cluster if it is set, else the SQLite file
    <data_dir>/metadata.sqlite3. `create=False`: NotFoundError if that file, or the PostgreSQL store's
    tables, do not exist yet; a Couchbase store has no file, its documents are created by the first write."""
    if is_postgres_url(os.fspath(data_dir)):
        from metadata.postgres import PostgresMetadataStore

        return PostgresMetadataStore(os.fspath(data_dir), create=create)
    env = os.environ if environ is None else environ
    url = env.get(METADATA_URL_ENV, "").strip()
    if not url:
        return SqliteMetadataStore(Path(data_dir) / SQLITE_FILE, create=create)
    target = parse_metadata_url(url, env)
    from metadata.couchbase import CouchbaseMetadataStore  # only when configured: ~0.1 s of imports

    return CouchbaseMetadataStore(
        target.connection_string,
        target.bucket,
        target.username,
        target.password,
        target.timeout_s,
        prefix=target.prefix,
    )


def parse_metadata_url(url: str, environ: Mapping[str, str] | None = None) -> CouchbaseTarget:
    """Split `couchbase://[user:pass@]host[:port]/bucket?username=..&password=..&timeout=..&prefix=..`.

    Credentials come from the URL, else from $EVENTING_COUCHBASE_USERNAME / $EVENTING_COUCHBASE_PASSWORD.
    Messages never repeat the password.
    """
    env = os.environ if environ is None else environ
    parts = urlsplit(url)
    shown = _redacted(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        supported = ", ".join(f"{s}://" for s in SCHEMES)
        raise StoreError(
            f"{METADATA_URL_ENV}={shown} has an unsupported scheme '{parts.scheme}'; supported: {supported} "
            f"(unset {METADATA_URL_ENV} to keep the metadata in SQLite under the data directory)"
        )
    hosts = parts.netloc.rpartition("@")[2]
    bucket = unquote(parts.path.strip("/"))
    if not hosts or not bucket or "/" in bucket:
        raise StoreError(
            f"{METADATA_URL_ENV}={shown} must name one host list and one bucket, as in {scheme}://host[:port]/bucket"
        )
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    username = query.pop("username", None) or unquote(parts.username or "") or env.get(USERNAME_ENV, "")
    password = query.pop("password", None) or unquote(parts.password or "") or env.get(PASSWORD_ENV, "")
    if not username or not password:
        raise StoreError(
            f"{METADATA_URL_ENV}={shown} has no credentials; add ?username=..&password=.. to it or set "
            f"{USERNAME_ENV} and {PASSWORD_ENV}"
        )
    raw_timeout = query.pop("timeout", None) or None
    raw_timeout = query.pop("timeout_s", None) or raw_timeout
    try:
        timeout_s = float(raw_timeout) if raw_timeout else DEFAULT_TIMEOUT_S
    except ValueError:
        timeout_s = -1.0
    if not timeout_s > 0:
        raise StoreError(
            f"{METADATA_URL_ENV}={shown}: timeout={raw_timeout!r} is not a positive number of seconds"
        )
    prefix = query.pop("prefix", None) or DEFAULT_PREFIX
    connection_string = f"{scheme}://{hosts}" + (f"?{urlencode(query)}" if query else "")
    return CouchbaseTarget(connection_string, bucket, username, password, timeout_s, prefix)


def _redacted(url: str) -> str:
    """The URL with any password replaced by ***, for messages and logs."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    query = "&".join(
        f"{k}=***" if k == "password" else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return parts._replace(netloc=netloc, query=query).geturl()
