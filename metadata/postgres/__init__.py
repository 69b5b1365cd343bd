"""The PostgreSQL backend: connections (pools, retries, errors, schema versions) shared by the PostgreSQL
metadata store and the PostgreSQL buckets (eventing.storage.postgres)."""

from metadata.postgres.connection import (
    PostgresDatabase,
    PostgresTarget,
    ensure_schema,
    is_postgres_url,
    parse_postgres_url,
    redact,
)

__all__ = ["PostgresDatabase", "PostgresTarget", "ensure_schema", "is_postgres_url", "parse_postgres_url", "redact"]
