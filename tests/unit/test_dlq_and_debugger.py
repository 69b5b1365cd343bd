"""Dead-letter queue (list, show, replay exactly once, purge), the debugger (trace, pdb, --apply, selection,
never consuming the mutation), and the bad-input suite, on the in-process executor with real SQLite."""

from __future__ import annotations

import importlib.util
import io
import json
import threading
import time
from pathlib import Path

import pytest

from eventing.cli import main
from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.errors import InvalidKeyError
from eventing.ops import dlq
from eventing.ops.verify import effect_key, history_key
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket
from eventing.storage.writes import chunked
from eventing.testing import LEDGER_HANDLER, LedgerReport, check_ledger, deploy_function, ledger_definition
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store
from sharding import vbucket_of

ROOT = Path(__file__).resolve().parents[2]

# The ledger handler (eventing.testing) behind a gate that fails on demand: a poison pill raises after a
# write (which must be discarded), a hang loops until execution_timeout, and the environment variables
# make one process's calls fail or be interrupted without touching the worker's.
GATED_LEDGER = (
    LEDGER_HANDLER
    + """
_ledger_update = on_update

def on_update(doc, meta):
    import os, time
    if doc.get("poison"):
        ledger[f"partial|{meta.id}|{meta.seq}"] = {"partial": True}
        raise ValueError("poison pill in " + meta.id)
    if doc.get("hang"):
        while True:
            time.sleep(0.01)
    if os.environ.get("EVENTING_TEST_FAIL") in (meta.id, f"{meta.id}@{meta.seq}"):
        raise RuntimeError("failing on request for " + meta.id)
    if os.environ.get("EVENTING_TEST_CTRL_C") == meta.id:
        raise KeyboardInterrupt
    _ledger_update(doc, meta)
"""
)

DEBUG_HANDLER = """
def on_update(doc, meta):
    log("handling", meta.id, "rev", doc["rev"])
    previous = dst.get(meta.id)
    dst[meta.id] = {"rev": doc["rev"], "previous": previous["rev"] if previous else None}

def on_delete(meta, options):
    log("deleting", meta.id)
    if meta.id in dst:
        del dst[meta.id]
"""


# -- helpers ---------------------------------------------------------------------------------------------


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *argv: str, expect: int = 0):
    code, out, err = cli(capsys, *argv, "--json")
    assert code == expect, err
    return json.loads(out)


def deploy(data_dir: str, defn: FunctionDefinition, source: str) -> None:
    deploy_function(data_dir, defn, source)


def update_handler(data_dir: str, name: str, source: str) -> None:
    """Fix a deployed function the way a user does: pause, update the stored handler, resume."""
    defn = FunctionDefinition.from_dict(open_store(data_dir).get_function(name).definition)
    lifecycle.pause(data_dir, name)
    lifecycle.save_function(data_dir, defn, source)
    lifecycle.resume(data_dir, name)


def run(data_dir: str) -> None:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors, summary.errors


def effect_counts(ledger: LocalBucket, function: str) -> dict[str, int]:
    """How many times each effect of `function` reached the ledger bucket's log (every version is kept)."""
    return ledger.logged_writes(f"e|{function}|")


def assert_handled_once_in_order_except(report: LedgerReport, dead: set[tuple[int, int]]) -> None:
    """Every mutation but the dead-lettered (vBucket, seqno) ones was handled exactly once, in per-document
    order."""
    assert report.ok, report.summary()
    assert report.dead_lettered == len(dead)
    assert report.handled == report.source_mutations - len(dead)


def poisoned_source(data_dir: str) -> LocalBucket:
    """12 documents x 3 revisions; revisions 2 and 3 of every third document are poison pills."""
    source = LocalBucket.create(data_dir, "src")
    for rev in (1, 2, 3):
        for i in range(12):
            source.upsert(f"doc{i:02d}", {"rev": rev, "poison": i % 3 == 0 and rev >= 2})
    return source


