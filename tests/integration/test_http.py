"""The HTTP API on a real uvicorn server on 127.0.0.1: security (401, 403, 413, bad names, bad handler
uploads, closed CORS, nothing half-changed), the Couchbase-shaped lifecycle, dead letters, and the
Prometheus metrics read back with the client library's own parser."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.http.auth import ServerConfig
from eventing.http.server import start_in_thread
from eventing.testing import deploy_function, ledger_definition, load_source
from eventing.workers.executor import make_executor

pytestmark = pytest.mark.integration

ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
DOCS, MUTATIONS = 200, 2_000
FAILING_HANDLER = """
def on_update(doc, meta):
    if meta.id.endswith("7"):
        raise ValueError(f"no luck for {meta.id}")
    out[meta.id] = {"ok": True}
"""
FIXED_HANDLER = """
def on_update(doc, meta):
    out[meta.id] = {"ok": True, "replayed": True}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("http") / "data")
    load_source(data_dir, DOCS, MUTATIONS, seed=7)
    deploy_function(data_dir, ledger_definition("fn_ledger", "src", "ledger"))
    failing = FunctionDefinition.from_dict(
        {
            "name": "fn_fail",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
            "checkpoint_interval": "100ms",
        }
    )
    deploy_function(data_dir, failing, FAILING_HANDLER)
    summary = EventingService(data_dir, make_executor("in-process"), until_caught_up=True).run()
    assert not summary.errors
    # A windowed function, deployed after the run (no Spark here): its window metrics exist from the start.
    windowed = FunctionDefinition.from_dict(
        {
            "name": "fn_windowed",
            "source_bucket": "src",
            "window": {
                "kind": "tumbling",
                "size": "1m",
                "boundary": "event_time",
                "time_field": "ts",
                "aggregates": [{"op": "count"}],
                "out_of_order_tolerance": "5s",
            },
        }
    )
    deploy_function(data_dir, windowed, "")
    config = ServerConfig(
        data_dir, port=free_port(), admin_token=ADMIN, read_token=READ, max_body_bytes=64 * 1024
    )
    server = start_in_thread(config)
    base = f"http://127.0.0.1:{config.port}"
    yield {"data_dir": data_dir, "base": base, "port": config.port}
    server.should_exit = True


def client(site, token: str | None = ADMIN) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=site["base"], headers=headers, timeout=60)


def state_of(site, name: str) -> str:
    return client(site, READ).get(f"/api/v1/status/{name}").json()["app"]["composite_status"]


def test_no_credentials_is_401_everywhere_but_the_console(site):
    anonymous = client(site, None)
    for path in ("/api/v1/functions", "/api/v1/status", "/metrics", "/getAppLog?name=fn_ledger"):
        r = anonymous.get(path)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "token" in r.json()["error"]
    assert client(site, "not-a-token-at-all-000000").get("/api/v1/functions").status_code == 401
    assert anonymous.get("/").status_code == 200  # static page, no data
    assert anonymous.get("/static/console.js").status_code == 200


def test_read_only_token_reads_but_a_write_is_403_and_changes_nothing(site):
    reader = client(site, READ)
    assert [f["name"] for f in reader.get("/api/v1/functions").json()] == [
        "fn_fail",
        "fn_ledger",
        "fn_windowed",
    ]
    r = reader.post("/api/v1/functions/fn_ledger/pause")
    assert r.status_code == 403
    assert "admin token" in r.json()["error"]
    assert state_of(site, "fn_ledger") == "deployed"


def test_basic_auth_with_the_token_as_password_works_like_couchbase_curl_u(site):
    creds = base64.b64encode(f"Administrator:{READ}".encode()).decode()
    r = httpx.get(site["base"] + "/api/v1/status", headers={"Authorization": f"Basic {creds}"})
    assert r.status_code == 200


def test_body_over_the_limit_is_413_and_changes_nothing(site):
    before = client(site).get("/api/v1/functions/fn_fail/appcode").text
    big = "# padding\n" * 7_000 + FIXED_HANDLER  # > 64 KiB
    r = client(site).post("/api/v1/functions/fn_fail/appcode", content=big)
    assert r.status_code == 413
    assert "larger than 65,536 bytes" in r.json()["error"]
    # Without a Content-Length (chunked), the limit holds as the body streams in.
    r = client(site).post(
        "/api/v1/functions/fn_fail/appcode", content=iter([big.encode()[:40_000], big.encode()[40_000:]])
    )
    assert r.status_code == 413
    assert client(site).get("/api/v1/functions/fn_fail/appcode").text == before


