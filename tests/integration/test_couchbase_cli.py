"""Couchbase's own command-line tool against `eventing serve`: `couchbase-cli eventing-function-setup` finds
the eventing service through the cluster manager's documents (/pools, /pools/default/nodeServices) and
imports, lists, exports, deploys, pauses, resumes, undeploys and deletes functions, each in the namespace
its --bucket and --scope name (a function imported with function_scope shop/_default is `shop._default.audit`
here), and reads a repeated deploy or undeploy as "already in that state".

The tool is Couchbase's source (github.com/couchbase/couchbase-cli), found through $EVENTING_COUCHBASE_CLI
(a checkout; it needs the `requests`, `pem` and `cryptography` packages); the test is skipped only when the
variable is not set."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from eventing.http.auth import ServerConfig
from eventing.http.server import start_in_thread
from eventing.security.users import hash_password
from eventing.storage.factory import create_bucket
from metadata.factory import open_store

pytestmark = pytest.mark.integration

CHECKOUT = os.environ.get("EVENTING_COUCHBASE_CLI", "")
FUNCTION = {
    "appname": "audit",
    "appcode": "function OnUpdate(doc, meta) { log('seen', meta.id); }",
    "depcfg": {
        "source_bucket": "shop",
        "source_scope": "_default",
        "source_collection": "_default",
        "metadata_bucket": "meta",
        "metadata_scope": "_default",
        "metadata_collection": "_default",
        "buckets": [],
    },
    "settings": {"dcp_stream_boundary": "everything", "deployment_status": False, "processing_status": False},
    "version": "evt-7.6.0-0000-ee",
    "function_scope": {"bucket": "shop", "scope": "_default"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    if not CHECKOUT:
        pytest.skip("set EVENTING_COUCHBASE_CLI to a checkout of couchbase/couchbase-cli")
    assert (Path(CHECKOUT) / "couchbase-cli").is_file(), (
        f"$EVENTING_COUCHBASE_CLI={CHECKOUT} has no couchbase-cli"
    )
    data_dir = str(tmp_path_factory.mktemp("cli") / "data")
    create_bucket(data_dir, "shop").close()
    with open_store(data_dir) as store:
        store.put_user("Administrator", hash_password("admin-password"), ["admin"])
    config = ServerConfig(data_dir, port=free_port())
    server = start_in_thread(config)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "couchbase-cli",
                "eventing-function-setup",
                "-c",
                f"http://127.0.0.1:{config.port}",
                "-u",
                "Administrator",
                "-p",
                "admin-password",
                *args,
            ],
            cwd=CHECKOUT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    yield run, data_dir, tmp_path_factory.mktemp("files")
    server.should_exit = True


def state(data_dir: str, name: str) -> str:
    with open_store(data_dir) as store:
        return store.get_function(name).state.value


def test_import_and_the_lifecycle(cli):
    run, data_dir, files = cli
    source = files / "in.json"
    source.write_text(json.dumps([FUNCTION]))
    done = run("--import", "--file", str(source))
    assert done.returncode == 0 and "SUCCESS: Events imported" in done.stdout, done.stdout + done.stderr
    assert state(data_dir, "shop._default.audit") == "undeployed"
    with open_store(data_dir) as store:
        assert (
            store.get_function("shop._default.audit").definition["metadata_keyspace"]
            == "meta._default._default"
        )
    for flag, expected in (
        ("--deploy", "deployed"),
        ("--pause", "paused"),
        ("--resume", "deployed"),
        ("--undeploy", "undeployed"),
    ):
        done = run(flag, "--name", "audit", "--bucket", "shop", "--scope", "_default")
        assert done.returncode == 0 and "SUCCESS" in done.stdout, (flag, done.stdout + done.stderr)
        assert state(data_dir, "shop._default.audit") == expected, flag
    done = run("--delete", "--name", "audit", "--bucket", "shop", "--scope", "_default")
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    with open_store(data_dir) as store:
        assert [r.name for r in store.list_functions()] == []


def in_scope(scope: str) -> dict:
    return {**FUNCTION, "function_scope": {"bucket": "shop", "scope": scope}}


def test_list_export_namespaces_and_repeated_lifecycle(cli):
    run, data_dir, files = cli
    source = files / "two.json"
    source.write_text(json.dumps([in_scope("_default"), in_scope("inventory")]))  # one name, two namespaces
    done = run("--import", "--file", str(source))
    assert done.returncode == 0, done.stdout + done.stderr
    with open_store(data_dir) as store:
        assert sorted(r.name for r in store.list_functions()) == [
            "shop._default.audit",
            "shop.inventory.audit",
        ]

    listed = run("--list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "shop/_default/audit\n Status: undeployed\n Source: shop._default._default" in listed.stdout
    assert "shop/inventory/audit\n Status: undeployed" in listed.stdout

    one = files / "one.json"
    done = run("--export", "--name", "audit", "--bucket", "shop", "--scope", "inventory", "--file", str(one))
    assert done.returncode == 0 and "SUCCESS: Function exported to" in done.stdout, done.stdout + done.stderr
    exported = json.loads(one.read_text())
    assert [(f["appname"], f["function_scope"]) for f in exported] == [
        ("audit", {"bucket": "shop", "scope": "inventory"})
    ]
    assert (
        exported[0]["appcode"] == FUNCTION["appcode"] and exported[0]["depcfg"]["metadata_bucket"] == "meta"
    )
    every = files / "all.json"
    done = run("--export-all", "--file", str(every))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(f["function_scope"]["scope"] for f in json.loads(every.read_text())) == [
        "_default",
        "inventory",
    ]

    at = ("--name", "audit", "--bucket", "shop", "--scope", "_default")
    done = run("--deploy", *at)
    assert done.returncode == 0 and "Request to deploy the function was accepted" in done.stdout, done.stdout
    assert (state(data_dir, "shop._default.audit"), state(data_dir, "shop.inventory.audit")) == (
        "deployed",
        "undeployed",
    )
    again = run("--deploy", *at)
    assert again.returncode == 0 and "Function is already in deployed state" in again.stdout, (
        again.stdout + again.stderr
    )
    assert run("--undeploy", *at).returncode == 0
    again = run("--undeploy", *at)
    assert again.returncode == 0 and "Function is already in undeployed state" in again.stdout, (
        again.stdout + again.stderr
    )

    wrong = run("--deploy", "--name", "audit", "--bucket", "shop", "--scope", "nope")
    assert wrong.returncode != 0 and 'Function "shop/nope/audit" does not exist' in wrong.stdout, wrong.stdout
    assert state(data_dir, "shop._default.audit") == "undeployed"
    done = run("--delete", "--name", "audit", "--bucket", "shop", "--scope", "inventory")
    assert done.returncode == 0, done.stdout + done.stderr
    with open_store(data_dir) as store:
        assert [r.name for r in store.list_functions()] == ["shop._default.audit"]