def deploy_poisoned(data_dir: str) -> LocalBucket:
    source = poisoned_source(data_dir)
    deploy(data_dir, ledger_definition("fn_p", "src", "ledger"), GATED_LEDGER)
    run(data_dir)
    assert len(open_store(data_dir).dlq_rows("fn_p")) == 8
    return source


def checkpoint_state(data_dir: str, function: str) -> dict[int, tuple]:
    return {
        vb: (cp.seqno, cp.epoch, cp.owner, cp.leased)
        for vb, cp in open_store(data_dir).checkpoints(function).items()
    }


# -- the dead-letter queue -------------------------------------------------------------------------------


def test_replay_after_fixing_a_poison_pill_handler_applies_each_row_once_in_per_document_order(
    data_dir, capsys
):
    source = deploy_poisoned(data_dir)
    ledger = LocalBucket.open(data_dir, "ledger")
    assert not [k for k in ledger.keys() if k.startswith("partial|")]  # the failed attempts left nothing
    update_handler(data_dir, "fn_p", LEDGER_HANDLER)

    report = cli_json(capsys, "dlq", "replay", "fn_p", "--all", "--data-dir", data_dir)

    assert (report["selected"], report["replayed"], report["failed"]) == (8, 8, 0)
    order = [(r["vb"], r["seqno"]) for r in report["rows"]]
    assert order == sorted(order)
    assert report["writes_applied"] == 16 and report["writes_skipped"] == 0  # e| and h| per row
    result = check_ledger(source, ledger, function="fn_p")
    assert result.ok and result.handled == 36, result.summary()  # the histories prove per-document order
    for i in (0, 3, 6, 9):
        key = f"doc{i:02d}"
        seqs = [m.seqno for batch in source.scan_log() for m in batch if m.key == key]
        assert ledger.get(history_key("fn_p", key))["seqs"] == seqs
    assert set(effect_counts(ledger, "fn_p").values()) == {1}
    assert cli_json(capsys, "dlq", "list", "fn_p", "--data-dir", data_dir) == []
    replayed = cli_json(capsys, "dlq", "list", "fn_p", "--all", "--data-dir", data_dir)
    assert len(replayed) == 8 and all(r["replayed_at"] for r in replayed)
    again = cli_json(capsys, "dlq", "replay", "fn_p", "--all", "--data-dir", data_dir)
    assert again["selected"] == 0 and sum(effect_counts(ledger, "fn_p").values()) == 36


def test_an_interrupted_replay_run_again_applies_nothing_twice(data_dir, capsys, monkeypatch):
    source = deploy_poisoned(data_dir)
    update_handler(data_dir, "fn_p", GATED_LEDGER.replace('doc.get("poison")', "False"))
    ledger = LocalBucket.open(data_dir, "ledger")
    store = open_store(data_dir)

    # Ctrl-C inside the handler of the third row: two rows were replayed, the third left no effects.
    third = store.dlq_rows("fn_p")[2]
    monkeypatch.setenv("EVENTING_TEST_CTRL_C", third.key)
    code, _, err = cli(capsys, "dlq", "replay", "fn_p", "--all", "--data-dir", data_dir)
    assert code == 130 and "interrupted" in err and "Traceback" not in err
    monkeypatch.delenv("EVENTING_TEST_CTRL_C")
    pending = store.dlq_rows("fn_p")
    assert len(pending) == 6 and pending[0].key == third.key

    # Stopped at the worst moment: the row's effects are durable, the row is not yet marked replayed.
    stopped: list[str] = []

    def stop_after_effects(row) -> None:
        stopped.append(row.key)
        if len(stopped) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dlq.replay(data_dir, "fn_p", dlq.DlqSelector(everything=True), after_effects=stop_after_effects)
    assert len(store.dlq_rows("fn_p")) == 5  # the second row of this run is applied but unmarked

    report = cli_json(capsys, "dlq", "replay", "fn_p", "--all", "--data-dir", data_dir)
    assert (
        report["replayed"] == 5 and report["writes_skipped"] == 2
    )  # that row's e| and h| were not re-applied
    counts = effect_counts(ledger, "fn_p")
    assert len(counts) == 36 and set(counts.values()) == {1}
    result = check_ledger(source, ledger, function="fn_p")
    assert result.ok, result.summary()


