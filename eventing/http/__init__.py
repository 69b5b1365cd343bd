"""The HTTP face of the service: a Couchbase-shaped REST API, Prometheus metrics and a web console.

`build_app(config)` returns the ASGI application; `serve(config)` runs it (eventing serve), and
`start_in_thread(config)` runs it beside a service (eventing run --serve).
"""

from eventing.http.auth import ServerConfig
from eventing.http.server import serve, start_in_thread

__all__ = ["ServerConfig", "serve", "start_in_thread"]
