"""`curl(method, binding, request)` for handlers: HTTP calls to the URL bindings of a function only.

HTTP calls are side effects outside the system: they are **at least once**. A handler that is retried,
replayed from the dead-letter queue, or run again after a crash before its checkpoint calls the URL again
(binding writes are exactly once; a remote server is not). Make the remote side idempotent, for example by
sending meta.id and meta.seq and letting it ignore repeats.
"""

from __future__ import annotations

import base64
import http.cookiejar
import json
import re
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eventing.errors import CurlError
from eventing.execution.context import CallContext
from eventing.execution.http_connection import HttpConnection

METHODS = ("GET", "POST", "PUT", "DELETE", "HEAD", "PATCH")


@dataclass(frozen=True)
class UrlBinding:
    """A URL binding as the handler sees it (a global named by its alias); only usable with curl(). It
    holds no secret: the password or token stays with the CurlClient that adds it to each request, and a
    sandboxed function's never reaches its process (the host makes those requests, see `through_host`)."""

    alias: str
    url: str
    auth: str = "none"  # none | basic | bearer | digest
    username: str = ""
    verify_tls: bool = True
    allow_cookies: bool = False  # keep the cookies the server sets and send them back (Couchbase's allow_cookies)

    def __repr__(self) -> str:
        return f"<url binding {self.alias} -> {self.url}>"


def url_bindings(defined: Any) -> tuple[list[UrlBinding], dict[str, str]]:
    """A definition's url_bindings as the handler's objects, and the secret of each (alias -> the password
    of basic and digest auth, the token of bearer), which only the CurlClient keeps."""
    bindings, secrets = [], {}
    for u in defined:
        fields = {k: v for k, v in u.items() if k not in ("password", "token")}
        binding = UrlBinding(**fields)
        bindings.append(binding)
        secret = u.get("token" if binding.auth == "bearer" else "password")
        if binding.auth != "none" and secret:
            secrets[binding.alias] = str(secret)
    return bindings, secrets


# In a sandboxed child (eventing.workers.sandbox_child): the call that has the host make a request of a URL
# binding with credentials, which the child never holds. None elsewhere.
_through_host: Callable[..., tuple] | None = None


def through_host(call: Callable[..., tuple] | None) -> None:
    """Make every request of a URL binding with credentials through `call(alias, method, url, data, headers,
    timeout)`, answered by HostCurl.exchange in the process that holds the secrets (a sandbox's host)."""
    global _through_host
    _through_host = call


@dataclass(frozen=True)
class CurlResponse:
    status: int
    headers: dict[str, str]
    body: Any  # decoded JSON when the response is JSON, else text (or bytes when it is not UTF-8)


