"""A metadata store file that exists but holds no store (truncated to 0 bytes, or a SQLite file without the
store's tables) is damaged: every command says so in one line, nothing makes it a new, empty store (which
would drop every function and user, let `eventing run` exit 0, and open a server protected by users to
anonymous callers), and `eventing restore` (or moving the file aside) is the way out. A store that had users
never takes callers without credentials again, not after its users are deleted either. New stores are
created whole, by however many processes at once."""

from __future__ import annotations

import base64
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from eventing.cli.app import main
from eventing.core.definition import FunctionDefinition
from eventing.http import auth
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.security import users as security_users
from eventing.security.users import hash_password
from eventing.storage.bucket import LocalBucket
from eventing.testing import deploy_function
from metadata import StoreCorruptError
from metadata.factory import SQLITE_FILE, open_store

HANDLER = "def on_update(doc, meta):\n    pass\n"


@pytest.fixture(autouse=True)
def cheap_scrypt(monkeypatch):
    monkeypatch.setattr(security_users, "SCRYPT_N", 2**8)


def cli(capsys, data_dir: str, *argv: str) -> tuple[int, str]:
    status = main(["--data-dir", data_dir, *argv])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def deployed_with_a_user(data_dir: str) -> Path:
    LocalBucket.create(data_dir, "src").upsert("k", {"n": 1})
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_src", "source_bucket": "src"}), HANDLER
    )
    with open_store(data_dir) as store:
        store.put_user("root", hash_password("root-password-1"), ["admin"])
    return Path(data_dir) / SQLITE_FILE


@pytest.mark.parametrize("damage", ["truncated to 0 bytes", "a SQLite file without the store's tables"])
def test_a_store_file_without_a_store_is_damaged_and_never_made_a_new_store(data_dir, capsys, damage):
    path = deployed_with_a_user(data_dir)
    backup = Path(data_dir).parent / "backup.sqlite3"
    assert cli(capsys, data_dir, "backup", "-o", str(backup))[0] == 0
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    if damage == "truncated to 0 bytes":
        os.truncate(path, 0)
    else:
        path.unlink()
        sqlite3.connect(path).execute("CREATE TABLE notes(text)").connection.close()
    before = path.read_bytes()
    for argv in (
        ["run", "--until-caught-up", "--executor", "in-process"],
        ["status"],
        ["user", "list"],
        ["deploy", "fn_src"],
    ):
        status, out = cli(capsys, data_dir, *argv)
        assert status == 2, (argv, out)
        lines = [line for line in out.splitlines() if line.strip()]
        assert len(lines) == 1 and f"metadata store {path} is damaged ({damage})" in lines[0], (argv, out)
        assert "restore it from a backup" in lines[0] and "Traceback" not in out
    with pytest.raises(StoreCorruptError):
        open_store(data_dir)  # creating stores on demand (create=True) does not make one out of it either
    assert path.read_bytes() == before  # not re-initialised
    # The way out: a restore (the damaged file is kept beside it), then the functions and users are back.
    status, out = cli(capsys, data_dir, "restore", str(backup))
    assert status == 0, out
    with open_store(data_dir, create=False) as store:
        assert [f.name for f in store.list_functions()] == ["fn_src"]
        assert [u.name for u in store.list_users()] == ["root"]


def test_a_store_file_moved_aside_starts_a_new_store(data_dir, capsys):
    path = deployed_with_a_user(data_dir)
    os.truncate(path, 0)
    path.rename(path.with_name("metadata.sqlite3.damaged"))
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_again", "source_bucket": "src"}), HANDLER
    )
    with open_store(data_dir, create=False) as store:
        assert [f.name for f in store.list_functions()] == ["fn_again"] and store.list_users() == []


def test_many_processes_creating_the_store_at_once_make_one(tmp_path):
    data_dir = tmp_path / "data"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        try:
            start.wait()
            with open_store(data_dir) as store:
                store.set_kv(f"k{i}", "v")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with open_store(data_dir, create=False) as store:
        assert [store.get_kv(f"k{i}") for i in range(8)] == ["v"] * 8
    assert sorted(p.name for p in data_dir.iterdir() if not p.name.startswith(SQLITE_FILE)) == []


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_a_server_whose_store_had_users_never_takes_callers_without_credentials(data_dir, monkeypatch):
    path = deployed_with_a_user(data_dir)
    config = ServerConfig(data_dir)  # loopback, no tokens: only users protect it
    running = TestClient(build_app(config), base_url="http://127.0.0.1:8096", raise_server_exceptions=False)
    assert running.get("/api/v1/status").status_code == 401
    assert running.get("/api/v1/status", headers=basic("root", "root-password-1")).status_code == 200
    later = [0.0]
    auth.authenticator_for(config).clock = lambda: time.monotonic() + later[0]  # its users are read again

    def started_now() -> TestClient:  # a server started afresh (no authenticator of an earlier one)
        monkeypatch.setattr(auth, "_AUTHENTICATORS", {})
        return TestClient(build_app(config), base_url="http://127.0.0.1:8096", raise_server_exceptions=False)

    # Every user deleted: the store remembers it had users, so callers still need credentials (a token).
    with open_store(data_dir) as store:
        store.delete_user("root")
    later[0] = 10.0
    assert running.get("/api/v1/status").status_code == 401
    running_auth = auth.authenticator_for(config)
    assert started_now().get("/api/v1/status").status_code == 401
    # The store truncated to 0 bytes: no request gets in without credentials, on a running or a new server.
    os.truncate(path, 0)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    later[0] = 20.0
    monkeypatch.setattr(auth, "_AUTHENTICATORS", {config: running_auth})
    for server in (running, started_now()):
        answer = server.get("/api/v1/status")
        assert answer.status_code >= 400, answer.text
    assert path.stat().st_size == 0


def test_a_store_from_before_the_users_mark_gets_it_from_its_users(tmp_path):
    path = tmp_path / SQLITE_FILE
    with open_store(tmp_path) as store:
        store.put_user("root", "hash", ["admin"])
    db = sqlite3.connect(path)
    db.execute("DELETE FROM kv")  # as a store written before the mark
    db.commit()
    db.close()
    with open_store(tmp_path) as store:
        store.delete_user("root")
        assert store.get_kv("users_created") == "1"
