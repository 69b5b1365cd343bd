"""Couchbase Eventing's REST shapes on a real uvicorn server on 127.0.0.1, after a real run of the service:
the function list and one function in Couchbase's function JSON by default (this project's with
?format=eventing), namespaces (?bucket=&scope=: one name in two namespaces, a wrong scope a 404 with code
13), /api/v1/status/NAME, the statistics endpoints, /api/v1/list/functions/query, a function's deployment
config, DELETE /api/v1/functions, and /settings keeping dcp_stream_boundary and refusing what Couchbase
refuses."""

from __future__ import annotations

import socket

import httpx
import pytest

from eventing.control.service import EventingService
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.http.auth import ServerConfig
from eventing.http.server import start_in_thread
from eventing.storage.state import as_state
from eventing.storage.values import Write
from eventing.testing import load_source
from eventing.workers.executor import make_executor
from metadata.factory import open_store

pytestmark = pytest.mark.integration

ADMIN = "admin-token-0123456789abcdef"
DOCS, MUTATIONS = 120, 300
COPY = "function OnUpdate(doc, meta) { seen[meta.id] = {n: 1}; }"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def couchbase_function(
    name: str, scope: tuple[str, str] | None, binding: str, boundary: str = "everything", access: str = "rw"
) -> dict:
    item = {
        "appname": name,
        "appcode": COPY,
        "depcfg": {
            "source_bucket": "src",
            "source_scope": "_default",
            "source_collection": "_default",
            "metadata_bucket": "meta",
            "metadata_scope": "_default",
            "metadata_collection": "_default",
            "buckets": [
                {
                    "alias": "seen",
                    "bucket_name": binding,
                    "scope_name": "_default",
                    "collection_name": "_default",
                    "access": access,
                }
            ],
        },
        "settings": {"dcp_stream_boundary": boundary, "deployment_status": False, "processing_status": False},
    }
    if scope:
        item["function_scope"] = {"bucket": scope[0], "scope": scope[1]}
    return item


def run_service(data_dir: str) -> None:
    summary = EventingService(data_dir, make_executor("in-process"), until_caught_up=True).run()
    assert not summary.errors, summary.errors


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("cbrest") / "data")
    load_source(data_dir, DOCS, MUTATIONS, seed=3)
    state = as_state(data_dir)
    for bucket in ("meta", "seen_global", "seen_scoped", "late"):
        state.create_bucket(bucket, exist_ok=True).close()
    config = ServerConfig(data_dir, port=free_port(), admin_token=ADMIN)
    server = start_in_thread(config)
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{config.port}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60
    )
    r = api.post(
        "/api/v1/import",
        json=[
            couchbase_function("audit", None, "seen_global"),
            couchbase_function("audit", ("src", "_default"), "seen_scoped"),
        ],
    )
    assert r.status_code == 200, r.text
    assert api.post("/api/v1/functions/audit/deploy?bucket=src&scope=_default").status_code == 200
    run_service(data_dir)
    yield {"api": api, "data_dir": data_dir, "state": state}
    api.close()
    server.should_exit = True


def test_one_name_in_two_namespaces_and_couchbase_shapes_by_default(site):
    api = site["api"]
    with open_store(site["data_dir"]) as store:
        assert sorted(r.name for r in store.list_functions()) == ["audit", "src._default.audit"]
    listed = api.get("/api/v1/functions").json()
    assert sorted((f["appname"], f["function_scope"]["bucket"]) for f in listed) == [
        ("audit", "*"),
        ("audit", "src"),
    ]
    assert all("appcode" in f and "depcfg" in f for f in listed)
    own = api.get("/api/v1/functions?format=eventing").json()
    assert sorted(f["name"] for f in own) == ["audit", "src._default.audit"] and "handler_source" in own[0]

    scoped = api.get("/api/v1/functions/audit?bucket=src&scope=_default").json()
    assert (scoped["function_scope"], scoped["settings"]["deployment_status"]) == (
        {"bucket": "src", "scope": "_default"},
        True,
    )
    plain = api.get("/api/v1/functions/audit").json()  # no namespace: the global function
    assert (plain["function_scope"], plain["settings"]["deployment_status"]) == (
        {"bucket": "*", "scope": "*"},
        False,
    )
    assert api.get("/api/v1/functions/audit?format=eventing").json()["name"] == "audit"

    wrong = api.get("/api/v1/functions/audit?bucket=src&scope=nope")
    assert wrong.status_code == 404 and (wrong.json()["code"], wrong.json()["name"]) == (
        13,
        "ERR_APP_NOT_FOUND_TS",
    )
    assert api.post("/api/v1/functions/audit/undeploy?bucket=src&scope=nope").status_code == 404
    # the global function was not touched by the scoped one's deploy
    assert site["state"].open_bucket("seen_global").count() == 0
    assert site["state"].open_bucket("seen_scoped").count() == DOCS

    exported = api.get("/api/v1/export").json()
    assert sorted(f["function_scope"]["scope"] for f in exported) == ["*", "_default"]


