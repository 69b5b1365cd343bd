"""The metadata store: function definitions and states, checkpoints with ownership epochs, counters, DLQ.

Backends: SqliteMetadataStore (embedded default), PostgresMetadataStore (a postgresql:// location) and
CouchbaseMetadataStore; `open_store` picks one from the location and the environment ($EVENTING_METADATA_URL).
"""

from metadata.errors import (
    ConfigError,
    EventingError,
    FencedError,
    HandlerLoadError,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
)
from metadata.factory import METADATA_URL_ENV, open_store, parse_metadata_url
from metadata.model import (
    REWIND,
    REWIND_REAPPLY,
    TIMER_VB_BASE,
    TRANSITIONS,
    USERS_MARK,
    Checkpoint,
    DlqRow,
    FunctionRecord,
    FunctionState,
    Lease,
    TimerChange,
    TimerDone,
    TimerRecord,
    UserRecord,
    check_transition,
    owner_vb,
)
from metadata.postgres import PostgresMetadataStore
from metadata.protocol import MetadataStore, WorkerMetadata
from metadata.sqlite import SqliteMetadataStore

__all__ = [
    "REWIND",
    "REWIND_REAPPLY",
    "TIMER_VB_BASE",
    "USERS_MARK",
    "TRANSITIONS",
    "Checkpoint",
    "ConfigError",
    "CouchbaseMetadataStore",
    "CouchbaseWindowStateStore",
    "DlqRow",
    "EventingError",
    "FencedError",
    "FunctionRecord",
    "FunctionState",
    "HandlerLoadError",
    "Lease",
    "LifecycleError",
    "METADATA_URL_ENV",
    "MetadataStore",
    "NotFoundError",
    "OrderViolationError",
    "PostgresMetadataStore",
    "SqliteMetadataStore",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "TimerChange",
    "TimerDone",
    "TimerRecord",
    "UserRecord",
    "WorkerMetadata",
    "check_transition",
    "owner_vb",
    "open_store",
    "parse_metadata_url",
]


def __getattr__(name: str):
    # The Couchbase backend is imported when first named (~0.1 s): embedded runs and workers never need it.
    if name in ("CouchbaseMetadataStore", "CouchbaseWindowStateStore"):
        from metadata import couchbase

        return getattr(couchbase, name)
    raise AttributeError(f"module 'metadata' has no attribute {name!r}")
