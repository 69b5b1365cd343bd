"""What a function manager (`eventing_manage_functions[shop:sales]`) can and cannot do, as a hostile one
would try it, through the real HTTP server on 127.0.0.1 with real users (scrypt hashes in the store):

- saving a function runs none of its handler: a handler whose top-level code writes a marker file and
  reads the metadata store, saved through every endpoint that saves or imports, leaves no marker; the
  manager's deploy imports it sandboxed, where the write is refused;
- every bucket binding needs the saver's and the deployer's roles: `data_reader` / `data_writer` of its
  keyspace, or the manager's own scope (also through Couchbase's `depcfg.buckets`), at save, deploy and
  resume;
- a URL binding's stored secret never goes to an address a manager chose, and no handler sees it: the
  object a handler gets has no secret (Python and JavaScript), and a sandboxed process holds none at all
  (its curl has the host add the credentials).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest

from eventing.api import Eventing
from eventing.control.service import EventingService
from eventing.http.auth import ServerConfig
from eventing.http.function_access import deployed_by_admin
from eventing.http.server import start_in_thread
from eventing.security.users import hash_password
from eventing.testing.http_peer import serve_http, url_of
from eventing.workers.executor import InProcessExecutor
from eventing.workers.sandbox.landlock import sandbox_unavailable
from metadata.factory import SQLITE_FILE, open_store

pytestmark = pytest.mark.integration
needs_sandbox = pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable()))

ADMIN = "admin-token-0123456789abcdef"
USERS = {
    "mgr": (["eventing_manage_functions[shop:sales]"], "mgr-password-12"),
    "mgr_r": (["eventing_manage_functions[shop:sales]", "data_reader[secret]"], "mgr-r-password-12"),
}
PASSWORD, TOKEN = "s3cret-pass-0451", "t0ken-secret-9923"
SECRET_DOC = {"pw": "hunter2"}

HOSTILE = """
try:
    with open(STORE, "rb") as store, open(MARKER, "w") as marker:
        marker.write(store.read(64).hex())
except OSError:
    pass


def on_update(doc, meta):
    pass
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def site(data_dir, tmp_path):
    ev = Eventing(data_dir)
    ev.create_bucket("shop")
    for keyspace in ("shop.sales.orders", "shop.sales.out", "shop.hr.staff"):
        ev.create_collection(keyspace)
    for i in range(4):
        ev.collection("shop.sales.orders").upsert(f"o{i}", {"n": i})
    ev.create_bucket("secret")
    ev.upsert("secret", "pw", SECRET_DOC)
    with open_store(data_dir) as store:
        for name, (roles, password) in USERS.items():
            store.put_user(name, hash_password(password), roles)
    config = ServerConfig(data_dir, port=free_port(), admin_token=ADMIN)
    server = start_in_thread(config)
    yield {
        "data_dir": data_dir,
        "base": f"http://127.0.0.1:{config.port}",
        "marker": str(tmp_path / "marker"),
        "store": str(Path(data_dir) / SQLITE_FILE),
    }
    server.should_exit = True


def as_user(site, name: str | None) -> httpx.Client:
    if name is None:
        headers = {"Authorization": f"Bearer {ADMIN}"}
    else:
        creds = base64.b64encode(f"{name}:{USERS[name][1]}".encode()).decode()
        headers = {"Authorization": f"Basic {creds}"}
    return httpx.Client(base_url=site["base"], headers=headers, timeout=60)


def definition(name: str, **extra) -> dict:
    return {
        "name": name,
        "source_bucket": "shop",
        "source_scope": "sales",
        "source_collection": "orders",
        **extra,
    }


def record(site, name: str):
    with open_store(site["data_dir"]) as store:
        return store.get_function(name)


def secret_untouched(site) -> bool:
    return (
        Eventing(site["data_dir"]).get("secret", "pw") == SECRET_DOC
        and Eventing(site["data_dir"]).count("secret") == 1
    )


# -- 1. saving runs none of the handler --------------------------------------------------------------------