def raw_request(site, method: str, path: str, body: bytes = b"") -> tuple[int, dict]:
    """http.client sends the path as given: no client-side normalisation of `..`."""
    conn = http.client.HTTPConnection("127.0.0.1", site["port"], timeout=30)
    conn.request(method, path, body=body, headers={"Authorization": f"Bearer {ADMIN}"})
    response = conn.getresponse()
    data = json.loads(response.read() or b"{}")
    conn.close()
    return response.status, data


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/functions/..%2F..%2Fetc%2Fpasswd",
        "/api/v1/functions/..%2Fmetadata/deploy",
        "/api/v1/functions/fn%20x/pause",
        "/api/v1/functions/fn.ledger",
        "/getAppLog?name=../../metadata.sqlite3",
        "/getAppLog?name=fn%2F..%2Fx",
    ],
)
def test_a_bad_function_name_is_400_with_the_rule(site, path):
    method = "POST" if path.endswith(("/deploy", "/pause")) else "GET"
    status, body = raw_request(site, method, path)
    assert status == 400, body
    rule = (
        "use a letter then letters, digits, '_' or '-' (max 100), or BUCKET.SCOPE.NAME for a function in the "
        "namespace of a bucket and scope"
    )
    assert f"is not valid; {rule}" in body["error"]
    assert body["fix"] == rule


def test_a_handler_upload_that_is_not_python_is_400_naming_the_line_and_the_old_one_stays(site):
    admin = client(site)
    assert admin.post("/api/v1/functions/fn_fail/pause").status_code == 200
    try:
        before = admin.get("/api/v1/functions/fn_fail/appcode").text
        r = admin.post("/api/v1/functions/fn_fail/appcode", content="def on_update(doc, meta):\n    x = (\n")
        assert r.status_code == 400
        assert "syntax error at line 2" in r.json()["error"]
        assert admin.get("/api/v1/functions/fn_fail/appcode").text == before
        # A definition upload with a bad window or binding changes nothing either.
        r = admin.post("/api/v1/functions/fn_fail/settings", json={"worker_count": 0})
        assert r.status_code == 400 and "worker_count" in r.json()["error"]
        assert admin.get("/api/v1/functions/fn_fail/settings").json()["worker_count"] == 1
    finally:
        assert admin.post("/api/v1/functions/fn_fail/resume").status_code == 200