def test_a_row_whose_handler_still_fails_stays_in_the_dlq_with_attempts_incremented(data_dir, capsys):
    deploy_poisoned(data_dir)
    before = {(r.vb, r.seqno): r for r in open_store(data_dir).dlq_rows("fn_p")}
    code, out, err = cli(capsys, "dlq", "replay", "fn_p", "--key", "doc03", "--data-dir", data_dir)
    assert code == 1 and "0 of 2" in out and "still failing" in out
    after = {(r.vb, r.seqno): r for r in open_store(data_dir).dlq_rows("fn_p")}
    assert after.keys() == before.keys()
    for k, row in after.items():
        if row.key == "doc03":
            assert row.attempts == before[k].attempts + 1 and row.last_failed_at > before[k].last_failed_at
            assert "poison pill in doc03" in row.error and "ValueError" in row.traceback
        else:
            assert row.attempts == before[k].attempts
    assert not [k for k in LocalBucket.open(data_dir, "ledger").keys() if k.startswith("partial|")]


def test_a_row_that_failed_again_is_applied_by_a_later_replay_after_later_rows_of_its_vbucket(
    data_dir, capsys, monkeypatch
):
    # Replay marks are per row: a per-vBucket high-water mark would skip doc00@2 once doc00@3 is applied.
    deploy_poisoned(data_dir)
    update_handler(data_dir, "fn_p", GATED_LEDGER.replace('doc.get("poison")', "False"))
    first, second = open_store(data_dir).find_dlq_rows("fn_p", key="doc00")
    assert first.vb == second.vb and first.seqno < second.seqno
    monkeypatch.setenv("EVENTING_TEST_FAIL", f"doc00@{first.seqno}")
    report = cli_json(capsys, "dlq", "replay", "fn_p", "--all", "--data-dir", data_dir, expect=1)
    assert (report["replayed"], report["failed"]) == (7, 1)
    monkeypatch.delenv("EVENTING_TEST_FAIL")
    report = cli_json(capsys, "dlq", "replay", "fn_p", "--all", "--data-dir", data_dir)
    assert report["replayed"] == 1 and report["writes_applied"] == 2
    counts = effect_counts(LocalBucket.open(data_dir, "ledger"), "fn_p")
    assert (
        counts[effect_key("fn_p", "doc00", first.seqno)] == 1
        and len(counts) == 36
        and set(counts.values()) == {1}
    )


