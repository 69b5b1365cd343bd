"""The Python API (`eventing.Eventing`): the same operations as the CLI, driven from Python."""

from __future__ import annotations

import json

import pytest

import eventing
from eventing import Eventing, EventingError, FunctionDefinition, RunSummary, Write
from eventing.api import FunctionStats, RunningService, VBucketMap, WindowReport
from eventing.cli.app import main as cli_main
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.testing import wait_for
from functions import FUNCTIONS_DIR


def test_the_public_names_are_exactly_the_documented_ones():
    assert sorted(eventing.__all__) == [
        "Eventing",
        "EventingError",
        "FunctionDefinition",
        "RunSummary",
        "Write",
        "__version__",
    ]
    for name in eventing.__all__:
        assert getattr(eventing, name) is not None
    with pytest.raises(AttributeError):
        eventing.NoSuchThing  # noqa: B018


def test_a_function_runs_end_to_end_from_python(tmp_path):
    app = Eventing(tmp_path / "data", executor="in-process")
    app.create_bucket("customers")
    app.create_bucket("emails", partitions=4)
    assert app.load("customers", documents=50, mutations=200, seed=3) == 200
    record = app.deploy(FUNCTIONS_DIR / "fn_email.json")
    assert record.state.value == "deployed"

    summary = app.run(until_caught_up=True)
    assert isinstance(summary, RunSummary) and not summary.errors
    stats = app.stats("fn_email")
    assert isinstance(stats, FunctionStats) and stats.function == "fn_email" and stats.state == "deployed"
    assert stats.mutations_seen == 200
    assert stats.on_update_success + stats.on_delete_success <= 200 and not stats.dlq
    assert stats.to_dict()["mutations_seen"] == 200 and stats.to_dict()["timers"]["fired"] == 0
    assert app.bucket("emails").stats()["documents"] > 0 and app.bucket("emails").stats()["partitions"] == 4
    vbmap = app.vbucket_map("fn_email")
    assert isinstance(vbmap, VBucketMap) and sum(w.vbuckets for w in vbmap.workers) == 1024
    assert vbmap.to_dict()["workers"][0] == {
        "worker": vbmap.workers[0].worker,
        "vbuckets": vbmap.workers[0].vbuckets,
        "ranges": vbmap.workers[0].ranges,
        "live": False,
    }

    app.pause("fn_email")
    app.undeploy("fn_email")
    app.delete("fn_email")


