"""The PostgreSQL backend: a store's location (location.py: its URL, errors as one line) and connections
(connection.py: pools, retries, schema versions), shared by the PostgreSQL metadata store and the PostgreSQL
buckets (eventing.storage.postgres), and the metadata store itself (store.py, its logic in metadata/sql/;
schema.py every table)."""

from metadata.postgres.connection import PostgresDatabase, ensure_schema
from metadata.postgres.location import PostgresTarget, is_postgres_url, parse_postgres_url, redact
from metadata.postgres.store import PostgresMetadataStore

__all__ = [
    "PostgresDatabase",
    "PostgresMetadataStore",
    "PostgresTarget",
    "ensure_schema",
    "is_postgres_url",
    "parse_postgres_url",
    "redact",
]
