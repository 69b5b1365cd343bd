"""The Data API's error shape (`{"code", "message", "resource"}` with a status) and the refusals every part of
it raises."""

from __future__ import annotations

from typing import Any

from eventing.errors import (
    EventingError,
    InvalidKeyError,
    MirrorWriteError,
    StoreError,
    StoreLockedError,
    StoreUnavailableError,
)

# Seconds a client waits before sending again a request the store could not take: the store's server was
# away (or failing over) for longer than this server waits for it, or a bucket's file stayed locked.
RETRY_AFTER_S = 1


class ApiError(Exception):
    """An answer in the Data API's error shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        resource: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.resource = status, code, message, resource
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.resource:
            out["resource"] = self.resource
        return out


def bad(message: str) -> ApiError:
    return ApiError(400, "InvalidArgument", message)


def not_allowed(method: str, allowed: str) -> ApiError:
    return ApiError(
        405,
        "InvalidArgument",
        f"{method} is not allowed here; this path answers {allowed}",
        headers={"Allow": allowed},
    )


def api_error(exc: Exception) -> Exception:
    """What to answer for an exception of a document request: the store's refusals as 400; the store itself
    failing (busy, away, damaged, full) goes on as it is, to be answered 503."""
    if isinstance(exc, InvalidKeyError):
        return bad(f"{exc}")
    if isinstance(exc, MirrorWriteError):
        return ApiError(403, "WriteRefused", f"{exc}")
    if isinstance(exc, EventingError) and not isinstance(exc, StoreError):
        return bad(f"{exc}")  # e.g. a document over the size limit; the store busy or away is a 503
    return exc


def retry_after(exc: BaseException) -> dict[str, str]:
    """The Retry-After header of a 503 whose cause passes by itself (a store's server away or failing over,
    a file locked by another process); none for a damaged store or a full disk, which need someone."""
    if isinstance(exc, StoreUnavailableError | StoreLockedError):
        return {"Retry-After": str(RETRY_AFTER_S)}
    return {}