def test_saving_a_managers_handler_runs_none_of_it_through_any_endpoint(site):
    mgr = as_user(site, "mgr")
    constants = {"MARKER": site["marker"], "STORE": site["store"]}
    body = {**definition("fn_h", constants=constants), "handler_source": HOSTILE}
    saves = [
        ("POST", "/api/v1/functions/fn_h", json.dumps(body)),
        ("POST", "/api/v1/functions/fn_h/appcode", HOSTILE + "\n# again\n"),
        ("POST", "/api/v1/functions/fn_h/settings", json.dumps({"description": "edited"})),
        ("POST", "/api/v1/import", json.dumps([{**body, "name": "fn_h2"}])),
        ("POST", "/api/v1/functions", json.dumps([{**body, "name": "fn_h3"}])),
    ]
    for method, path, content in saves:
        r = mgr.request(method, path, content=content)
        assert r.status_code == 200, (path, r.text)
        assert not os.path.exists(site["marker"]), f"{path} ran the handler's top-level code in the server"
    for name in ("fn_h", "fn_h2", "fn_h3"):
        saved = record(site, name)
        assert "open(MARKER" in saved.source and not deployed_by_admin(saved)  # a non-admin's code, marked so
    # A handler that cannot load is still refused at save, with the line, and without running anything.
    r = mgr.post("/api/v1/functions/fn_h/appcode", content="def on_update(doc):\n    pass\n")
    assert (
        r.status_code == 400
        and "on_update(doc) cannot be called as on_update(doc, meta)" in r.json()["error"]
    )
    r = mgr.post("/api/v1/functions/fn_h/appcode", content=HOSTILE + "\ndef broken(:\n")
    assert r.status_code == 400 and "syntax error at line" in r.json()["error"]
    assert not os.path.exists(site["marker"])


def test_saving_javascript_runs_none_of_it(site):
    """A JavaScript handler whose top-level code never ends saves at once: V8 compiles it and runs nothing."""
    mgr = as_user(site, "mgr")
    source = "while (true) {}\nfunction OnUpdate(doc, meta) {}\n"
    r = httpx.post(
        site["base"] + "/api/v1/functions/fn_js",
        timeout=10,
        headers=mgr.headers,
        content=json.dumps({**definition("fn_js", language="javascript"), "handler_source": source}),
    )
    assert r.status_code == 200, r.text
    r = mgr.post("/api/v1/functions/fn_js/appcode", content="function OnUpdate(doc, meta) { var x = ; }\n")
    assert r.status_code == 400 and "syntax error at line 1" in r.json()["error"], r.text


@needs_sandbox
def test_a_managers_deploy_imports_the_handler_where_it_is_confined(site):
    mgr = as_user(site, "mgr")
    body = {
        **definition("fn_h", constants={"MARKER": site["marker"], "STORE": site["store"]}),
        "handler_source": HOSTILE,
    }
    assert mgr.post("/api/v1/functions/fn_h", content=json.dumps(body)).status_code == 200
    r = mgr.post("/api/v1/functions/fn_h/deploy")
    assert r.status_code == 200, r.text
    assert not os.path.exists(site["marker"])  # imported in a sandboxed child: the write was refused
    assert record(site, "fn_h").deployed_by["user"] == "mgr"


def test_a_managers_edit_of_an_admins_paused_function_marks_its_code_as_the_managers(site):
    """Dead letters replayed, on_deploy and the debugger run a function's current code with its deployer's
    trust: once a manager changed it, that code must not run as an admin's."""
    admin, mgr = as_user(site, None), as_user(site, "mgr")
    ok = {**definition("fn_p"), "handler_source": "def on_update(doc, meta):\n    pass\n"}
    assert admin.post("/api/v1/functions/fn_p", content=json.dumps(ok)).status_code == 200
    assert admin.post("/api/v1/functions/fn_p/deploy").status_code == 200
    assert admin.post("/api/v1/functions/fn_p/pause", params={"wait": "0"}).status_code == 200
    assert deployed_by_admin(record(site, "fn_p"))
    edited = "def on_update(doc, meta):\n    pass  # the manager's\n"
    assert mgr.post("/api/v1/functions/fn_p/appcode", content=edited).status_code == 200
    assert not deployed_by_admin(record(site, "fn_p")) and record(site, "fn_p").deployed_by["user"] == "mgr"
    # an admin's resume vouches for the code again; a refused edit (deployed) leaves the record as it was
    assert admin.post("/api/v1/functions/fn_p/resume").status_code == 200
    assert deployed_by_admin(record(site, "fn_p"))
    assert mgr.post("/api/v1/functions/fn_p/appcode", content=HOSTILE).status_code == 409
    assert deployed_by_admin(record(site, "fn_p"))


