"""curl's kept-alive HTTP/1.1 connection (eventing.execution.http_connection) reads every framing a server
may use, refuses what would split a request, and works over TLS."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventing.errors import CurlError
from eventing.execution.context import CallContext
from eventing.execution.curl import CurlClient, UrlBinding, _query
from eventing.execution.http_connection import HttpConnection


@contextmanager
def scripted(
    *connections: list[bytes], tls: ssl.SSLContext | None = None
) -> Iterator[tuple[int, list[bytes]]]:
    """A server that accepts one connection per list of answers, one after another. On each it reads one
    request (head and Content-Length body) per answer and writes the answer's bytes as they are; an answer
    of b"" closes the connection unanswered. Yields the port and the requests read."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []

    def answer(conn: socket.socket, answers: list[bytes]) -> None:
        buf = b""
        with conn:
            for reply in answers:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(buf) < length:
                    buf += conn.recv(65536)
                requests.append(head + b"\r\n\r\n" + buf[:length])
                buf = buf[length:]
                if not reply:
                    return
                conn.sendall(reply)

    def serve() -> None:
        for answers in connections:
            try:
                conn, _ = listener.accept()
                if tls is not None:
                    conn = tls.wrap_socket(conn, server_side=True)
            except OSError:  # the listener closed, or a client that refused the certificate
                continue
            answer(conn, answers)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], requests
    finally:
        listener.close()
        thread.join(5)


def test_content_length_chunks_and_a_closed_end_frame_the_body():
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n4\r\ndefg\r\n0\r\nTrailer: "
        b"x\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 2\n\nlf",  # a server that ends its lines with LF alone
        b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end",
    ]
    with scripted(answers) as (port, requests):
        conn = HttpConnection("127.0.0.1", port, 5)
        got = [conn.request("GET", f"/r{i}", {}, None, 5, 1000) for i in range(len(answers))]
    assert [(status, body, keep) for status, _, body, keep in got] == [
        (200, b"hello", True),
        (200, b"abcdefg", True),
        (201, b"ok", True),
        (204, b"", True),
        (200, b"lf", True),
        (200, b"until the end", False),
    ]
    assert got[0][1] == {"Content-Length": "5", "X-A": "1"}
    assert (
        requests[0]
        == f"GET /r0 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept-Encoding: identity\r\n\r\n".encode()
    )


def test_a_body_is_sent_with_its_length_and_connection_close_is_honoured():
    with scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"]) as (port, requests):
        conn = HttpConnection("127.0.0.1", port, 5)
        status, _, body, keep = conn.request(
            "POST", "/p", {"Content-Type": "application/json"}, b'{"a":1}', 5, 10
        )
    assert (status, body, keep) == (200, b"", False)
    assert b"Content-Length: 7\r\n" in requests[0] and requests[0].endswith(b'\r\n\r\n{"a":1}')


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\nhello world",
    ],
    ids=["length", "chunked", "to-the-end"],
)
def test_a_body_over_the_limit_is_refused_however_it_is_framed(answer):
    with scripted([answer]) as (port, _):
        conn = HttpConnection("127.0.0.1", port, 5)
        with pytest.raises(CurlError, match=r"larger than curl_max_response_bytes \(10\)"):
            conn.request("GET", "/", {}, None, 5, 10)
        conn.close()


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/a b", {}),
        ("/a", {"X-Evil": "1\r\nHost: other"}),
        ("/a", {"X:Evil": "1"}),
        ("/a", {"X-Name": "caf\u00e9 \u2603"}),
    ],
)
def test_what_would_split_or_garble_a_request_is_refused_before_sending(target, headers):
    with scripted([b""]) as (port, requests):
        conn = HttpConnection("127.0.0.1", port, 5)
        with pytest.raises(CurlError, match="curl"):
            conn.request("GET", target, headers, None, 5, 10)
        conn.close()
    assert requests == []


def test_a_kept_connection_the_server_closed_is_replaced_once_by_curl():
    one = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none"
    two = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo"
    # The first connection answers once, then closes unanswered; the second answers the request again.
    with scripted([one, b""], [two]) as (port, requests):
        api = UrlBinding("api", f"http://127.0.0.1:{port}")
        curl = CurlClient(CallContext(5.0), [api], 1000)
        assert [curl("GET", api, {"path": p}).body for p in ("/1", "/2")] == ["one", "two"]
    assert [r.split(b" ")[1] for r in requests] == [b"/1", b"/2", b"/2"]  # at least once: /2 reached it twice
    with pytest.raises(CurlError, match="failed"):  # nobody listens any more: one clear error
        curl("GET", api)


@pytest.fixture(scope="module")
def tls_contexts(tmp_path_factory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    return server, client


def test_https_through_a_binding_that_does_not_verify_the_certificate(tls_contexts):
    server, _ = tls_contexts
    answers = [b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{"n": 1}'] * 3
    with scripted(answers, tls=server) as (port, requests):
        api = UrlBinding("api", f"https://127.0.0.1:{port}", verify_tls=False)
        curl = CurlClient(CallContext(5.0), [api], 1000)
        assert [curl("GET", api, {"path": f"/t{i}"}).body for i in range(3)] == [{"n": 1}] * 3
    assert len(requests) == 3  # all three on one kept connection (the server accepts only one)


def test_https_with_verification_refuses_a_self_signed_certificate(tls_contexts):
    server, _ = tls_contexts
    with scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"], tls=server) as (port, _):
        api = UrlBinding("api", f"https://127.0.0.1:{port}")
        curl = CurlClient(CallContext(5.0), [api], 1000)
        with pytest.raises(CurlError, match="CERTIFICATE_VERIFY_FAILED"):
            curl("GET", api)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=8),
        st.one_of(
            st.text(max_size=8),
            st.integers(),
            st.booleans(),
            st.floats(allow_nan=False),
            st.binary(max_size=6),
        ),
        max_size=4,
    )
)
def test_curl_query_strings_are_what_urlencode_makes(params):
    assert _query(params) == urllib.parse.urlencode(params)
