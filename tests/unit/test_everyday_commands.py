"""Everyday commands: browsing and emptying buckets, the per-vBucket view of a function, rewinding its
checkpoints, live stats, and backing up the metadata store. Each through `eventing.cli.main` as a user
runs it, and the store-level logic underneath directly."""

from __future__ import annotations

import json

import pytest

from eventing.cli import main
from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core import xattrs as X
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.ops import buckets as bucket_ops
from eventing.storage.bucket import LocalBucket
from eventing.storage.values import Write
from eventing.testing import deploy_function, ledger_definition, load_source
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store
from sharding import vbucket_of


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


def test_an_export_carries_the_documents_xattrs_and_a_load_puts_them_back(capsys, dd, small_bucket, tmp_path):
    tagged = {"audit": {"by": "ada"}, "_sync": {"rev": 2}}
    small_bucket.write([Write("a::2", OP_UPDATE, encode_document({"n": 2}), xattrs=X.encode(tagged))])
    out_file = tmp_path / "src.jsonl"
    assert run_cli(capsys, "bucket", "export", "src", "-o", str(out_file), *dd)[0] == 0
    lines = {line["key"]: line for line in map(json.loads, out_file.read_text().splitlines())}
    assert lines["a::2"]["xattrs"] == tagged and "xattrs" not in lines["a::2"]["meta"]
    assert "xattrs" not in lines["a::1"]
    assert json_of(capsys, "bucket", "get", "src", "a::2", *dd)["xattrs"] == tagged
    assert run_cli(capsys, "bucket", "create", "copy", *dd)[0] == 0
    code, _, err = run_cli(capsys, "bucket", "load", "copy", "--file", str(out_file), *dd)
    assert code == 0, err
    copy = LocalBucket.open(dd[1], "copy")
    assert X.decode(copy.get_meta("a::2")["xattrs"]) == tagged and "xattrs" not in copy.get_meta("a::1")
    # a line without "xattrs" keeps the document's; {} leaves none; a bad name is one rejected line
    fix = tmp_path / "fix.jsonl"
    fix.write_text(
        '{"key": "a::2", "doc": {"n": 20}}\n{"key": "a::1", "doc": {"n": 10}, "xattrs": {"t": 1}}\n'
        '{"key": "a::1", "doc": {"n": 11}, "xattrs": {}}\n'
        '{"key": "a::3", "doc": {}, "xattrs": {"$document": 1}}\n'
    )
    code, _, err = run_cli(capsys, "bucket", "load", "copy", "--file", str(fix), *dd)
    assert code == 1 and "line 4: \"xattrs\" holds '$document', not an extended attribute's name" in err
    assert X.decode(copy.get_meta("a::2")["xattrs"]) == tagged and copy.get("a::2") == {"n": 20}
    assert "xattrs" not in copy.get_meta("a::1") and copy.get("a::3") == {"n": 3}
    assert [m.xattrs for m in copy.read_vb(vbucket_of("a::1"), 0, 100) if m.key == "a::1"] == [
        None,
        X.encode({"t": 1}),
        None,
    ]
    # into a named collection: the same lines, its keys stored under the collection's mark
    assert run_cli(capsys, "collection", "create", "copy.s.c", *dd)[0] == 0
    assert run_cli(capsys, "bucket", "load", "copy.s.c", "--file", str(out_file), *dd)[0] == 0
    assert json_of(capsys, "bucket", "get", "copy.s.c", "a::2", *dd)["xattrs"] == tagged


@pytest.mark.parametrize("argv", [["keys", "src", "--limit", "0"], ["scan", "src", "--limit", "-3"]])
def test_a_limit_below_one_is_refused_in_one_line(capsys, dd, small_bucket, argv):
    with pytest.raises(SystemExit) as caught:
        main(["bucket", *argv, *dd])
    assert caught.value.code == 2
    assert "must be a whole number from 1 to " in capsys.readouterr().err


def test_browsing_an_unknown_bucket_names_the_fix(capsys, dd):
    code, _, err = run_cli(capsys, "bucket", "keys", "nope", *dd)
    assert (
        code == 2 and err.startswith("error: unknown bucket 'nope'") and "eventing bucket create nope" in err
    )


