"""What commands print, read as a user reads it: counts of one are singular ("1 document", "the row before it
is"), an in-process run says nothing of Ray (it starts none), and a run's handled mutations are explained when
some of them were passed over without a handler call (a 4-document flush of a collection reported as "7
mutations handled": the other 3 were the function's own deletes in another collection of its source
bucket)."""

from __future__ import annotations

import json
from pathlib import Path

from starlette.testclient import TestClient

from eventing.cli.app import main
from eventing.http.app import build_app
from eventing.http.auth import ServerConfig
from eventing.storage.factory import create_bucket
from eventing.storage.keyspace import create_collection, open_keyspace

HANDLER = """
def on_update(doc, meta):
    totals[meta.id] = {"n": doc["n"]}


def on_delete(meta, options):
    del totals[meta.id]
"""


def cli(capsys, data_dir: str, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["--data-dir", data_dir, *argv])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def orders_and_totals(data_dir: str, tmp_path: Path) -> None:
    create_bucket(data_dir, "shop").close()
    create_collection(data_dir, "shop.sales.orders")
    create_collection(data_dir, "shop.sales.totals")
    with open_keyspace(data_dir, "shop.sales.orders") as orders:
        for i in range(4):
            orders.upsert(f"order::{i}", {"n": i})
    (tmp_path / "fn_orders.py").write_text(HANDLER)
    (tmp_path / "fn_orders.json").write_text(
        json.dumps(
            {
                "name": "fn_orders",
                "source_bucket": "shop",
                "source_scope": "sales",
                "source_collection": "orders",
                "handler": "fn_orders.py",
                "bindings": [
                    {
                        "alias": "totals",
                        "bucket": "shop",
                        "scope": "sales",
                        "collection": "totals",
                        "access": "rw",
                    }
                ],
            }
        )
    )


def test_a_run_says_what_its_handled_mutations_were(data_dir, tmp_path, capsys):
    orders_and_totals(data_dir, tmp_path)
    assert cli(capsys, data_dir, "deploy", str(tmp_path / "fn_orders.json"))[0] == 0
    status, out = cli(capsys, data_dir, "run", "--until-caught-up", "--executor", "in-process")
    assert status == 0, out
    assert out.splitlines()[0].startswith("fn_orders: 4 mutations handled")
    assert "passed over" not in out  # all 4 called the handler
    assert cli(capsys, data_dir, "bucket", "flush", "shop.sales.orders")[0] == 0
    status, out = cli(capsys, data_dir, "run", "--until-caught-up", "--executor", "in-process")
    assert status == 0, out
    lines = out.splitlines()
    # the 4 deletes, and the 4 totals the first run's handler wrote after that run's end point (mutations of
    # the source bucket, in its other collection)
    assert lines[0].startswith("fn_orders: 8 mutations handled")
    assert lines[1] == (
        "  4 of them called the handler; the others were passed over: 4 of other collections of "
        "the source bucket"
    )
    # An in-process run starts no Ray: its start-up line says nothing of it.
    assert lines[2].startswith("start-up: workers up ") and "Ray" not in out
    status, out = cli(capsys, data_dir, "run", "--until-caught-up", "--executor", "in-process", "--json")
    done = json.loads(out)["functions"]["fn_orders"]
    assert done["handled"] == 4  # the totals the flush's deletes deleted: passed over
    assert done["of_them"]["handler_calls"] == 0 and done["of_them"]["collection_filtered"] == 4


def test_counts_of_one_are_singular(data_dir, tmp_path, capsys):
    create_bucket(data_dir, "shop").close()
    create_collection(data_dir, "shop.sales.orders")
    with open_keyspace(data_dir, "shop.sales.orders") as orders:
        orders.upsert("order::1", {"n": 1})
    status, out = cli(capsys, data_dir, "collection", "drop", "shop.sales.orders")
    assert status == 0 and "dropped collection 'shop.sales.orders' with 1 document\n" in out
    create_bucket(data_dir, "one").close()
    with open_keyspace(data_dir, "one") as one:
        one.upsert("k", {"n": 1})
    status, out = cli(capsys, data_dir, "bucket", "export", "one", "-o", str(tmp_path / "one.jsonl"))
    assert status == 0 and "exported 1 document of 'one'" in out
    status, out = cli(capsys, data_dir, "bucket", "flush", "one")
    assert status == 0 and "deleted 1 document, 0 tombstones and a log of 1 mutation;" in out
    create_bucket(data_dir, "two").close()
    with open_keyspace(data_dir, "two") as two:
        two.upsert("k", {"n": 1})
        two.delete("k")
    status, out = cli(capsys, data_dir, "bucket", "drop", "two")
    assert status == 0 and "with 0 documents, 1 tombstone and a log of 2 mutations" in out
    client = TestClient(build_app(ServerConfig(data_dir)), base_url="http://127.0.0.1:8096")
    create_bucket(data_dir, "src").close()
    answer = client.post("/api/v1/keyspaces/src/load", content=b'{"key": "a", "doc": {}}\nnot json\n')
    assert answer.status_code == 400, answer.text
    assert "; the row before it is committed, none after" in answer.json()["error"]


FAILING_ONCE = """
def on_update(doc, meta):
    if doc.get("bad") and not FIXED:
        raise ValueError("bad doc")
    out[meta.id] = doc
"""


