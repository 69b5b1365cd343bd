"""The HTTP face of the service: a Couchbase-shaped REST API, Prometheus metrics and a web console.

`build_app(config)` returns the ASGI application; `serve(config)` runs it (eventing serve), and
`start_in_thread(config)` runs it beside a service (eventing run --serve).

The names are imported when first used: the CLI reads this package's constants (eventing.http.auth) for its
--help without loading the web stack.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerConfig", "serve", "start_in_thread"]


def __getattr__(name: str) -> Any:
    if name == "ServerConfig":
        from eventing.http.auth import ServerConfig

        return ServerConfig
    if name in ("serve", "start_in_thread"):
        from eventing.http import server

        return getattr(server, name)
    raise AttributeError(f"module 'eventing.http' has no attribute {name!r}")