def test_dlq_list_filters_and_show_prints_the_error_traceback_and_mutation(data_dir, capsys):
    deploy_poisoned(data_dir)
    dd = ["--data-dir", data_dir]
    rows = cli_json(capsys, "dlq", "list", "fn_p", "--reason", "error", "--limit", "3", *dd)
    assert len(rows) == 3 and [(r["vb"], r["seqno"]) for r in rows] == sorted(
        (r["vb"], r["seqno"]) for r in rows
    )
    assert cli_json(capsys, "dlq", "list", "fn_p", "--reason", "timeout", *dd) == []
    first = rows[0]
    shown = cli_json(
        capsys, "dlq", "show", "fn_p", "--vb", str(first["vb"]), "--seqno", str(first["seqno"]), *dd
    )
    assert (
        len(shown) == 1 and shown[0]["attempts"] == 1 and "ValueError: poison pill" in shown[0]["traceback"]
    )
    assert shown[0]["mutation"]["doc"]["poison"] is True and shown[0]["mutation"]["op"] == "update"
    assert len(cli_json(capsys, "dlq", "show", "fn_p", "--key", "doc06", *dd)) == 2
    code, out, _ = cli(capsys, "dlq", "list", "fn_p", *dd)
    assert code == 0 and "poison pill" in out and "8 rows" in out
    code, out, _ = cli(capsys, "dlq", "show", "fn_p", "--key", "doc06", *dd)
    assert code == 0 and "traceback:" in out and "doc06" in out
    for argv, message in [
        (["dlq", "show", "fn_p", "--seqno", "1"], "--seqno needs --vb"),
        (["dlq", "show", "fn_p", "--key", "doc01"], "has no dead letter for key 'doc01'"),
        (["dlq", "list", "fn_nope"], "unknown function 'fn_nope'"),
        (["dlq", "replay", "fn_p"], "needs --all or a selector"),
        (["dlq", "show", "fn_p", "--vb", "2048", "--seqno", "1"], "vBucket 2048 does not exist"),
    ]:
        code, _, err = cli(capsys, *argv, *dd)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_purge_removes_only_the_selected_rows_and_says_how_many(data_dir, capsys):
    deploy_poisoned(data_dir)
    update_handler(data_dir, "fn_p", LEDGER_HANDLER)
    dd = ["--data-dir", data_dir]
    assert cli_json(capsys, "dlq", "replay", "fn_p", "--key", "doc00", *dd)["replayed"] == 2
    code, _, err = cli(capsys, "dlq", "purge", "fn_p", *dd)
    assert code == 2 and "needs --all, --replayed or a selector" in err
    assert cli_json(capsys, "dlq", "purge", "fn_p", "--replayed", *dd)["purged"] == 2
    row = open_store(data_dir).dlq_rows("fn_p")[0]
    assert (
        cli_json(capsys, "dlq", "purge", "fn_p", "--vb", str(row.vb), "--seqno", str(row.seqno), *dd)[
            "purged"
        ]
        == 1
    )
    assert cli_json(capsys, "dlq", "purge", "fn_p", "--key", "doc03", *dd)["purged"] == 2 - (
        row.key == "doc03"
    )
    remaining = len(open_store(data_dir).dlq_rows("fn_p", include_replayed=True))
    code, out, _ = cli(capsys, "dlq", "purge", "fn_p", "--all", *dd)
    assert code == 0 and out.strip() == f"purged {remaining} dead letter{'s' * (remaining != 1)} of 'fn_p'"
    assert open_store(data_dir).dlq_rows("fn_p", include_replayed=True) == []


# -- the debugger ----------------------------------------------------------------------------------------


def debug_setup(data_dir: str) -> LocalBucket:
    source = LocalBucket.create(data_dir, "src")
    for key in ("alpha", "beta", "gamma"):
        source.upsert(key, {"rev": 1})
    source.upsert("alpha", {"rev": 2})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_d",
            "source_bucket": "src",
            "checkpoint_interval": "100ms",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, DEBUG_HANDLER)
    LocalBucket.open(data_dir, "dst").upsert("alpha", {"rev": 0})  # something for the handler to read
    return source


