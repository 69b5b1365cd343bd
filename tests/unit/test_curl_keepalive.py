"""curl keeps a connection open per thread and host: many requests on one connection when the server
keeps it, a new one when the server closes it (at once or while it was kept), redirects still followed."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.execution.context import CallContext
from eventing.execution.curl import CurlClient, UrlBinding
from eventing.testing.http_peer import serve_http, url_of


class Peers(BaseHTTPRequestHandler):
    peers: list[int] = []

    def do_GET(self) -> None:
        Peers.peers.append(self.client_address[1])
        if self.path.startswith("/old"):
            self.send_response(302)
            self.send_header("Location", "/new")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class Closing(Peers):
    protocol_version = "HTTP/1.0"  # closes the connection after each answer


@pytest.fixture(params=[("HTTP/1.1", Peers), ("HTTP/1.0", Closing)], ids=["keeps", "closes"])
def served(request):
    version, handler = request.param
    handler.protocol_version = version
    Peers.peers = []
    with serve_http(handler) as httpd:
        yield version, url_of(httpd), httpd


def test_requests_share_a_kept_connection_and_survive_its_closing(served):
    version, url, httpd = served
    api = UrlBinding("api", url)
    curl = CurlClient(CallContext(5.0), [api], 1000)
    bodies = [curl("GET", api, {"path": f"/n{i}"}).body for i in range(20)]
    assert bodies == [f"/n{i}" for i in range(20)]
    assert len(set(Peers.peers)) == (1 if version == "HTTP/1.1" else 20)
    assert curl("GET", api, {"path": "/old"}).body == "/new"  # a redirect is followed
    if version == "HTTP/1.1":  # the kept connection is dropped under it: the next request opens another
        for conn in curl._kept.connections.values():
            assert conn.sock is not None
            conn.sock.shutdown(socket.SHUT_RDWR)
        assert curl("GET", api, {"path": "/again"}).body == "/again"
    assert curl.ops["curl_success_count"] == (22 if version == "HTTP/1.1" else 21)
