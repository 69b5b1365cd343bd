"""Everyday commands: browsing and emptying buckets, the per-vBucket view of a function, rewinding its
checkpoints, live stats, and backing up the metadata store. Each through `eventing.cli.main` as a user
runs it, and the store-level logic underneath directly."""

from __future__ import annotations

import json

import pytest

from eventing.cli import main
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.ops import buckets as bucket_ops
from eventing.runtime import lifecycle
from eventing.runtime.executor import InProcessExecutor
from eventing.runtime.service import EventingService
from eventing.storage.bucket import LocalBucket, Write
from eventing.storage.metadata import open_metadata
from eventing.testing import deploy_function, ledger_definition, load_source


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def json_of(capsys, *argv: str):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def run_until_caught_up(data_dir: str):
    return EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()


@pytest.fixture
def dd(data_dir):
    return ["--data-dir", data_dir]


@pytest.fixture
def small_bucket(data_dir) -> LocalBucket:
    bucket = LocalBucket.create(data_dir, "src")
    for key, n in [("b::2", 2), ("a::1", 1), ("a::3", 3), ("c::4", 4), ("a::2", 2)]:
        bucket.upsert(key, {"n": n})
    bucket.delete("c::4")
    bucket.upsert("a::9", {"n": 9}, expiry=4_000_000_000)
    return bucket


# -- buckets: keys, scan, export, count --------------------------------------------------------------------


def test_keys_come_in_key_order_filtered_by_prefix_and_limit(small_bucket):
    assert small_bucket.keys() == ["a::1", "a::2", "a::3", "a::9", "b::2"]
    assert small_bucket.keys("a::") == ["a::1", "a::2", "a::3", "a::9"]
    assert small_bucket.keys("a::", 2) == ["a::1", "a::2"]
    assert small_bucket.keys("zz") == []
    assert small_bucket.count() == 5  # the deleted document is a tombstone, not counted


def test_scan_pages_through_a_bucket_larger_than_one_batch(data_dir):
    bucket = LocalBucket.create(data_dir, "big")
    bucket.write([Write(f"k{i:05d}", OP_UPDATE, encode_document({"n": i})) for i in range(2500)])
    keys = [k for k, _, _ in bucket.scan()]
    assert keys == sorted(keys) and len(keys) == 2500
    assert [k for k, _, _ in bucket.scan("k01", 150)] == [f"k{i:05d}" for i in range(1000, 1150)]


def test_bucket_keys_and_count_commands(capsys, dd, small_bucket):
    code, out, _ = run_cli(capsys, "bucket", "keys", "src", "--prefix", "a::", "--limit", "3", *dd)
    assert code == 0 and out.split() == ["a::1", "a::2", "a::3"]
    assert json_of(capsys, "bucket", "keys", "src", *dd) == ["a::1", "a::2", "a::3", "a::9", "b::2"]
    code, out, _ = run_cli(capsys, "bucket", "count", "src", *dd)
    assert (code, out) == (0, "5\n")
    assert json_of(capsys, "bucket", "count", "src", *dd) == {"bucket": "src", "documents": 5}


def test_bucket_scan_prints_json_lines_with_key_doc_and_meta(capsys, dd, small_bucket):
    code, out, _ = run_cli(capsys, "bucket", "scan", "src", "--prefix", "a::", *dd)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [x["key"] for x in lines] == ["a::1", "a::2", "a::3", "a::9"]
    assert lines[0]["doc"] == {"n": 1}
    assert set(lines[0]["meta"]) == {"vb", "seqno", "cas", "expiry", "flags"}
    assert lines[3]["expiry"] == 4_000_000_000
    rows = json_of(capsys, "bucket", "scan", "src", "--limit", "2", *dd)
    assert [r["key"] for r in rows] == ["a::1", "a::2"]


def test_an_export_loads_back_into_an_equal_bucket(capsys, dd, small_bucket, tmp_path):
    out_file = tmp_path / "src.jsonl"
    code, out, _ = run_cli(capsys, "bucket", "export", "src", "-o", str(out_file), *dd)
    assert code == 0 and "exported 5 documents" in out
    assert run_cli(capsys, "bucket", "create", "copy", *dd)[0] == 0
    code, _, err = run_cli(capsys, "bucket", "load", "copy", "--file", str(out_file), *dd)
    assert code == 0, err
    original = json_of(capsys, "bucket", "scan", "src", *dd)
    copied = json_of(capsys, "bucket", "scan", "copy", *dd)
    assert [(r["key"], r["doc"], r["meta"]["expiry"]) for r in copied] == [
        (r["key"], r["doc"], r["meta"]["expiry"]) for r in original
    ]
    assert json_of(capsys, "bucket", "export", "src", "-o", str(out_file), *dd)["documents"] == 5


