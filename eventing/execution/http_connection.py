"""One kept-alive HTTP/1.1 connection for `curl` (eventing.execution.curl): the request written in one
piece, the answer read with no more parsing than HTTP/1.1 framing needs.

http.client cost ~95 us of CPU per kept-alive request here, most of it building the request header by
header and parsing the answer's header through the email package; this connection costs ~30 us
(docs/benchmarks.md, "Concurrency"). It speaks only what curl needs: one request at a time, bodies framed
by Content-Length, chunks or the connection's end; redirects, digest auth and cookies stay with urllib.
"""

from __future__ import annotations

import re
import socket
import ssl

from eventing.errors import CurlError

# What http.client refuses in a request line or a header (a request smuggled into another).
_UNSAFE_TARGET = re.compile(r"[\x00-\x20\x7f]")
_UNSAFE_HEADER = re.compile(r"[\r\n\x00]")
_HEAD_LIMIT = 65_536  # as http.client's _MAXLINE: a longer head is not an HTTP answer


class ClosedBeforeAnswer(ConnectionResetError):
    """The server closed the connection before a byte of its answer: a kept connection it closed while
    it was idle, so the request may be sent again on a new one."""


class HttpConnection:
    def __init__(self, host: str, port: int | None, timeout: float, tls: ssl.SSLContext | None = None):
        default = 443 if tls is not None else 80
        self.port = port or default
        name = f"[{host}]" if ":" in host else host  # an IPv6 address
        self.host_header = name if self.port == default else f"{name}:{self.port}"
        sock = socket.create_connection((host, self.port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the request leaves in one segment
            self.sock: socket.socket | None = (
                tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
            )
        except BaseException:
            sock.close()
            raise
        self._buf = bytearray()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float,
        max_bytes: int,
    ) -> tuple[int, dict[str, str], bytes, bool]:
        """Send one request and read its answer: (status, headers, body, whether the connection can be kept).
        A body over ``max_bytes`` raises CurlError; the caller closes the connection on any exception."""
        sock = self.sock
        if sock is None:
            raise ConnectionResetError("the connection is closed")
        sock.settimeout(timeout)
        sock.sendall(self._head(method, target, headers, body) + (body or b""))
        status, version, answer = self._read_head(first=True)
        while 100 <= status < 200:  # an interim answer (100 Continue) precedes the real one
            status, version, answer = self._read_head(first=False)
        lower = {k.lower(): v for k, v in answer.items()}
        connection = lower.get("connection", "").lower()
        keep = "close" not in connection if version >= 11 else "keep-alive" in connection
        if method == "HEAD" or status in (204, 304):
            payload = b""
        elif "chunked" in lower.get("transfer-encoding", "").lower():
            payload = self._read_chunks(max_bytes)
        elif "content-length" in lower:
            try:
                length = int(lower["content-length"])
            except ValueError:
                raise CurlError(
                    f"curl answer has a bad Content-Length: {lower['content-length']!r}"
                ) from None
            if length > max_bytes:
                raise _too_large(max_bytes)
            payload = self._read_exactly(length)
        else:  # the body ends with the connection
            payload = self._read_to_end(max_bytes)
            keep = False
        return status, answer, payload, keep and not self._buf

    def _head(self, method: str, target: str, headers: dict[str, str], body: bytes | None) -> bytes:
        if _UNSAFE_TARGET.search(target):
            raise CurlError(f"curl URL path {target!r} has spaces or control characters; quote them (%20)")
        names = {k.lower() for k in headers}
        lines = [f"{method} {target} HTTP/1.1"]
        if "host" not in names:
            lines.append(f"Host: {self.host_header}")
        if "accept-encoding" not in names:
            lines.append("Accept-Encoding: identity")  # as http.client: the body is never compressed
        for name, value in headers.items():
            if _UNSAFE_HEADER.search(name) or _UNSAFE_HEADER.search(value) or ":" in name:
                raise CurlError(f"curl header {name!r} has a line break or a colon in its name or value")
            lines.append(f"{name}: {value}")
        if "content-length" not in names and "transfer-encoding" not in names:
            if body is not None:
                lines.append(f"Content-Length: {len(body)}")
            elif method in ("POST", "PUT", "PATCH"):
                lines.append("Content-Length: 0")
        lines.append("\r\n")
        try:
            return "\r\n".join(lines).encode("latin-1")
        except UnicodeEncodeError:
            raise CurlError("curl request path or header is not Latin-1 text; percent-encode it") from None

    def _read_head(self, first: bool) -> tuple[int, int, dict[str, str]]:
        buf = self._buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head, size = bytes(buf[:end]), end + 4
                break
            end = buf.find(b"\n\n")  # a server that ends its lines with LF alone
            if end >= 0:
                head, size = bytes(buf[:end]), end + 2
                break
            if len(buf) > _HEAD_LIMIT:
                raise CurlError(f"curl answer's header is longer than {_HEAD_LIMIT} bytes")
            chunk = self._recv()
            if not chunk:
                if first and not buf:
                    raise ClosedBeforeAnswer("the server closed the connection")
                raise ConnectionResetError("the server closed the connection in the middle of its answer")
            buf += chunk
        del buf[:size]
        lines = head.decode("latin-1").split("\n")
        version, _, rest = lines[0].partition(" ")
        try:
            status = int(rest.strip()[:3])
        except ValueError:
            raise CurlError(f"curl answer is not HTTP: {lines[0][:80]!r}") from None
        answer: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if colon:
                answer[name.strip()] = value.strip()
        return status, (10 if version.strip() == "HTTP/1.0" else 11), answer

    def _recv(self) -> bytes:
        assert self.sock is not None
        return self.sock.recv(65_536)

    def _read_exactly(self, length: int) -> bytes:
        buf = self._buf
        while len(buf) < length:
            chunk = self._recv()
            if not chunk:
                raise ConnectionResetError("the server closed the connection in the middle of its answer")
            buf += chunk
        payload = bytes(buf[:length])
        del buf[:length]
        return payload

    def _read_line(self) -> bytes:
        buf = self._buf
        while (end := buf.find(b"\n")) < 0:
            if len(buf) > _HEAD_LIMIT:
                raise CurlError(f"curl answer has a chunk line longer than {_HEAD_LIMIT} bytes")
            chunk = self._recv()
            if not chunk:
                raise ConnectionResetError("the server closed the connection in the middle of its answer")
            buf += chunk
        line = bytes(buf[:end]).rstrip(b"\r")
        del buf[: end + 1]
        return line

    def _read_chunks(self, max_bytes: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self._read_line()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise CurlError(f"curl answer has a bad chunk size: {line[:40]!r}") from None
            if size == 0:
                while self._read_line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            total += size
            if total > max_bytes:
                raise _too_large(max_bytes)
            parts.append(self._read_exactly(size))
            self._read_exactly(2)  # the CRLF after the chunk

    def _read_to_end(self, max_bytes: int) -> bytes:
        buf = self._buf
        while len(buf) <= max_bytes and (chunk := self._recv()):
            buf += chunk
        if len(buf) > max_bytes:
            raise _too_large(max_bytes)
        payload = bytes(buf)
        buf.clear()
        return payload


def _too_large(max_bytes: int) -> CurlError:
    return CurlError(
        f"curl response is larger than curl_max_response_bytes ({max_bytes}); ask for less or raise the "
        "setting"
    )
