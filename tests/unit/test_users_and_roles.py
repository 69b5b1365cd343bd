"""Users and roles of the REST and Data APIs, through the ASGI app in-process (real SQLite): salted scrypt
hashes only, each role's allowed and refused endpoints, keyspace wildcards, failed-login limits on a clock
the test moves, remembered logins, who deployed a function, and the `eventing user` commands."""

from __future__ import annotations

import base64
import io
import json
import logging
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from eventing.cli.app import main
from eventing.core.definition import FunctionDefinition
from eventing.core.keyspaces import Keyspace
from eventing.errors import ConfigError
from eventing.http import auth
from eventing.http.app import build_app
from eventing.http.auth import Authenticator, AuthError, ServerConfig
from eventing.http.function_access import deployed_by_admin
from eventing.security import users as security_users
from eventing.security.users import (
    CLUSTER_MANAGE,
    CLUSTER_READ,
    DATA_READ,
    DATA_WRITE,
    FUNCTIONS_MANAGE,
    SECRETS_READ,
    Grant,
    hash_password,
    verify_password,
)
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from metadata.factory import open_store

ADMIN_TOKEN = "admin-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
PASSWORDS = {
    "root": "root-password-1",
    "ro": "ro-password-12",
    "mgr": "mgr-password-12",
    "writer": "writer-pass-12",
    "local": "local-password-1",
}
ROLES = {
    "root": ["admin"],
    "ro": ["ro_admin"],
    "mgr": ["eventing_manage_functions[shop:sales]"],
    "writer": ["data_writer[shop.sales.*]"],
    "local": ["eventing_manage_functions[src:_default]"],
}
HANDLER = "def on_update(doc, meta):\n    pass\n"


PRODUCTION_COST_TESTS = {"test_a_password_is_stored_only_as_a_salted_scrypt_hash_and_salted_scram_keys"}


@pytest.fixture(autouse=True)
def cheap_scrypt(request, monkeypatch):
    """Passwords hashed here cost N = 2**8 rather than SCRYPT_N (2**14, ~50 ms a hash and as much a
    verification, paid for every user of every test). verify_password reads N from the stored hash, so
    hashing and verifying run the same code, faster. The tests of PRODUCTION_COST_TESTS keep SCRYPT_N."""
    if request.node.originalname not in PRODUCTION_COST_TESTS:
        monkeypatch.setattr(security_users, "SCRYPT_N", 2**8)
        monkeypatch.setattr(
            security_users, "SCRAM_ITERATIONS", 64
        )  # the SCRAM keys kept beside the hash, likewise


def basic(user: str, password: str | None = None) -> dict[str, str]:
    secret = PASSWORDS[user] if password is None else password
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()}


def fn(name: str, scope: str, collection: str) -> dict:
    return {"name": name, "source_bucket": "shop", "source_scope": scope, "source_collection": collection}


@pytest.fixture
def site(data_dir):
    LocalBucket.create(data_dir, "src").upsert("k", {"n": 1})
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_src", "source_bucket": "src"}), HANDLER
    )
    store = open_store(data_dir)
    for name, roles in ROLES.items():
        store.put_user(name, hash_password(PASSWORDS[name]), roles)
    store.put_function("fn_sales", fn("fn_sales", "sales", "orders"), HANDLER)
    store.put_function("fn_hr", fn("fn_hr", "hr", "staff"), HANDLER)
    store.close()
    config = ServerConfig(data_dir, admin_token=ADMIN_TOKEN, read_token=READ_TOKEN)
    return TestClient(build_app(config), base_url="http://127.0.0.1:8096")


def state(data_dir: str, name: str) -> str:
    with open_store(data_dir) as store:
        return store.get_function(name).state.value


# -- passwords -------------------------------------------------------------------------------------------