def test_debug_trace_shows_doc_meta_log_reads_and_writes_and_applies_nothing(data_dir, capsys):
    source = debug_setup(data_dir)
    dst = LocalBucket.open(data_dir, "dst")
    checkpoints, marks, dst_log = (
        checkpoint_state(data_dir, "fn_d"),
        dst.effect_marks("fn_d"),
        dst.stats()["mutations"],
    )
    first_vb = min(vbucket_of(k) for k in ("alpha", "beta", "gamma"))
    first = source.read_vb(first_vb, 0, 1)[0]

    report = cli_json(capsys, "debug", "fn_d", "--trace", "--data-dir", data_dir)

    assert report["mutation"]["vb"] == first_vb and report["mutation"]["seqno"] == first.seqno
    assert report["doc"] == {"rev": 1} and report["kind"] == "on_update"
    assert (
        report["meta"]["id"] == first.key and report["meta"]["vb"] == first_vb and report["meta"]["seq"] == 1
    )
    events = [(e["event"], e.get("key"), e.get("line")) for e in report["events"]]
    assert events == [
        ("log", None, f"handling {first.key} rev 1"),
        ("read", first.key, None),
        ("write", first.key, None),
    ]
    assert report["outcome"] == "ok" and report["applied"] is False and report["consumed"] is False
    assert report["writes"][0]["doc"]["rev"] == 1 and report["writes"][0]["bucket"] == "dst"
    # Nothing moved: no write, no checkpoint, no ownership, no effect mark.
    assert dst.stats()["mutations"] == dst_log and dst.effect_marks("fn_d") == marks
    assert checkpoint_state(data_dir, "fn_d") == checkpoints

    code, out, _ = cli(capsys, "debug", "fn_d", "--key", "alpha", "--data-dir", data_dir)
    assert code == 0
    for text in (
        "pulled a copy of vBucket",
        'doc:  {"rev": 1}',
        "meta: {",
        "log     handling alpha rev 1",
        "read    dst['alpha'] -> {\"rev\": 0}",
        'write   dst[\'alpha\'] = {"rev": 1, "previous": 0}',
        "1 write shown, not applied",
        "the mutation was not consumed",
    ):
        assert text in out, out
    assert dst.get("alpha") == {"rev": 0}


def test_debug_with_apply_writes_the_effects_with_the_deployment_as_origin(data_dir, capsys):
    debug_setup(data_dir)
    dst = LocalBucket.open(data_dir, "dst")
    marks = dst.effect_marks("fn_d")
    report = cli_json(capsys, "debug", "fn_d", "--key", "beta", "--apply", "--data-dir", data_dir)
    assert report["applied"] is True and report["consumed"] is False
    assert dst.get("beta") == {"rev": 1, "previous": None}
    last = [m for batch in dst.scan_log() for m in batch if m.key == "beta"]
    assert len(last) == 1 and last[0].origin == "fn_d@1"  # its deployment's (eventing.storage.origins)
    assert dst.effect_marks("fn_d") == marks  # outside the effect marks: the worker still handles it


def test_debug_selects_the_next_mutation_of_a_key_or_a_vbucket_after_the_checkpoint(data_dir, capsys):
    source = debug_setup(data_dir)
    dd = ["--data-dir", data_dir]
    alpha_vb = vbucket_of("alpha")
    assert cli_json(capsys, "debug", "fn_d", "--key", "alpha", *dd)["doc"] == {"rev": 1}
    assert cli_json(capsys, "debug", "fn_d", "--vb", str(vbucket_of("gamma")), *dd)["meta"]["id"] == "gamma"
    run(data_dir)  # checkpoints move to the high seqnos
    code, _, err = cli(capsys, "debug", "fn_d", "--vb", str(alpha_vb), *dd)
    assert code == 2 and f"no pending mutation in vBucket {alpha_vb}" in err and "--wait" in err
    source.upsert("alpha", {"rev": 3})
    source.delete("beta")
    pulled = cli_json(capsys, "debug", "fn_d", "--key", "alpha", *dd)
    assert pulled["doc"] == {"rev": 3} and pulled["mutation"]["seqno"] == source.get_meta("alpha")["seqno"]
    deleted = cli_json(capsys, "debug", "fn_d", "--key", "beta", *dd)
    assert deleted["kind"] == "on_delete" and deleted["mutation"]["op"] == "delete"
    assert deleted["events"][0] == {"event": "log", "line": "deleting beta"}
    code, _, err = cli(capsys, "debug", "fn_d", "--vb", "1024", *dd)
    assert code == 2 and "vBucket 1024 does not exist" in err


