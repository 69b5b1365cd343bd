"""`curl(method, binding, request)` for handlers: HTTP calls to the URL bindings of a function only.

HTTP calls are side effects outside the system: they are **at least once**. A handler that is retried,
replayed from the dead-letter queue, or run again after a crash before its checkpoint calls the URL again
(binding writes are exactly once; a remote server is not). So every request carries the call's
idempotency key (eventing.core.idempotency) in an `Idempotency-Key` header, the same at every attempt, and
a server that honours it applies the request once.

A binding's `rate_limit` and `max_in_flight` are waited for before a request starts (eventing.execution.
limits), and a 429 or 503 with Retry-After pauses the binding's requests and is honoured before the call's
next attempt (eventing.core.retry).
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

from eventing.core.counters import CURL_THROTTLED, CURL_THROTTLED_MS
from eventing.core.idempotency import HEADER, request_key
from eventing.errors import CurlError
from eventing.execution.context import CallContext
from eventing.execution.http_connection import HttpConnection
from eventing.execution.limits import Limits, retry_after_s

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
    allow_cookies: bool = (
        False  # keep the cookies the server sets and send them back (Couchbase's allow_cookies)
    )
    idempotency_header: str = HEADER  # the header the call's idempotency key goes in; "": none
    rate_limit: tuple[float, float] | None = (
        None  # (requests per second, burst) shared by the function's workers
    )
    max_in_flight: int | None = None  # requests at once, shared the same way

    def __repr__(self) -> str:
        return f"<url binding {self.alias} -> {self.url}>"

    @property
    def limited(self) -> bool:
        return self.rate_limit is not None or self.max_in_flight is not None


def url_bindings(defined: Any) -> tuple[list[UrlBinding], dict[str, str]]:
    """A definition's url_bindings as the handler's objects, and the secret of each (alias -> the password
    of basic and digest auth, the token of bearer), which only the CurlClient keeps."""
    bindings, secrets = [], {}
    for u in defined:
        fields = {k: v for k, v in u.items() if k not in ("password", "token")}
        if fields.get("idempotency_header") is False:
            fields["idempotency_header"] = ""
        rate = fields.get("rate_limit")
        if isinstance(rate, dict):
            fields["rate_limit"] = (float(rate["per_second"]), float(rate.get("burst", 1)))
        binding = UrlBinding(**fields)
        bindings.append(binding)
        secret = u.get("token" if binding.auth == "bearer" else "password")
        if binding.auth != "none" and secret:
            secrets[binding.alias] = str(secret)
    return bindings, secrets


# In a sandboxed child (eventing.workers.sandbox.child): the call that has the host make a request of a URL
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
    def __init__(
        self,
        context: CallContext,
        bindings: list[UrlBinding],
        max_response_bytes: int,
        secrets: dict[str, str] | None = None,
        *,
        keys: Callable[[CallContext], str | None] | None = None,
        limits: Limits | None = None,
    ):
        self.context = context  # the call in flight: how much of its execution_timeout is left
        self.keys = keys  # the idempotency key of a call (the runner's), None: requests carry none
        self.limits = limits  # the bindings' rate_limit and max_in_flight (None: not applied here)
        self.bindings = {id(b): b for b in bindings}
        self._secrets = dict(
            secrets or {}
        )  # alias -> password or token (url_bindings); never on a UrlBinding
        self.max_response_bytes = max_response_bytes
        self.ops: Counter[str] = Counter()  # curl_success_count, ... taken by the worker
        self._ops_lock = (
            threading.Lock()
        )  # calls of a function with concurrency > 1 count from several threads
        self._openers: dict[tuple[int, bool], urllib.request.OpenerDirector] = {}
        self._kept = _KeptConnections()
        self._origins: dict[
            int, tuple[int, str, int | None, bool]
        ] = {}  # binding -> its URL's prefix, host, port
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
        call = self.context.here()  # the call of this thread (a worker's pool thread has its own)
        if binding.idempotency_header and self.keys is not None and call.active:
            key = self.keys(call)
            lower = binding.idempotency_header.lower()
            if key is not None and not any(k.lower() == lower for k in headers):
                sent = call.attempt().sent
                sent[key] = n = sent.get(key, 0) + 1
                headers[binding.idempotency_header] = request_key(key, n)
        self._count(f"curl_{method.lower()}_count")
        try:
            status, raw_headers, payload = self._exchange(binding, method, url, data, headers, call)
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
        if call.active:  # what the retry policy looks at if the call fails (eventing.core.retry)
            seen = call.attempt()
            seen.statuses.add(status)
            if status in (429, 503):
                seen.retry_after = max(seen.retry_after, retry_after_s(raw_headers))
        return CurlResponse(status, raw_headers, _decode(payload, raw_headers))

    def _exchange(
        self,
        binding: UrlBinding,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str],
        call: CallContext,
    ) -> tuple[int, dict[str, str], bytes]:
        """The request, once the binding's limits let it start, with its credentials added: (status, headers,
        body). It may take what is left of the call's execution_timeout (time waited for the limits is not
        counted), less a margin so the handler sees a CurlError before the worker's watchdog abandons the
        whole call. In a sandboxed child, a binding with credentials or limits is asked of the host instead,
        which holds the secrets and the limits' files (HostCurl)."""
        if (binding.auth != "none" or binding.limited) and _through_host is not None:
            deadline, left = call.deadline, _left(call)
            if call.active and binding.limited:
                call.deadline = deadline + 86_400.0  # the host waits for the limits: not this call's time
            try:
                hosted = _through_host(binding.alias, method, url, data, headers, left)
            finally:
                if call.active and binding.limited:
                    call.deadline = deadline
            if hosted[0] == "ok":
                if len(hosted) > 4:
                    self._waited(call, float(hosted[4]))
                return int(hosted[1]), dict(hosted[2]), bytes(hosted[3])
            if hosted[0] == "timeout":
                raise TimeoutError(hosted[1])
            if hosted[0] == "failed":
                raise OSError(hosted[1])
            raise CurlError(str(hosted[1]))
        limit = self.limits.of(binding) if self.limits is not None and binding.limited else None
        if limit is None:
            return self._send(binding, method, url, data, headers, _left(call))
        waited, slot = limit.acquire(call.extend)
        try:
            self._waited(call, waited, counted_in_deadline=True)
            answer = self._send(binding, method, url, data, headers, _left(call))
        finally:
            limit.release(slot)
        if answer[0] in (429, 503):
            limit.pause(retry_after_s(answer[1]))
        return answer

    def _waited(self, call: CallContext, seconds: float, counted_in_deadline: bool = False) -> None:
        """A request waited `seconds` for its binding's limits: counted (backpressure), and not the call's
        time (a wait in this process moved the deadline as it went; one in a sandbox's host moves it now)."""
        if seconds <= 0.0005:
            return
        if not counted_in_deadline:
            call.extend(seconds)
        with self._ops_lock:
            self.ops[CURL_THROTTLED] += 1
            self.ops[CURL_THROTTLED_MS] += round(seconds * 1000)

    def _send(
        self,
        binding: UrlBinding,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str],
        timeout: float,
    ) -> tuple[int, dict[str, str], bytes]:
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
        self,
        method: str,
        url: str,
        data: bytes | None,
        headers: dict[str, str],
        binding: UrlBinding,
        timeout: float,
    ) -> tuple[int, dict[str, str], bytes] | None:
        """The request on a connection this thread keeps open to the host (urllib opens and closes one per
        request: ~3x the CPU); None for a redirect, left to urllib. A kept connection the server has closed
        meanwhile is replaced once (curl is at least once: a request may reach the server again)."""
        origin = self._origins.get(id(binding))
        if origin is None:  # the binding's scheme and host, split once: a call only adds a path and a query
            parts = urllib.parse.urlsplit(binding.url)
            origin = self._origins[id(binding)] = (
                len(parts.scheme) + 3 + len(parts.netloc),
                parts.hostname or "",
                parts.port,
                parts.scheme == "https",
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
                status, answer, payload, keep = conn.request(
                    method, target, headers, data, timeout, self.max_response_bytes
                )
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

    def __init__(self, defined: Any, max_response_bytes: int, timeout_s: float, limits: Limits | None = None):
        bindings, secrets = url_bindings(defined)
        self.timeout_s = timeout_s
        self.by_alias = {b.alias: b for b in bindings if b.auth != "none" or b.limited}
        self.client = CurlClient(CallContext(timeout_s), bindings, max_response_bytes, secrets, limits=limits)

    def exchange(self, alias: Any, method: Any, url: Any, data: Any, headers: Any, timeout: Any) -> tuple:
        binding = self.by_alias.get(alias) if isinstance(alias, str) else None
        if binding is None or method not in METHODS or not isinstance(url, str) or not _within(binding, url):
            return ("error", f"curl through URL binding {alias!r} may only call its own URL")
        if (
            not isinstance(headers, dict)
            or not isinstance(data, bytes | None)
            or not isinstance(timeout, int | float)
        ):
            return ("error", "curl request is not one the sandbox's curl makes")
        call = CallContext(min(max(0.05, float(timeout)), self.timeout_s))
        call.begin(_NO_MUTATION, 0)  # the child's call, as far as its remaining time goes
        deadline = call.deadline  # moved by the time the binding's limits make the request wait
        try:
            status, answer, payload = self.client._exchange(
                binding, method, url, data, {str(k): str(v) for k, v in headers.items()}, call
            )
        except TimeoutError as exc:
            return ("timeout", str(exc))
        except CurlError as exc:
            return ("error", str(exc))
        except (urllib.error.URLError, OSError) as exc:
            return ("failed", str(getattr(exc, "reason", exc)))
        finally:
            call.active = False
        return ("ok", status, answer, payload, call.deadline - deadline)


_NO_MUTATION: Any = None


def _left(call: CallContext) -> float:
    """The time a request may take: what is left of the call's execution_timeout, less a margin."""
    left = call.remaining_s()
    return max(0.05, left - min(0.2, left / 4))


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
    """Per thread (each of a worker's pool threads runs calls of its own): (host, https, verify) ->
    connection."""

    def __init__(self) -> None:
        self.connections: dict[tuple[str, int | None, bool, bool], HttpConnection] = {}


def _join(binding: UrlBinding, path: Any) -> str:
    if not isinstance(path, str):
        raise CurlError(f"curl path {path!r} is not a string")
    parsed = urllib.parse.urlsplit(path)
    segments = path.split("?")[0].split("/")
    if parsed.scheme or parsed.netloc or path.startswith("//") or ".." in segments:
        raise CurlError(
            f"curl path {path!r} leaves URL binding '{binding.alias}' ({binding.url}); pass a path relative "
            "to it"
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