def test_exporting_to_an_unwritable_path_names_the_fix(capsys, dd, small_bucket, tmp_path):
    code, _, err = run_cli(capsys, "bucket", "export", "src", "-o", str(tmp_path / "no" / "such" / "f"), *dd)
    assert code == 2 and "cannot write" in err and "pick a writable path" in err


# -- buckets: flush and drop ---------------------------------------------------------------------------------


def test_flush_empties_documents_and_log_and_changes_the_identity(small_bucket):
    old_uuid = small_bucket.uuid
    result = small_bucket.flush()
    assert (result["documents"], result["tombstones"], result["mutations"]) == (5, 1, 7)
    assert (
        small_bucket.count() == 0 and small_bucket.keys() == [] and small_bucket.high_seqnos() == [0] * 1024
    )
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
            f"error: cannot {action} bucket '{bucket}': it is the {role} of function 'fn_a', which is "
            f"{state}; undeploy it first (`eventing undeploy fn_a`)\n"
        )
    assert LocalBucket.open(data_dir, "src").count() > 0 and LocalBucket.open(data_dir, bucket).path.exists()


def test_drop_after_undeploy_deletes_the_file_and_names_the_functions_that_still_name_it(
    capsys, dd, data_dir
):
    _deployed(data_dir)
    lifecycle.undeploy(data_dir, "fn_a")
    code, out, _ = run_cli(capsys, "bucket", "drop", "ledger", *dd)
    assert code == 0 and out.startswith("dropped bucket 'ledger': deleted ")
    assert "undeployed functions still name it (fn_a)" in out
    assert "ledger" not in [b["name"] for b in json_of(capsys, "bucket", "list", *dd)]
    result = bucket_ops.flush(data_dir, "src")  # the source too, now that no deployed function reads it
    assert result["documents"] > 0 and LocalBucket.open(data_dir, "src").count() == 0


def test_a_function_deployed_on_a_flushed_and_refilled_bucket_handles_only_the_new_mutations(
    capsys, dd, data_dir
):
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
    store = open_store(data_dir)
    assert {cp.bucket_uuid for cp in store.checkpoints("fn_a").values()} == {source.uuid}


# -- checkpoints: the per-vBucket view ----------------------------------------------------------------------


def test_the_checkpoint_view_shows_backlog_owner_epoch_and_lease_per_vbucket(capsys, dd, data_dir):
    from eventing.ops.stats import checkpoint_view

    _deployed(data_dir)
    before = checkpoint_view(data_dir, "fn_a", backlog_only=True)
    assert before["backlog"] == 60 and before["owners"] == [] and before["leased"] == 0
    assert all(r["backlog"] == r["high_seqno"] > 0 and r["checkpoint"] == 0 for r in before["rows"])
    assert len(before["rows"]) == before["vbuckets_with_backlog"]
    run_until_caught_up(data_dir)
    after = json_of(capsys, "checkpoints", "fn_a", *dd)
    assert (after["backlog"], after["vbuckets"], after["source_identity_matches"]) == (0, 1024, True)
    assert after["owners"] == ["local/w0", "local/w1"]
    busy = before["rows"][0]["vb"]
    (row,) = json_of(capsys, "checkpoints", "fn_a", "--vb", str(busy), *dd)["rows"]
    assert row["checkpoint"] == row["high_seqno"] == before["rows"][0]["high_seqno"]
    assert row["owner"].startswith("local/w") and row["epoch"] == (1 << 32) + 1 and row["leased"] is False
    code, out, _ = run_cli(capsys, "checkpoints", "fn_a", "--vb", str(busy), *dd)
    assert code == 0 and "backlog 0 in 0 vBuckets" in out and f"\n{busy} " in out and " 1:1 " in out
    code, out, _ = run_cli(capsys, "checkpoints", "fn_a", "--backlog-only", *dd)
    assert code == 0 and "no vBucket matches (no backlog anywhere)" in out


def test_the_checkpoint_view_of_an_undeployed_function_or_a_missing_vbucket_names_the_fix(
    capsys, dd, data_dir
):
    _deployed(data_dir)
    code, _, err = run_cli(capsys, "checkpoints", "fn_a", "--vb", "1024", *dd)
    assert code == 2 and "vBucket 1024 does not exist; vBuckets are numbered 0..1023" in err
    lifecycle.undeploy(data_dir, "fn_a")
    code, _, err = run_cli(capsys, "checkpoints", "fn_a", *dd)
    assert (
        code == 2 and err == "error: function 'fn_a' has no checkpoints (it is undeployed); deploy it first\n"
    )


