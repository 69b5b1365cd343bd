"""The project's error hierarchy, rooted where every layer above `sharding` can import it.

    EventingError                  root: every error a user can act on
    ├── ConfigError                bad function definition, bad option value
    ├── NotFoundError              unknown function, bucket, node or DLQ row
    ├── LifecycleError             an illegal state transition (deploying a deployed function, ...)
    ├── StoreError                 the metadata store or a bucket file cannot be used
    │   ├── StoreLockedError       another process holds the write lock for too long
    │   ├── StoreUnavailableError  the store's server did not answer in time (or a commit's fate is unknown)
    │   └── StoreCorruptError      the file is not a valid store; fail closed, never skip ahead
    ├── FencedError                a stale owner (zombie) tried to write; its write was rejected
    ├── OrderViolationError        a seqno went backwards where it must only move forward
    └── HandlerLoadError           a handler that does not import or lacks on_update/on_delete

The CLI prints `error: <message>` for these and exits non-zero, without a traceback.
"""

from __future__ import annotations


class EventingError(Exception):
    """Root of every error a user can act on; the message names the thing and the fix."""


class ConfigError(EventingError):
    pass


class NotFoundError(EventingError):
    pass


class LifecycleError(EventingError):
    pass


class StoreError(EventingError):
    pass


class StoreLockedError(StoreError):
    pass


class StoreCorruptError(StoreError):
    pass


class StoreUnavailableError(StoreError):
    """The store's server did not answer within the wait (it is down, restarting or failing over).
    ``ambiguous``: a COMMIT was sent and no answer came, so the write may or may not have been made."""

    def __init__(self, message: str, *, ambiguous: bool = False):
        super().__init__(message)
        self.ambiguous = ambiguous


class FencedError(EventingError):
    pass


class OrderViolationError(EventingError):
    pass


class HandlerLoadError(EventingError):
    pass
