"""Saving a function checks its handler without running any of it (eventing.execution.static_check), and
the host side of a sandboxed function's URL binding requests (eventing.execution.curl.HostCurl, through
ScopedService): only bindings with credentials, only to their own URL, with the secret added there; the
definition the sandboxed process gets has its secrets masked."""

from __future__ import annotations

import base64
from http.server import BaseHTTPRequestHandler

import pytest

from eventing.control import lifecycle
from eventing.core.definition import FunctionDefinition
from eventing.errors import ConfigError, HandlerLoadError
from eventing.execution.static_check import check_handler_source
from eventing.storage.bucket import LocalBucket
from eventing.storage.remote import DataService
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers.sandbox.scope import ScopedService
from metadata.factory import open_store


@pytest.mark.parametrize(
    "source, message",
    [
        ("def on_update(doc, meta)\n    pass\n", "syntax error at line 1"),
        ("return 1\ndef on_update(doc, meta): pass\n", "syntax error at line 1: 'return' outside function"),
        ("x = 1\n", "defines neither on_update(doc, meta) nor on_delete(meta, options)"),
        ("def helper():\n    def on_update(doc, meta): pass\n", "defines neither"),
        ("class H:\n    def on_update(self, doc, meta): pass\n", "defines neither"),
        ("def on_update(doc):\n    pass\n", "on_update(doc) cannot be called as on_update(doc, meta)"),
        (
            "def on_update(doc, meta, xattrs, extra):\n    pass\n",
            "on_update(doc, meta, xattrs, extra) cannot be called",
        ),
        ("def on_update(doc, meta, *, flag):\n    pass\n", "cannot be called as on_update(doc, meta)"),
        ("on_update = lambda doc: None\n", "on_update(doc) cannot be called"),
        ("on_delete = 5\n", "on_delete is a int, not a function"),
        (
            "def on_update(doc, meta): pass\ndef on_deploy(): pass\n",
            "on_deploy() cannot be called as on_deploy(action)",
        ),
        ("x = (" * 200 + "1" + ")" * 200 + "\ndef on_update(doc, meta): pass\n", "handler of function 'fn'"),
        ("def on_update(doc, meta):\n    pass\n\0", "handler of function 'fn'"),
    ],
)
def test_a_handler_that_cannot_load_is_refused_without_running_it(source, message):
    with pytest.raises(
        HandlerLoadError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")
    ):
        check_handler_source("fn", source)


@pytest.mark.parametrize(
    "source",
    [
        "def on_update(doc, meta):\n    pass\n",
        "async def on_delete(meta, options=None):\n    pass\n",
        "def on_update(doc, meta, extra=None, *rest):\n    pass\n",
        "def on_update(*args):\n    pass\n",
        "from helpers import *\n",  # may define anything: the import at deploy tells
        "from helpers import on_update\n",
        "import functools\n\n@functools.cache\ndef on_update(doc):\n    pass\n",  # a decorator may change it
        "if True:\n    def on_update(doc, meta): pass\nelse:\n    def on_update(doc): pass\n",  # bound twice
        "try:\n    import fast\nexcept ImportError:\n    fast = None\n\ndef on_delete(meta, options):\n    "
        "pass\n",
    ],
)
def test_what_only_the_import_can_tell_is_left_to_deploy(source):
    check_handler_source("fn", source)


def test_a_windowed_function_needs_no_entry_point():
    check_handler_source("fn", "", windowed=True)
    check_handler_source("fn", "", windowed=True, language="javascript")


def test_javascript_is_compiled_not_run():
    check_handler_source("fn", "while (true) {}\nfunction OnUpdate(doc, meta) {}\n", language="javascript")
    with pytest.raises(HandlerLoadError, match="syntax error at line 2"):
        check_handler_source("fn", "function OnUpdate(doc, meta) {\n  var x = ;\n}\n", language="javascript")
    with pytest.raises(HandlerLoadError, match="defines neither OnUpdate"):
        check_handler_source("fn", "function onupdate(doc, meta) {}\n// OnUpdate\n", language="javascript")
    with pytest.raises(HandlerLoadError, match="SQL"):
        check_handler_source(
            "fn", "function OnUpdate(doc, meta) { N1QL('SELECT 1'); }\n", language="javascript"
        )