def test_debug_waits_for_a_mutation_when_none_is_pending(data_dir, capsys):
    source = debug_setup(data_dir)
    run(data_dir)
    key = next(
        f"late{i}"
        for i in range(10_000)
        if vbucket_of(f"late{i}") not in {vbucket_of(k) for k in ("alpha", "beta", "gamma")}
    )
    timer = threading.Timer(0.3, lambda: LocalBucket.open(data_dir, "src").upsert(key, {"rev": 7}))
    timer.start()
    started = time.monotonic()
    report = cli_json(
        capsys, "debug", "fn_d", "--vb", str(vbucket_of(key)), "--wait", "10", "--data-dir", data_dir
    )
    timer.join()
    assert report["meta"]["id"] == key and report["doc"] == {"rev": 7}
    assert 0.25 < time.monotonic() - started < 5
    assert source.get(key) == {"rev": 7}


def test_debug_of_an_unknown_function_is_a_one_line_error(data_dir, capsys):
    debug_setup(data_dir)
    code, out, err = cli(capsys, "debug", "fn_nope", "--data-dir", data_dir)
    assert code == 2 and out == ""
    assert err.startswith("error: unknown function 'fn_nope'") and len(err.strip().splitlines()) == 1


def test_debug_under_pdb_runs_the_handler_and_a_quit_applies_nothing(data_dir, capsys, monkeypatch):
    debug_setup(data_dir)
    monkeypatch.setattr("sys.stdin", io.StringIO("continue\n"))
    report = cli_json(capsys, "debug", "fn_d", "--key", "gamma", "--pdb", "--apply", "--data-dir", data_dir)
    assert report["outcome"] == "ok" and report["mode"] == "pdb" and report["applied"] is True
    monkeypatch.setattr("sys.stdin", io.StringIO("quit\n"))
    report = cli_json(capsys, "debug", "fn_d", "--key", "beta", "--pdb", "--apply", "--data-dir", data_dir)
    assert report["outcome"] == "quit" and report["writes"] == [] and report["applied"] is False
    assert LocalBucket.open(data_dir, "dst").get("beta") is None


def test_a_debug_session_that_fails_or_is_interrupted_leaves_the_mutation_to_its_worker(
    data_dir, capsys, monkeypatch
):
    source = LocalBucket.create(data_dir, "src")
    for chunk in chunked(loadgen.generate(60, 400, seed=5), 1000):
        source.write(chunk)
    deploy(data_dir, ledger_definition("fn_l", "src", "ledger", workers=2), GATED_LEDGER)
    dd = ["--data-dir", data_dir]
    checkpoints = checkpoint_state(data_dir, "fn_l")

    first = cli_json(capsys, "debug", "fn_l", *dd)
    monkeypatch.setenv("EVENTING_TEST_FAIL", first["meta"]["id"])
    failed = cli_json(capsys, "debug", "fn_l", *dd, expect=1)
    assert failed["outcome"] == "error" and "failing on request" in failed["error"]
    assert "RuntimeError" in failed["traceback"] and failed["writes"] == []
    code, out, _ = cli(capsys, "debug", "fn_l", *dd)
    assert code == 1 and "result: error: RuntimeError: failing on request" in out and "Traceback" in out
    monkeypatch.delenv("EVENTING_TEST_FAIL")

    monkeypatch.setenv("EVENTING_TEST_CTRL_C", first["meta"]["id"])
    code, out, err = cli(capsys, "debug", "fn_l", *dd)
    assert code == 130 and "Traceback" not in err
    assert "was not consumed" in err and f"vBucket {first['mutation']['vb']}" in err
    monkeypatch.delenv("EVENTING_TEST_CTRL_C")

    assert checkpoint_state(data_dir, "fn_l") == checkpoints
    run(data_dir)
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"), function="fn_l")
    assert report.ok and report.handled == 400, report.summary()
    assert open_store(data_dir).dlq_rows("fn_l") == []


