"""A local HTTP server for tests whose handlers call out (curl, URL bindings): on a free port of 127.0.0.1, on
a daemon thread, closed on leaving the `with`.

It looks for its shutdown every 50 ms: http.server's default of 0.5 s would be waited out at the end of every
test that uses one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def url_of(httpd: ThreadingHTTPServer, path: str = "") -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}{path}"
