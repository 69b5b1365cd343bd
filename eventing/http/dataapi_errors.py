"""The Data API's error shape (`{"code", "message", "resource"}` with a status) and the refusals every part of it
raises."""

from __future__ import annotations

from typing import Any

from eventing.errors import EventingError, InvalidKeyError, MirrorWriteError, StoreLockedError


class ApiError(Exception):
    """An answer in the Data API's error shape."""

    def __init__(self, status: int, code: str, message: str, resource: str | None = None, headers: dict[str, str] | None = None):
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
    return ApiError(405, "InvalidArgument", f"{method} is not allowed here; this path answers {allowed}",
                    headers={"Allow": allowed})


def api_error(exc: Exception) -> Exception:
    """What to answer for an exception of a document request: the store's refusals as 400."""
    if isinstance(exc, InvalidKeyError):
        return bad(f"{exc}")
    if isinstance(exc, MirrorWriteError):
        return ApiError(403, "WriteRefused", f"{exc}")
    if isinstance(exc, EventingError) and not isinstance(exc, StoreLockedError):
        return bad(f"{exc}")  # e.g. a document over the size limit
    return exc