# -- rewind --------------------------------------------------------------------------------------------------


def _ran_and_paused(
    data_dir: str, tmp_path, documents: int = 100, mutations: int = 600, **deploy_kwargs
) -> str:
    calls = str(tmp_path / "calls.log")
    load_source(data_dir, documents, mutations)
    deploy_function(data_dir, ledger_definition("fn_a", "src", "ledger", call_log=calls), **deploy_kwargs)
    run_until_caught_up(data_dir)
    lifecycle.pause(data_dir, "fn_a")
    return calls


def _calls(path: str) -> int:
    from eventing.testing import read_call_log

    return sum(len(seqs) for seqs in read_call_log(path).values())


def test_a_rewind_to_zero_reruns_every_handler_without_applying_an_effect_twice(
    capsys, dd, data_dir, tmp_path
):
    calls = _ran_and_paused(data_dir, tmp_path)
    assert _calls(calls) == 600
    code, out, _ = run_cli(capsys, "rewind", "fn_a", "--to-seqno", "0", *dd)
    assert code == 0, out
    assert "600 mutations will be handled again after `eventing resume fn_a`" in out
    assert "effects: kept." in out and "`eventing verify` still passes" in out
    assert json_of(capsys, "checkpoints", "fn_a", *dd)["backlog"] == 600
    lifecycle.resume(data_dir, "fn_a")
    assert run_until_caught_up(data_dir).functions["fn_a"].handled == 600
    assert _calls(calls) == 1200  # every handler ran again ...
    report = json_of(capsys, "verify", "fn_a", *dd)  # ... and every effect applied once
    assert report["ok"] and report["handled"] == 600 and report["duplicate_effects"] == []
    assert report["checkpoint_regressions"] == []
    assert any("checkpoint rewinds with effect marks kept" in n for n in report["notes"])


def test_a_rewind_with_reapply_effects_applies_the_effects_again_and_says_so(capsys, dd, data_dir, tmp_path):
    _ran_and_paused(data_dir, tmp_path)
    result = json_of(capsys, "rewind", "fn_a", "--to-seqno", "0", "--reapply-effects", *dd)
    assert (result["effects"], result["mutations_again"]) == ("reapplied", 600)
    assert result["effect_marks_lowered"]["ledger"] > 0
    lifecycle.resume(data_dir, "fn_a")
    run_until_caught_up(data_dir)
    code, out, _ = run_cli(capsys, "verify", "fn_a", *dd)
    assert code == 1 and "600 effects applied more than once" in out


def test_a_rewind_to_a_time_handles_again_exactly_what_arrived_since(capsys, dd, data_dir, tmp_path):
    import time

    from eventing.testing import read_call_log

    calls = str(tmp_path / "calls.log")
    source = load_source(data_dir, 50, 200)
    time.sleep(0.01)
    since = time.time()
    time.sleep(0.01)
    for i in range(30):
        source.upsert(f"late::{i}", {"i": i})
    deploy_function(data_dir, ledger_definition("fn_a", "src", "ledger", call_log=calls))
    run_until_caught_up(data_dir)
    lifecycle.pause(data_dir, "fn_a")
    result = json_of(capsys, "rewind", "fn_a", "--to-time", f"{since:.6f}", *dd)
    assert result["mutations_again"] == 30 and result["vbuckets_moved"] == len(
        {source.get_meta(f"late::{i}")["vb"] for i in range(30)}
    )
    lifecycle.resume(data_dir, "fn_a")
    run_until_caught_up(data_dir)
    handled = read_call_log(calls)
    assert all(len(seqs) == 2 for key, seqs in handled.items() if key.startswith("late::"))
    assert all(len(set(seqs)) == len(seqs) for key, seqs in handled.items() if not key.startswith("late::"))
    code, out, _ = run_cli(capsys, "verify", "fn_a", *dd)
    assert code == 0 and out.startswith("ALL MUTATIONS ACCOUNTED FOR (230 of 230)")
    # An ISO 8601 time works too; one after everything arrived leaves nothing to rewind.
    lifecycle.pause(data_dir, "fn_a")
    code, out, _ = run_cli(capsys, "rewind", "fn_a", "--to-time", "2999-01-01T00:00:00Z", *dd)
    assert code == 0 and out.startswith("nothing to rewind")