class CurlClient:
    def __init__(self, context: CallContext, bindings: list[UrlBinding], max_response_bytes: int,
                 secrets: dict[str, str] | None = None):
        self.context = context  # the call in flight: how much of its execution_timeout is left
        self.bindings = {id(b): b for b in bindings}
        self._secrets = dict(secrets or {})  # alias -> password or token (url_bindings); never on a UrlBinding
        self.max_response_bytes = max_response_bytes
        self.ops: Counter[str] = Counter()  # curl_success_count, ... taken by the worker
        self._ops_lock = threading.Lock()  # calls of a function with concurrency > 1 count from several threads
        self._openers: dict[tuple[int, bool], urllib.request.OpenerDirector] = {}
        self._kept = _KeptConnections()
        self._origins: dict[int, tuple[int, str, int | None, bool]] = {}  # binding -> its URL's prefix, host, port
        # One cookie jar per binding that allows cookies, kept for the runner's life (Couchbase's session).
        self.cookies = {id(b): http.cookiejar.CookieJar() for b in bindings if b.allow_cookies}

    def __call__(self, method: str, binding: Any, request: dict | None = None) -> CurlResponse:
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise CurlError(f"curl method {method!r} is not one of {', '.join(METHODS)}")
        method = method.upper()
        if not isinstance(binding, UrlBinding) or id(binding) not in self.bindings:
            self._count("curl_unbound_count")
            raise CurlError(
                f"curl target {binding!r} is not a URL binding of this function; add it to 'url_bindings' in "
                "the definition and pass the binding's alias, for example curl('GET', api, {'path': '/x'})"
            )
        request = request or {}
        if not isinstance(request, dict):
            raise CurlError("curl request must be a dict with optional path, params, headers and body")
        url = _join(binding, request.get("path", ""))
        params = request.get("params")
        if params:
            url += ("&" if "?" in url else "?") + _query(params)
        headers = {str(k): str(v) for k, v in (request.get("headers") or {}).items()}
        body = request.get("body")
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, bytes):
            data = body
        elif isinstance(body, str):
            data = body.encode()
            headers.setdefault("Content-Type", "text/plain; charset=utf-8")
        else:
            data = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
        # The call counts against execution_timeout: it may take what is left of it, less a margin so the
        # handler sees a CurlError before the worker's watchdog abandons the whole call.
        call = self.context.here()  # the call of this thread (a worker's pool thread has its own)
        left = call.remaining_s()
        left = left - min(0.2, left / 4)
        self._count(f"curl_{method.lower()}_count")
        try:
            status, raw_headers, payload = self._exchange(binding, method, url, data, headers, max(0.05, left))
        except TimeoutError:
            self._count("curl_timeout_count")
            raise CurlError(f"curl {method} {url} timed out (execution_timeout {call.timeout_s}s)") from None
        except CurlError:
            self._count("curl_failure_count")
            raise
        except (urllib.error.URLError, OSError) as exc:
            self._count("curl_failure_count")
            reason = getattr(exc, "reason", exc)
            raise CurlError(f"curl {method} {url} failed: {reason}") from None
        self._count("curl_success_count" if status < 400 else "curl_non_2xx_count")
        return CurlResponse(status, raw_headers, _decode(payload, raw_headers))

    def _exchange(self, binding: UrlBinding, method: str, url: str, data: bytes | None, headers: dict[str, str],
                  timeout: float) -> tuple[int, dict[str, str], bytes]:
        """The request with the binding's credentials added: (status, headers, body). In a sandboxed child, a
        binding with credentials is asked of the host instead, which holds them (HostCurl)."""
        if binding.auth != "none" and _through_host is not None:
            hosted = _through_host(binding.alias, method, url, data, headers, timeout)
            if hosted[0] == "ok":
                return int(hosted[1]), dict(hosted[2]), bytes(hosted[3])
            if hosted[0] == "timeout":
                raise TimeoutError(hosted[1])
            if hosted[0] == "failed":
                raise OSError(hosted[1])
            raise CurlError(str(hosted[1]))
        secret = self._secrets.get(binding.alias, "")
        if binding.auth == "basic":
            token = base64.b64encode(f"{binding.username}:{secret}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        elif binding.auth == "bearer":
            headers["Authorization"] = f"Bearer {secret}"
        # Kept-alive connections for a binding without digest auth or cookies (those go through urllib's
        # handlers); a redirect is followed by urllib too.
        try:
            answer = None
            if binding.auth != "digest" and id(binding) not in self.cookies:
                answer = self._kept_alive(method, url, data, headers, binding, timeout)
            if answer is not None:
                return answer
            opener = self._opener(binding, url.startswith("https:"))
            req = urllib.request.Request(url, data=data, method=method, headers=headers)
            with opener.open(req, timeout=timeout) as resp:  # noqa: S310 - bound URL
                return resp.status, dict(resp.headers.items()), self._read(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers.items()), self._read(exc)

    def _kept_alive(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str], binding: UrlBinding, timeout: float
    ) -> tuple[int, dict[str, str], bytes] | None:
        """The request on a connection this thread keeps open to the host (urllib opens and closes one per
        request: ~3x the CPU); None for a redirect, left to urllib. A kept connection the server has closed
        meanwhile is replaced once (curl is at least once: a request may reach the server again)."""
        origin = self._origins.get(id(binding))
        if origin is None:  # the binding's scheme and host, split once: a call only adds a path and a query
            parts = urllib.parse.urlsplit(binding.url)
            origin = self._origins[id(binding)] = (
                len(parts.scheme) + 3 + len(parts.netloc), parts.hostname or "", parts.port, parts.scheme == "https"
            )
        prefix, host, port, https = origin
        key = (host, port, https, binding.verify_tls)
        target = url[prefix:].partition("#")[0] or "/"
        kept = self._kept.connections
        for _ in range(2):
            conn = kept.pop(key, None)
            reused = conn is not None
            if conn is None:
                conn = HttpConnection(host, port, timeout, self._tls(binding) if https else None)
            try:
                status, answer, payload, keep = conn.request(method, target, headers, data, timeout,
                                                             self.max_response_bytes)
            except (BrokenPipeError, ConnectionResetError):  # ClosedBeforeAnswer is one
                conn.close()
                if reused:
                    continue  # the server closed it while it was kept
                raise
            except BaseException:
                conn.close()
                raise
            if keep:
                kept[key] = conn
            else:
                conn.close()
            return None if status in (301, 302, 303, 307, 308) else (status, answer, payload)
        raise ConnectionResetError("the server closed the connection twice")

    def _tls(self, binding: UrlBinding) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if not binding.verify_tls:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def _opener(self, binding: UrlBinding, https: bool) -> urllib.request.OpenerDirector:
        """The binding's opener, made once (building one costs ~0.25 ms, a TLS context more): its handlers
        keep no state between requests, but digest auth's counts its challenges, so that one is per call."""
        key = (id(binding), https)
        opener = self._openers.get(key)
        if opener is not None:
            return opener
        context = self._tls(binding) if https else None
        handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPSHandler(context=context)]
        if binding.auth == "digest":  # answers the server's challenge (one more round trip, as curl does)
            passwords = urllib.request.HTTPPasswordMgrWithDefaultRealm()
            passwords.add_password(None, binding.url, binding.username, self._secrets.get(binding.alias, ""))
            handlers.append(urllib.request.HTTPDigestAuthHandler(passwords))
        if id(binding) in self.cookies:
            handlers.append(urllib.request.HTTPCookieProcessor(self.cookies[id(binding)]))
        opener = urllib.request.build_opener(*handlers)
        if binding.auth != "digest":
            self._openers[key] = opener
        return opener

    def _count(self, name: str) -> None:
        with self._ops_lock:
            self.ops[name] += 1

    def _read(self, resp: Any) -> bytes:
        payload = resp.read(self.max_response_bytes + 1)
        if len(payload) > self.max_response_bytes:
            raise CurlError(
                f"curl response is larger than curl_max_response_bytes ({self.max_response_bytes}); "
                "ask for less or raise the setting"
            )
        return payload


