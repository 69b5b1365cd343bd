"""The REST and Data APIs meeting careless and hostile input, through the ASGI app in-process (real SQLite):
deeply nested JSON, out-of-range and sub-second expiries, damaged files (503 with the CLI's line), a 20 MiB
document, host names in capitals, 403s naming keyspaces as bucket.scope.collection, a refused bulk load
naming the role that works, passwords with a NUL, what `eventing serve` says is in force, and the tokens
read from files and removed from the environment of `serve` and `run`."""

from __future__ import annotations

import base64
import email.utils
import io
import json
import os
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from eventing.cli.app import main
from eventing.cli.serve import _banner
from eventing.core.mutation import encode_document
from eventing.errors import ConfigError, InvalidDocumentError
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.security import users as security_users
from eventing.security.users import check_password, hash_password, verify_password
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import open_bucket
from eventing.storage.files import bucket_path
from eventing.testing import deploy_function
from metadata.factory import SQLITE_FILE, open_store

ADMIN = "admin-token-0123456789abcdef"
A = {"Authorization": f"Bearer {ADMIN}"}
DOC = "/v1/buckets/shop/scopes/_default/collections/_default/documents"
DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture(autouse=True)
def cheap_scrypt(monkeypatch):
    monkeypatch.setattr(security_users, "SCRYPT_N", 2**8)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def client(data_dir):
    shop = LocalBucket.create(data_dir, "shop")
    shop.create_collection("sales", "orders")
    shop.create_collection("hr", "staff")
    shop.upsert("k", {"n": 1})
    shop.close()
    with open_store(data_dir) as store:
        store.put_user("writer", hash_password("writer-pass-12"), ["data_writer[shop.sales.*]"])
        store.put_user("reader", hash_password("reader-pass-12"), ["data_reader[shop]"])
    return TestClient(
        build_app(ServerConfig(data_dir, admin_token=ADMIN)),
        base_url="http://127.0.0.1:8096",
        raise_server_exceptions=False,
    )


def one_line(text: str) -> str:
    assert "Traceback" not in text and "\n" not in text.strip(), text
    return text


# -- nesting, expiries, sizes -------------------------------------------------------------------------------


def test_deeply_nested_json_is_a_400_with_one_line_everywhere(client):
    r = client.put(f"{DOC}/deep", content=DEEP, headers={**A, "content-type": "application/json"})
    assert r.status_code == 400 and "nests more than about 900 levels" in one_line(r.json()["message"])
    r = client.put(f"{DOC}/deep", content='{"a":' * 5000 + "1" + "}" * 5000, headers=A)
    assert r.status_code == 400 and r.json()["code"] == "InvalidArgument"
    r = client.post(
        "/api/v1/keyspaces/shop/load",
        headers=A,
        content='{"key": "ok", "doc": {}}\n{"key": "deep", "doc": {"x": ' + DEEP + "}}\n",
    )
    assert r.status_code == 400 and r.json()["committed"] == 1
    assert r.json()["error"].startswith("line 2: the JSON nests more than about 900 levels deep")
    r = client.post("/api/v1/functions/fn_x", headers=A, content=DEEP)
    assert r.status_code == 400 and "nests too deeply" in one_line(r.json()["error"])


def test_documents_nest_at_most_900_deep_on_every_write_so_each_stored_one_reads_back(client):
    """How deep a decoder reaches depends on the stack it runs on: a Data API PUT of 990 levels was stored and
    its GET was a 500 (RecursionError). The limit is the same on every write: 900 levels."""

    def nested(depth: int) -> str:
        return '{"a":' * depth + "1" + "}" * depth

    for depth, status in ((900, 200), (901, 400), (950, 400), (990, 400)):
        r = client.put(
            f"{DOC}/d{depth}", content=nested(depth), headers={**A, "content-type": "application/json"}
        )
        assert r.status_code == status, (depth, r.text)
        got = client.get(f"{DOC}/d{depth}", headers=A)
        if status == 200:
            assert got.status_code == 200 and got.text == nested(depth)
        else:
            assert (
                "nests more than about 900 levels" in one_line(r.json()["message"]) and got.status_code == 404
            )
    r = client.post(
        "/api/v1/keyspaces/shop/load", headers=A, content='{"key": "l", "doc": ' + nested(901) + "}\n"
    )
    assert r.status_code == 400 and "nests more than about 900 levels deep" in r.json()["error"]
    assert encode_document(json.loads(nested(900)))
    with pytest.raises(InvalidDocumentError, match="nests more than about 900 levels deep"):
        encode_document(json.loads(nested(901)))  # a handler's write