def test_cors_is_closed_by_default(site):
    r = httpx.options(
        site["base"] + "/api/v1/functions",
        headers={"Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers
    r = client(site).post("/api/v1/functions/fn_ledger/pause", headers={"Origin": "http://elsewhere.example"})
    assert r.status_code == 403
    assert "access-control-allow-origin" not in r.headers
    assert "CORS is closed" in r.json()["error"]
    assert state_of(site, "fn_ledger") == "deployed"
    # A foreign Host (DNS rebinding) gets no answer from a loopback server.
    r = client(site).get("/api/v1/functions", headers={"Host": "attacker.example"})
    assert r.status_code == 421


def test_binding_another_address_without_credentials_is_refused_with_one_line(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventing",
            "--data-dir",
            str(tmp_path),
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "EVENTING_ADMIN_TOKEN": "", "EVENTING_READ_TOKEN": ""},
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: refusing to bind 0.0.0.0 without credentials: anyone who can reach it could deploy code; set "
        "--admin-token (or $EVENTING_ADMIN_TOKEN) and optionally --read-token, add an admin user "
        "(`eventing user add NAME --role admin`), or bind 127.0.0.1"
    ]


def test_lifecycle_follows_the_cli_rules_and_messages(site):
    admin = client(site)
    r = admin.post("/api/v1/functions/fn_ledger/resume")
    assert r.status_code == 409
    body = r.json()  # this API's error and fix, beside Couchbase's name, code and description
    assert (body["error"], body["fix"]) == (
        "cannot resume function 'fn_ledger': it is deployed; only a paused "
        "function can be resumed; deploy it if it is undeployed",
        "deploy it if it is undeployed",
    )
    assert body["code"] == 22 and body["description"] == body["error"]
    assert admin.post("/api/v1/functions/fn_nope/pause").status_code == 404
    assert admin.post("/api/v1/functions/fn_ledger/pause").json()["state"] == "paused"
    assert state_of(site, "fn_ledger") == "paused"
    assert admin.post("/api/v1/functions/fn_ledger/resume").json()["state"] == "deployed"
    status = admin.get("/api/v1/status").json()
    assert {a["name"]: a["composite_status"] for a in status["apps"]} == {
        "fn_fail": "deployed",
        "fn_ledger": "deployed",
        "fn_windowed": "deployed",
    }
    assert {a["name"] for a in status["apps"] if a["windowed"]} == {"fn_windowed"}
    assert status["num_eventing_nodes"] == 1


def test_create_export_import_settings_and_delete_round_trip(site):
    admin = client(site)
    exported = admin.get("/api/v1/export?name=fn_ledger").json()[0]
    copy = {**exported, "name": "fn_copy"}
    r = admin.post("/api/v1/functions/fn_copy", json=copy)
    assert r.status_code == 200 and r.json()["state"] == "undeployed"
    r = admin.post("/api/v1/functions/fn_copy", json={**copy, "name": "fn_other"})
    assert r.status_code == 400 and "make them agree" in r.json()["error"]
    assert admin.post("/api/v1/functions/fn_copy/settings", json={"worker_count": 3}).status_code == 200
    assert admin.get("/api/v1/functions/fn_copy/settings").json()["worker_count"] == 3
    assert admin.delete("/api/v1/functions/fn_copy").json() == {"name": "fn_copy", "deleted": True}
    r = admin.post("/api/v1/import", json=[{**copy, "name": "fn_imported"}])
    assert [f["name"] for f in r.json()] == ["fn_imported"]
    assert admin.get("/api/v1/functions/fn_imported/appcode").text == exported["handler_source"]
    assert admin.delete("/api/v1/functions/fn_imported").status_code == 200
    assert admin.get("/api/v1/functions/fn_imported").status_code == 404


def test_vbuckets_checkpoints_nodes_rebalance_and_verify(site):
    reader = client(site, READ)
    view = reader.get("/api/v1/functions/fn_ledger/checkpoints").json()
    cps = view["rows"]
    assert len(cps) == 1024 and view["backlog"] == sum(c["backlog"] for c in cps) == 0
    assert reader.get("/api/v1/functions/fn_ledger/checkpoints?vb=5").json()["rows"][0]["vb"] == 5
    r = reader.get("/api/v1/functions/fn_ledger/checkpoints?vb=2000")
    assert r.status_code == 400 and "vBucket 2000 does not exist" in r.json()["error"]
    assert {c["owner"] for c in cps} == {"local/w0", "local/w1"}
    assert (
        sum(w["vbuckets"] for w in reader.get("/api/v1/functions/fn_ledger/vbmap").json()["workers"]) == 1024
    )
    assert reader.get("/api/v1/nodes").json()["nodes"][0]["vbuckets"] == 1024
    assert reader.get("/api/v1/rebalance/plan").json()["moves"] == 0
    assert reader.get("/api/v1/rebalance").json()["progress"] == 1.0
    report = reader.get("/api/v1/functions/fn_ledger/verify").json()
    assert report["ok"], report["summary"]
    r = reader.get("/api/v1/functions/fn_ledger/windows")
    assert r.status_code == 400 and "declares no window" in r.json()["error"]
    spec = reader.get("/api/v1/openapi.json").json()
    assert spec["openapi"].startswith("3.") and "/api/v1/functions/{name}/deploy" in spec["paths"]
    assert spec["paths"]["/api/v1/functions/{name}/deploy"]["post"]["x-role"] == "admin"


def test_dead_letters_list_show_replay_purge_and_their_metrics(site):
    admin = client(site)
    rows = admin.get("/api/v1/functions/fn_fail/dlq").json()
    assert rows and all(r["key"].endswith("7") and r["reason"] == "error" for r in rows)
    metrics = scrape(site)
    assert metrics[("eventing_dead_letters_total", ("fn_fail", "error"))] == len(rows)
    first = rows[0]
    shown = admin.get(f"/api/v1/functions/fn_fail/dlq/show?vb={first['vb']}&seqno={first['seqno']}").json()
    assert shown[0]["traceback"] and "no luck" in shown[0]["error"]
    r = admin.post("/api/v1/functions/fn_fail/dlq/replay", json={})
    assert r.status_code == 400 and '{"all": true} or a selector' in r.json()["error"]
    assert admin.post("/api/v1/functions/fn_fail/pause").status_code == 200
    assert admin.post("/api/v1/functions/fn_fail/appcode", content=FIXED_HANDLER).status_code == 200
    assert admin.post("/api/v1/functions/fn_fail/resume").status_code == 200
    report = admin.post("/api/v1/functions/fn_fail/dlq/replay", json={"all": True}).json()
    assert report["replayed"] == len(rows) and report["failed"] == 0
    assert admin.get("/api/v1/functions/fn_fail/dlq").json() == []
    assert admin.post("/api/v1/functions/fn_fail/dlq/purge", json={"replayed": True}).json()["purged"] == len(
        rows
    )


def scrape(site) -> dict[tuple[str, tuple[str, ...]], float]:
    text = client(site, READ).get("/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(s.labels.values()))] = s.value
    return out


def test_metrics_parse_with_the_prometheus_parser_and_match_the_stats(site):
    text = client(site, READ).get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(text.text)}
    for name in (
        "eventing_mutations_seen",
        "eventing_handler_success",
        "eventing_handler_failure",
        "eventing_handler_timeout",
        "eventing_dead_letters",
        "eventing_backlog_mutations",
        "eventing_handler_latency_seconds",
        "eventing_checkpoint_age_seconds",
        "eventing_workers_recycled",
        "eventing_fenced_writes",
        "eventing_rebalance_progress_ratio",
        "eventing_function_state",
    ):
        assert name in families, name
    assert families["eventing_handler_latency_seconds"].type == "histogram"
    m = scrape(site)
    stats = client(site, READ).get("/api/v1/functions/fn_ledger/stats").json()
    assert m[("eventing_mutations_seen_total", ("fn_ledger",))] == stats["mutations_seen"] == MUTATIONS
    assert m[("eventing_handler_success_total", ("fn_ledger", "on_update"))] == stats["on_update_success"]
    assert m[("eventing_backlog_mutations", ("fn_ledger",))] == 0
    assert m[("eventing_checkpoint_age_seconds", ("fn_ledger",))] == 0
    # Every handled mutation is in the latency histogram; buckets are cumulative.
    assert m[("eventing_handler_latency_seconds_count", ("fn_ledger",))] == MUTATIONS
    assert m[("eventing_handler_latency_seconds_bucket", ("fn_ledger", "+Inf"))] == MUTATIONS
    assert m[("eventing_handler_latency_seconds_sum", ("fn_ledger",))] > 0
    assert m[("eventing_function_state", ("fn_ledger", "deployed"))] == 1
    assert m[("eventing_rebalance_progress_ratio", ())] == 1.0
    assert m[("eventing_open_windows", ("fn_windowed",))] == 0
    assert m[("eventing_late_rows_total", ("fn_windowed",))] == 0
    assert ("eventing_open_windows", ("fn_ledger",)) not in m  # window metrics only for windowed functions
    report = client(site, READ).get("/api/v1/functions/fn_windowed/windows").json()
    assert report["results"] == [] and report["window"]["size"] == "1m"


def test_eventing_run_serve_answers_from_inside_the_running_service(tmp_path):
    import os
    import signal
    import time

    data_dir = str(tmp_path / "data")
    load_source(data_dir, 100, 500, seed=3)
    deploy_function(data_dir, ledger_definition("fn_served", "src", "ledger"))
    port = free_port()
    env = {**os.environ, "EVENTING_ADMIN_TOKEN": ADMIN, "EVENTING_READ_TOKEN": READ}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventing",
            "--data-dir",
            data_dir,
            "run",
            "--executor",
            "in-process",
            "--quiet",
            "--serve",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        app = None
        while time.monotonic() < deadline:
            try:
                app = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/status/fn_served",
                    headers={"Authorization": f"Bearer {READ}"},
                ).json()["app"]
            except httpx.HTTPError:
                app = None
            if app and app["vbuckets_leased"] == 1024 and app["num_deployed_nodes"] == 1:
                break
            time.sleep(0.2)
        assert app and app["vbuckets_leased"] == 1024, app
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (
        f"eventing console and API on http://127.0.0.1:{port}/ (credentials required: the admin token, "
        "the read-only token)"
    ) in err