def test_a_rewind_of_one_vbucket_moves_only_that_one(capsys, dd, data_dir, tmp_path):
    _ran_and_paused(data_dir, tmp_path)
    busy = max(json_of(capsys, "checkpoints", "fn_a", *dd)["rows"], key=lambda r: r["checkpoint"])
    result = json_of(capsys, "rewind", "fn_a", "--to-seqno", "1", "--vb", str(busy["vb"]), *dd)
    assert result["moves"] == {str(busy["vb"]): {"from": busy["checkpoint"], "to": 1}}
    assert json_of(capsys, "checkpoints", "fn_a", *dd)["backlog"] == busy["checkpoint"] - 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--to-seqno", "0"],
            "cannot rewind function 'fn_a': it is deployed; only a paused function can be rewound",
        ),
        (["--to-time", "yesterday"], None),
    ],
)
def test_rewinding_a_running_function_is_refused_in_one_line(capsys, dd, data_dir, argv, message):
    _deployed(data_dir)
    code, _, err = run_cli(capsys, "rewind", "fn_a", *argv, *dd)
    assert code == 2 and err.count("\n") == 1
    assert message is None or message in err


def test_a_bad_time_and_a_rewind_below_the_feed_boundary_name_the_fix(capsys, dd, data_dir, tmp_path):
    _ran_and_paused(data_dir, tmp_path, boundary="from_now")
    code, _, err = run_cli(capsys, "rewind", "fn_a", "--to-time", "yesterday", *dd)
    assert code == 2 and "neither ISO 8601 (2026-01-31T12:00:00Z) nor epoch seconds" in err
    code, _, err = run_cli(capsys, "rewind", "fn_a", "--to-seqno", "0", *dd)
    assert code == 2 and "boundary from_now" in err and "or pass --reapply-effects" in err
    with pytest.raises(SystemExit):
        main(["rewind", "fn_a", *dd])  # a target is required
    assert "one of the arguments --to-seqno --to-time is required" in capsys.readouterr().err


# -- stats --watch -------------------------------------------------------------------------------------------


def test_stats_watch_prints_one_line_per_refresh_when_not_on_a_terminal(capsys, dd, data_dir):
    _deployed(data_dir)
    code, out, _ = run_cli(capsys, "stats", "fn_a", "--watch", "--interval", "0.1", "--count", "3", *dd)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert all(" fn_a state=deployed " in line and "checkpoint_lag=60" in line for line in lines)
    code, out, _ = run_cli(
        capsys, "stats", "fn_a", "--watch", "--interval", "0.1", "--count", "2", "--json", *dd
    )
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["function"] for r in rows] == ["fn_a", "fn_a"] and rows[1]["at"] >= rows[0]["at"]


def test_stats_watch_redraws_in_place_on_a_terminal_and_ctrl_c_exits_0_like_run():
    import io

    from eventing.cli.watch import CLEAR, watch

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    samples = iter(range(100))
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    screen = Terminal()
    code = watch(
        lambda: {"n": next(samples)},
        lambda d: print(f"n is {d['n']}"),
        str,
        interval_s=0.5,
        as_json=False,
        out=screen,
        sleep=sleep,
    )
    assert code == 130 and sleeps == [0.5, 0.5, 0.5]  # Ctrl-C, as for every command
    frames = screen.getvalue().split(CLEAR)[1:]
    assert len(frames) == 3 and [f.splitlines()[1] for f in frames] == ["n is 0", "n is 1", "n is 2"]
    assert "every 0.5s (Ctrl-C to stop)" in frames[0]


@pytest.mark.parametrize("interval", ["0", "-1", "soon"])
def test_a_watch_interval_below_a_tenth_of_a_second_is_refused(capsys, dd, interval):
    with pytest.raises(SystemExit) as caught:
        main(["stats", "fn_a", "--watch", "--interval", interval, *dd])
    assert caught.value.code == 2 and "must be a number of seconds of at least 0.1" in capsys.readouterr().err


# -- backup and restore of the metadata store ----------------------------------------------------------------


