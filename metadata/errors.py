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

An error may carry its way out as data (`Fix`: an action and its arguments), which each face words
itself: the message holds ``{fix}`` where the fix goes, `str(error)` words it as the CLI command
(`CLI_WORDING`), and the REST API words it as a request and returns it as a field
(eventing.http.routes.request), so no face rewrites another face's words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# How the CLI words each fix (the REST API has its own table): `{name}` is an argument of the Fix.
CLI_WORDING: dict[str, str] = {
    "deploy": "`eventing deploy {function}`",
    "undeploy": "`eventing undeploy {function}`",
    "pause": "`eventing pause {function}`",
    "resume": "`eventing resume {function}`",
    "status": "`eventing status`",
    "stats": "`eventing stats {function}`",
    "export": "`eventing export {function}`",
    "dlq_list": "`eventing dlq list {function}`",
    "dlq_purge_replayed": "`eventing dlq purge {function} --replayed`",
    "collection_create": "`eventing collection create {keyspace}`",
    "collection_list": "`eventing collection list {bucket}`",
    "option": "{flag} {value}",
}


@dataclass(frozen=True)
class Fix:
    """A way out of an error as data: `action` (a key of CLI_WORDING) and its arguments."""

    action: str
    args: dict[str, Any] = field(default_factory=dict)

    def worded(self, wording: dict[str, str]) -> str:
        return wording[self.action].format(**self.args)


def fix(action: str, **args: Any) -> Fix:
    return Fix(action, args)


class EventingError(Exception):
    """Root of every error a user can act on; the message names the thing and the fix. With `fix`, the
    message's ``{fix}`` is where its wording goes (see the module docstring)."""

    def __init__(self, *args: Any, fix: Fix | None = None):
        super().__init__(*args)
        self.fix = fix

    def worded(self, wording: dict[str, str]) -> str:
        """The message with its fix worded by `wording` (a face's table)."""
        text = str(self.args[0]) if self.args else ""
        return text.replace("{fix}", self.fix.worded(wording)) if self.fix is not None else text

    def __str__(self) -> str:
        return self.worded(CLI_WORDING) if self.fix is not None else super().__str__()


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
