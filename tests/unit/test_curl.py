"""curl() against a real HTTP server on 127.0.0.1: URL bindings only, auth, JSON decoding, the response
size limit, execution_timeout, and calls being at least once (a retried handler calls again)."""

from __future__ import annotations

import hashlib
import json
import re
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store


class Recorder(BaseHTTPRequestHandler):
    calls: list[dict] = []

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        Recorder.calls.append(
            {
                "method": self.command,
                "path": self.path,
                "auth": self.headers.get("Authorization"),
                "body": body,
            }
        )
        if self.path.startswith("/v1/big"):
            payload, kind = b"x" * 5000, "text/plain"
        elif self.path.startswith("/v1/slow"):
            import time

            time.sleep(2)
            payload, kind = b"late", "text/plain"
        elif self.path.startswith("/v1/missing"):
            self.send_response(404)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"nope")
            return
        else:
            payload, kind = json.dumps({"echo": self.path, "got": body}).encode(), "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _reply

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the execution_timeout test)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    Recorder.calls = []
    with serve_http(Recorder) as httpd:
        yield url_of(httpd)


HANDLER = """
def on_update(doc, meta):
    out = {}
    r = curl("POST", api, {"path": "/items", "params": {"id": meta.id}, "body": {"n": doc["n"]}})
    out["post"] = [r.status, r.body]
    out["missing"] = curl("GET", api, {"path": "/missing"}).status
    for name, attempt in {
        "unbound": lambda: curl("GET", "http://127.0.0.1:1/", {}),
        "escape": lambda: curl("GET", api, {"path": "http://example.com/"}),
        "dotdot": lambda: curl("GET", api, {"path": "/../admin"}),
        "big": lambda: curl("GET", api, {"path": "/big"}),
        "method": lambda: curl("FETCH", api),
    }.items():
        try:
            attempt()
        except Exception as exc:
            out[name] = type(exc).__name__ + ": " + str(exc)
    dst[meta.id] = out
"""

RETRIED = """
state = {"attempts": 0}

def on_update(doc, meta):
    curl("POST", api, {"path": "/items", "body": {"id": meta.id}})
    state["attempts"] += 1
    if state["attempts"] == 1:
        dst.upsert("marker", {})  # discarded with the failed attempt
        raise RuntimeError("fail after calling out")
"""


def definition(url: str, **extra) -> FunctionDefinition:
    return FunctionDefinition.from_dict(
        {
            "name": "fn_curl",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
            "url_bindings": [{"alias": "api", "url": url + "/v1", "auth": "bearer", "token": "t0k"}],
            "curl_max_response_bytes": 1000,
            **extra,
        }
    )


def test_curl_reaches_only_bound_urls_and_decodes_json(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, definition(server), HANDLER)
    source.upsert("a", {"n": 1})
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    out = LocalBucket.open(data_dir, "dst").get("a")
    assert out["post"] == [200, {"echo": "/v1/items?id=a", "got": '{"n": 1}'}]
    assert out["missing"] == 404
    assert "is not a URL binding of this function" in out["unbound"]
    assert "leaves URL binding 'api'" in out["escape"] and "leaves URL binding 'api'" in out["dotdot"]
    assert "larger than curl_max_response_bytes (1000)" in out["big"]
    assert "not one of GET" in out["method"]
    assert all(v.startswith("CurlError: ") for k, v in out.items() if k not in ("post", "missing"))
    assert Recorder.calls[0]["auth"] == "Bearer t0k"
    assert not any(c["path"].startswith("/admin") for c in Recorder.calls)  # never left the binding
    counters = open_store(data_dir).counters("fn_curl")
    assert (
        counters["curl_success_count"],
        counters["curl_non_2xx_count"],
        counters["curl_failure_count"],
    ) == (1, 1, 1)


