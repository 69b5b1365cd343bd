"""Errors of the runtime; the hierarchy is drawn in `metadata.errors`, re-exported here for users."""

from metadata.errors import (
    CLI_WORDING,
    ConfigError,
    EventingError,
    FencedError,
    Fix,
    HandlerLoadError,
    LifecycleError,
    NotFoundError,
    OrderViolationError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    StoreUnavailableError,
    fix,
)
from sharding.vbucket import InvalidKeyError


class InvalidDocumentError(EventingError):
    """A document that is not a JSON object, or too large."""


class BindingError(EventingError):
    """A handler misused a bucket binding (for example wrote through a read-only alias)."""


class MirrorWriteError(ConfigError):
    """A write to a collection that mirrors a PostgreSQL table (its documents follow the table)."""


class TimerError(EventingError):
    """A handler misused create_timer / cancel_timer (callback, time, reference or context)."""


class CurlError(EventingError):
    """A handler's curl() call failed: unbound URL, network error, timeout or oversized response."""


__all__ = [
    "CLI_WORDING",
    "Fix",
    "StoreUnavailableError",
    "fix",
    "BindingError",
    "ConfigError",
    "CurlError",
    "EventingError",
    "FencedError",
    "HandlerLoadError",
    "InvalidDocumentError",
    "InvalidKeyError",
    "LifecycleError",
    "MirrorWriteError",
    "NotFoundError",
    "OrderViolationError",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "TimerError",
]