def test_a_document_stored_deeper_before_the_limit_still_reads_back(client, data_dir):
    """Written before every write was held to 900 levels (a PUT of 990 levels was stored then)."""
    import msgpack

    from eventing.core.mutation import OP_UPDATE
    from eventing.storage.values import Write

    deep: object = 1
    for _ in range(990):
        deep = {"a": deep}
    shop = LocalBucket.open(data_dir, "shop")
    shop.write([Write("old-deep", OP_UPDATE, msgpack.packb(deep, use_bin_type=True))])
    shop.close()
    got = client.get(f"{DOC}/old-deep", headers=A)
    assert got.status_code == 200 and got.text == '{"a":' * 990 + "1" + "}" * 990


def test_an_expires_out_of_range_is_a_400_and_a_sub_second_one_rounds_up(client):
    r = client.put(f"{DOC}/e", content="{}", headers={**A, "expires": "9" * 5000 + "s"})
    assert r.status_code == 400 and "is out of range" in one_line(r.json()["message"])
    before = time.time()
    r = client.put(f"{DOC}/e", content="{}", headers={**A, "expires": "500ms"})
    assert r.status_code == 200
    r = client.get(f"{DOC}/e", headers=A)
    assert r.status_code == 200  # not already expired as it was written
    expires = email.utils.parsedate_to_datetime(r.headers["expires"]).timestamp()
    assert before + 0.5 <= expires <= before + 2


def test_a_load_line_with_a_negative_expiry_is_refused(client):
    r = client.post(
        "/api/v1/keyspaces/shop/load", headers=A, content='{"key": "x", "doc": {}, "expiry": -5}\n'
    )
    assert r.status_code == 400 and r.json()["committed"] == 0
    assert r.json()["error"].startswith(
        'line 1: "expiry" -5 is not valid; give the Unix time in whole seconds'
    )
    rejected: list[str] = []
    from eventing.ops.jsonl import rows_of_lines

    assert list(rows_of_lines([b'{"key": "x", "doc": {}, "expiry": 4294967296}'], rejected)) == []
    assert rejected and "4294967296 is not valid" in rejected[0]


def test_a_20_mib_body_says_it_exceeds_the_limit(client):
    body = b"x" * (20 * 1024 * 1024)
    r = client.put(f"{DOC}/big", content=body, headers={**A, "content-type": "application/octet-stream"})
    assert r.status_code == 400
    message = r.json()["message"]
    assert "exceeds the limit of 20,971,520 bytes" in message and "the limit is 20971520" not in message


# -- damaged files ------------------------------------------------------------------------------------------