class HostCurl:
    """The host's side of `through_host`: a sandboxed function's requests of its URL bindings with
    credentials, made here, where the secrets are (the definition as stored), and only to the binding's own
    URL. Answers are plain values for the sandbox's line: ("ok", status, headers, body), ("timeout", why),
    ("failed", why) or ("error", why)."""

    def __init__(self, defined: Any, max_response_bytes: int, timeout_s: float):
        bindings, secrets = url_bindings(defined)
        self.timeout_s = timeout_s
        self.by_alias = {b.alias: b for b in bindings if b.auth != "none"}
        self.client = CurlClient(CallContext(timeout_s), bindings, max_response_bytes, secrets)

    def exchange(self, alias: Any, method: Any, url: Any, data: Any, headers: Any, timeout: Any) -> tuple:
        binding = self.by_alias.get(alias) if isinstance(alias, str) else None
        if binding is None or method not in METHODS or not isinstance(url, str) or not _within(binding, url):
            return ("error", f"curl through URL binding {alias!r} may only call its own URL")
        if not isinstance(headers, dict) or not isinstance(data, bytes | None) or not isinstance(timeout, int | float):
            return ("error", "curl request is not one the sandbox's curl makes")
        try:
            status, answer, payload = self.client._exchange(
                binding, method, url, data, {str(k): str(v) for k, v in headers.items()},
                min(max(0.05, float(timeout)), self.timeout_s))
        except TimeoutError as exc:
            return ("timeout", str(exc))
        except CurlError as exc:
            return ("error", str(exc))
        except (urllib.error.URLError, OSError) as exc:
            return ("failed", str(getattr(exc, "reason", exc)))
        return ("ok", status, answer, payload)


def _within(binding: UrlBinding, url: str) -> bool:
    """Whether `url` is the binding's URL or under it, as _join makes them (no `..`, same scheme and host)."""
    if url == binding.url:
        return True
    base = binding.url.rstrip("/")
    if not (url.startswith(base + "/") or url.startswith(binding.url + "?")):
        return False
    parts, own = urllib.parse.urlsplit(url), urllib.parse.urlsplit(binding.url)
    return (parts.scheme, parts.netloc) == (own.scheme, own.netloc) and ".." not in parts.path.split("/")


class _KeptConnections(threading.local):
    """Per thread (each of a worker's pool threads runs calls of its own): (host, https, verify) -> connection."""

    def __init__(self) -> None:
        self.connections: dict[tuple[str, int | None, bool, bool], HttpConnection] = {}


def _join(binding: UrlBinding, path: Any) -> str:
    if not isinstance(path, str):
        raise CurlError(f"curl path {path!r} is not a string")
    parsed = urllib.parse.urlsplit(path)
    segments = path.split("?")[0].split("/")
    if parsed.scheme or parsed.netloc or path.startswith("//") or ".." in segments:
        raise CurlError(
            f"curl path {path!r} leaves URL binding '{binding.alias}' ({binding.url}); pass a path relative to it"
        )
    if not path:
        return binding.url
    return binding.url.rstrip("/") + "/" + path.lstrip("/")


_PLAIN = re.compile(r"[A-Za-z0-9_.~-]*").fullmatch  # what quote_plus leaves as it is


def _query(params: Any) -> str:
    """urllib.parse.urlencode(params), with the quoting skipped for the plain keys and values that need
    none (a tenth of a concurrent I/O-bound call's CPU went to quoting ids and numbers)."""
    if not isinstance(params, dict):
        return urllib.parse.urlencode(params)
    return "&".join(f"{_quoted(k)}={_quoted(v)}" for k, v in params.items())


# quote_plus of one ASCII character, as a str.translate table: a document id such as "order::17" is quoted
# in one C call instead of quote_plus's encode and per-byte join.
_ASCII_QUOTED = {c: ("+" if c == 32 else f"%{c:02X}") for c in range(128) if not _PLAIN(chr(c))}


def _quoted(part: Any) -> str:
    if type(part) is str:
        if _PLAIN(part):
            return part
        if part.isascii():
            return part.translate(_ASCII_QUOTED)
        return urllib.parse.quote_plus(part)
    if type(part) is int:
        return str(part)
    return urllib.parse.quote_plus(part if isinstance(part, (str, bytes)) else str(part))


def _decode(payload: bytes, headers: dict[str, str]) -> Any:
    kind = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        return payload
    if "json" in kind:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text