def test_a_definition_given_as_data_needs_its_handler_and_writes_go_through_write(tmp_path):
    app = Eventing(tmp_path / "data", executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    defn = FunctionDefinition.from_dict(
        {
            "name": "copy",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )
    with pytest.raises(EventingError, match="handler's source"):
        app.deploy(defn)
    app.deploy(defn, "def on_update(doc, meta):\n    dst[meta.id] = doc\n")
    app.upsert("src", "a", {"x": 1})
    app.remove("src", "a")
    assert app.write("src", [Write("b", OP_UPDATE, encode_document({"x": 2})), Write("c", OP_DELETE)]) == 1
    assert not app.run().errors
    assert app.bucket("dst").get("b") == {"x": 2}
    assert app.bucket("dst").get("a") == {"x": 1}


def test_run_without_until_caught_up_runs_in_the_background_until_stopped(tmp_path):
    app = Eventing(tmp_path / "data", executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    defn = FunctionDefinition.from_dict(
        {
            "name": "copy",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )
    app.deploy(defn, "def on_update(doc, meta):\n    dst[meta.id] = doc\n")
    running = app.run(until_caught_up=False)
    assert isinstance(running, RunningService)
    try:
        app.upsert("src", "a", {"x": 1})  # written while the service runs: it follows new mutations
        wait_for(lambda: app.bucket("dst").get("a") == {"x": 1}, "the running service to copy 'a'", 20)
        with pytest.raises(TimeoutError, match="still running"):
            running.wait(timeout=0.01)
        assert running.running
    finally:
        running.stop()
    summary = running.wait(timeout=30)
    assert isinstance(summary, RunSummary) and not summary.errors and not running.running
    assert summary.functions["copy"].handled == 1
    assert app.stats("copy").on_update_success == 1


def _copy_app(tmp_path, handler="def on_update(doc, meta):\n    dst[meta.id] = doc\n"):
    app = Eventing(tmp_path / "data", executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    defn = FunctionDefinition.from_dict(
        {
            "name": "copy",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )
    app.deploy(defn, handler)
    return app


def test_wait_until_caught_up_returns_once_the_writes_made_before_it_are_handled(tmp_path):
    app = _copy_app(tmp_path)
    running = app.run(until_caught_up=False)
    try:
        for i in range(50):
            app.upsert("src", f"k{i}", {"n": i})
        running.wait_until_caught_up(timeout=30)
        # No polling: every write made before the call has been handled and its effect applied.
        assert app.count("dst") == 50 and app.get("dst", "k49") == {"n": 49}
        assert app.stats("copy").checkpoint_lag == 0
        assert running.running  # it keeps running
        app.upsert("src", "late", {"n": -1})
        running.wait_until_caught_up(timeout=30)
        assert app.get("dst", "late") == {"n": -1}
    finally:
        running.stop()
    summary = running.wait(timeout=30)
    assert summary.functions["copy"].handled == 51 and not summary.errors


def test_wait_until_caught_up_times_out_naming_what_is_behind_and_refuses_a_stopped_service(tmp_path):
    app = _copy_app(tmp_path, "import time\n\ndef on_update(doc, meta):\n    time.sleep(0.2)\n")
    running = app.run(until_caught_up=False)
    try:
        for i in range(20):
            app.upsert("src", f"k{i}", {"n": i})
        with pytest.raises(TimeoutError, match=r"not caught up after 0.1 s; .*copy \d+"):
            running.wait_until_caught_up(timeout=0.1)
    finally:
        running.stop()
    running.wait(timeout=60)
    app.upsert("src", "after", {"n": 0})
    with pytest.raises(EventingError, match="stopped before its functions caught up"):
        running.wait_until_caught_up(timeout=5)


def test_run_in_the_background_hands_a_start_failure_to_wait(tmp_path):
    app = Eventing(tmp_path / "data", executor="in-process")
    first = app.run(until_caught_up=False)
    try:
        # The first holds the leader lease before the second starts (else the second may take it first).
        wait_for(
            lambda: first._service.summary.leadership.get("role") == "leader", "the first service leads", 30
        )
        second = app.run(until_caught_up=False)
        with pytest.raises(EventingError, match="another eventing service"):
            second.wait(timeout=30)
    finally:
        first.stop()
    assert not first.wait(timeout=30).errors


def test_load_jsonl_imports_a_file_as_bucket_load_file_does(tmp_path, capsys):
    lines = [
        {"key": "a", "doc": {"n": 1}},
        {"key": "b", "doc": {"n": 2}, "expiry": 0},
        {"key": "a", "op": "delete"},
        {"key": "missing", "op": "delete"},
    ]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    app = Eventing(tmp_path / "api", executor="in-process")
    app.create_bucket("b")
    assert app.load_jsonl("b", path) == 3  # the delete of a missing document logs nothing
    assert app.bucket("b").get("b") == {"n": 2} and app.bucket("b").get("a") is None

    cli_dir = tmp_path / "cli"
    assert cli_main(["--data-dir", str(cli_dir), "bucket", "create", "b"]) == 0
    capsys.readouterr()
    assert cli_main(["--data-dir", str(cli_dir), "--json", "bucket", "load", "b", "--file", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["mutations_written"] == 3
    cli_bucket = Eventing(cli_dir).bucket("b")
    assert cli_bucket.stats()["mutations"] == app.bucket("b").stats()["mutations"]


def test_load_jsonl_names_a_bad_line_and_loads_the_others(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"key": "a", "doc": {"n": 1}}\nnot json\n{"key": "b", "doc": {"n": 2}}\n')
    app = Eventing(tmp_path / "data", executor="in-process")
    app.create_bucket("b")
    with pytest.raises(EventingError, match="line 2: not valid JSON"):
        app.load_jsonl("b", path)
    assert app.bucket("b").get("a") == {"n": 1} and app.bucket("b").get("b") == {"n": 2}
    rejected: list[str] = []
    assert app.load_jsonl("b", path, rejected=rejected) == 2
    assert rejected == [rejected[0]] and rejected[0].startswith("line 2: not valid JSON")


def test_windows_returns_a_typed_report(tmp_path):
    app = Eventing(tmp_path / "data", executor="in-process")
    app.create_bucket("customers")
    app.deploy(FUNCTIONS_DIR / "fn_sales_per_minute.json")
    report = app.windows("fn_sales_per_minute")
    assert isinstance(report, WindowReport) and report.function == "fn_sales_per_minute"
    assert report.results == () and report.windows_emitted == 0
    assert report.to_dict()["function"] == "fn_sales_per_minute" and report.to_dict()["results"] == []
    assert list(report.group_by) == report.to_dict()["group_by"]
