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

from eventing.http.auth import ServerConfig, is_loopback, needs_admin, presented_token, role_of
from eventing.http.dataapi import DataApi
from eventing.http.dataapi import serves as serves_data_api

PROTECTED_PREFIXES = ("/api/", "/metrics", "/getAppLog")
# The console loads only its own script and style; nothing may frame it or sniff types.
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
# On every authenticated response: the caller's role ("admin" or "read"), so a client can offer only what
# the token allows (the console hides the state-changing buttons from a read-only token).
ROLE_HEADER = b"x-eventing-role"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})


def build_app(config: ServerConfig) -> Starlette:
    from eventing.http.routes import EXCEPTION_HANDLERS, routes

    middleware = []
    if config.cors_origins:
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        ))
    middleware.append(Middleware(GuardMiddleware, config=config))
    middleware.append(Middleware(DataApi, config=config))  # the Data API and the bulk load (eventing.http.dataapi)
    app = Starlette(routes=routes(), middleware=middleware, exception_handlers=EXCEPTION_HANDLERS)
    app.state.config = config
    return app


async def send_json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    data = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                    *headers],
    })
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
            await send_json(send, 421, {"error": f"host name '{host}' is not served here",
                                        "fix": f"use http://{self.config.host}:{self.config.port}/"})
            return
        origin = headers.get("origin")
        if origin and origin not in self.config.cors_origins and not _same_origin(origin, headers.get("host", "")):
            await send_json(send, 403, {"error": f"requests from origin {origin} are not allowed (CORS is closed)",
                                        "fix": "serve the page from this server, or list the origin with --cors-origin"})
            return

        role_header: list[tuple[bytes, bytes]] = []
        if path.startswith(PROTECTED_PREFIXES) and method != "OPTIONS":
            token = presented_token(headers.get("authorization"))
            role = role_of(self.config, token)
            if role is None:
                await send_json(send, 401, _unauthenticated(token is None),
                                [(b"www-authenticate", b'Bearer realm="eventing"')])
                return
            role_header = [(ROLE_HEADER, role.encode())]  # the console hides what this caller cannot do
            if needs_admin(method) and role != "admin":
                await send_json(send, 403, {
                    "error": f"{method} {path} changes state and needs the admin token; the read-only token was given",
                    "fix": "send the admin token (--admin-token / $EVENTING_ADMIN_TOKEN)",
                })
                return

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
    if header.startswith("["):
        return header.split("]")[0] + "]"
    return header.rsplit(":", 1)[0]


def _unauthenticated(no_token: bool) -> dict[str, str]:
    """401: no token at all, or a token that is neither the admin nor the read-only one."""
    if no_token:
        return {"error": "this endpoint needs a token and none was given",
                "fix": "send `Authorization: Bearer TOKEN` (the read-only token for reads, the admin token for changes)"}
    return {"error": "the token given is not accepted: it is neither the admin nor the read-only token",
            "fix": "check the token (--admin-token / $EVENTING_ADMIN_TOKEN, --read-token / $EVENTING_READ_TOKEN)"}


def _too_large(limit: int) -> dict[str, str]:
    return {"error": f"request body is larger than {limit:,} bytes",
            "fix": "send a smaller body, or start the server with a larger --max-body"}


def _same_origin(origin: str, host: str) -> bool:
    scheme, _, rest = origin.partition("://")
    return scheme in ("http", "https") and rest.rstrip("/") == host