def test_a_damaged_bucket_file_is_a_503_with_the_clis_line(client, data_dir, capsys):
    path = bucket_path(data_dir, "shop")
    os.truncate(path, path.stat().st_size // 3)
    assert main(["--data-dir", data_dir, "bucket", "get", "shop", "k"]) != 0
    cli_line = capsys.readouterr().err.strip().removeprefix("error: ")
    assert f"bucket file {path} is damaged" in cli_line
    r = client.get("/api/v1/buckets/shop/collections", headers=A)
    assert (r.status_code, r.json()["error"]) == (503, cli_line)
    r = client.get(f"{DOC}/k", headers=A)
    assert (r.status_code, r.json()["code"], r.json()["message"]) == (
        503,
        "UnderlyingServiceUnavailable",
        cli_line,
    )
    r = client.post("/api/v1/keyspaces/shop/load", headers=A, content='{"key": "x", "doc": {}}\n')
    assert (r.status_code, r.json()["error"], r.json()["committed"]) == (503, cli_line, 0)


def test_a_damaged_metadata_store_is_a_503_with_the_clis_line(data_dir, capsys):
    LocalBucket.create(data_dir, "shop").close()
    deploy_function(data_dir, _definition(), "def on_update(doc, meta):\n    pass\n")
    path = Path(data_dir) / SQLITE_FILE
    os.truncate(path, path.stat().st_size // 2)
    assert main(["--data-dir", data_dir, "status"]) != 0
    cli_line = capsys.readouterr().err.strip().removeprefix("error: ")
    assert "metadata store" in cli_line and "is damaged" in cli_line
    for config in (ServerConfig(data_dir), ServerConfig(data_dir, admin_token=ADMIN)):
        client = TestClient(
            build_app(config), base_url="http://127.0.0.1:8096", raise_server_exceptions=False
        )
        for path_ in ("/api/v1/functions", "/api/v1/status", "/metrics"):
            r = client.get(path_, headers=A)
            assert (r.status_code, r.json()["error"]) == (503, cli_line), path_
        r = client.get(f"{DOC}/k", headers=A)
        assert (r.status_code, r.json()["message"]) == (503, cli_line)


def test_a_store_that_is_away_is_a_503_with_retry_after_and_a_damaged_one_without(client, monkeypatch):
    """StoreUnavailableError (a server store away longer than the wait) and StoreLockedError pass by
    themselves: 503 with Retry-After, wherever the store failed (looking up the keyspace, committing the
    write, a bulk load), never a 400 that blames the request."""
    from eventing.errors import StoreCorruptError, StoreUnavailableError
    from eventing.http.dataapi.writer import Buckets

    away = StoreUnavailableError(
        "PostgreSQL at 127.0.0.1:5432 is unreachable (Connection refused); start the "
        "server or fix the host and port in --store (waited 2s)"
    )

    def fail(*args, **kwargs):
        raise away

    for target in (Buckets, LocalBucket):
        with monkeypatch.context() as patch:
            patch.setattr(
                *((target, "collection", fail) if target is Buckets else (target, "change_documents", fail))
            )
            r = client.put(f"{DOC}/k", content='{"n": 2}', headers=A)
            assert (r.status_code, r.json()["code"], r.json()["message"]) == (
                503,
                "UnderlyingServiceUnavailable",
                str(away),
            ), target
            assert r.headers["retry-after"] == "1"
    with monkeypatch.context() as patch:
        patch.setattr(LocalBucket, "load_rows", fail)
        r = client.post("/api/v1/keyspaces/shop/load", headers=A, content='{"key": "x", "doc": {}}\n')
        assert (r.status_code, r.json()["committed"], r.headers["retry-after"]) == (503, 0, "1")
    with monkeypatch.context() as patch:
        patch.setattr(
            LocalBucket,
            "change_documents",
            lambda *a, **k: (_ for _ in ()).throw(StoreCorruptError("damaged")),
        )
        r = client.put(f"{DOC}/k", content='{"n": 2}', headers=A)
        assert r.status_code == 503 and "retry-after" not in r.headers  # someone must repair it first
    assert client.get(f"{DOC}/k", headers=A).json() == {"n": 1}


def _definition():
    from eventing.core.definition import FunctionDefinition

    return FunctionDefinition.from_dict({"name": "fn_a", "source_bucket": "shop"})


# -- names, hints, passwords --------------------------------------------------------------------------------


def test_host_names_compare_without_case(client):
    for host in ("LOCALHOST:8096", "LocalHost", "127.0.0.1:8096"):
        assert client.get("/api/v1/status", headers={**A, "host": host}).status_code == 200, host
    assert client.get("/api/v1/status", headers={**A, "host": "EVIL.example"}).status_code == 421


def test_a_refused_bulk_load_names_the_keyspace_and_data_writer(client):
    for user, password in (("writer", "writer-pass-12"), ("reader", "reader-pass-12")):
        r = client.post(
            "/api/v1/keyspaces/shop.hr.staff/load",
            headers=basic(user, password),
            content='{"key": "x", "doc": {}}\n',
        )
        assert r.status_code == 403, (user, r.text)
        assert r.json()["error"].startswith(f"{user} may not load documents into shop.hr.staff (roles: ")
        assert (
            "data_writer[shop.hr.staff]" in r.json()["fix"]
            and "eventing_manage_functions" not in r.json()["fix"]
        )
        assert "Keyspace(" not in r.text
    r = client.post(
        "/api/v1/keyspaces/shop/load",
        headers=basic("writer", "writer-pass-12"),
        content='{"key": "x", "doc": {}}\n',
    )
    assert r.status_code == 403 and "load documents into shop._default._default" in r.json()["error"]


def test_a_password_with_a_nul_is_not_the_password_without_it(client, data_dir, monkeypatch):
    assert verify_password("password", hash_password("password"))
    assert not verify_password("password\0", hash_password("password"))
    assert client.get("/api/v1/status", headers=basic("writer", "writer-pass-12\0")).status_code == 401
    assert (
        client.get("/api/v1/status", headers=basic("writer", "writer-pass-12")).status_code == 403
    )  # known, no role
    with pytest.raises(ConfigError, match="NUL"):
        check_password("new-password\0")
    monkeypatch.setattr("sys.stdin", io.StringIO("nul-password\0\n"))
    assert main(["--data-dir", data_dir, "user", "add", "nul", "--role", "ro_admin", "--password-stdin"]) == 2
    with open_store(data_dir) as store:
        assert [u.name for u in store.list_users()] == ["reader", "writer"]


# -- what `serve` says, and its tokens ----------------------------------------------------------------------


def test_serve_says_which_credentials_are_in_force(data_dir):
    LocalBucket.create(data_dir, "shop").close()
    assert "no credentials: every local caller is trusted" in _banner(ServerConfig(data_dir))
    with open_store(data_dir) as store:
        store.put_user("ann", hash_password("ann-password"), ["ro_admin"])
    banner = _banner(ServerConfig(data_dir))
    assert "credentials required: the password of 1 user" in banner and "no credentials" not in banner
    banner = _banner(ServerConfig(data_dir, admin_token=ADMIN))
    assert "credentials required: the admin token, the password of 1 user" in banner
    client = TestClient(build_app(ServerConfig(data_dir)), base_url="http://127.0.0.1:8096")
    assert client.get("/api/v1/status").status_code == 401  # as the banner says


def test_serve_never_says_every_caller_is_trusted_when_it_accepts_none(data_dir, tmp_path):
    """A store whose users were all removed still needs credentials (its users' mark), and a store that
    cannot be read answers 503: the banner says so instead of "no credentials"."""
    LocalBucket.create(data_dir, "shop").close()
    with open_store(data_dir) as store:
        store.put_user("ann", hash_password("ann-password"), ["ro_admin"])
        store.delete_user("ann")
    client = TestClient(build_app(ServerConfig(data_dir)), base_url="http://127.0.0.1:8096")
    assert client.get("/api/v1/status").status_code == 401
    banner = _banner(ServerConfig(data_dir))
    assert "no credentials" not in banner and "credentials required: a user's password" in banner
    assert (
        "\nwarning: the metadata store had users and has none left" in banner
        and "eventing user add" in banner
    )
    assert "warning" not in _banner(ServerConfig(data_dir, admin_token=ADMIN))  # the token is accepted
    damaged = str(tmp_path / "damaged")
    LocalBucket.create(damaged, "shop").close()
    deploy_function(damaged, _definition(), "def on_update(doc, meta):\n    pass\n")
    os.truncate(Path(damaged) / SQLITE_FILE, 0)  # emptied: damaged, never a new store without users
    client = TestClient(build_app(ServerConfig(damaged)), base_url="http://127.0.0.1:8096")
    assert client.get("/api/v1/status").status_code == 503
    first, warning = _banner(ServerConfig(damaged), "; KV port 11210").split("\n")
    assert "no credentials" not in first and first.endswith("; KV port 11210")
    assert warning.startswith("warning: every request is answered 503 until the metadata store can be read: ")
    assert "is damaged (truncated to 0 bytes)" in warning


def test_tokens_come_from_files_and_leave_the_environment(tmp_path, monkeypatch):
    admin_file, read_file = tmp_path / "admin.token", tmp_path / "read.token"
    admin_file.write_text(ADMIN + "\n")
    read_file.write_text("read-token-0123456789abcdef")
    monkeypatch.setenv("EVENTING_ADMIN_TOKEN", "from-the-environment-0000")
    monkeypatch.setenv("EVENTING_READ_TOKEN_FILE", str(read_file))
    config = ServerConfig.from_env("d", admin_token_file=str(admin_file))
    assert (config.admin_token, config.read_token) == (ADMIN, "read-token-0123456789abcdef")
    assert "EVENTING_ADMIN_TOKEN" not in os.environ
    monkeypatch.setenv("EVENTING_ADMIN_TOKEN", "from-the-environment-0000")
    monkeypatch.delenv("EVENTING_READ_TOKEN_FILE")
    assert ServerConfig.from_env("d").admin_token == "from-the-environment-0000"
    assert "EVENTING_ADMIN_TOKEN" not in os.environ
    for content, message in (("", "holds nothing"), ("a\nb\n", "several lines")):
        admin_file.write_text(content)
        with pytest.raises(ConfigError, match=message):
            ServerConfig.from_env("d", admin_token_file=str(admin_file))
    with pytest.raises(ConfigError, match="cannot be read"):
        ServerConfig.from_env("d", admin_token_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="give one"):
        ServerConfig.from_env("d", admin_token=ADMIN, admin_token_file=str(admin_file))


def test_a_handler_run_by_eventing_run_finds_no_token_in_the_environment(data_dir, monkeypatch):
    from eventing.core.definition import FunctionDefinition

    LocalBucket.create(data_dir, "src").upsert("k", {"n": 1})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_env",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    handler = (
        "import os\n\ndef on_update(doc, meta):\n"
        "    out[meta.id] = {k: os.environ.get(k) for k in ('EVENTING_ADMIN_TOKEN', 'EVENTING_READ_TOKEN')}\n"
    )
    deploy_function(data_dir, defn, handler)
    monkeypatch.setenv("EVENTING_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("EVENTING_READ_TOKEN", "read-token-0123456789abcdef")
    assert (
        main(["--data-dir", data_dir, "run", "--until-caught-up", "--executor", "in-process", "--quiet"]) == 0
    )
    with open_bucket(data_dir, "out") as out:
        assert out.get("k") == {"EVENTING_ADMIN_TOKEN": None, "EVENTING_READ_TOKEN": None}