def test_a_backup_taken_while_another_process_writes_is_a_whole_consistent_store(
    capsys, dd, data_dir, tmp_path
):
    import threading

    from metadata import SqliteMetadataStore

    _deployed(data_dir)
    writer = SqliteMetadataStore(f"{data_dir}/metadata.sqlite3")
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            writer.add_counters("fn_a", {"busy": 1})

    thread = threading.Thread(target=write)
    thread.start()
    try:
        results = [json_of(capsys, "backup", "-o", str(tmp_path / f"b{i}.sqlite3"), *dd) for i in range(3)]
    finally:
        stop.set()
        thread.join()
        writer.close()
    for result in results:
        copy = SqliteMetadataStore(result["file"], create=False)
        copy.verify_integrity()
        assert [f.name for f in copy.list_functions()] == ["fn_a"] and len(copy.checkpoints("fn_a")) == 1024
        copy.close()
    busy = [SqliteMetadataStore(r["file"]).counters("fn_a").get("busy", 0) for r in results]
    assert busy == sorted(busy)  # each a snapshot of a later moment


def test_backup_writes_under_the_data_directory_by_default(capsys, dd, data_dir):
    _deployed(data_dir)
    code, out, _ = run_cli(capsys, "backup", *dd)
    assert (
        code == 0 and f"to {data_dir}/backups/metadata-" in out and "restore it with `eventing restore" in out
    )


def test_a_restore_brings_checkpoints_back_and_the_rerun_applies_no_effect_twice(
    capsys, dd, data_dir, tmp_path
):
    source = load_source(data_dir, 50, 300)
    deploy_function(data_dir, ledger_definition("fn_a", "src", "ledger"))
    run_until_caught_up(data_dir)
    backup_file = str(tmp_path / "meta.sqlite3")
    assert run_cli(capsys, "backup", "-o", backup_file, *dd)[0] == 0
    for i in range(100):
        source.upsert(f"after::{i}", {"i": i})
    run_until_caught_up(data_dir)
    assert json_of(capsys, "verify", "fn_a", *dd)["handled"] == 400
    code, out, _ = run_cli(capsys, "restore", backup_file, *dd)
    assert code == 0, out
    assert f"the replaced store is kept as {data_dir}/metadata.sqlite3.bak" in out and "fn_a: deployed" in out
    assert json_of(capsys, "checkpoints", "fn_a", *dd)["backlog"] == 100  # back to where the backup was
    assert run_until_caught_up(data_dir).functions["fn_a"].handled == 100
    report = json_of(capsys, "verify", "fn_a", *dd)
    assert report["ok"] and report["handled"] == 400 and report["duplicate_effects"] == []


def test_a_restore_into_a_fresh_directory_warns_of_each_missing_bucket(capsys, dd, data_dir, tmp_path):
    load_source(data_dir, 20, 50)
    deploy_function(data_dir, ledger_definition("fn_a", "src", "ledger"))
    backup_file = str(tmp_path / "meta.sqlite3")
    assert run_cli(capsys, "backup", "-o", backup_file, *dd)[0] == 0
    fresh = str(tmp_path / "fresh")
    code, out, err = run_cli(capsys, "restore", backup_file, "--data-dir", fresh)
    assert code == 0
    assert "bucket 'src' (source of function 'fn_a') is not in" in err
    assert "bucket 'ledger' (binding 'ledger' of function 'fn_a') is not in" in err
    assert "--with-buckets" in err and "functions resume after" not in out


def test_a_backup_with_buckets_restores_into_a_fresh_directory_and_carries_on_exactly_once(
    capsys, dd, data_dir, tmp_path
):
    source = load_source(data_dir, 50, 300)
    deploy_function(data_dir, ledger_definition("fn_a", "src", "ledger"))
    run_until_caught_up(data_dir)
    with LocalBucket.open(data_dir, "ledger") as ledger:  # a document with XATTRs: the file is copied whole
        ledger.write([Write("tagged", OP_UPDATE, encode_document({}), xattrs=X.encode({"a": 1}))])
    folder = tmp_path / "full"
    code, out, _ = run_cli(capsys, "backup", "--with-buckets", "-o", str(folder), *dd)
    assert code == 0 and "buckets (ledger, src)" in out
    for i in range(100):
        source.upsert(f"after::{i}", {"i": i})  # after the backup: not in the restored directory
    fresh = str(tmp_path / "fresh")
    code, out, err = run_cli(capsys, "restore", str(folder), "--data-dir", fresh)
    assert code == 0 and err == "" and "restored buckets: ledger, src" in out
    assert "functions resume after the restored checkpoints" in out
    with LocalBucket.open(fresh, "ledger") as restored:
        assert X.decode(restored.get_meta("tagged")["xattrs"]) == {"a": 1}
    with LocalBucket.open(fresh, "src") as restored:
        restored.upsert("new::1", {"i": 1})
    assert run_until_caught_up(fresh).functions["fn_a"].handled == 1
    report = json_of(capsys, "verify", "fn_a", "--data-dir", fresh)
    assert report["ok"] and report["handled"] == 301 and report["duplicate_effects"] == []
    code, out, _ = run_cli(capsys, "restore", str(folder), "--data-dir", fresh)
    assert code == 0 and "bucket 'src' exists here: kept it" in out  # never overwrites a bucket