def test_a_password_is_stored_only_as_a_salted_scrypt_hash_and_salted_scram_keys():
    first, second = hash_password("correct horse"), hash_password("correct horse")
    assert first != second  # a fresh salt each time
    scrypt, *scram = first.split(";")
    scheme, n, r, p, salt, digest = scrypt.split("$")
    assert (scheme, int(n), int(r), int(p), len(base64.b64decode(salt))) == ("scrypt", 2**14, 8, 1, 16)
    # the SCRAM keys the KV port's SASL checks (eventing.kv.sasl): salted, iterated, one set a mechanism
    assert [k.split("$")[:2] for k in scram] == [
        ["scram-sha512", "15000"],
        ["scram-sha256", "15000"],
        ["scram-sha1", "15000"],
    ]
    assert "correct horse" not in first
    assert verify_password("correct horse", first) and not verify_password("correct hors", first)
    assert not verify_password("x", "not a hash")


def test_the_store_holds_no_password_in_clear(site, data_dir):
    with open_store(data_dir) as store:
        assert all(u.password_hash.startswith("scrypt$") for u in store.list_users())
    files = b"".join(p.read_bytes() for p in Path(data_dir).rglob("*") if p.is_file())
    assert b"scrypt$" in files and not any(p.encode() in files for p in PASSWORDS.values())


# -- roles and wildcards ---------------------------------------------------------------------------------


def test_roles_parse_with_couchbase_names_and_wildcards_cover_keyspaces():
    writer = Grant.parse("data_writer[shop.sales.*]")
    assert str(writer) == "data_writer[shop.sales.*]"
    assert writer.allows(DATA_WRITE, Keyspace("shop", "sales", "orders"))
    assert not writer.allows(DATA_WRITE, Keyspace("shop", "hr", "staff"))
    assert not writer.allows(DATA_READ, Keyspace("shop", "sales", "orders"))
    assert Grant.parse("data_reader[shop]").allows(DATA_READ, Keyspace("shop", "hr", "staff"))
    assert Grant.parse("data_reader[*.*.orders]").covers(Keyspace("any", "thing", "orders"))
    assert not Grant.parse("data_reader[*.*.orders]").covers(Keyspace("any", "thing", "staff"))
    manager = Grant.parse("eventing_manage_functions[shop:sales]")
    assert str(manager) == "eventing_manage_functions[shop:sales]"
    assert manager.allows(FUNCTIONS_MANAGE, Keyspace("shop", "sales", "orders"))
    assert not manager.allows(FUNCTIONS_MANAGE, Keyspace("shop", "hr", "staff"))
    assert not manager.allows(CLUSTER_MANAGE, None)
    assert Grant.parse("ro_admin").allows(CLUSTER_READ, None)
    assert not Grant.parse("ro_admin").allows(SECRETS_READ, None)
    for bad in (
        "root",
        "admin[shop]",
        "data_writer",
        "data_writer[a.b.c.d]",
        "eventing_manage_functions[a:b:c]",
    ):
        with pytest.raises(ConfigError):
            Grant.parse(bad)


# -- each role's endpoints -------------------------------------------------------------------------------

