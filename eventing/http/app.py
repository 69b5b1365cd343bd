"""The ASGI application: routes, JSON errors, and the guards every request passes first.

Order of the guards (outermost first), each answering before the application sees the request:
1. Host and Origin: a loopback server answers only to loopback Host names (no DNS rebinding), and a
   browser request from another origin is refused unless listed with --cors-origin (no CSRF);
2. authentication (401: no token, or one not accepted) and role (403) for the API, /metrics and
   /getAppLog, whose responses then name the caller's role in `X-Eventing-Role`; the console's static
   files carry no data and need none;
3. the body size limit (413), read in full before any handler runs, so a refused request changes nothing;
   the Data API (/v1/...) and the bulk load (/api/v1/keyspaces/K/load) read their own bodies: 20 MiB a
   document, and the load streamed in batches (eventing.http.dataapi, inside the guard).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventing.errors import StoreError
from eventing.http.auth import (
    IDENTITY_SCOPE_KEY,
    AuthError,
    ServerConfig,
    authenticator_for,
    check_guarded,
    is_loopback,
)
from eventing.http.dataapi import DataApi
from eventing.http.dataapi import serves as serves_data_api
from eventing.http.dataapi.errors import retry_after

# Every REST endpoint's path starts with one of these (a test checks each endpoint): a caller is
# authenticated before any of them runs. Only the console's page and static files are served to anyone.
PROTECTED_PREFIXES = (
    "/api/",
    "/pools",
    "/metrics",
    "/get",  # Couchbase's /getAppLog, /getDeployedApps, /getExecutionStats, /getFailureStats, ...
    "/resetStatsCounters",
)
DATA_API_PREFIXES = ("/v1/", "/v1.alpha/")  # authenticated here; refusals in the Data API's own shape
# The console loads only its own script and style; nothing may frame it or sniff types.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors "
        b"'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
# On every authenticated response: the caller's role ("admin", "manage" for a manager of some functions, or
# "read"), so a client can offer only what it may do (the console hides the state-changing buttons from
# "read").
ROLE_HEADER = b"x-eventing-role"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


def build_app(config: ServerConfig) -> Starlette:
    from eventing.http.routes import EXCEPTION_HANDLERS, routes

    middleware = []
    if config.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["Authorization", "Content-Type"],
            )
        )
    middleware.append(Middleware(GuardMiddleware, config=config))
    middleware.append(
        Middleware(DataApi, config=config)
    )  # the Data API and the bulk load (eventing.http.dataapi)
    app = Starlette(routes=routes(), middleware=middleware, exception_handlers=EXCEPTION_HANDLERS)
    app.state.config = config
    return app


async def send_json(
    send: Send,
    status: int,
    body: dict[str, Any],
    headers: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class GuardMiddleware:
    def __init__(self, app: ASGIApp, config: ServerConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope["method"]
        path = scope["path"]

        host = _host_name(headers.get("host", ""))
        if is_loopback(self.config.host) and host and host not in LOOPBACK_NAMES:
            await send_json(
                send,
                421,
                {
                    "error": f"host name '{host}' is not served here",
                    "fix": f"use http://{self.config.host}:{self.config.port}/",
                },
            )
            return
        origin = headers.get("origin")
        if (
            origin
            and origin not in self.config.cors_origins
            and not _same_origin(origin, headers.get("host", ""))
        ):
            await send_json(
                send,
                403,
                {
                    "error": f"requests from origin {origin} are not allowed (CORS is closed)",
                    "fix": "serve the page from this server, or list the origin with --cors-origin",
                },
            )
            return

        role_header: list[tuple[bytes, bytes]] = []
        data_api = path.startswith(DATA_API_PREFIXES) or path in ("/v1", "/v1.alpha")
        if (data_api or path.startswith(PROTECTED_PREFIXES)) and method != "OPTIONS":
            # Tokens, or users by HTTP Basic (eventing.http.auth): 401 who?, 429 too many failed logins, and
            # 403 for a request no role of the caller could make; each endpoint then checks its keyspace.
            client = (scope.get("client") or ("", 0))[0]
            try:
                identity = await authenticator_for(self.config).authenticate_async(
                    headers.get("authorization"), client
                )
                if not data_api:
                    check_guarded(identity, method, path)
            except (
                StoreError
            ) as exc:  # the users cannot be read: the store is busy or damaged (the CLI's line)
                line = str(exc)
                await send_json(
                    send,
                    503,
                    {"code": "UnderlyingServiceUnavailable", "message": line}
                    if data_api
                    else {"error": line, "fix": line.rpartition("; ")[2] or None},
                    [(k.lower().encode(), v.encode()) for k, v in retry_after(exc).items()],
                )
                return
            except AuthError as refused:
                if data_api:  # answered in the Data API's error shape ({code, message})
                    no_credentials = "none was given" in refused.message
                    code = {429: "TooManyRequests"}.get(
                        refused.status, "Unauthorized" if no_credentials else "InvalidAuth"
                    )
                    status = (
                        403 if code == "InvalidAuth" else refused.status
                    )  # as the Data API answers bad credentials
                    await send_json(
                        send,
                        status,
                        {"code": code, "message": f"{refused.message}; {refused.fix}"},
                        [(k.lower().encode(), v.encode()) for k, v in refused.headers.items()],
                    )
                    return
                else:
                    challenge = (
                        [(b"www-authenticate", b'Bearer realm="eventing"')] if refused.status == 401 else []
                    )
                    await send_json(
                        send,
                        refused.status,
                        refused.body(),
                        challenge
                        + [
                            (k.lower().encode(), v.encode())
                            for k, v in refused.headers.items()
                            if k.lower() != "www-authenticate"
                        ],
                    )
                    return
            else:
                scope[IDENTITY_SCOPE_KEY] = identity
                role_header = [
                    (ROLE_HEADER, identity.role_header.encode())
                ]  # the console hides what it cannot do

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS, *role_header]
            await send(message)

        if serves_data_api(path):  # these read their own bodies, with their own limits (and the load streams)
            await self.app(scope, receive, send_with_headers)
            return

        limit = self.config.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await send_json(send, 413, _too_large(limit))
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await send_json(send, 413, _too_large(limit))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send_with_headers)


def _host_name(header: str) -> str:
    """The Host header's name, lower case (host names are case-insensitive), without its port."""
    header = header.lower()
    if header.startswith("["):
        return header.split("]")[0] + "]"
    return header.rsplit(":", 1)[0]


def _too_large(limit: int) -> dict[str, str]:
    return {
        "error": f"request body is larger than {limit:,} bytes",
        "fix": "send a smaller body, or start the server with a larger --max-body",
    }


def _same_origin(origin: str, host: str) -> bool:
    scheme, _, rest = origin.partition("://")
    return scheme in ("http", "https") and rest.rstrip("/") == host