def test_saving_runs_no_top_level_code_and_deploy_does(data_dir, tmp_path):
    LocalBucket.create(data_dir, "src").close()
    marker = tmp_path / "marker"
    defn = FunctionDefinition.from_dict(
        {"name": "fn", "source_bucket": "src", "constants": {"MARKER": str(marker)}}
    )
    source = "open(MARKER, 'w').close()\n\ndef on_update(doc, meta):\n    pass\n"
    lifecycle.save_function(data_dir, defn, source)
    assert not marker.exists()
    lifecycle.deploy(data_dir, "fn")  # the local CLI's deploy: trusted, imported here
    assert marker.exists()


# -- the host's side of a sandboxed function's curl ---------------------------------------------------------


class Auth(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:
        Auth.seen.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def service(data_dir):
    Auth.seen = []
    LocalBucket.create(data_dir, "src").close()
    with serve_http(Auth) as httpd:
        url = url_of(httpd)
        defn = FunctionDefinition.from_dict(
            {
                "name": "fn",
                "source_bucket": "src",
                "url_bindings": [
                    {
                        "alias": "api",
                        "url": url + "/v1",
                        "auth": "basic",
                        "username": "u",
                        "password": "pw-0451",
                    },
                    {"alias": "open", "url": url + "/v2"},
                ],
            }
        )
        with open_store(data_dir) as store:
            store.put_function("fn", defn.to_dict(), "def on_update(doc, meta):\n    pass\n")
        scoped = ScopedService("fn", defn, DataService(data_dir))
        yield scoped, url
        scoped.backend.close()


def test_the_host_adds_the_secret_and_calls_only_the_bindings_own_url(service):
    scoped, url = service
    answer = scoped.call("curl", "api", "GET", url + "/v1/items?id=1", None, {}, 5.0)
    assert answer[:2] == ("ok", 200) and answer[3] == b"ok"
    assert Auth.seen == ["Basic " + base64.b64encode(b"u:pw-0451").decode()]
    for elsewhere in (
        "http://127.0.0.1:1/v1",
        url + "/v2/x",
        url + "/v1/../admin",
        url + "/v10",
        url.replace("127.0.0.1", "localhost") + "/v1/x",
    ):
        assert scoped.call("curl", "api", "GET", elsewhere, None, {}, 5.0)[0] == "error", elsewhere
    assert Auth.seen == ["Basic " + base64.b64encode(b"u:pw-0451").decode()]  # none of those was sent
    for alias in ("open", "nope"):  # a binding without credentials is the child's own to call
        with pytest.raises(ConfigError, match="runs sandboxed and may not call curl"):
            scoped.call("curl", alias, "GET", url + "/v2", None, {}, 5.0)


def test_the_sandboxed_process_gets_its_definition_without_secrets(service):
    scoped, _ = service
    record = scoped.call("meta", "get_function", ("fn",), {})
    api = next(u for u in record.definition["url_bindings"] if u["alias"] == "api")
    assert api["password"] == "*****" and "pw-0451" not in repr(record)


@pytest.mark.parametrize(
    "source, language, none",
    [
        ('"""Window-only: the window does the work."""\n', "python", True),
        ("# a comment\n\npass\n...\n", "python", True),
        ("", "python", True),
        ("import math\n", "python", False),
        ('"""doc"""\nx = f"{open(\'/etc/passwd\').read()}"\n', "python", False),
        ('f"{print(1)}"\n', "python", False),  # an f-string runs code
        ("def helper():\n    pass\n", "python", False),
        ("def on_update(doc, meta)\n", "python", False),  # does not parse: the sandboxed import says why
        ("// window-only\n/* nothing else */\n", "javascript", True),
        ('"use strict";\n', "javascript", False),
        ("//x\u2028function OnUpdate(doc, meta) {}\n", "javascript", False),  # a line separator ends it
        ("//x\rthrow new Error('ran')\n", "javascript", False),
        ("//x\u2029;\n", "javascript", False),
    ],
)
def test_runs_no_code_only_for_a_handler_whose_import_runs_nothing(source, language, none):
    from eventing.execution.static_check import runs_no_code

    assert runs_no_code(source, language) is none