MATRIX = [
    # (method, path, body, {caller: allowed})
    ("GET", "/api/v1/functions/fn_sales", None, {"root": True, "ro": True, "mgr": True, "writer": False}),
    ("GET", "/api/v1/functions/fn_hr", None, {"root": True, "ro": True, "mgr": False, "writer": False}),
    ("GET", "/api/v1/functions/fn_hr/stats", None, {"ro": True, "mgr": False, "writer": False}),
    ("GET", "/getAppLog?name=fn_hr", None, {"ro": True, "mgr": False}),
    ("GET", "/api/v1/nodes", None, {"root": True, "ro": True, "mgr": False, "writer": False}),
    ("GET", "/metrics", None, {"ro": True, "mgr": False, "writer": False}),
    ("POST", "/api/v1/nodes", {"name": "n9"}, {"ro": False, "mgr": False, "writer": False}),
    ("POST", "/api/v1/functions/fn_hr/pause", None, {"ro": False, "mgr": False, "writer": False}),
    ("POST", "/api/v1/functions/fn_hr/deploy", None, {"mgr": False, "writer": False}),
    ("POST", "/api/v1/functions/fn_sales/deploy", None, {"ro": False, "writer": False}),
    ("DELETE", "/api/v1/functions/fn_hr", None, {"ro": False, "mgr": False, "writer": False}),
    ("GET", "/api/v1/export?secrets=true", None, {"ro": False, "mgr": False}),
    (
        "POST",
        "/api/v1/functions/fn_new",
        {**fn("fn_new", "hr", "staff"), "handler_source": HANDLER},
        {"mgr": False},
    ),
    ("POST", "/api/v1/functions/fn_sales/settings", {"source_scope": "hr"}, {"mgr": False}),
    (
        "POST",
        "/api/v1/import",
        [{**fn("fn_sales", "hr", "staff"), "handler_source": HANDLER}],
        {"mgr": False},
    ),
    ("POST", "/api/v1/keyspaces/shop.hr.staff/load", None, {"writer": False, "mgr": False, "ro": False}),
    (  # a deployment config moving a function of the caller's scope to another's source
        "POST",
        "/api/v1/functions/fn_sales/config",
        {"source_bucket": "shop", "source_scope": "hr", "source_collection": "staff"},
        {"mgr": False},
    ),
    # a query naming two functions: each is checked, whichever one the endpoint reads
    ("POST", "/resetStatsCounters?name=nosuchfn&appName=fn_hr", None, {"mgr": False}),
]


@pytest.mark.parametrize("method,path,body,expected", MATRIX, ids=[f"{m} {p}" for m, p, _, _ in MATRIX])
def test_each_role_is_allowed_or_refused_each_endpoint(site, data_dir, method, path, body, expected):
    before = {n: state(data_dir, n) for n in ("fn_sales", "fn_hr")}
    for user, allowed in expected.items():
        r = site.request(
            method, path, headers=basic(user), content=None if body is None else json.dumps(body)
        )
        if allowed:
            assert r.status_code not in (401, 403), (user, r.status_code, r.text)
        else:
            assert r.status_code == 403, (user, r.status_code, r.text)
            assert r.json()["error"].startswith(user) and r.json()["fix"]  # the REST API's error shape
    if not any(expected.values()):
        assert {n: state(data_dir, n) for n in before} == before  # a refused request changed nothing


def test_a_function_manager_manages_its_scope_and_lists_only_its_functions(site, data_dir):
    names = [f["name"] for f in site.get("/api/v1/functions?format=eventing", headers=basic("mgr")).json()]
    assert names == ["fn_sales"]
    assert [a["name"] for a in site.get("/api/v1/status", headers=basic("mgr")).json()["apps"]] == [
        "fn_sales"
    ]
    assert {f["name"] for f in site.get("/api/v1/functions?format=eventing", headers=basic("ro")).json()} == {
        "fn_src",
        "fn_sales",
        "fn_hr",
    }
    assert site.get("/api/v1/functions", headers=basic("writer")).status_code == 403
    r = site.post(
        "/api/v1/functions/fn_sales/settings", headers=basic("mgr"), content=json.dumps({"description": "x"})
    )
    assert r.status_code not in (401, 403)
    assert site.get("/api/v1/functions/fn_sales", headers=basic("mgr")).headers["x-eventing-role"] == "manage"


def test_a_manager_cannot_take_over_another_scopes_function_through_a_bodys_namespace(site, data_dir):
    with open_store(data_dir) as store:
        store.put_function("shop.hr.audit", fn("shop.hr.audit", "hr", "staff"), HANDLER)
    body = {
        "appname": "audit",
        "appcode": "function OnUpdate(doc, meta) {}",
        "depcfg": {"source_bucket": "shop", "source_scope": "sales", "source_collection": "orders"},
        "settings": {},
        "function_scope": {"bucket": "shop", "scope": "hr"},
    }
    r = site.post("/api/v1/functions/audit", headers=basic("mgr"), content=json.dumps(body))
    assert r.status_code == 403, r.text
    assert "shop.hr.audit" in r.json()["error"]
    with open_store(data_dir) as store:
        kept = store.get_function("shop.hr.audit")
    assert kept.source == HANDLER and kept.definition["source_scope"] == "hr"


