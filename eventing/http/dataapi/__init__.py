"""Couchbase's Data API (the Capella Data API, v1) over the buckets of the data directory, plus a streamed
bulk load.

Paths, headers, status codes and error bodies follow the Data API's OpenAPI description: a document is
`/v1/buckets/{bucket}/scopes/{scope}/collections/{collection}/documents/{key}` (GET, POST creates, PUT
upserts or replaces under If-Match, DELETE), with /append, /prepend, /increment, /decrement and /touch;
`/v1/callerIdentity` names the caller. Errors are `{"code": ..., "message": ..., "resource": ...}`.
The /v1.alpha paths (locking, sub-document) are not served: 404, as a server whose alpha API is off.

A document is stored as the rest of the project stores it (eventing.core.mutation): a JSON object as a
msgpack map, so a handler gets a dict; any other body (text, binary, a JSON number or array, a counter)
as its bytes. `ETag` is the document's cas in hex, `X-CB-Flags` its flags (Couchbase's common flags: the
format in the top byte), `Expires` its expiry as an HTTP date. Every write goes through
`Collection.change`, one transaction that reads the current version, checks the condition (absent for a
create, the If-Match cas for a replace or delete) and writes, so two callers never both win. A write is a
mutation of the bucket like any other: functions whose source is the keyspace see it.

`POST /api/v1/keyspaces/{keyspace}/load` takes the JSON lines of `eventing bucket load --file`, read in
chunks as they arrive and committed in transactions of up to 20,000 lines; the first bad line stops it,
and the answer says which line and how many rows before it were committed.

This module is the ASGI side (paths, permissions, the answer's shape); its parts: requests.py
(limits, a request read and parsed, the answer written), documents.py (each operation's checks,
write and answer), writer.py (the open buckets and the group-commit request thread of each),
load.py (the bulk load), errors.py (the error shape).
"""

from __future__ import annotations

import json
import logging
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from eventing.core.keyspaces import Keyspace
from eventing.errors import StoreError
from eventing.http.auth import AUTH_ERROR_SCOPE_KEY, IDENTITY_SCOPE_KEY, AuthError, Identity, ServerConfig
from eventing.http.dataapi.errors import ApiError, bad, not_allowed, retry_after
from eventing.http.dataapi.idempotency import HEADER as IDEMPOTENCY_HEADER
from eventing.http.dataapi.idempotency import IdempotencyRecords
from eventing.http.dataapi.load import LOAD_PREFIX, serve_load
from eventing.http.dataapi.requests import (
    DOCUMENT_OPS,
    FLAGS_BINARY,
    FLAGS_JSON,
    FLAGS_STRING,
    MAX_BODY_BYTES,
    MAX_KEY_BYTES,
    DocRequest,
    read_body,
    respond,
)
from eventing.http.dataapi.writer import shared_buckets
from eventing.security.users import DATA_READ, DATA_WRITE

# Importable from the package as before the Data API became one.
__all__ = ["FLAGS_BINARY", "FLAGS_JSON", "FLAGS_STRING", "MAX_BODY_BYTES", "ApiError", "DataApi", "serves"]

log = logging.getLogger(__name__)


def serves(path: str) -> bool:
    """Paths whose requests this module answers, reading their bodies itself (no whole-body buffering)."""
    return path.startswith(("/v1/", "/v1.alpha/", LOAD_PREFIX)) or path in ("/v1", "/v1.alpha")


# -- the ASGI side -----------------------------------------------------------------------------------------


