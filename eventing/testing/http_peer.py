"""A local HTTP server for tests whose handlers call out (curl, URL bindings): on a free port of 127.0.0.1, on
a daemon thread, closed on leaving the `with`.

It looks for its shutdown every 50 ms: http.server's default of 0.5 s would be waited out at the end of every
test that uses one. Its listen backlog is 128, not socketserver's 5: a pool of calls (`concurrency`) opens
its connections at once, and a connection the backlog dropped is retried by TCP a second later."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    request_queue_size = 128


@contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    httpd = _Server(("127.0.0.1", 0), handler)
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
