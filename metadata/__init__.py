"""The metadata store: function definitions and states, checkpoints with ownership epochs, counters, DLQ."""

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
from metadata.model import TRANSITIONS, Checkpoint, DlqRow, FunctionRecord, FunctionState, check_transition
from metadata.protocol import MetadataStore
from metadata.sqlite_store import SqliteMetadataStore

__all__ = [
    "TRANSITIONS",
    "Checkpoint",
    "ConfigError",
    "DlqRow",
    "EventingError",
    "FencedError",
    "FunctionRecord",
    "FunctionState",
    "HandlerLoadError",
    "LifecycleError",
    "MetadataStore",
    "NotFoundError",
    "OrderViolationError",
    "SqliteMetadataStore",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "check_transition",
]