def test_one_replayed_purged_or_debugged_write_and_a_first_bad_load_line_are_said_singular(
    data_dir, tmp_path, capsys
):
    for name in ("src", "out"):
        create_bucket(data_dir, name).close()
    (tmp_path / "fn_d.py").write_text(FAILING_ONCE)
    definition = {
        "name": "fn_d",
        "source_bucket": "src",
        "handler": "fn_d.py",
        "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        "constants": {"FIXED": False},
    }
    (tmp_path / "fn_d.json").write_text(json.dumps(definition))
    with open_keyspace(data_dir, "src") as src:
        src.upsert("k1", {"bad": True})
    assert cli(capsys, data_dir, "deploy", str(tmp_path / "fn_d.json"))[0] == 0
    assert cli(capsys, data_dir, "run", "--until-caught-up", "--executor", "in-process")[0] == 3
    assert cli(capsys, data_dir, "pause", "fn_d")[0] == 0
    (tmp_path / "fn_d.json").write_text(json.dumps({**definition, "constants": {"FIXED": True}}))
    assert cli(capsys, data_dir, "create", str(tmp_path / "fn_d.json"))[0] == 0
    status, out = cli(capsys, data_dir, "dlq", "replay", "fn_d", "--all")
    assert status == 0 and "replayed 1 of 1 dead letter of 'fn_d' (1 write applied); 0 still failing" in out
    status, out = cli(capsys, data_dir, "dlq", "purge", "fn_d", "--replayed")
    assert status == 0 and "purged 1 dead letter of 'fn_d'" in out
    assert cli(capsys, data_dir, "resume", "fn_d")[0] == 0
    with open_keyspace(data_dir, "src") as src:
        src.upsert("k2", {"n": 2})
    status, out = cli(capsys, data_dir, "debug", "fn_d", "--key", "k2", "--trace")
    assert status == 0 and "\n1 write shown, not applied (--apply writes it)\n" in out, out
    status, out = cli(capsys, data_dir, "debug", "fn_d", "--key", "k2", "--apply")
    assert (
        "\n1 write applied directly (origin 'fn_d'); the worker still handles this mutation, so it may" in out
    )
    client = TestClient(build_app(ServerConfig(data_dir)), base_url="http://127.0.0.1:8096")
    answer = client.post("/api/v1/keyspaces/src/load", content=b"not json\n")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].endswith("; nothing is committed") and "0 rows" not in answer.text


def test_a_window_only_run_accounts_for_every_mutation(data_dir, tmp_path, capsys):
    """A window-only function calls no handler: its updates go to the windows as rows, and the summary says
    so instead of leaving them out ("0 of them called the handler; the others were passed over: 2 ...")."""
    create_bucket(data_dir, "sales").close()
    with open_keyspace(data_dir, "sales") as sales:
        for i in range(8):
            sales.upsert(f"sale::{i}", {"ts": 1_700_000_000_000 + i * 1000, "amount": i})
        sales.delete("sale::0")
        sales.delete("sale::1")
    definition = {
        "name": "fn_window_only",
        "source_bucket": "sales",
        "handler": "fn_window_only.py",
        "window": {
            "kind": "tumbling",
            "size": "1m",
            "boundary": "event_time",
            "time_field": "ts",
            "aggregates": [{"op": "count"}, {"op": "sum", "field": "amount"}],
        },
    }
    (tmp_path / "fn_window_only.json").write_text(json.dumps(definition))
    (tmp_path / "fn_window_only.py").write_text('"""No handler: the window does the work."""\n')
    assert cli(capsys, data_dir, "deploy", str(tmp_path / "fn_window_only.json"))[0] == 0
    status, out = cli(capsys, data_dir, "run", "--until-caught-up", "--executor", "in-process")
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("fn_window_only: 10 mutations handled")
    assert lines[1] == (
        "  8 of them went to its windows as rows (no handler call); the others were passed over: "
        "2 with no handler for their operation"
    )


def test_the_line_names_window_rows_beside_handler_calls():
    from eventing.cli.run import _of_them_line

    assert _of_them_line({"handler_calls": 5, "window_rows": 5}) is None  # every one called the handler
    assert _of_them_line({"handler_calls": 5, "window_rows": 4, "no_handler": 0, "filtered": 2}) == (
        "5 of them called the handler (4 of those also went to its windows as rows); the others were "
        "passed over: 2 not matching the function's filter"
    )
    assert _of_them_line({"handler_calls": 0, "window_rows": 3}) == (
        "3 of them went to its windows as rows (no handler call)"
    )


def test_run_json_prints_only_its_json_object_on_standard_output(capsys, data_dir, tmp_path):
    from eventing.core.definition import FunctionDefinition
    from eventing.storage.bucket import LocalBucket
    from eventing.testing import deploy_function

    LocalBucket.create(data_dir, "src").upsert("k", {"n": 1})
    chatty = "def on_update(doc, meta):\n    print('a line the handler prints')\n"
    deploy_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn_chatty", "source_bucket": "src"}), chatty
    )
    capsys.readouterr()
    status = main(["--data-dir", data_dir, "run", "--until-caught-up", "--executor", "in-process", "--json"])
    captured = capsys.readouterr()
    assert status == 0
    assert json.loads(captured.out)["functions"]["fn_chatty"]["handled"] == 1  # nothing before or after it
    assert "a line the handler prints" in captured.err
