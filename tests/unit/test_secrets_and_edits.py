"""URL binding secrets are masked wherever a definition leaves the store and kept when the mask comes back;
a paused function's source bucket cannot change; status says when no service runs a deployed function."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from eventing.cli import main
from eventing.control import lifecycle
from eventing.core.definition import FunctionDefinition
from eventing.core.secrets import MASK, mask_definition
from eventing.errors import ConfigError, LifecycleError
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.storage.bucket import LocalBucket
from metadata import FunctionState
from metadata.factory import open_store

ADMIN = "a" * 20
READ = "r" * 20
PASSWORD = "pw-s3cret-basic"
TOKEN = "tok-s3cret-bearer"
HANDLER = "def on_update(doc, meta):\n    pass\n"


def definition(source: str = "src", **extra) -> dict:
    return {
        "name": "fn_api",
        "source_bucket": source,
        "url_bindings": [
            {
                "alias": "api",
                "url": "https://example.com/v1",
                "auth": "basic",
                "username": "u",
                "password": PASSWORD,
            },
            {"alias": "hook", "url": "https://example.com/hook", "auth": "bearer", "token": TOKEN},
            {"alias": "open", "url": "https://example.com/open"},
        ],
        **extra,
    }


@pytest.fixture
def saved(data_dir):
    LocalBucket.create(data_dir, "src")
    LocalBucket.create(data_dir, "other")
    lifecycle.save_function(data_dir, FunctionDefinition.from_dict(definition()), HANDLER)
    return data_dir


def stored_bindings(data_dir: str) -> list[dict]:
    with open_store(data_dir) as store:
        return store.get_function("fn_api").definition["url_bindings"]


class client:
    """Requests to the ASGI app in-process (httpx's ASGI transport, real SQLite), as the given token."""

    def __init__(self, data_dir: str, token: str):
        self.app = build_app(ServerConfig(data_dir, admin_token=ADMIN, read_token=READ))
        self.headers = {"Authorization": f"Bearer {token}"}

    def __enter__(self) -> client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as c:
                return await c.request(method, path, headers=self.headers, **kwargs)

        return asyncio.run(call())

    def get(self, path: str) -> httpx.Response:
        return self._call("GET", path)

    def post(self, path: str, json: Any = None) -> httpx.Response:
        return self._call("POST", path, json=json)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- masking -------------------------------------------------------------------------------------------


def test_mask_replaces_only_set_secrets_and_leaves_the_stored_definition_alone():
    d = definition()
    masked = mask_definition(d)
    assert [b.get("password") for b in masked["url_bindings"]] == [MASK, None, None]
    assert [b.get("token") for b in masked["url_bindings"]] == [None, MASK, None]
    assert masked["url_bindings"][0]["username"] == "u"
    assert d["url_bindings"][0]["password"] == PASSWORD  # a copy was masked
    assert PASSWORD not in repr(FunctionDefinition.from_dict(d))


@pytest.mark.parametrize("token", [READ, ADMIN])
def test_rest_reads_mask_secrets_for_every_role(saved, token):
    with client(saved, token) as c:
        for path in (
            "/api/v1/functions?format=eventing",
            "/api/v1/functions/fn_api",
            "/api/v1/functions/fn_api/settings",
            "/api/v1/export?format=eventing",
            "/api/v1/export?name=fn_api",
        ):
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            assert PASSWORD not in r.text and TOKEN not in r.text, path
            assert MASK in r.text, path


def test_export_with_secrets_is_for_the_admin_token_only(saved):
    with client(saved, READ) as c:
        r = c.get("/api/v1/export?name=fn_api&secrets=true")
        assert r.status_code == 403 and "may not read URL binding secrets in clear" in r.json()["error"]
        assert PASSWORD not in r.text
    with client(saved, ADMIN) as c:
        r = c.get("/api/v1/export?name=fn_api&secrets=true")
        assert r.status_code == 200
        assert r.json()[0]["url_bindings"][0]["password"] == PASSWORD
        assert r.json()[0]["url_bindings"][1]["token"] == TOKEN


def test_cli_export_masks_unless_with_secrets(saved, capsys):
    code, out, _ = run_cli(capsys, "export", "fn_api", "--data-dir", saved)
    assert code == 0 and PASSWORD not in out and TOKEN not in out and MASK in out
    code, out, _ = run_cli(capsys, "export", "fn_api", "--with-secrets", "--data-dir", saved)
    assert code == 0 and json.loads(out)["url_bindings"][0]["password"] == PASSWORD


def test_masked_export_edited_and_imported_keeps_the_stored_secrets(saved, capsys, tmp_path):
    path = tmp_path / "fn_api.json"
    assert run_cli(capsys, "export", "fn_api", "-o", str(path), "--data-dir", saved)[0] == 0
    data = json.loads(path.read_text())
    assert data["url_bindings"][0]["password"] == MASK  # the file holds no secret
    data["description"] = "edited"
    data["url_bindings"][0]["url"] = "https://example.com/v2"
    path.write_text(json.dumps(data))
    code, _, err = run_cli(capsys, "import", str(path), "--data-dir", saved)
    assert code == 0, err
    bindings = stored_bindings(saved)
    assert bindings[0]["password"] == PASSWORD and bindings[0]["url"] == "https://example.com/v2"
    assert bindings[1]["token"] == TOKEN


def test_rest_settings_and_update_with_the_mask_keep_the_stored_secrets(saved):
    with client(saved, ADMIN) as c:
        settings = c.get("/api/v1/functions/fn_api/settings").json()
        assert settings["url_bindings"][1]["token"] == MASK
        r = c.post(
            "/api/v1/functions/fn_api/settings",
            json={"url_bindings": settings["url_bindings"], "description": "changed"},
        )
        assert r.status_code == 200, r.text
        doc = c.get("/api/v1/functions/fn_api").json()
        body = {k: v for k, v in doc.items() if k not in ("state", "generation")}
        r = c.post("/api/v1/functions/fn_api", json={**body, "worker_count": 2})
        assert r.status_code == 200, r.text
        imported = c.post("/api/v1/import", json=c.get("/api/v1/export?name=fn_api").json())
        assert imported.status_code == 200, imported.text
    bindings = stored_bindings(saved)
    assert bindings[0]["password"] == PASSWORD and bindings[1]["token"] == TOKEN


def test_a_mask_with_no_stored_secret_is_refused_not_stored(data_dir):
    LocalBucket.create(data_dir, "src")
    data = mask_definition(definition())
    with pytest.raises(
        ConfigError,
        match=r"url binding 'api' of function 'fn_api' has password '\*\*\*\*\*'.*"
        r"put the real password in the definition",
    ):
        lifecycle.import_definitions(data_dir, {**data, "handler_source": HANDLER})
    with open_store(data_dir) as store:
        assert store.list_functions() == []


# -- a paused function's source -------------------------------------------------------------------------


def test_the_source_of_a_paused_function_cannot_change(saved):
    lifecycle.deploy(saved, "fn_api")
    lifecycle.pause(saved, "fn_api")
    moved = FunctionDefinition.from_dict(definition("other"))
    with pytest.raises(
        LifecycleError,
        match="cannot change the source bucket of function 'fn_api' from 'src' to "
        "'other'.*; undeploy it, then deploy the new definition",
    ):
        lifecycle.save_function(saved, moved, HANDLER)
    # other edits of a paused function stay allowed
    lifecycle.save_function(saved, FunctionDefinition.from_dict(definition(description="still src")), HANDLER)
    with client(saved, ADMIN) as c:
        r = c.post("/api/v1/functions/fn_api/settings", json={"source_bucket": "other"})
        assert r.status_code == 409 and r.json()["fix"] == "undeploy it, then deploy the new definition"
    with open_store(saved) as store:
        record = store.get_function("fn_api")
    assert record.state is FunctionState.PAUSED and record.definition["source_bucket"] == "src"
    assert record.definition["description"] == "still src"
    lifecycle.undeploy(saved, "fn_api")
    assert lifecycle.save_function(saved, moved, HANDLER).definition["source_bucket"] == "other"


# -- status without a running service --------------------------------------------------------------------


def test_status_says_a_deployed_function_runs_nowhere_when_no_service_runs(saved, capsys):
    lifecycle.deploy(saved, "fn_api")
    with client(saved, READ) as c:
        app = c.get("/api/v1/status").json()["apps"][0]
    assert app["composite_status"] == "deployed" and app["deployment_status"] is True
    assert app["num_deployed_nodes"] == 0 and app["running"] is False
    assert app["hint"] == "no service is running this function; start one with `eventing run`"
    code, out, _ = run_cli(capsys, "status", "--data-dir", saved)
    assert code == 0 and "fn_api: deployed" in out and "no service is running this function" in out
    code, out, _ = run_cli(capsys, "status", "--json", "--data-dir", saved)
    view = json.loads(out)["functions"][0]
    assert view["running"] is False and "start one with `eventing run`" in view["hint"]
    lifecycle.pause(saved, "fn_api")
    with client(saved, READ) as c:
        app = c.get("/api/v1/status/fn_api").json()["app"]
    assert app["composite_status"] == "paused" and app["running"] is False and "hint" not in app


def test_a_function_as_a_get_gave_it_saves_back_and_its_state_is_changed_only_by_its_own_endpoints(saved):
    with client(saved, ADMIN) as c:
        got = c.get("/api/v1/functions/fn_api?format=eventing").json()
        assert got["state"] == "undeployed" and "generation" in got
        assert c.post("/api/v1/functions/fn_api", json={**got, "description": "again"}).status_code == 200
        assert c.get("/api/v1/functions/fn_api?format=eventing").json()["description"] == "again"
        r = c.post("/api/v1/functions/fn_api", json={**got, "state": "deployed"})
        assert r.status_code == 400
        assert (
            "'state' of function 'fn_api' is 'undeployed', not 'deployed'" in r.text and "/deploy" in r.text
        )
        new = {**got, "name": "fn_copy", "url_bindings": []}  # masked secrets have nothing to keep there
        assert c.post("/api/v1/functions/fn_copy", json=new).status_code == 200  # saved undeployed