class DataApi:
    """Answers the Data API paths and the bulk load; hands every other request to `app`."""

    def __init__(self, app: ASGIApp, config: ServerConfig):
        self.app = app
        self.config = config
        self.buckets = shared_buckets(config.state)  # shared with the KV port (eventing.kv)
        # Writes sent with an Idempotency-Key: their answers, kept for the retention window.
        self.idempotency = IdempotencyRecords(config.state, config.idempotency_retention_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not serves(scope["path"]):
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith(LOAD_PREFIX):
            await self.load(scope, receive, send)
            return
        try:
            status, headers, body, ctype = await self.dispatch(scope, receive)
        except ApiError as exc:
            status, headers, body, ctype = (
                exc.status,
                exc.headers,
                json.dumps(exc.body()).encode(),
                "application/json",
            )
        except (
            StoreError
        ) as exc:  # busy, away, damaged (the CLI's line: the file and the way out), or a full disk
            status, headers, ctype = 503, retry_after(exc), "application/json"
            body = json.dumps({"code": "UnderlyingServiceUnavailable", "message": f"{exc}"}).encode()
        except Exception as exc:  # a fault of this server: still the Data API's error shape
            log.exception("Data API: %s %s failed", scope["method"], scope["path"])
            status, headers, ctype = 500, {}, "application/json"
            body = json.dumps(
                {
                    "code": "Internal",
                    "message": f"An internal error occurred ({type(exc).__name__}); "
                    "the server log has the details",
                }
            ).encode()
        await respond(send, status, headers, body, ctype)

    async def dispatch(self, scope: Scope, receive: Receive) -> tuple[int, dict[str, str], bytes, str | None]:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        segments = raw_path.split(b"?")[0].split(b"/")[1:]
        method = scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if segments[0] != b"v1":
            raise ApiError(
                404,
                "InvalidArgument",
                f"{scope['path']} is not served: the alpha Data API (locking, "
                "sub-document operations) is not enabled on this server; see docs/data-api.md",
            )
        if segments[1:] == [b"openapi.json"]:  # no data in it: any authenticated caller
            if method not in ("GET", "HEAD"):
                raise not_allowed(method, "GET")
            from eventing.http.dataapi.openapi import dataapi_openapi

            return (
                200,
                {},
                (b"" if method == "HEAD" else json.dumps(dataapi_openapi()).encode()),
                "application/json",
            )
        if segments[1:] == [b"callerIdentity"]:
            if method not in ("GET", "HEAD"):
                raise not_allowed(method, "GET")
            caller = self.check(scope, headers, DATA_READ, None)
            return 200, {}, json.dumps({"user": caller}).encode(), "application/json"
        if not (
            len(segments) in (9, 10)
            and segments[1] == b"buckets"
            and segments[3] == b"scopes"
            and segments[5] == b"collections"
            and segments[7] == b"documents"
        ):
            raise ApiError(
                404,
                "InvalidArgument",
                f"no Data API endpoint {scope['path']}; documents are at "
                "/v1/buckets/BUCKET/scopes/SCOPE/collections/COLLECTION/documents/KEY",
            )
        try:
            bucket, scope_name, collection, key = (
                unquote_to_bytes(s).decode("utf-8") for s in segments[2:9:2]
            )
        except UnicodeDecodeError:
            raise bad(
                "A path segment is not valid UTF-8 once percent-decoded; encode names and keys as UTF-8"
            ) from None
        op = segments[9].decode("latin-1") if len(segments) == 10 else ""
        if op and op not in DOCUMENT_OPS:
            raise ApiError(
                404,
                "InvalidArgument",
                f"no document operation '{op[:40]}'; use one of {', '.join(sorted(DOCUMENT_OPS))}",
            )
        allowed = "POST" if op else "GET, POST, PUT, DELETE"
        if method not in allowed.split(", ") and not (method == "HEAD" and not op):
            raise not_allowed(method, allowed)
        ks = Keyspace(bucket, scope_name, collection)
        caller = self.check(scope, headers, DATA_READ if method in ("GET", "HEAD") else DATA_WRITE, ks)
        key_bytes = len(key.encode())
        if not 1 <= key_bytes <= MAX_KEY_BYTES:
            raise bad(
                f"Length of document key '{key[:60]}' is {key_bytes} bytes; a key is 1 to {MAX_KEY_BYTES} "
                "bytes"
            )
        body = await read_body(receive, headers)
        if op == "touch" and _returns_content(body):  # a touch that returns the document reads it too
            self.check(scope, headers, DATA_READ, ks)
        req = DocRequest(
            ks,
            key,
            "GET" if method == "HEAD" else method,
            op,
            headers,
            scope.get("query_string", b"").decode("latin-1"),
            body,
        )
        idempotency_key = headers.get(IDEMPOTENCY_HEADER)
        if idempotency_key is not None and method not in ("GET", "HEAD"):  # a retried write: its first answer
            return await self.idempotency.answer(
                caller,
                idempotency_key,
                (method, raw_path.split(b"?")[0].decode("latin-1"), req.query, body),
                lambda: self.buckets.submit(req),
            )
        status, out_headers, out, ctype = await self.buckets.submit(req)
        return status, out_headers, (b"" if method == "HEAD" else out), ctype

    def check(self, scope: Scope, headers: dict[str, str], permission: str, ks: Keyspace | None) -> str:
        """The caller's name if it may read (`data.read`) or write (`data.write`) the documents of `ks`, else
        the Data API's 401 or 403. The guard (eventing.http.app) has authenticated the caller (tokens, or
        users by HTTP Basic: eventing.http.auth); here its roles decide: data_reader / data_writer on the
        keyspace (with * wildcards), ro_admin reads, admin reads and writes, a server without credentials
        trusts local callers."""
        refused: AuthError | None = scope.get(AUTH_ERROR_SCOPE_KEY)
        identity: Identity | None = scope.get(IDENTITY_SCOPE_KEY)
        if refused is not None or identity is None:
            if not headers.get("authorization", "").strip():
                raise ApiError(
                    401,
                    "Unauthorized",
                    "You must send authentication to use this endpoint; send "
                    "`Authorization: Basic` (a user's name and password, or any name and a token as "
                    "password) or `Bearer TOKEN`",
                    headers={"WWW-Authenticate": 'Basic realm="eventing"'},
                )
            raise ApiError(
                403,
                "InvalidAuth",
                "Your username or password is invalid; check the user's password "
                "(`eventing user list` names the users) or the token (--admin-token / --read-token)",
            )
        if ks is not None and not identity.can(permission, ks):
            where = f"'{ks.bucket}/{ks.scope}/{ks.collection}'"
            resource = f"/buckets/{ks.bucket}/scopes/{ks.scope}/collections/{ks.collection}"
            roles = ", ".join(str(g) for g in identity.grants) or "none"
            if permission == DATA_WRITE:
                raise ApiError(
                    403,
                    "NoWriteAccess",
                    f"No permissions to write documents into {where} as "
                    f"{identity.user} (roles: {roles}); a write needs data_writer[{ks}] or admin",
                    resource,
                )
            raise ApiError(
                403,
                "NoReadAccess",
                f"No permissions to read documents from {where} as {identity.user} "
                f"(roles: {roles}); a read needs data_reader[{ks}], ro_admin or admin",
                resource,
            )
        return identity.user

    # -- bulk load ---------------------------------------------------------------------------------------

    async def load(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /api/v1/keyspaces/{keyspace}/load (the guard has checked the token and the admin role)."""
        await serve_load(self.buckets, self.config.state, scope, receive, send)


def _returns_content(body: bytes) -> bool:
    """Whether a touch's body asks for the document back (`"returnContent": true`); a body that cannot be read
    is the operation's to refuse."""
    import json

    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(parsed, dict) and parsed.get("returnContent") is True