# -- 3. bindings need the saver's and the deployer's roles --------------------------------------------------


def test_every_bucket_binding_needs_a_role_of_its_keyspace(site):
    mgr, mgr_r = as_user(site, "mgr"), as_user(site, "mgr_r")
    handler = "def on_update(doc, meta):\n    out[meta.id] = {'pw': src.get('pw')}\n"

    def save(client: httpx.Client, name: str, bindings: list[dict]) -> httpx.Response:
        return client.post(
            f"/api/v1/functions/{name}",
            content=json.dumps({**definition(name, bindings=bindings), "handler_source": handler}),
        )

    own = {"alias": "out", "bucket": "shop", "scope": "sales", "collection": "out", "access": "rw"}
    steal = {"alias": "src", "bucket": "secret", "access": "rw"}
    peek = {"alias": "src", "bucket": "secret", "access": "r"}
    r = save(mgr, "fn_steal", [own, steal])
    assert r.status_code == 403, r.text
    assert r.json()["error"] == (
        "mgr may not bind secret._default._default read-write as 'src' in function 'fn_steal' "
        "(roles: eventing_manage_functions[shop:sales])"
    )
    assert (
        "data_reader[secret._default._default] and data_writer[secret._default._default]" in r.json()["fix"]
    )
    assert save(mgr, "fn_steal", [own, peek]).status_code == 403
    assert as_user(site, None).get("/api/v1/functions/fn_steal").status_code == 404  # nothing was saved
    assert save(mgr, "fn_own", [own]).status_code == 200  # its own scope: no data role needed
    assert save(mgr_r, "fn_peek", [own, peek]).status_code == 200  # data_reader[secret]: read-only binding
    assert save(mgr_r, "fn_peek", [own, steal]).status_code == 403  # read-write needs data_writer too
    other_scope = {"alias": "hr", "bucket": "shop", "scope": "hr", "collection": "staff", "access": "r"}
    assert save(mgr, "fn_hr", [own, other_scope]).status_code == 403
    assert secret_untouched(site)


def test_couchbase_depcfg_buckets_are_checked_as_well(site):
    fixture = Path(__file__).parent.parent / "unit" / "fixtures" / "couchbase_export.json"
    item = json.loads(fixture.read_text())[0]
    item["depcfg"]["curl"] = []
    item["depcfg"]["buckets"] = [
        {
            "alias": "audit",
            "bucket_name": "shop",
            "scope_name": "sales",
            "collection_name": "out",
            "access": "rw",
        },
        {
            "alias": "customers",
            "bucket_name": "secret",
            "scope_name": "_default",
            "collection_name": "_default",
            "access": "rw",
        },
    ]
    mgr = as_user(site, "mgr")
    for path in ("/api/v1/import", "/api/v1/functions", "/api/v1/functions/audit_orders"):
        r = mgr.post(path, content=json.dumps(item if path.endswith("audit_orders") else [item]))
        assert r.status_code == 403 and "bind secret._default._default read-write" in r.text, (path, r.text)
    assert as_user(site, None).get("/api/v1/functions/audit_orders").status_code == 404
    assert secret_untouched(site)


def test_deploy_and_resume_of_a_function_binding_beyond_the_managers_roles_are_refused(site):
    admin, mgr = as_user(site, None), as_user(site, "mgr")
    body = {
        **definition("fn_adm", bindings=[{"alias": "src", "bucket": "secret", "access": "rw"}]),
        "handler_source": "def on_update(doc, meta):\n    src['stolen'] = src.get('pw')\n",
    }
    assert admin.post("/api/v1/functions/fn_adm", content=json.dumps(body)).status_code == 200
    r = mgr.post("/api/v1/functions/fn_adm/deploy")
    assert r.status_code == 403 and "bind secret._default._default read-write as 'src'" in r.json()["error"]
    assert record(site, "fn_adm").state.value == "undeployed" and record(site, "fn_adm").deployed_by is None
    r = mgr.post("/api/v1/functions/fn_adm/settings", content=json.dumps({"deployment_status": True}))
    assert r.status_code == 403 and record(site, "fn_adm").state.value == "undeployed"
    assert (
        mgr.post("/api/v1/functions/fn_adm/settings", content=json.dumps({"description": "x"})).status_code
        == 403
    )
    assert admin.post("/api/v1/functions/fn_adm/deploy").status_code == 200
    assert admin.post("/api/v1/functions/fn_adm/pause", params={"wait": "0"}).status_code == 200
    r = mgr.post("/api/v1/functions/fn_adm/resume")
    assert r.status_code == 403 and record(site, "fn_adm").state.value == "paused"
    assert deployed_by_admin(record(site, "fn_adm"))
    assert secret_untouched(site)


