"""Couchbase's REST shapes through the app in-process (httpx's ASGI transport, real SQLite): a Couchbase
export posted as a list, a function in Couchbase JSON, status flags on /settings, appcode and its checksum,
/api/v1/config, the listings, resetStatsCounters, stats?type=full, export?format=couchbase and the errors
in Couchbase's shape."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import httpx
import pytest

from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.storage.bucket import LocalBucket
from metadata.factory import open_store

ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
FIXTURE = Path(__file__).parent / "fixtures" / "couchbase_export.json"
FULL = "shop.sales.audit_orders"  # the fixture's function in its namespace (function_scope shop/sales)


def export() -> list[dict]:
    items = json.loads(FIXTURE.read_text())
    items[0]["depcfg"]["curl"] = []  # nothing to call in these tests
    items[0]["settings"]["deployment_status"] = False
    return items


@pytest.fixture
def api(data_dir):
    LocalBucket.create(data_dir, "crm")
    shop = LocalBucket.create(data_dir, "shop")
    shop.create_collection("sales", "orders")
    shop.create_collection("sales", "audit")
    return Api(build_app(ServerConfig(data_dir, admin_token=ADMIN, read_token=READ)), data_dir)


class Api:
    def __init__(self, app, data_dir):
        self.app, self.data_dir = app, data_dir

    def call(self, method: str, path: str, body=None, token: str = ADMIN, **kw) -> httpx.Response:
        async def run() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as client:
                content = body if isinstance(body, str | bytes) or body is None else json.dumps(body)
                return await client.request(
                    method, path, content=content, headers={"Authorization": f"Bearer {token}"}, **kw
                )

        return asyncio.run(run())

    def state(self, name: str) -> str:
        return open_store(self.data_dir).get_function(name).state.value


def test_a_couchbase_export_posted_as_a_list_then_status_flags_deploy_pause_resume_undeploy(api):
    r = api.call("POST", "/api/v1/functions", export())
    assert r.status_code == 200, r.text
    assert [f["name"] for f in r.json()["functions"]] == [FULL]
    assert any("log_level" in w for w in json.loads(r.headers["x-eventing-warnings"]))
    assert api.state(FULL) == "undeployed"
    for flags, state in (
        ((True, True), "deployed"),
        ((True, False), "paused"),
        ((True, True), "deployed"),
        ((False, False), "undeployed"),
    ):
        r = api.call(
            "POST",
            "/api/v1/functions/audit_orders/settings?wait=0",
            {"deployment_status": flags[0], "processing_status": flags[1]},
        )
        assert r.status_code == 200, r.text
        assert api.state(FULL) == state
    assert (
        api.call("GET", "/api/v1/functions/audit_orders/settings?format=couchbase").json()["worker_count"]
        == 3
    )


def test_one_function_in_couchbase_json_and_its_appcode_checksum(api):
    item = export()[0]
    r = api.call("POST", "/api/v1/functions/audit_orders", item)
    assert r.status_code == 200, r.text
    code = api.call("GET", "/api/v1/functions/audit_orders/appcode").text
    assert code == item["appcode"]
    checksum = api.call("GET", "/api/v1/functions/audit_orders/appcode/checksum", token=READ)
    assert checksum.text == hashlib.sha256(code.encode()).hexdigest()
    got = api.call("GET", "/api/v1/functions/audit_orders?bucket=shop&scope=sales", token=READ).json()
    assert (
        got["appname"],
        got["function_scope"],
        got["depcfg"]["source_collection"],
        got["settings"]["dcp_stream_boundary"],
    ) == ("audit_orders", {"bucket": "shop", "scope": "sales"}, "orders", "from_now")
    r = api.call("POST", "/api/v1/functions/other", item)  # the body names another function
    assert r.status_code == 400 and r.json()["name"] == "ERR_READ_REQ"
    assert "names function 'audit_orders' but the URL names 'other'" in r.json()["description"]


def test_listings_reset_stats_and_full_stats(api):
    api.call("POST", "/api/v1/import", export())
    assert api.call(
        "GET", "/api/v1/list/functions?source_bucket=shop&function_scope=shop.sales", token=READ
    ).json() == {"functions": [FULL]}
    assert api.call("GET", "/api/v1/list/functions?source_bucket=crm", token=READ).json() == {"functions": []}
    assert api.call("GET", "/getDeployedApps", token=READ).json() == {}
    api.call("POST", "/api/v1/functions/audit_orders/deploy")
    assert api.call("GET", "/getDeployedApps", token=READ).json() == {FULL: ""}
    assert api.call("GET", "/getRunningApps", token=READ).json() == {}  # no service runs it
    store = open_store(api.data_dir)
    store.add_counters(FULL, {"on_update_success": 4, "dlq_error": 1})
    full = api.call("GET", "/api/v1/stats?type=full", token=READ).json()[0]
    assert full["function_name"] == FULL
    assert (
        full["execution_stats"]["on_update_success"] == 4
        and full["event_processing_stats"]["dcp_mutation"] == 4
    )
    assert full["failure_stats"]["dlq_count"] == 1
    assert api.call("POST", "/resetStatsCounters?appName=audit_orders", token=READ).status_code == 403
    assert api.call("POST", "/resetStatsCounters?appName=audit_orders").json() == {
        "name": FULL,
        "reset": True,
    }
    assert store.counters(FULL) == {"dlq_error": 1}
    missing = api.call("POST", "/resetStatsCounters?appName=nope")
    assert missing.status_code == 404
    assert missing.json()["name"] == "ERR_APP_NOT_FOUND_TS" and missing.json()["runtime_info"]["code"] == 13


def test_config_keeps_what_this_system_has_and_refuses_the_rest(api):
    assert api.call("GET", "/api/v1/config", token=READ).json() == {"enable_debugger": True}
    assert api.call("POST", "/api/v1/config", {"enable_debugger": True}).status_code == 200
    r = api.call("POST", "/api/v1/config", {"ram_quota": 512})
    assert r.status_code == 400 and "config ram_quota is not supported here" in r.json()["description"]
    assert api.call("POST", "/api/v1/config", {"enable_debugger": True}, token=READ).status_code == 403


def test_export_in_couchbase_format_masks_secrets_unless_the_admin_asks(api):
    item = json.loads(FIXTURE.read_text())[0]
    item["settings"]["deployment_status"] = False
    api.call("POST", "/api/v1/import", [item])
    masked = api.call("GET", "/api/v1/export", token=READ).json()  # Couchbase's shape by default
    assert masked[0]["depcfg"]["curl"][0]["bearer_key"] == "*****"
    clear = api.call("GET", "/api/v1/export?format=couchbase&secrets=true").json()
    assert clear[0]["depcfg"]["curl"][0]["bearer_key"] == "t0ps3cret"
    assert api.call("GET", "/api/v1/export?format=couchbase&secrets=true", token=READ).status_code == 403
    # posted back masked, the stored secret is kept
    assert api.call("POST", "/api/v1/functions", masked).status_code == 200
    assert open_store(api.data_dir).get_function(FULL).definition["url_bindings"][0]["token"] == "t0ps3cret"
    bad = api.call("GET", "/api/v1/export?format=yaml", token=READ)
    assert bad.status_code == 400 and "format=yaml is not valid" in bad.text