def test_restore_is_refused_while_a_service_runs(capsys, dd, data_dir, tmp_path):
    _deployed(data_dir)
    backup_file = str(tmp_path / "meta.sqlite3")
    run_cli(capsys, "backup", "-o", backup_file, *dd)
    store = open_store(data_dir)
    store.heartbeat("host:123", "{}")
    store.close()
    code, _, err = run_cli(capsys, "restore", backup_file, *dd)
    assert code == 2 and err == (
        "error: cannot restore the metadata store while an eventing service runs (host:123); "
        "stop it first (Ctrl-C on `eventing run`), then restore\n"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "backup file .* does not exist"),
        (b"not a database at all, just text" * 200, "is not a SQLite database"),
        ("empty-sqlite", "is a SQLite database but not an eventing metadata store"),
    ],
)
def test_restoring_something_that_is_not_a_backup_names_it_and_changes_nothing(
    capsys, dd, data_dir, tmp_path, content, message
):
    import re
    import sqlite3

    _deployed(data_dir)
    bad = tmp_path / "bad.sqlite3"
    if content == "empty-sqlite":
        sqlite3.connect(bad).execute("CREATE TABLE t(x)").connection.commit()
    elif content is not None:
        bad.write_bytes(content)
    code, _, err = run_cli(capsys, "restore", str(bad), *dd)
    assert code == 2 and re.search(message, err) and err.count("\n") == 1
    assert [f["name"] for f in json_of(capsys, "list", *dd)] == ["fn_a"]
    assert not (tmp_path / "data" / "metadata.sqlite3.bak").exists()


def test_a_couchbase_store_is_restored_with_couchbases_tools(capsys, dd, tmp_path, monkeypatch):
    # (its backup: test_metadata_contract.py::test_a_couchbase_store_is_backed_up_with_couchbases_tools)
    monkeypatch.setenv("EVENTING_METADATA_URL", "couchbase://cb/meta?username=u&password=p")
    code, _, err = run_cli(capsys, "restore", str(tmp_path / "b.sqlite3"), *dd)
    assert code == 2 and "restore it with Couchbase's own tools (`cbbackupmgr restore`)" in err


def test_effects_kept_by_one_rewind_can_be_reapplied_by_the_next(capsys, dd, data_dir, tmp_path):
    _ran_and_paused(data_dir, tmp_path)
    assert run_cli(capsys, "rewind", "fn_a", "--to-seqno", "0", *dd)[0] == 0
    code, out, _ = run_cli(capsys, "rewind", "fn_a", "--to-seqno", "0", "--reapply-effects", *dd)
    assert code == 0 and "already at or before seqno 0; none moved" in out and "effects: REAPPLIED." in out
    lifecycle.resume(data_dir, "fn_a")
    run_until_caught_up(data_dir)
    code, out, _ = run_cli(capsys, "verify", "fn_a", "--json", *dd)
    assert code == 1 and json.loads(out)["duplicate_writes"] == 600


def test_a_windowed_function_cannot_be_rewound(capsys, dd, data_dir):
    from pathlib import Path

    functions = Path(__file__).resolve().parents[2] / "functions"
    LocalBucket.create(data_dir, "customers")
    assert run_cli(capsys, "deploy", str(functions / "fn_sales_per_minute.json"), *dd)[0] == 0
    lifecycle.pause(data_dir, "fn_sales_per_minute")
    code, _, err = run_cli(capsys, "rewind", "fn_sales_per_minute", "--to-seqno", "0", *dd)
    assert code == 2 and "it aggregates windows" in err and "undeploy and deploy it" in err