def test_status_and_statistics_in_couchbase_shapes(site):
    api = site["api"]
    one = api.get("/api/v1/status/audit?bucket=src&scope=_default").json()
    assert set(one) >= {"app", "num_eventing_nodes"} and "apps" not in one
    assert (one["app"]["name"], one["app"]["function_scope"], one["app"]["composite_status"]) == (
        "audit",
        {"bucket": "src", "scope": "_default"},
        "deployed",
    )
    with open_store(site["data_dir"]) as store:
        counters = store.counters("src._default.audit")
    q = "?name=audit&bucket=src&scope=_default"
    execution = api.get("/getExecutionStats" + q).json()
    assert execution["on_update_success"] == counters["on_update_success"] > 0
    failure = api.get("/getFailureStats" + q).json()
    assert failure["timeout_count"] == 0 and "bkt_ops_cas_mismatch_count" in failure
    latency = api.get("/getLatencyStats" + q).json()
    assert sum(latency.values()) == counters["latency_count"] > 0 and all(
        k.isdigit() or k == "inf" for k in latency
    )
    assert api.get("/getDcpEventsRemaining" + q).json() == {"dcp_backlog": 0}
    with site["state"].open_bucket("src") as src:
        src.write(
            [
                Write("late-1", OP_UPDATE, encode_document({"v": 1})),
                Write("late-2", OP_UPDATE, encode_document({"v": 2})),
            ]
        )
    assert api.get("/getDcpEventsRemaining" + q).json() == {"dcp_backlog": 2}
    undeployed = api.get("/getExecutionStats?name=audit")  # the global one is undeployed
    assert undeployed.status_code == 409 and undeployed.json()["code"] == 12


def test_list_query_config_and_delete_all(site):
    api = site["api"]
    assert api.get("/api/v1/list/functions/query?deployed=true").json() == {
        "functions": ["src._default.audit"]
    }
    assert api.get("/api/v1/list/functions/query?deployed=false&source_bucket=src").json() == {
        "functions": ["audit"]
    }
    assert (
        api.post("/api/v1/functions", json=couchbase_function("selfwriter", None, "src")).status_code == 200
    )
    assert api.get("/api/v1/list/functions/query?function_type=sbm").json() == {"functions": ["selfwriter"]}
    assert (
        "selfwriter" not in api.get("/api/v1/list/functions/query?function_type=notsbm").json()["functions"]
    )

    config = api.get("/api/v1/functions/audit/config").json()
    assert (config["source_bucket"], config["buckets"][0]["bucket_name"]) == ("src", "seen_global")
    r = api.post("/api/v1/functions/audit/config", json={**config, "metadata_bucket": "late"})
    assert r.status_code == 200, r.text
    assert api.get("/api/v1/functions/audit/config").json()["metadata_bucket"] == "late"
    deployed = api.post("/api/v1/functions/audit/config?bucket=src&scope=_default", json=config)
    assert deployed.status_code == 409 and deployed.json()["code"] == 22

    answers = api.delete("/api/v1/functions").json()
    assert sorted(a["code"] for a in answers) == [0, 0, 22]
    with open_store(site["data_dir"]) as store:
        assert [r.name for r in store.list_functions()] == ["src._default.audit"]


def test_settings_keep_the_stream_boundary_and_refuse_what_couchbase_refuses(site):
    api = site["api"]
    assert (
        api.post(
            "/api/v1/import", json=[couchbase_function("later", None, "late", boundary="from_now")]
        ).status_code
        == 200
    )
    r = api.post("/api/v1/functions/later/settings", json={"dcp_stream_boundary": "everything"})
    assert r.status_code == 200, r.text
    with open_store(site["data_dir"]) as store:
        assert store.get_function("later").definition["boundary"] == "everything"
    for body, named in (
        ({"deployment_status": "yes", "processing_status": True}, "deployment_status"),
        ({"worker_count": 0, "deployment_status": False, "processing_status": False}, "worker_count"),
        ({"dcp_stream_boundary": "yesterday"}, "dcp_stream"),
        ({"checkpoint_interval": 2.5, "dcp_stream_boundary": "everything"}, "checkpoint_interval"),
    ):
        refused = api.post("/api/v1/functions/later/settings", json=body)
        assert (
            refused.status_code == 400
            and refused.json()["code"] == 38
            and named in refused.json()["description"]
        )
    with open_store(site["data_dir"]) as store:
        assert store.get_function("later").state.value == "undeployed"
    again = api.post(
        "/api/v1/functions/later/settings", json={"deployment_status": True, "processing_status": True}
    )
    assert again.status_code == 200, again.text
    run_service(site["data_dir"])
    with site["state"].open_bucket("src") as src:
        updated = {m.key for batch in src.scan_log() for m in batch if m.op == OP_UPDATE}
    with site["state"].open_bucket("late") as late:
        assert set(late.keys()) == updated  # every document from the start, not 0: the boundary was kept