def test_the_debug_script_runs_the_same_command(data_dir, capsys):
    debug_setup(data_dir)
    spec = importlib.util.spec_from_file_location("debug_mutation", ROOT / "scripts" / "debug_mutation.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["fn_d", "--key", "alpha", "--trace", "--data-dir", data_dir]) == 0
    assert "write   dst['alpha']" in capsys.readouterr().out


# -- bad input: a DLQ row or a clear error, and nothing else lost ----------------------------------------


def corrupt(source: LocalBucket, vb: int, seqno: int, data: bytes) -> None:
    source.file.db.execute("UPDATE log SET doc=? WHERE vb=? AND seqno=?", (data, vb, seqno))


@pytest.mark.parametrize("kind", ["poison", "hang", "undecodable", "oversize"])
def test_bad_input_goes_to_the_dlq_and_every_other_mutation_is_handled_once_in_order(data_dir, kind):
    source = LocalBucket.create(data_dir, "src")
    for chunk in chunked(loadgen.generate(80, 400, seed=11, delete_ratio=0.0), 1000):
        source.write(chunk)
    bad: list[tuple[int, int]] = []
    for key in ("customer::07", "customer::42", f"{kind}::new"):
        doc = (
            {"rev": 1000, "poison": True}
            if kind == "poison"
            else {"rev": 1000, "hang": True}
            if kind == "hang"
            else {"rev": 1000, "pad": "x" * 5000}
            if kind == "oversize"
            else {"rev": 1000}
        )
        vb, seqno = source.upsert(key, doc)
        if kind == "undecodable":
            corrupt(source, vb, seqno, b"\xc1\xc1\xc1")
        bad.append((vb, seqno))
        source.upsert(key, {"rev": 1001})  # a later revision of the same document is still handled, in order
    extra = (
        {"execution_timeout": "200ms"}
        if kind == "hang"
        else {"max_document_bytes": 2000}
        if kind == "oversize"
        else {}
    )
    deploy(data_dir, ledger_definition("fn_b", "src", "ledger", workers=2, **extra), GATED_LEDGER)

    run(data_dir)

    rows = open_store(data_dir).dlq_rows("fn_b")
    reason = {"poison": "error", "hang": "timeout", "undecodable": "undecodable", "oversize": "oversize"}[
        kind
    ]
    assert sorted((r.vb, r.seqno) for r in rows) == sorted(bad)
    assert {r.reason for r in rows} == {reason}
    message = {
        "poison": "ValueError: poison pill",
        "hang": "execution_timeout",
        "undecodable": "",
        "oversize": "max_document_bytes is 2000",
    }[kind]
    assert all(message in r.error and r.error for r in rows)
    dead = {(r.vb, r.seqno) for r in rows}
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"), function="fn_b", dead_letters=dead)
    assert_handled_once_in_order_except(report, dead)
    assert not [k for k in LocalBucket.open(data_dir, "ledger").keys() if k.startswith("partial|")]


def test_a_250_byte_key_is_handled_and_a_251_byte_key_is_refused_at_ingest(data_dir, capsys, tmp_path):
    source = LocalBucket.create(data_dir, "src")
    key250, key251 = "k" * 248 + "é", "k" * 249 + "é"  # é is two bytes in UTF-8
    assert len(key250.encode()) == 250 and len(key251.encode()) == 251
    source.upsert(key250, {"rev": 1})
    with pytest.raises(InvalidKeyError, match="251 bytes long; the limit is 250 bytes"):
        source.upsert(key251, {"rev": 1})
    lines = tmp_path / "keys.jsonl"
    lines.write_text(
        "\n".join(
            json.dumps(item, ensure_ascii=False)
            for item in [
                {"key": "plain", "doc": {"rev": 1}},
                {"key": key251, "doc": {"rev": 1}},
                {"key": key250, "doc": {"rev": 2}},
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    code, _, err = cli(capsys, "bucket", "load", "src", "--file", str(lines), "--data-dir", data_dir)
    assert code == 1 and "line 2:" in err and "251 bytes long" in err
    assert source.stats()["mutations"] == 3
    copy = FunctionDefinition.from_dict(
        {
            "name": "fn_copy",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy(data_dir, copy, "def on_update(doc, meta):\n    out[meta.id] = doc\n")
    # The ledger derives longer keys (e|<key>|<seqno>) from a 250-byte key: its writes fail with a clear
    # error and the mutations go to the DLQ; every other mutation is handled exactly once.
    deploy(data_dir, ledger_definition("fn_b", "src", "ledger"), GATED_LEDGER)

    run(data_dir)

    assert LocalBucket.open(data_dir, "out").get(key250) == {"rev": 2}
    rows = open_store(data_dir).dlq_rows("fn_b")
    assert [r.key for r in rows] == [key250, key250]
    assert all("the limit is 250 bytes" in r.error for r in rows)
    dead = {(r.vb, r.seqno) for r in rows}
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"), function="fn_b", dead_letters=dead)
    assert_handled_once_in_order_except(report, dead)


def test_non_utf8_lines_in_bucket_load_are_rejected_by_number_and_the_rest_is_handled(
    data_dir, capsys, tmp_path
):
    LocalBucket.create(data_dir, "src")
    lines = tmp_path / "mixed.jsonl"
    lines.write_bytes(
        b'{"key": "a", "doc": {"rev": 1}}\n'
        b'{"key": "b\xff", "doc": {"rev": 1}}\n'
        b'{"key": "c", "doc": {"name": "caf\xe9"}}\n'
        b'{"key": "a", "doc": {"rev": 2}}\n'
        b'{"key": "d", "doc": {"rev": 1}}\n'
    )
    code, out, err = cli(capsys, "bucket", "load", "src", "--file", str(lines), "--data-dir", data_dir)
    assert code == 1
    assert "line 2: not UTF-8" in err and "line 3: not UTF-8" in err and "re-encode the file as UTF-8" in err
    assert "loaded 3 mutations" in out
    deploy(data_dir, ledger_definition("fn_b", "src", "ledger"), GATED_LEDGER)
    run(data_dir)
    source = LocalBucket.open(data_dir, "src")
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"), function="fn_b")
    assert_handled_once_in_order_except(report, set())
    assert report.handled == 3 and open_store(data_dir).dlq_rows("fn_b") == []


def test_debugging_an_undeployed_function_says_to_deploy_it_first(data_dir, capsys):
    debug_setup(data_dir)
    lifecycle.undeploy(data_dir, "fn_d")
    code, _, err = cli(capsys, "debug", "fn_d", "--data-dir", data_dir)
    assert code == 2 and "is undeployed" in err and "deploy it first" in err
    assert open_store(data_dir).checkpoints("fn_d") == {}


def test_a_replayed_write_to_the_source_bucket_does_not_trigger_the_function_again(data_dir):
    source = LocalBucket.create(data_dir, "src_rg")
    source.upsert("a", {"n": 1})
    broken = "def on_update(doc, meta):\n    raise ValueError('not yet')\n"
    fixed = (
        "def on_update(doc, meta):\n    if 'copy' not in doc:\n        src[meta.id + '-copy'] = {'copy': "
        "True}\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_rg",
            "source_bucket": "src_rg",
            "bindings": [{"alias": "src", "bucket": "src_rg", "access": "rw"}],
        }
    )
    lifecycle.save_function(data_dir, defn, broken)
    lifecycle.deploy(data_dir, "fn_rg")
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    lifecycle.pause(data_dir, "fn_rg")
    lifecycle.save_function(data_dir, defn, fixed)
    lifecycle.resume(data_dir, "fn_rg")
    dlq.replay(data_dir, "fn_rg", dlq.DlqSelector(everything=True))
    assert source.get("a-copy") == {"copy": True}
    EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    counters = open_store(data_dir).counters("fn_rg")
    assert counters["recursion_filtered"] == 1  # the replayed copy was recognised as the function's own write