@pytest.mark.parametrize("argv", [["keys", "src", "--limit", "0"], ["scan", "src", "--limit", "-3"]])
def test_a_limit_below_one_is_refused_in_one_line(capsys, dd, small_bucket, argv):
    with pytest.raises(SystemExit) as caught:
        main(["bucket", *argv, *dd])
    assert caught.value.code == 2
    assert "must be a whole number of at least 1" in capsys.readouterr().err


def test_browsing_an_unknown_bucket_names_the_fix(capsys, dd):
    code, _, err = run_cli(capsys, "bucket", "keys", "nope", *dd)
    assert code == 2 and err.startswith("error: unknown bucket 'nope'") and "eventing bucket create nope" in err


def test_exporting_to_an_unwritable_path_names_the_fix(capsys, dd, small_bucket, tmp_path):
    code, _, err = run_cli(capsys, "bucket", "export", "src", "-o", str(tmp_path / "no" / "such" / "f"), *dd)
    assert code == 2 and "cannot write" in err and "pick a writable path" in err


# -- buckets: flush and drop ---------------------------------------------------------------------------------


def test_flush_empties_documents_and_log_and_changes_the_identity(small_bucket):
    old_uuid = small_bucket.uuid
    result = small_bucket.flush()
    assert (result["documents"], result["tombstones"], result["mutations"]) == (5, 1, 7)
    assert small_bucket.count() == 0 and small_bucket.keys() == [] and small_bucket.high_seqnos() == [0] * 1024
    assert small_bucket.uuid != old_uuid == result["old_uuid"]
    reopened = LocalBucket.open(small_bucket.path.parent.parent, "src")
    assert reopened.uuid == small_bucket.uuid and reopened.stats()["mutations"] == 0
    assert reopened.upsert("x", {"n": 1})[1] == 1  # seqnos start again at 1


def _deployed(data_dir: str) -> None:
    load_source(data_dir, 20, 60)
    deploy_function(data_dir, ledger_definition("fn_a", "src", "ledger"))


@pytest.mark.parametrize("action", ["drop", "flush"])
@pytest.mark.parametrize("bucket", ["src", "ledger"])
def test_drop_and_flush_are_refused_while_a_deployed_or_paused_function_uses_the_bucket(
    capsys, dd, data_dir, action, bucket
):
    _deployed(data_dir)
    role = "source" if bucket == "src" else "binding 'ledger' (rw)"
    for state in ("deployed", "paused"):
        if state == "paused":
            lifecycle.pause(data_dir, "fn_a")
        code, _, err = run_cli(capsys, "bucket", action, bucket, *dd)
        assert code == 2
        assert err == (
            f"error: cannot {action} bucket '{bucket}': it is the {role} of function 'fn_a', which is {state}; "
            "undeploy it first (`eventing undeploy fn_a`)\n"
        )
    assert LocalBucket.open(data_dir, "src").count() > 0 and LocalBucket.open(data_dir, bucket).path.exists()


def test_drop_after_undeploy_deletes_the_file_and_names_the_functions_that_still_name_it(capsys, dd, data_dir):
    _deployed(data_dir)
    lifecycle.undeploy(data_dir, "fn_a")
    code, out, _ = run_cli(capsys, "bucket", "drop", "ledger", *dd)
    assert code == 0 and out.startswith("dropped bucket 'ledger': deleted ")
    assert "undeployed functions still name it (fn_a)" in out
    assert "ledger" not in [b["name"] for b in json_of(capsys, "bucket", "list", *dd)]
    result = bucket_ops.flush(data_dir, "src")  # the source too, now that no deployed function reads it
    assert result["documents"] > 0 and LocalBucket.open(data_dir, "src").count() == 0


def test_a_function_deployed_on_a_flushed_and_refilled_bucket_handles_only_the_new_mutations(capsys, dd, data_dir):
    _deployed(data_dir)
    run_until_caught_up(data_dir)
    lifecycle.undeploy(data_dir, "fn_a")
    assert run_cli(capsys, "bucket", "flush", "src", *dd)[0] == 0
    assert run_cli(capsys, "bucket", "flush", "ledger", *dd)[0] == 0
    source = LocalBucket.open(data_dir, "src")
    source.upsert("fresh", {"n": 1})
    lifecycle.deploy(data_dir, "fn_a")
    run_until_caught_up(data_dir)
    code, out, _ = run_cli(capsys, "verify", "fn_a", *dd)
    assert code == 0 and "ALL MUTATIONS ACCOUNTED FOR (1 of 1)" in out
    store = open_metadata(data_dir)
    assert {cp.bucket_uuid for cp in store.checkpoints("fn_a").values()} == {source.uuid}