def test_serve_reads_its_tokens_from_files_and_no_token_is_in_its_environment(tmp_path):
    """Token files keep the tokens out of the environment the kernel shows (/proc/PID/environ); a token
    given by variable is removed from the environment `serve` passes on, but the kernel still shows it."""
    import os

    from eventing.testing import wait_for

    admin_file, read_file = tmp_path / "admin.token", tmp_path / "read.token"
    admin_file.write_text(ADMIN + "\n")
    read_file.write_text(READ + "\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTING_")}
    env["EVENTING_READ_TOKEN_FILE"] = str(read_file)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventing",
            "--data-dir",
            str(tmp_path / "data"),
            "serve",
            "--port",
            str(port),
            "--admin-token-file",
            str(admin_file),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}/api/v1/status"
        r = wait_for(
            lambda: httpx.get(base, headers={"Authorization": f"Bearer {READ}"}),
            "the server answers",
            60,
            retry_on=(httpx.HTTPError,),
        )
        assert r.status_code == 200
        secrets = f"http://127.0.0.1:{port}/api/v1/export?secrets=true"  # the admin token's alone
        assert httpx.get(secrets, headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        assert httpx.get(secrets, headers={"Authorization": f"Bearer {READ}"}).status_code == 403
        assert httpx.get(base).status_code == 401
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert ADMIN.encode() not in environ and READ.encode() not in environ
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
