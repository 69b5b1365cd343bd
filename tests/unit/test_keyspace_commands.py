"""Keyspaces wherever a bucket name is taken: `eventing collection create|list|drop`, the bucket commands on a
collection, the Python API, the REST collection endpoints, verify, rewind, the debugger, windows and
backups of a bucket with collections."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from eventing.api import Eventing
from eventing.cli import main
from eventing.core.definition import FunctionDefinition
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.ops.debugger import DebugSession
from eventing.ops.rewind import rewind
from eventing.ops.verify import verify_function
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.keyspace import create_collection, open_keyspace
from eventing.testing import LEDGER_HANDLER, deploy_function, ledger_definition, read_call_log, wait_for
from metadata.factory import open_store

ORDERS = "shop.sales.orders"
COPY_HANDLER = """
def on_update(doc, meta):
    out[meta.id] = {"n": doc["n"], "from": meta.keyspace["collection_name"]}
"""


def cli(data_dir: str, *words: str) -> int:
    return main([*words, "--data-dir", data_dir])


def cli_json(capsys, data_dir: str, *words: str):
    capsys.readouterr()
    assert cli(data_dir, *words, "--json") == 0
    return json.loads(capsys.readouterr().out)


def _shop(data_dir: str) -> None:
    create_bucket(data_dir, "shop").close()
    create_collection(data_dir, ORDERS)
    with open_keyspace(data_dir, "shop") as default:
        for i in range(3):
            default.upsert(f"k{i}", {"n": 100 + i})  # the same keys in the default collection: kept apart
    with open_keyspace(data_dir, ORDERS) as orders:
        for i in range(5):
            orders.upsert(f"k{i}", {"n": i})


# -- CLI --------------------------------------------------------------------------------------------------


def test_collection_create_list_drop_and_bucket_commands_on_a_collection(data_dir, capsys, tmp_path):
    assert cli(data_dir, "bucket", "create", "shop") == 0
    created = cli_json(capsys, data_dir, "collection", "create", ORDERS)
    assert (created["keyspace"], created["scope"], created["collection"]) == (ORDERS, "sales", "orders")
    assert cli_json(capsys, data_dir, "bucket", "upsert", ORDERS, "o1", '{"total": 3}')["key"] == "o1"
    assert cli_json(capsys, data_dir, "bucket", "get", ORDERS, "o1")["doc"] == {"total": 3}
    assert cli_json(capsys, data_dir, "bucket", "keys", "shop") == []  # not in the default collection
    lines = tmp_path / "more.jsonl"
    lines.write_text('{"key": "o2", "doc": {"total": 5}}\n{"key": "o1", "op": "delete"}\n')
    assert (
        cli_json(capsys, data_dir, "bucket", "load", ORDERS, "--file", str(lines))["mutations_written"] == 2
    )
    assert (
        cli_json(
            capsys,
            data_dir,
            "bucket",
            "load",
            ORDERS,
            "--documents",
            "4",
            "--mutations",
            "6",
            "--prefix",
            "gen",
        )["mutations_written"]
        == 6
    )
    keys = cli_json(capsys, data_dir, "bucket", "keys", ORDERS)
    assert len(keys) == 5 and keys[-1] == "o2" and all(k.startswith("gen") for k in keys[:4])
    assert cli_json(capsys, data_dir, "bucket", "count", ORDERS)["documents"] == 5
    assert cli_json(capsys, data_dir, "bucket", "count", "shop")["documents"] == 0
    assert [
        line["key"] for line in cli_json(capsys, data_dir, "bucket", "scan", ORDERS, "--prefix", "o")
    ] == ["o2"]
    out = tmp_path / "orders.jsonl"
    assert cli_json(capsys, data_dir, "bucket", "export", ORDERS, "-o", str(out))["documents"] == 5
    assert all(not json.loads(line)["key"].startswith("\x01") for line in out.read_text().splitlines())

    listed = cli_json(capsys, data_dir, "collection", "list", "shop")
    assert [(r["keyspace"], r["documents"]) for r in listed] == [("shop", 0), (ORDERS, 5)]

    # flush of a collection: one delete mutation a document; the bucket keeps its identity
    before = open_bucket(data_dir, "shop").stats()
    flushed = cli_json(capsys, data_dir, "bucket", "flush", ORDERS)
    assert flushed["documents"] == 5
    after = open_bucket(data_dir, "shop").stats()
    assert after["mutations"] == before["mutations"] + 5 and after["uuid"] == before["uuid"]
    assert cli_json(capsys, data_dir, "bucket", "count", ORDERS)["documents"] == 0

    assert cli_json(capsys, data_dir, "collection", "drop", ORDERS)["documents"] == 0
    assert cli(data_dir, "bucket", "get", ORDERS, "o2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"eventing collection create {ORDERS}" in err


@pytest.mark.parametrize(
    ("command", "named", "said"),
    [
        (
            "create",
            "shop.sales",
            "'shop.sales' names no collection: a collection is named by three parts, "
            "BUCKET.SCOPE.COLLECTION (for example shop.sales.COLLECTION",
        ),
        ("drop", "shop.sales", "'shop.sales' names no collection"),
        (
            "create",
            "shop",
            "'shop' is bucket 'shop', whose default collection always exists; name a collection as "
            "BUCKET.SCOPE.COLLECTION (for example shop.SCOPE.COLLECTION)",
        ),
        (
            "drop",
            "shop",
            "'shop' is bucket 'shop', whose default collection cannot be dropped (drop the bucket instead)",
        ),
    ],
)
def test_a_name_of_one_or_two_parts_is_said_to_be_a_bucket_or_no_collection(
    data_dir, capsys, command, named, said
):
    create_bucket(data_dir, "shop").close()
    capsys.readouterr()
    assert cli(data_dir, "collection", command, named) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "a bucket's default collection" not in err


def test_dropping_a_collection_undeploys_the_functions_reading_or_binding_it_and_no_other(data_dir, capsys):
    _shop(data_dir)
    create_bucket(data_dir, "results").close()
    create_collection(data_dir, "results.fn.copy")
    copy = {
        "name": "fn_copy",
        "source_bucket": "shop",
        "source_scope": "sales",
        "source_collection": "orders",
        "bindings": [
            {"alias": "out", "bucket": "results", "scope": "fn", "collection": "copy", "access": "rw"}
        ],
    }
    other = {**copy, "name": "fn_other", "bindings": [{"alias": "out", "bucket": "results", "access": "rw"}]}
    deploy_function(data_dir, FunctionDefinition.from_dict(copy), COPY_HANDLER)
    deploy_function(data_dir, FunctionDefinition.from_dict(other), COPY_HANDLER)

    def state(name: str) -> str:
        with open_store(data_dir) as store:
            return store.get_function(name).state.value

    # a binding's collection: its function goes, the one binding another keyspace stays
    capsys.readouterr()
    assert cli(data_dir, "collection", "drop", "results.fn.copy") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "undeployed function 'fn_copy': collection 'results.fn.copy' is its binding 'out' (rw) "
        "(deploy it again once the collection is back)"
    )
    assert out[1].startswith("dropped collection 'results.fn.copy'") and len(out) == 2
    assert state("fn_copy") == "undeployed" and state("fn_other") == "deployed"
    # the source collection: fn_other goes; fn_copy, already undeployed, is only named
    dropped = cli_json(capsys, data_dir, "collection", "drop", ORDERS)
    assert dropped["documents"] == 5
    assert dropped["undeployed_functions"] == [{"function": "fn_other", "role": "source"}]
    assert dropped["named_by_undeployed_functions"] == ["fn_copy"]
    assert state("fn_other") == "undeployed"
    assert cli(data_dir, "collection", "create", "shop.sales.returns") == 0
    assert (
        cli_json(capsys, data_dir, "collection", "drop", "shop.sales.returns")["undeployed_functions"] == []
    )


def test_a_collection_dropped_under_a_running_service_stops_its_function_and_nothing_else_is_lost(
    data_dir, capsys
):
    _shop(data_dir)
    create_collection(data_dir, "shop.sales.returns")
    readers = {"fn_orders": ORDERS, "fn_returns": "shop.sales.returns"}
    for name, keyspace in readers.items():
        _, scope, collection = keyspace.split(".")
        defn = ledger_definition(
            name, "shop", f"ledger_{name}", workers=2, source_scope=scope, source_collection=collection
        )
        deploy_function(data_dir, defn, LEDGER_HANDLER)
    app = Eventing(data_dir, executor="in-process")
    running = app.run(until_caught_up=False)
    try:
        for i in range(40):
            app.upsert("shop.sales.returns", f"r{i}", {"i": i})
        capsys.readouterr()
        assert cli(data_dir, "collection", "drop", ORDERS) == 0
        assert capsys.readouterr().out.startswith(
            f"undeployed function 'fn_orders': collection '{ORDERS}' is its source"
        )
        for i in range(40, 80):
            app.upsert("shop.sales.returns", f"r{i}", {"i": i})
        wait_for(
            lambda: app.verify("fn_returns").handled == 80,
            "fn_returns has handled and checkpointed every write",
        )
        assert running.running
    finally:
        running.stop()
    summary = running.wait(60)
    assert not summary.errors
    report = app.verify("fn_returns")
    assert report.ok and report.handled == report.source_mutations == 80, report.summary()
    with open_store(data_dir) as store:
        assert store.get_function("fn_orders").state.value == "undeployed"


# -- Python API -------------------------------------------------------------------------------------------


def test_python_api_manages_collections_and_takes_keyspaces(data_dir, tmp_path):
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("shop")
    assert app.create_collection(ORDERS) > 0
    assert app.collections("shop") == ["shop", ORDERS]
    app.upsert(ORDERS, "o1", {"total": 1})
    assert app.get(ORDERS, "o1") == {"total": 1} and app.get("shop", "o1") is None
    assert app.load(ORDERS, documents=3, mutations=4, prefix="gen") == 4
    lines = tmp_path / "l.jsonl"
    lines.write_text('{"key": "x1", "doc": {"a": 1}}\n')
    assert app.load_jsonl(ORDERS, lines) == 1
    assert app.count(ORDERS) == 5 and app.count("shop") == 0
    assert "x1" in app.keys(ORDERS)
    app.remove(ORDERS, "o1")
    assert app.drop_collection(ORDERS) == 4
    assert app.collections("shop") == ["shop"]


# -- REST -------------------------------------------------------------------------------------------------

ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"


def _request(data_dir: str, method: str, path: str, token: str) -> httpx.Response:
    app = build_app(ServerConfig(data_dir, admin_token=ADMIN, read_token=READ))

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8096") as client:
            return await client.request(method, path, headers={"Authorization": f"Bearer {token}"})

    return asyncio.run(call())


def test_rest_lists_creates_and_drops_collections_admin_only(data_dir):
    create_bucket(data_dir, "shop").close()
    path = "/api/v1/buckets/shop/scopes/sales/collections/orders"
    assert _request(data_dir, "POST", path, READ).status_code == 403
    r = _request(data_dir, "POST", path, ADMIN)
    assert r.status_code == 201 and r.json()["keyspace"] == ORDERS
    r = _request(data_dir, "POST", path, ADMIN)
    assert r.status_code == 400 and "exists already" in r.json()["error"]
    listed = _request(data_dir, "GET", "/api/v1/buckets/shop/collections", READ)
    assert [c["keyspace"] for c in listed.json()] == ["shop", ORDERS]
    assert _request(data_dir, "GET", "/api/v1/buckets/nope/collections", READ).status_code == 404
    assert _request(data_dir, "DELETE", path, READ).status_code == 403
    assert _request(data_dir, "DELETE", path, ADMIN).json()["documents"] == 0
    r = _request(data_dir, "DELETE", path, ADMIN)
    assert r.status_code == 404
    r = _request(data_dir, "POST", "/api/v1/buckets/shop/scopes/_bad/collections/x", ADMIN)
    assert r.status_code == 400 and "scope name '_bad'" in r.json()["error"]
    spec = _request(data_dir, "GET", "/api/v1/openapi.json", READ).json()
    assert (
        spec["paths"]["/api/v1/buckets/{bucket}/scopes/{scope}/collections/{collection}"]["post"]["x-role"]
        == "admin"
    )


# -- functions sourced from a collection: verify, rewind, debug, windows --------------------------------


def test_verify_counts_only_the_source_collection_and_reads_a_ledger_collection(data_dir, tmp_path):
    _shop(data_dir)
    create_bucket(data_dir, "audit").close()
    create_collection(data_dir, "audit.fn.ledger")
    calls = tmp_path / "calls.log"
    defn = ledger_definition(
        "fn_orders",
        "shop",
        "audit.fn.ledger",
        call_log=str(calls),
        source_scope="sales",
        source_collection="orders",
    )
    deploy_function(data_dir, defn, LEDGER_HANDLER)
    Eventing(data_dir, executor="in-process").run(until_caught_up=True)
    report = verify_function(data_dir, "fn_orders")
    assert report.ok, report.summary()
    assert (report.source_mutations, report.handled, report.collection_filtered) == (5, 5, 3)
    assert report.ledger == "audit.fn.ledger"
    assert verify_function(data_dir, "fn_orders", ledger="audit.fn.ledger").ok
    with open_keyspace(data_dir, "audit") as default:
        assert default.count() == 0  # the ledger went to its collection only

    # A rewind of the collection-sourced function handles that collection's mutations again, and only them.
    first = read_call_log(calls)
    assert sorted(first) == [f"k{i}" for i in range(5)] and all(len(s) == 1 for s in first.values())
    app = Eventing(data_dir, executor="in-process")
    app.pause("fn_orders")
    rewind(data_dir, "fn_orders", to_seqno=0)
    app.resume("fn_orders")
    app.run(until_caught_up=True)
    again = read_call_log(calls)
    assert sorted(again) == sorted(first) and all(len(s) == 2 for s in again.values())
    assert verify_function(data_dir, "fn_orders").ok  # the effect marks kept the effects once


def test_the_debugger_pulls_the_source_collections_mutation_of_a_key(data_dir):
    _shop(data_dir)
    create_bucket(data_dir, "results").close()
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_copy",
            "source_bucket": "shop",
            "source_scope": "sales",
            "source_collection": "orders",
            "bindings": [{"alias": "out", "bucket": "results", "access": "rw"}],
        }
    )
    deploy_function(data_dir, defn, COPY_HANDLER)
    events: list[dict] = []
    session = DebugSession(data_dir, "fn_copy", key="k1", on_event=events.append)
    assert session.run().status == "ok"
    pulled = next(e for e in events if e["event"] == "pulled")["mutation"]
    assert pulled["key"] == "k1"
    call = next(e for e in events if e["event"] == "call")
    assert call["doc"] == {"n": 1}  # the orders document, not the default collection's {"n": 101}
    assert call["meta"]["id"] == "k1" and call["meta"]["keyspace"]["collection_name"] == "orders"
    writes = next(e for e in events if e["event"] == "result")["writes"]
    assert [(w["key"]) for w in writes] == ["k1"]
    with pytest.raises(Exception, match="no pending mutation of key 'k9'"):
        DebugSession(data_dir, "fn_copy", key="k9").run()


def test_a_window_function_sourced_from_a_collection_counts_only_its_rows(data_dir, monkeypatch):
    from eventing.testing.windows import python_aggregator
    from eventing.windows.runtime import host

    monkeypatch.setattr(
        host, "make_aggregator", lambda master=None: python_aggregator
    )  # no Spark in unit tests
    _shop(data_dir)
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_win",
            "source_bucket": "shop",
            "source_scope": "sales",
            "source_collection": "orders",
            "window": {
                "kind": "tumbling",
                "size": "1h",
                "boundary": "processing_time",
                "aggregates": [{"op": "count"}, {"op": "sum", "field": "n"}],
                "sink": {"kind": "sqlite"},
            },
        }
    )
    deploy_function(data_dir, defn, "")
    Eventing(data_dir, executor="in-process").run(until_caught_up=True, close_windows=True)
    results = Eventing(data_dir, executor="in-process").windows("fn_win").to_dict()["results"]
    assert sum(r["count"] for r in results) == 5
    assert (
        sum(r["sum_n"] for r in results) == 0 + 1 + 2 + 3 + 4
    )  # the default collection's 100s are not in it


# -- backup ---------------------------------------------------------------------------------------------


def test_a_backup_with_buckets_restores_collections_and_their_documents(data_dir, tmp_path, capsys):
    _shop(data_dir)
    create_bucket(data_dir, "results").close()
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_copy",
                "source_bucket": "shop",
                "bindings": [{"alias": "out", "bucket": "results", "access": "rw"}],
            }
        ),
        COPY_HANDLER,
    )
    folder = tmp_path / "full"
    assert cli(data_dir, "backup", "--with-buckets", "-o", str(folder)) == 0
    restored = str(tmp_path / "restored")
    assert cli(restored, "restore", str(folder)) == 0
    listed = cli_json(capsys, restored, "collection", "list", "shop")
    assert [(r["keyspace"], r["documents"]) for r in listed] == [("shop", 3), (ORDERS, 5)]
    assert cli_json(capsys, restored, "bucket", "get", ORDERS, "k4")["doc"] == {"n": 4}