def test_a_save_is_checked_against_the_function_as_stored_whoever_calls_it(site, data_dir):
    from eventing.control import lifecycle

    manager = auth.Identity("local", (Grant.parse("eventing_manage_functions[src:_default]"),))
    moved = FunctionDefinition.from_dict({"name": "fn_hr", "source_bucket": "src"})  # a source it manages
    with pytest.raises(AuthError, match="fn_hr"):
        lifecycle.save_function(data_dir, moved, HANDLER, saved_by=manager)
    with pytest.raises(AuthError, match="fn_other"):  # nor may it save one whose source it does not manage
        lifecycle.save_function(
            data_dir,
            FunctionDefinition.from_dict(fn("fn_other", "hr", "staff")),
            HANDLER,
            saved_by=manager,
        )
    assert state(data_dir, "fn_hr") == "undeployed"
    with open_store(data_dir) as store:
        assert store.get_function("fn_hr").definition["source_bucket"] == "shop"


def test_delete_all_deletes_only_the_callers_functions_and_listings_show_only_them(site, data_dir):
    names = site.get("/api/v1/list/functions/query", headers=basic("mgr")).json()
    assert names == {"functions": ["fn_sales"]}
    r = site.request(
        "DELETE", "/api/v1/functions", headers=basic("mgr"), content=json.dumps({"source_bucket": "shop"})
    )
    assert r.status_code == 200, r.text
    assert r.json() == [{"code": 0, "info": "Function: fn_sales deleted"}]
    with open_store(data_dir) as store:
        assert {f.name for f in store.list_functions()} == {"fn_src", "fn_hr"}


def test_a_bulk_load_checks_the_keyspace_it_writes_as_it_resolves_it(site, data_dir):
    from eventing.storage.factory import open_bucket

    LocalBucket.create(data_dir, "pay.roll.x").close()  # a bucket whose name reads like a keyspace
    with open_store(data_dir) as store:
        store.put_user("dotw", hash_password("dotw-password-1"), ["data_writer[pay.roll.x]"])
    line = json.dumps({"key": "k1", "doc": {"n": 1}}) + "\n"
    auth_header = {"Authorization": "Basic " + base64.b64encode(b"dotw:dotw-password-1").decode()}
    r = site.post("/api/v1/keyspaces/pay.roll.x/load", headers=auth_header, content=line)
    assert r.status_code == 403, r.text  # the role names collection x of scope roll of bucket pay
    assert "pay.roll.x._default._default" in r.json()["error"]
    with open_bucket(data_dir, "pay.roll.x") as bucket:
        assert bucket.get("k1") is None
    # a writer of shop.sales.orders passes the check (this site has no bucket shop: 404, not 403)
    r = site.post("/api/v1/keyspaces/shop.sales.orders/load", headers=basic("writer"), content=line)
    assert r.status_code == 404, r.text


def test_an_unknown_name_tells_a_manager_no_other_functions_names(site):
    r = site.get("/api/v1/functions/nope", headers=basic("mgr"))
    assert r.status_code == 404 and "fn_hr" not in r.text and "known:" not in r.text, r.text
    r = site.get("/api/v1/functions/nope", headers=basic("ro"))  # ro_admin lists every function anyway
    assert r.status_code == 404 and "fn_hr" in r.text


