"""The Data API's HTTP exchange: its limits and formats, a document request read and parsed (body, headers,
expiry, cas, flags), and the answer written back."""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive, Send

from eventing.core.keyspaces import Keyspace
from eventing.http.dataapi.errors import ApiError, bad

MAX_BODY_BYTES = 20 * 1024 * 1024  # Couchbase's document limit; a larger body is a 413
MAX_KEY_BYTES = 250
# Couchbase's common flags: the document's format in the top byte.
FLAGS_JSON = 0x02000000
FLAGS_BINARY = 0x03000000
FLAGS_STRING = 0x04000000
UINT32 = (1 << 32) - 1
UINT64 = (1 << 64) - 1
DURABILITY_LEVELS = frozenset({"None", "Majority", "MajorityAndPersistOnMaster", "PersistToMajority"})
DOCUMENT_OPS = frozenset({"append", "prepend", "increment", "decrement", "touch"})
_DURATION = re.compile(r"^(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_HEX = re.compile(r"^[0-9a-fA-F]{1,16}$")


def too_large() -> ApiError:
    return ApiError(
        413,
        "InvalidArgument",
        f"The content of the request was too large (over {MAX_BODY_BYTES:,} bytes); store a smaller document",
    )


def parse_expires(value: str | None, *, iso: bool = False) -> int | None:
    """Couchbase's expiry header: "0" or empty (none), an HTTP date, or a Go duration ("90s", "1h30m");
    the touch body also takes an ISO 8601 time. Returns absolute Unix seconds (0: none), None if absent;
    a time between two seconds is rounded up to the later one."""
    if value is None:
        return None
    text = value.strip()
    if text in ("", "0"):
        return 0
    when: float | None = None
    if _DURATION.match(text):
        when = time.time() + sum(float(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(text))
    else:
        try:
            parsed = email.utils.parsedate_to_datetime(text)
            when = parsed.timestamp() if parsed.tzinfo else None
        except (TypeError, ValueError, IndexError):
            when = None
        if when is None and iso:
            try:
                from datetime import datetime

                parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
                when = parsed.timestamp() if parsed.tzinfo else None
            except ValueError:
                when = None
    if when is None:
        raise bad(
            f"Invalid time format '{value[:60]}': give 0, an HTTP date (Mon, 02 Jan 2006 15:04:05 GMT)"
            + (", an ISO 8601 time" if iso else "")
            + " or a duration such as 90s or 1h30m"
        )
    if not math.isfinite(when) or not 0 < when <= UINT32:  # a 5,000-digit duration is infinite here
        raise bad(f"Expiry '{value[:60]}' is out of range; give a time after 1970 and before 2106")
    # Expiries are whole seconds: rounded up, so a document lives at least as long as asked (500ms: up to 1 s
    # more, never already expired when it is written).
    return min(math.ceil(when), UINT32)


def parse_cas(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if text.startswith("W/"):
        text = text[2:]
    text = text.strip('"')
    if not _HEX.match(text):
        raise bad(
            f"Invalid etag format '{value[:60]}'; send the ETag of the document as it was returned (hex)"
        )
    cas = int(text, 16)
    if cas == 0:
        raise bad("CAS value cannot be zero; send the ETag of the document as it was returned")
    return cas


def parse_flags(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit() or int(text) > UINT32:
        raise bad(f"Invalid X-CB-Flags '{value[:60]}'; give a whole number from 0 to {UINT32}")
    return int(text)


@dataclass
class DocRequest:
    ks: Keyspace
    key: str
    method: str
    op: str  # "" for the document itself, else append/prepend/increment/decrement/touch
    headers: dict[str, str]
    query: str
    body: bytes

    @property
    def resource(self) -> str:
        return (
            f"/buckets/{self.ks.bucket}/scopes/{self.ks.scope}/collections/{self.ks.collection}"
            f"/documents/{self.key}"
        )

    @property
    def where(self) -> str:
        return f"'{self.ks.bucket}/{self.ks.scope}/{self.ks.collection}'"

    def missing(self) -> ApiError:
        return ApiError(
            404, "DocumentNotFound", f"Document '{self.key}' not found in {self.where}", self.resource
        )

    def exists(self) -> ApiError:
        return ApiError(
            409,
            "DocumentExists",
            f"Document '{self.key}' already exists in {self.where}; PUT replaces it, or POST another key",
            self.resource,
        )

    def cas_mismatch(self) -> ApiError:
        return ApiError(
            409,
            "CasMismatch",
            f"The specified CAS for '{self.key}' in {self.where} did not match: the "
            "document changed since; GET it again for the current ETag",
            self.resource,
        )

    def json_body(self) -> dict[str, Any] | None:
        """An optional JSON object body (counters), None when empty."""
        if not self.body.strip():
            return None
        ctype = self.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise bad(f"Unexpected content type '{ctype}'; send the body as application/json")
        try:
            data = json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad(f"The request body is not valid JSON ({exc}); send a JSON object") from None
        except RecursionError:
            raise bad("The request body's JSON nests too deeply to read; send a flat JSON object") from None
        if not isinstance(data, dict):
            raise bad("The request body must be a JSON object")
        return data


def uint64_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= UINT64:
        raise bad(f"'{name}' must be a whole number from 0 to {UINT64}, not {json.dumps(value)[:40]}")
    return value


async def read_body(receive: Receive, headers: dict[str, str]) -> bytes:
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large()
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large()
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def respond(send: Send, status: int, headers: dict[str, str], body: bytes, ctype: str | None) -> None:
    out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if ctype is not None:
        out.append((b"content-type", ctype.encode()))
    out.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


async def respond_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    await respond(send, status, headers or {}, json.dumps(body).encode(), "application/json")