def test_curl_is_at_least_once_a_retried_handler_calls_again(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    deploy_function(data_dir, definition(server, retries=1), RETRIED)
    source.upsert("b", {"n": 2})
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    posts = [c for c in Recorder.calls if c["method"] == "POST"]
    assert len(posts) == 2  # the first attempt failed after its call; the retry called again
    assert LocalBucket.open(data_dir, "dst").get("marker") is None


def test_curl_honours_execution_timeout(data_dir, server):
    source = LocalBucket.create(data_dir, "src")
    handler = """
def on_update(doc, meta):
    try:
        curl("GET", api, {"path": "/slow"})
        dst[meta.id] = {"ok": True}
    except Exception as exc:
        dst[meta.id] = {"error": str(exc)}
"""
    deploy_function(data_dir, definition(server, execution_timeout="500ms"), handler)
    source.upsert("s", {"n": 1})
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    got = LocalBucket.open(data_dir, "dst").get("s")
    store = open_store(data_dir)
    # Either the call timed out inside the handler, or the watchdog abandoned the handler: never a hang.
    assert (got is not None and "timed out" in got["error"]) or store.dlq_rows("fn_curl")[
        0
    ].reason == "timeout"


def test_bad_url_bindings_are_configuration_errors():
    with pytest.raises(ConfigError, match="has url 'ftp://x'"):
        FunctionDefinition.from_dict(
            {"name": "f", "source_bucket": "src", "url_bindings": [{"alias": "a", "url": "ftp://x"}]}
        )
    with pytest.raises(ConfigError, match="auth 'ntlm'"):
        FunctionDefinition.from_dict(
            {
                "name": "f",
                "source_bucket": "src",
                "url_bindings": [{"alias": "a", "url": "http://x", "auth": "ntlm"}],
            }
        )
    with pytest.raises(ConfigError, match="allow_cookies of url binding 'a' .* must be true or false"):
        FunctionDefinition.from_dict(
            {
                "name": "f",
                "source_bucket": "src",
                "url_bindings": [{"alias": "a", "url": "http://x", "allow_cookies": "yes"}],
            }
        )


class DigestAndCookies(BaseHTTPRequestHandler):
    """/digest answers only a correct RFC 7616 (MD5, qop=auth) response to its challenge; /cookie sets a
    session cookie and echoes the Cookie header it got."""

    REALM, NONCE, USER, PASSWORD = "api", "n0nce", "ada", "s3cret"

    def do_GET(self) -> None:
        if self.path.startswith("/v1/digest"):
            fields = dict(
                re.findall(r'(\w+)="?([^",]*)"?', self.headers.get("Authorization", "")[len("Digest ") :])
            )

            def md5(text: str) -> str:
                return hashlib.md5(text.encode()).hexdigest()  # noqa: S324 - the digest scheme's hash

            ha1 = md5(f"{self.USER}:{self.REALM}:{self.PASSWORD}")
            expected = md5(
                f"{ha1}:{self.NONCE}:{fields.get('nc')}:{fields.get('cnonce')}:auth:"
                f"{md5('GET:' + fields.get('uri', ''))}"
            )
            if fields.get("response") != expected:
                self.send_response(401)
                self.send_header(
                    "WWW-Authenticate",
                    f'Digest realm="{self.REALM}", nonce="{self.NONCE}", qop="auth", algorithm=MD5',
                )
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            payload = json.dumps({"user": fields.get("username")}).encode()
        else:
            payload = json.dumps({"cookie": self.headers.get("Cookie")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "session=s1; Path=/")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


def test_digest_auth_and_cookies_as_couchbase_url_bindings_have_them(data_dir):
    with serve_http(DigestAndCookies) as httpd:
        url = url_of(httpd, "/v1")
        source = LocalBucket.create(data_dir, "src")
        defn = FunctionDefinition.from_dict(
            {
                "name": "fn_curl",
                "source_bucket": "src",
                "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
                "url_bindings": [
                    {
                        "alias": "secured",
                        "url": url,
                        "auth": "digest",
                        "username": "ada",
                        "password": "s3cret",
                    },
                    {"alias": "wrong", "url": url, "auth": "digest", "username": "ada", "password": "nope"},
                    {"alias": "session", "url": url, "allow_cookies": True},
                    {"alias": "plain", "url": url},
                ],
            }
        )
        handler = """
def on_update(doc, meta):
    dst[meta.id] = {
        "digest": [curl("GET", secured, {"path": "/digest"}).body, curl("GET", wrong, {"path": "/digest"}).status],
        "session": [curl("GET", session, {"path": "/cookie"}).body["cookie"],
                    curl("GET", session, {"path": "/cookie"}).body["cookie"]],
        "plain": [curl("GET", plain, {"path": "/cookie"}).body["cookie"],
                  curl("GET", plain, {"path": "/cookie"}).body["cookie"]],
    }
"""  # noqa: E501
        deploy_function(data_dir, defn, handler)
        source.upsert("a", {"n": 1})
        EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    got = LocalBucket.open(data_dir, "dst").get("a")
    assert got["digest"] == [{"user": "ada"}, 401]
    assert got["session"] == [None, "session=s1"]  # the cookie set by the first call goes back on the second
    assert got["plain"] == [None, None]  # cookies are not kept unless the binding allows them