def test_every_rest_endpoint_needs_credentials(site):
    import re

    from eventing.http.app import PROTECTED_PREFIXES
    from eventing.http.routes import ENDPOINTS

    for ep in ENDPOINTS:
        path = re.sub(r"\{[^}]+\}", "fn_hr", ep.path)
        assert path.startswith(PROTECTED_PREFIXES), f"{ep.method} {ep.path} is served without a login"
        sep = "&" if "?" in path else "?"
        r = site.request(ep.method, f"{path}{sep}name=fn_hr&appName=fn_hr")
        assert r.status_code == 401, (ep.method, ep.path, r.status_code, r.text[:200])


def test_tokens_map_to_admin_and_ro_admin_and_credentials_are_needed(site):
    assert site.get("/api/v1/nodes", headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 200
    r = site.post(
        "/api/v1/nodes", headers={"Authorization": f"Bearer {READ_TOKEN}"}, content='{"name": "n2"}'
    )
    assert r.status_code == 403
    r = site.post(
        "/api/v1/nodes", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, content='{"name": "n2"}'
    )
    assert r.status_code == 200
    assert site.get("/api/v1/nodes").status_code == 401
    assert site.get("/api/v1/nodes", headers=basic("ro", "wrong-password")).status_code == 401


def test_loopback_without_users_or_tokens_stays_open_and_a_user_closes_it(data_dir):
    LocalBucket.create(data_dir, "src")
    client = TestClient(build_app(ServerConfig(data_dir)), base_url="http://127.0.0.1:8096")
    assert client.get("/api/v1/functions").status_code == 200
    with open_store(data_dir) as store:
        store.put_user("ann", hash_password("ann-password"), ["ro_admin"])
    auth.authenticator_for(ServerConfig(data_dir)).clock = lambda: (
        time.monotonic() + 60
    )  # past the user snapshot
    assert client.get("/api/v1/functions").status_code == 401
    assert (
        client.get(
            "/api/v1/functions",
            headers={"Authorization": "Basic " + base64.b64encode(b"ann:ann-password").decode()},
        ).status_code
        == 200
    )


def test_a_function_deployed_by_a_non_admin_is_recorded_as_such(site, data_dir):
    site.post(
        "/api/v1/functions/fn_src/pause",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        params={"wait": "0"},
    )
    site.post(
        "/api/v1/functions/fn_src/undeploy",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        params={"wait": "0"},
    )
    with open_store(data_dir) as store:
        assert deployed_by_admin(store.get_function("fn_src"))
    r = site.post("/api/v1/functions/fn_src/deploy", headers=basic("local"))
    assert r.status_code == 200, r.text
    with open_store(data_dir) as store:
        record = store.get_function("fn_src")
    assert record.deployed_by["user"] == "local" and not deployed_by_admin(record)
    r = site.post("/api/v1/functions/fn_src/deploy", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert (
        r.status_code == 422
    )  # already deployed (Couchbase's answer); a refused deploy leaves the record as it was
    with open_store(data_dir) as store:
        assert store.get_function("fn_src").deployed_by["user"] == "local"


# -- failed logins, remembered logins --------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _authenticator(clock: Clock) -> Authenticator:
    users = [
        auth.UserRecord("ann", hash_password("ann-password"), ("ro_admin",), 0.0),
        auth.UserRecord("bob", hash_password("bob-password"), ("ro_admin",), 0.0),
    ]
    return Authenticator(ServerConfig("unused"), clock, load_users=lambda: users)


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_guesses_sent_at_once_are_checked_no_more_than_guesses_sent_one_by_one():
    import threading

    a = _authenticator(Clock())
    start, outcomes = threading.Barrier(24), []

    def guess(i: int) -> None:
        start.wait()
        try:
            a.authenticate(header("ann", f"guess-{i}"), f"10.0.1.{i}")  # each from its own address
            outcomes.append(200)
        except AuthError as refused:
            outcomes.append(refused.status)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.scrypt_runs == auth.MAX_FAILURES  # the rest met the lock before their password was checked
    assert sorted(outcomes) == [401] * auth.MAX_FAILURES + [429] * (24 - auth.MAX_FAILURES)


def test_failed_logins_lock_the_client_and_the_user_for_a_growing_delay(caplog):
    clock = Clock()
    a = _authenticator(clock)
    caplog.set_level(logging.DEBUG)
    for i in range(auth.MAX_FAILURES):
        with pytest.raises(AuthError) as refused:
            a.authenticate(header("ann", f"guess-{i}"), "10.0.0.1")
        assert refused.value.status == 401
    with pytest.raises(AuthError) as locked:
        a.authenticate(header("ann", "ann-password"), "10.0.0.1")  # even the right password waits
    assert locked.value.status == 429 and int(locked.value.headers["Retry-After"]) == auth.BASE_LOCK_S
    with pytest.raises(AuthError) as other_client:
        a.authenticate(header("ann", "ann-password"), "10.0.0.2")  # the user is locked from anywhere
    assert other_client.value.status == 429
    assert a.authenticate(header("bob", "bob-password"), "10.0.0.2").user == "bob"  # others are not
    clock.now += auth.BASE_LOCK_S + 1
    assert a.authenticate(header("ann", "ann-password"), "10.0.0.1").user == "ann"
    for i in range(auth.MAX_FAILURES):
        with pytest.raises(AuthError):
            a.authenticate(header("ann", f"again-{i}"), "10.0.0.1")
    with pytest.raises(AuthError) as longer:
        a.authenticate(header("ann", "ann-password"), "10.0.0.1")
    assert int(longer.value.headers["Retry-After"]) == 2 * auth.BASE_LOCK_S  # the user's second lock
    assert "guess-" not in caplog.text and "again-" not in caplog.text and "ann-password" not in caplog.text
    assert "failed login of user 'ann' from 10.0.0.1" in caplog.text


def test_others_failures_never_lock_out_a_valid_token_or_another_users_password(site):
    """Every local process shares 127.0.0.1: wrong tokens and wrong passwords for one user, enough to lock
    that address and that user, leave the admin token, the read-only token and other users working from the
    same address; the guessed user's right password waits (it is the one being guessed)."""
    for i in range(3 * auth.MAX_FAILURES):
        r = site.get("/api/v1/nodes", headers={"Authorization": f"Bearer wrong-token-{i:04d}-0123456789"})
        assert r.status_code in (401, 429)
        assert site.get("/api/v1/nodes", headers=basic("ro", f"bad-password-{i}")).status_code in (401, 429)
    assert (
        site.get("/api/v1/nodes", headers={"Authorization": "Bearer yet-another-wrong-token-000"}).status_code
        == 429
    )
    assert site.get("/api/v1/nodes", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
    assert site.get("/api/v1/nodes", headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 200
    assert site.get("/api/v1/nodes", headers=basic("root")).status_code == 200
    assert site.get("/api/v1/functions/fn_sales", headers=basic("mgr")).status_code == 200
    assert site.get("/api/v1/nodes", headers=basic("ro")).status_code == 429  # the name being guessed


def test_a_locked_client_gets_429_with_retry_after_over_http(site):
    for i in range(auth.MAX_FAILURES):
        assert site.get("/api/v1/nodes", headers=basic("ro", f"bad-password-{i}")).status_code == 401
    r = site.get("/api/v1/nodes", headers=basic("ro"))
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0 and r.json()["fix"]


def test_the_same_wrong_credential_sent_again_is_not_another_guess():
    """A console or script polling with a stale token must not lock its client out of the right one."""
    clock = Clock()
    a = _authenticator(clock)
    for _ in range(3 * auth.MAX_FAILURES):
        for stale in (header("ann", "old-password"), "Bearer old-token"):
            with pytest.raises(AuthError) as refused:
                a.authenticate(stale, "10.0.0.1")
            assert refused.value.status == 401
    assert a.authenticate(header("ann", "ann-password"), "10.0.0.1").user == "ann"
    for i in range(auth.MAX_FAILURES - 2):  # with the two above: MAX_FAILURES distinct guesses lock
        with pytest.raises(AuthError):
            a.authenticate(f"Bearer guess-{i}", "10.0.0.1")
    with pytest.raises(AuthError) as locked:
        a.authenticate("Bearer one-more-guess", "10.0.0.1")
    assert locked.value.status == 429  # the client's wrong credentials wait now; its right ones do not
    assert a.authenticate(header("bob", "bob-password"), "10.0.0.1").user == "bob"


def test_a_verified_login_is_remembered_so_scrypt_runs_once_for_thousands_of_requests():
    a = _authenticator(Clock())
    started = time.perf_counter()
    for _ in range(5000):
        assert a.authenticate(header("ann", "ann-password"), "10.0.0.1").user == "ann"
    elapsed = time.perf_counter() - started
    assert a.scrypt_runs == 1
    assert 5000 / elapsed > 5000, f"{5000 / elapsed:.0f} authentications a second"
    with pytest.raises(AuthError):
        a.authenticate(header("ann", "not-the-password"), "10.0.0.1")
    assert a.scrypt_runs == 2


# -- the CLI ---------------------------------------------------------------------------------------------


def test_user_commands_add_list_and_remove_without_showing_a_password(data_dir, monkeypatch, capsys, caplog):
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret-password\n"))
    assert (
        main(
            [
                "--data-dir",
                data_dir,
                "user",
                "add",
                "ann",
                "--role",
                "data_writer[shop.sales.*]",
                "--role",
                "ro_admin",
                "--password-stdin",
            ]
        )
        == 0
    )
    monkeypatch.setenv("EVENTING_USER_PASSWORD", "other-password")
    assert main(["--data-dir", data_dir, "user", "add", "bob", "--role", "admin"]) == 0
    assert main(["--data-dir", data_dir, "user", "add", "bob", "--role", "admin"]) == 2  # exists: --replace
    assert main(["--data-dir", data_dir, "user", "add", "cy", "--role", "nobody"]) == 2
    assert main(["--data-dir", data_dir, "user", "list"]) == 0
    assert main(["--data-dir", data_dir, "user", "list", "--json"]) == 0
    out = capsys.readouterr()
    listed = json.loads(out.out[out.out.index("[\n") :])
    assert [(u["name"], u["roles"]) for u in listed] == [
        ("ann", ["data_writer[shop.sales.*]", "ro_admin"]),
        ("bob", ["admin"]),
    ]
    assert "role 'nobody' is not known" in out.err and "--replace" in out.err
    for secret in ("s3cret-password", "other-password", "scrypt$"):
        assert secret not in out.out + out.err + caplog.text
    with open_store(data_dir) as store:
        assert verify_password("s3cret-password", store.get_user("ann").password_hash)
    assert main(["--data-dir", data_dir, "user", "remove", "ann"]) == 0
    assert main(["--data-dir", data_dir, "user", "remove", "ann"]) == 2
    with open_store(data_dir) as store:
        assert [u.name for u in store.list_users()] == ["bob"]


def test_the_data_api_needs_credentials_once_users_exist_even_on_loopback(data_dir):
    with open_store(data_dir) as store:
        store.put_user("ann", hash_password("ann-password"), ["data_reader[shop.*.*]"])
    client = TestClient(build_app(ServerConfig(data_dir)), base_url="http://127.0.0.1:8096")
    r = client.get("/v1/buckets/shop/scopes/_default/collections/_default/documents/k")
    assert r.status_code == 401 and r.json()["code"] == "Unauthorized"
    r = client.get(
        "/v1/callerIdentity",
        headers={"Authorization": "Basic " + base64.b64encode(b"ann:wrong-pass").decode()},
    )
    assert r.status_code == 403 and r.json()["code"] == "InvalidAuth" and "wrong-pass" not in r.text