# -- 4. URL binding secrets ---------------------------------------------------------------------------------


class Listener(BaseHTTPRequestHandler):
    """Records the Authorization header of every request, per server port."""

    seen: dict[int, list[str | None]] = {}
    lock = threading.Lock()

    def do_GET(self) -> None:
        with Listener.lock:
            Listener.seen.setdefault(self.server.server_address[1], []).append(
                self.headers.get("Authorization")
            )
        payload = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


SEES_NO_SECRET = '''
import gc
import hashlib


def holds(digests):
    """Whether a string this process holds is one of the secrets (known here by their SHA-256 only)."""
    for o in gc.get_objects():
        values = o.values() if isinstance(o, dict) else o if isinstance(o, list | tuple) else ()
        for v in values:
            if isinstance(v, str) and len(v) < 200 and hashlib.sha256(v.encode()).hexdigest() in digests:
                return True
    return False


def on_update(doc, meta):
    seen = {}
    for alias, b in (("api", api), ("tok", tok)):
        seen[alias] = {"attrs": sorted(vars(b)), "repr": repr(b), "password": getattr(b, "password", None),
                       "token": getattr(b, "token", None), "status": curl("GET", b, {"path": "/x"}).status}
    seen["held"] = holds(set(SECRET_DIGESTS))
    out[meta.id] = seen
'''


@pytest.fixture
def listeners():
    Listener.seen = {}
    with serve_http(Listener) as owner, serve_http(Listener) as thief:
        yield url_of(owner), url_of(thief), owner.server_address[1], thief.server_address[1]


def _url_function(site, owner: str, **extra) -> dict:
    url_bindings = [
        {"alias": "api", "url": owner + "/v1", "auth": "basic", "username": "svc", "password": PASSWORD},
        {"alias": "tok", "url": owner + "/v2", "auth": "bearer", "token": TOKEN},
    ]
    out = {"alias": "out", "bucket": "shop", "scope": "sales", "collection": "out", "access": "rw"}
    secrets = [
        PASSWORD,
        TOKEN,
        f"Bearer {TOKEN}",
        "Basic " + base64.b64encode(f"svc:{PASSWORD}".encode()).decode(),
    ]
    constants = {"SECRET_DIGESTS": [hashlib.sha256(s.encode()).hexdigest() for s in secrets]}
    return {
        **definition("fn_url", bindings=[out], url_bindings=url_bindings, constants=constants, **extra),
        "handler_source": SEES_NO_SECRET,
    }


def test_a_kept_secret_is_not_sent_to_an_address_a_manager_chose(site, listeners):
    owner, thief, _, _ = listeners
    admin, mgr = as_user(site, None), as_user(site, "mgr")
    assert (
        admin.post("/api/v1/functions/fn_url", content=json.dumps(_url_function(site, owner))).status_code
        == 200
    )
    shown = mgr.get("/api/v1/export", params={"name": "fn_url"}).json()[0]
    assert [u.get("password") or u.get("token") for u in shown["url_bindings"]] == ["*****", "*****"]
    stored = record(site, "fn_url").definition
    for change in ({"url": thief + "/v1"}, {"auth": "digest"}, {"verify_tls": False}):
        edited = json.loads(json.dumps(shown))
        edited["url_bindings"][0].update(change)
        r = mgr.post("/api/v1/functions/fn_url", content=json.dumps(edited))
        assert r.status_code == 400, (change, r.text)
        assert r.json()["error"].startswith(
            f"url binding 'api' of function 'fn_url' changes its {next(iter(change))}"
        )
        assert record(site, "fn_url").definition == stored  # nothing changed
    edited = json.loads(json.dumps(shown))
    edited["url_bindings"][1]["url"] = thief + "/v2"
    assert mgr.post("/api/v1/functions/fn_url", content=json.dumps(edited)).status_code == 400
    # kept while the address stays; and a manager's own new secret for its own address is its own to give
    edited = {**json.loads(json.dumps(shown)), "description": "same addresses"}
    assert mgr.post("/api/v1/functions/fn_url", content=json.dumps(edited)).status_code == 200
    assert record(site, "fn_url").definition["url_bindings"] == stored["url_bindings"]
    # an admin may move a binding and keep its secret
    moved = {**json.loads(json.dumps(shown))}
    moved["url_bindings"][0]["url"] = owner + "/v3"
    assert admin.post("/api/v1/functions/fn_url", content=json.dumps(moved)).status_code == 200
    assert record(site, "fn_url").definition["url_bindings"][0] == {
        **stored["url_bindings"][0],
        "url": owner + "/v3",
    }
    edited["url_bindings"][0].update(url=thief + "/v1", password="the-managers-own")
    assert mgr.post("/api/v1/functions/fn_url", content=json.dumps(edited)).status_code == 200
    assert record(site, "fn_url").definition["url_bindings"][0]["password"] == "the-managers-own"


