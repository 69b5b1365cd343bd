"""The `eventing` command as a user runs it: exit codes, one-line errors naming the fix, --json output."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from eventing.cli import main
from functions import FUNCTIONS_DIR


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def json_of(capsys, *argv: str):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def dd(data_dir):
    return ["--data-dir", data_dir]


def setup_demo_buckets(capsys, dd, mutations: int = 2000):
    for name in ("customers", "emails", "scores"):
        assert run_cli(capsys, "bucket", "create", name, *dd)[0] == 0
    assert (
        run_cli(
            capsys, "bucket", "load", "customers", "--documents", "200", "--mutations", str(mutations), *dd
        )[0]
        == 0
    )


def test_bucket_load_is_deterministic_with_a_seed(capsys, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for d in (a, b):
        run_cli(capsys, "bucket", "create", "c", "--data-dir", d)
        run_cli(
            capsys,
            "bucket",
            "load",
            "c",
            "--documents",
            "50",
            "--mutations",
            "400",
            "--seed",
            "9",
            "--data-dir",
            d,
        )
    docs_a = json_of(capsys, "bucket", "get", "c", "customer::07", "--data-dir", a)
    docs_b = json_of(capsys, "bucket", "get", "c", "customer::07", "--data-dir", b)
    assert docs_a["doc"] == docs_b["doc"]
    info = json_of(capsys, "bucket", "info", "c", "--data-dir", a)
    assert info["mutations"] == 400


def test_bucket_load_imports_json_lines_and_reports_bad_lines(capsys, dd, tmp_path):
    run_cli(capsys, "bucket", "create", "c", *dd)
    lines = tmp_path / "in.jsonl"
    lines.write_bytes(
        b'{"key": "a", "doc": {"x": 1}}\n'
        b'{"key": "b", "doc": [1]}\n'
        b'{"key": "", "doc": {"x": 1}}\n'
        b"not json\n"
        b'{"key": "\xff", "doc": {}}\n'
        b'{"key": "a", "op": "delete"}\n' + b'{"key": "' + b"k" * 251 + b'", "doc": {}}\n'
    )
    code, out, err = run_cli(capsys, "bucket", "load", "c", "--file", str(lines), *dd)
    assert code == 1  # some lines were rejected: say so in the exit code
    assert "line 3: key is empty" in err
    assert "line 4: not valid JSON" in err
    assert "line 5: not UTF-8" in err
    assert "line 7:" in err and "251 bytes" in err
    info = json_of(capsys, "bucket", "info", "c", *dd)
    # line 2's array is loaded too (its JSON text), as `bucket upsert` takes it
    assert info["mutations"] == 3 and info["tombstones"] == 1


def test_upsert_get_delete_roundtrip(capsys, dd):
    run_cli(capsys, "bucket", "create", "c", *dd)
    assert run_cli(capsys, "bucket", "upsert", "c", "k1", '{"a": 1}', *dd)[0] == 0
    assert json_of(capsys, "bucket", "get", "c", "k1", *dd)["doc"] == {"a": 1}
    assert run_cli(capsys, "bucket", "delete", "c", "k1", *dd)[0] == 0
    code, _, err = run_cli(capsys, "bucket", "get", "c", "k1", *dd)
    assert code == 2 and "does not exist" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bucket", "upsert", "c", "k", "{bad json"], "not valid JSON"),
        (["bucket", "upsert", "c", "", "{}"], "key is empty"),
        (["bucket", "upsert", "c", "x" * 251, "{}"], "the limit is 250 bytes"),
        (["bucket", "get", "nope", "k"], "unknown bucket 'nope'"),
        (["deploy", "fn_missing"], "unknown function 'fn_missing'"),
        (["stats", "fn_missing"], "no eventing metadata"),
    ],
)
def test_user_mistakes_get_one_line_errors_without_tracebacks(capsys, dd, argv, message):
    run_cli(capsys, "bucket", "create", "c", *dd)
    code, out, err = run_cli(capsys, *argv, *dd)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_lifecycle_through_the_cli(capsys, dd, tmp_path):
    setup_demo_buckets(capsys, dd)
    assert json_of(capsys, "deploy", str(FUNCTIONS_DIR / "fn_email.json"), *dd)["state"] == "deployed"
    code, _, err = run_cli(capsys, "deploy", "fn_email", *dd)
    assert code == 2 and "it is deployed; undeploy it first" in err
    assert json_of(capsys, "pause", "fn_email", *dd)["state"] == "paused"
    code, _, err = run_cli(capsys, "pause", "fn_email", *dd)
    assert code == 2 and "only a deployed function can be paused" in err
    assert json_of(capsys, "resume", "fn_email", *dd)["state"] == "deployed"
    code, _, err = run_cli(capsys, "delete", "fn_email", *dd)
    assert code == 2 and "undeploy it first" in err
    exported = tmp_path / "fn_email.export.json"
    assert run_cli(capsys, "export", "fn_email", "-o", str(exported), *dd)[0] == 0
    assert json_of(capsys, "undeploy", "fn_email", *dd)["state"] == "undeployed"
    assert run_cli(capsys, "delete", "fn_email", *dd)[0] == 0
    assert json_of(capsys, "list", *dd) == []
    imported = json_of(capsys, "import", str(exported), *dd)
    assert imported[0]["name"] == "fn_email" and imported[0]["state"] == "undeployed"
    data = json.loads(exported.read_text())
    assert "def on_update" in data["handler_source"] and data["worker_count"] == 4


def test_run_until_caught_up_then_stats_and_vbmap(capsys, dd):
    setup_demo_buckets(capsys, dd)
    run_cli(capsys, "deploy", str(FUNCTIONS_DIR / "fn_email.json"), *dd)
    run_cli(capsys, "deploy", str(FUNCTIONS_DIR / "fn_score.json"), *dd)
    result = json_of(capsys, "run", "--until-caught-up", "--executor", "in-process", *dd)
    assert result["functions"]["fn_email"]["handled"] == 2000
    assert result["functions"]["fn_score"]["handled"] == 2000
    stats = json_of(capsys, "stats", "fn_email", *dd)
    assert stats["mutations_seen"] == 2000 and stats["checkpoint_lag"] == 0
    assert stats["on_update_success"] + stats["on_delete_success"] == 2000
    vbmap = json_of(capsys, "vbmap", "fn_score", *dd)
    assert [w["vbuckets"] for w in vbmap["workers"]] == [342, 341, 341]
    assert [w["ranges"] for w in vbmap["workers"]] == ["0-341", "342-682", "683-1023"]
    code, out, _ = run_cli(capsys, "vbmap", "fn_email", *dd)
    assert code == 0 and "local/w3" in out and "768-1023" in out


def test_a_data_directory_that_is_not_writable_is_named(capsys, tmp_path):
    if os.geteuid() == 0:
        target = "/proc/eventing-cannot-write-here"  # root ignores mode bits; /proc refuses anyone
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
        target = str(locked / "data")
    code, _, err = run_cli(capsys, "bucket", "create", "c", "--data-dir", target)
    assert code == 2 and "is not writable" in err and "--data-dir" in err


def test_environment_variable_sets_the_data_directory(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("EVENTING_DATA_DIR", str(tmp_path / "envdir"))
    assert run_cli(capsys, "bucket", "create", "c")[0] == 0
    assert (tmp_path / "envdir" / "buckets" / "c.sqlite3").exists()


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("bucket", "deploy", "pause", "resume", "undeploy", "run", "vbmap", "stats", "demo"):
        assert command in out


def test_deploy_with_an_unknown_bucket_is_refused_with_the_fix(capsys, dd):
    code, _, err = run_cli(capsys, "deploy", str(FUNCTIONS_DIR / "fn_email.json"), *dd)
    assert code == 2 and "eventing bucket create customers" in err
    assert json_of(capsys, "list", *dd) == []


def test_a_command_loads_only_what_it_uses():
    """Every `eventing` command builds the whole parser; building it loads no engine (the service, workers,
    handler runner), no Ray, Spark or web stack: a command such as `bucket count` starts in ~0.2 s, not ~0.6
    s."""
    code = (
        "import sys; from eventing.cli.app import build_parser; build_parser(); print(' '.join(sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    heavy = (
        "ray",
        "pyspark",
        "uvicorn",
        "starlette",
        "eventing.control.service",
        "eventing.control.lifecycle",
        "eventing.workers",
        "eventing.execution.runner",
        "eventing.ops.stats",
        "eventing.http.server",
    )
    assert [m for m in loaded if any(m == h or m.startswith(h + ".") for h in heavy)] == []


def test_bucket_get_and_upsert_take_documents_that_are_not_objects(tmp_path, capsys):
    """Strings, arrays, numbers and null (as handlers, the Data API and the SDKs write them) and binary
    bytes."""
    dd = ("--data-dir", str(tmp_path / "d"))
    assert run_cli(capsys, "bucket", "create", "c", *dd)[0] == 0
    for text, value in (
        ('"hello"', "hello"),
        ("[1, 2]", [1, 2]),
        ("42", 42),
        ("null", None),
        ('{"a": 1}', {"a": 1}),
    ):
        assert run_cli(capsys, "bucket", "upsert", "c", "k", text, *dd)[0] == 0
        code, out, err = run_cli(capsys, "bucket", "get", "c", "k", *dd)
        assert code == 0 and json.loads(out) == value and "Traceback" not in err
        assert json_of(capsys, "bucket", "get", "c", "k", *dd)["doc"] == value
    from eventing.storage.keyspace import open_keyspace

    with open_keyspace(str(tmp_path / "d"), "c") as coll:
        coll.upsert("bin", b"\xff\x00raw")
        coll.upsert("txt", b"plain text")
    assert json_of(capsys, "bucket", "get", "c", "bin", *dd)["datatype"] == "binary"
    code, out, _ = run_cli(capsys, "bucket", "get", "c", "txt", *dd)
    assert code == 0 and out.strip() == "plain text"