def _run_and_read(site) -> dict:
    summary = EventingService(
        site["data_dir"], InProcessExecutor(), until_caught_up=True, functions=["fn_url"]
    ).run()
    assert summary.functions["fn_url"].handled == 4, summary
    return {
        k: Eventing(site["data_dir"]).collection("shop.sales.out").get(k) for k in ("o0", "o1", "o2", "o3")
    }


def _check_seen(docs: dict, listeners, *, sandboxed: bool) -> None:
    _, _, owner_port, thief_port = listeners
    expected = {"Basic " + base64.b64encode(f"svc:{PASSWORD}".encode()).decode(), f"Bearer {TOKEN}"}
    for key, seen in docs.items():
        for alias in ("api", "tok"):
            assert seen[alias]["status"] == 200, (key, seen)
            assert seen[alias]["password"] is None and seen[alias]["token"] is None
            assert "password" not in seen[alias]["attrs"] and "token" not in seen[alias]["attrs"]
            assert PASSWORD not in seen[alias]["repr"] and TOKEN not in seen[alias]["repr"]
        if sandboxed:
            assert seen["held"] is False, f"{key}: the sandboxed process holds a URL binding secret"
    assert set(Listener.seen[owner_port]) == expected  # the credentials were added to every request
    assert len(Listener.seen[owner_port]) == 8 and thief_port not in Listener.seen


def test_an_admins_handler_sees_no_secret_and_curl_adds_it(site, listeners):
    owner = listeners[0]
    admin = as_user(site, None)
    assert (
        admin.post("/api/v1/functions/fn_url", content=json.dumps(_url_function(site, owner))).status_code
        == 200
    )
    assert admin.post("/api/v1/functions/fn_url/deploy").status_code == 200
    _check_seen(_run_and_read(site), listeners, sandboxed=False)


@needs_sandbox
def test_a_sandboxed_process_never_holds_a_url_secret_and_its_curl_still_authenticates(site, listeners):
    owner = listeners[0]
    admin, mgr = as_user(site, None), as_user(site, "mgr")
    assert (
        admin.post("/api/v1/functions/fn_url", content=json.dumps(_url_function(site, owner))).status_code
        == 200
    )
    r = mgr.post("/api/v1/functions/fn_url/deploy")  # deployed by a manager: it runs sandboxed
    assert r.status_code == 200, r.text
    _check_seen(_run_and_read(site), listeners, sandboxed=True)


def test_a_javascript_handler_sees_no_secret(site, listeners):
    owner = listeners[0]
    admin = as_user(site, None)
    body = _url_function(site, owner, language="javascript")
    body["handler_source"] = """
function OnUpdate(doc, meta) {
  out[meta.id] = {api: JSON.stringify(api), names: Object.getOwnPropertyNames(api).concat(Object.getOwnPropertyNames(tok)),
                  status: curl("GET", api, {path: "/x"}).status, tokStatus: curl("GET", tok, {path: "/x"}).status};
}
"""  # noqa: E501
    assert admin.post("/api/v1/functions/fn_url", content=json.dumps(body)).status_code == 200
    assert admin.post("/api/v1/functions/fn_url/deploy").status_code == 200
    for seen in _run_and_read(site).values():
        assert seen["status"] == 200 and seen["tokStatus"] == 200
        assert (
            PASSWORD not in seen["api"] and "password" not in seen["names"] and "token" not in seen["names"]
        )
    assert len(Listener.seen[listeners[2]]) == 8
