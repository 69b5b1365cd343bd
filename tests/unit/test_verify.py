"""`eventing verify` and the ledger check behind it, on the in-process executor: what counts as accounted
for (an effect, a dead letter, the recursion guard), and what is reported (missing, duplicated,
reordered, checkpoints moved backwards), with the CLI's verdict line, --json and exit codes."""

from __future__ import annotations

import json

import pytest

from eventing.cli import main
from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.mutation import OP_UPDATE, encode_document
from eventing.errors import OrderViolationError
from eventing.ops.verify import effect_key, history_key, parse_effect_key, verify_function
from eventing.storage.bucket import LocalBucket
from eventing.storage.values import Write
from eventing.testing import LEDGER_HANDLER, check_ledger, deploy_function, ledger_definition, load_source
from eventing.workers.executor import InProcessExecutor
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS


def load(data_dir: str, documents: int = 100, mutations: int = 600) -> LocalBucket:
    return load_source(data_dir, documents, mutations, chunk=5000, seed=5)


deploy = deploy_function


def run(data_dir: str) -> None:
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors, summary.errors


@pytest.fixture
def processed(data_dir):
    """600 mutations handled by fn_v into the bucket `ledger`."""
    source = load(data_dir)
    deploy(data_dir, ledger_definition("fn_v", "src", "ledger"))
    run(data_dir)
    return source, LocalBucket.open(data_dir, "ledger")


def first_mutation(source: LocalBucket):
    return next(iter(source.scan_log()))[0]


def test_every_mutation_up_to_the_checkpoints_is_accounted_for(data_dir, processed):
    report = verify_function(data_dir, "fn_v")
    assert report.ok, report.summary()
    assert (report.source_mutations, report.handled, report.accounted) == (600, 600, 600)
    assert report.summary() == "ALL MUTATIONS ACCOUNTED FOR (600 of 600): 600 handled"


def test_a_deleted_ledger_effect_is_reported_missing(data_dir, processed):
    source, ledger = processed
    m = first_mutation(source)
    ledger.file.db.execute("DELETE FROM log WHERE key=?", (effect_key("fn_v", m.key, m.seqno),))
    report = verify_function(data_dir, "fn_v")
    assert not report.ok
    assert [(r.key, r.vb, r.seqno) for r in report.missing] == [(m.key, m.vb, m.seqno)]
    assert report.summary().startswith("NOT ALL MUTATIONS ACCOUNTED FOR (599 of 600): 1 missing (e.g. ")
    assert f"{m.key}@{m.vb}:{m.seqno}" in report.summary()


def test_an_effect_written_twice_is_reported_duplicated(data_dir, processed):
    source, ledger = processed
    m = first_mutation(source)
    key = effect_key("fn_v", m.key, m.seqno)
    ledger.write([Write(key, OP_UPDATE, ledger.get_raw(key))], origin="fn_v")
    report = verify_function(data_dir, "fn_v")
    assert report.duplicate_effects == [key] and report.duplicate_writes == 1
    assert report.missing == [] and not report.ok
    assert "1 effects applied more than once" in report.summary()


def test_a_reordered_history_is_reported(data_dir, processed):
    source, ledger = processed
    key = next(k for k in source.keys() if len(ledger.get(history_key("fn_v", k))["seqs"]) >= 3)
    seqs = ledger.get(history_key("fn_v", key))["seqs"]
    ledger.upsert(history_key("fn_v", key), {"seqs": [seqs[1], seqs[0], *seqs[2:]]})
    report = verify_function(data_dir, "fn_v")
    assert report.out_of_order == [key] and not report.ok
    assert "1 document out of order" in report.summary()


def test_an_effect_of_no_source_mutation_is_reported(data_dir, processed):
    _, ledger = processed
    ledger.upsert(effect_key("fn_v", "ghost", 999_999), {"key": "ghost"}, origin="fn_v")
    report = verify_function(data_dir, "fn_v")
    assert report.unexpected == [effect_key("fn_v", "ghost", 999_999)] and not report.ok


def test_dead_letters_count_as_accounted_for(data_dir):
    load(data_dir)
    poisoned = LEDGER_HANDLER + (
        "\n_record_update = on_update\n"
        "def on_update(doc, meta):\n"
        "    if meta.id.endswith('7'):\n"
        "        raise ValueError('poison ' + meta.id)\n"
        "    _record_update(doc, meta)\n"
    )
    deploy(data_dir, ledger_definition("fn_p", "src", "ledger", retry_backoff="1ms"), poisoned)
    run(data_dir)
    dead = open_store(data_dir).dlq_rows("fn_p")
    assert dead
    report = verify_function(data_dir, "fn_p")
    assert report.ok, report.summary()
    assert report.dead_lettered == len(dead) and report.handled + report.dead_lettered == 600
    assert f"{len(dead)} dead-lettered" in report.summary()


def test_mutations_filtered_by_the_recursion_guard_count_as_accounted_for(data_dir):
    load(data_dir, 20, 50)
    deploy(data_dir, ledger_definition("fn_self", "src", "src"))  # its ledger is its own source bucket
    run(data_dir)
    run(data_dir)  # the second run reaches the function's own writes, which the guard filters
    report = verify_function(data_dir, "fn_self")
    assert report.ok, report.summary()
    assert report.handled == 50
    assert report.recursion_filtered == 2 * 50  # an effect and a history write per handled mutation
    assert report.source_mutations == 150


def test_a_running_function_owes_only_what_its_checkpoints_cover(data_dir):
    load(data_dir)
    deploy(data_dir, ledger_definition("fn_r", "src", "ledger", workers=1))
    generation = open_store(data_dir).get_function("fn_r").generation
    core = WorkerCore(WorkerSpec(data_dir, "fn_r", generation, "local/w0", tuple(range(NUM_VBUCKETS))))
    core.step(200)
    core.commit()
    core.step(100)
    core.flush_effects()  # effects of 100 more are durable; the checkpoint has not moved yet
    report = verify_function(data_dir, "fn_r")
    assert report.ok, report.summary()
    assert (
        report.source_mutations == 200 and report.beyond_checkpoint == 100 and report.past_checkpoint == 400
    )
    assert report.summary().endswith(
        "; 400 more past the checkpoints, not owed yet (100 of them already handled)"
    )
    assert sum(cp.seqno for cp in open_store(data_dir).checkpoints("fn_r").values()) == 200


def test_a_from_now_function_owes_only_mutations_after_its_boundary(data_dir):
    source = load(data_dir)
    deploy(data_dir, ledger_definition("fn_n", "src", "ledger"), boundary="from_now")
    for i in range(30):
        source.upsert(f"new::{i}", {"rev": 1})
    run(data_dir)
    report = verify_function(data_dir, "fn_n")
    assert report.ok, report.summary()
    assert report.source_mutations == 30


def test_a_checkpoint_moved_backwards_is_reported(data_dir, processed):
    store = open_store(data_dir)
    vb = next(vb for vb, cp in store.checkpoints("fn_v").items() if cp.seqno >= 2)
    top = store.checkpoints("fn_v")[vb].seqno
    # A write that bypasses commit (a fault) is caught by the store's trigger ...
    store._db.execute("UPDATE checkpoints SET seqno=? WHERE function=? AND vb=?", (top - 2, "fn_v", vb))
    # ... and one through commit is refused, and recorded all the same.
    epoch = store.checkpoints("fn_v")[vb].epoch
    with pytest.raises(OrderViolationError):
        store.commit("fn_v", {vb: epoch}, {vb: top - 3})
    report = verify_function(data_dir, "fn_v")
    assert [(r["vb"], r["from_seqno"], r["to_seqno"], r["how"]) for r in report.checkpoint_regressions] == [
        (vb, top, top - 2, "applied"),
        (vb, top - 2, top - 3, "refused"),
    ]
    assert not report.ok and "2 checkpoints moved backwards" in report.summary()


def test_two_functions_can_share_one_ledger_bucket(data_dir):
    source = load(data_dir)
    deploy(data_dir, ledger_definition("fn_one", "src", "shared"))
    deploy(data_dir, ledger_definition("fn_two", "src", "shared", workers=3))
    run(data_dir)
    for name in ("fn_one", "fn_two"):
        report = verify_function(data_dir, name)
        assert report.ok and report.handled == 600, report.summary()
    with pytest.raises(Exception, match="several functions"):
        check_ledger(source, LocalBucket.open(data_dir, "shared"))
    assert check_ledger(source, LocalBucket.open(data_dir, "shared"), function="fn_two").ok


def test_the_harness_check_ledger_is_the_same_check(processed):
    source, ledger = processed
    report = check_ledger(source, ledger)
    assert report.ok and report.function == "fn_v" and report.handled == 600


def test_effect_keys_round_trip_with_separators_in_document_keys():
    assert parse_effect_key(effect_key("fn", "a|b|c", 42)) == ("fn", "a|b|c", 42)
    assert parse_effect_key("h|fn|a") is None
    assert parse_effect_key("e|fn|nokey") is None


# -- the command ------------------------------------------------------------------------------------


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_command_prints_the_verdict_and_exits_0_when_all_are_accounted_for(
    data_dir, processed, capsys
):
    code, out, _ = cli(capsys, "verify", "fn_v", "--data-dir", data_dir)
    assert code == 0
    assert out == "ALL MUTATIONS ACCOUNTED FOR (600 of 600): 600 handled\n"


def test_verify_command_exits_1_and_names_what_is_missing(data_dir, processed, capsys):
    source, ledger = processed
    m = first_mutation(source)
    ledger.file.db.execute("DELETE FROM log WHERE key=?", (effect_key("fn_v", m.key, m.seqno),))
    code, out, _ = cli(capsys, "verify", "fn_v", "--data-dir", data_dir)
    assert code == 1
    assert out.count("\n") == 1 and out.startswith("NOT ALL MUTATIONS ACCOUNTED FOR (599 of 600): 1 missing")


def test_verify_command_json(data_dir, processed, capsys):
    source, ledger = processed
    m = first_mutation(source)
    key = effect_key("fn_v", m.key, m.seqno)
    ledger.write([Write(key, OP_UPDATE, encode_document({"again": True}))], origin="fn_v")
    code, out, _ = cli(capsys, "verify", "fn_v", "--ledger", "ledger", "--json", "--data-dir", data_dir)
    data = json.loads(out)
    assert code == 1 and data["ok"] is False
    assert data["duplicate_effects"] == [key] and data["missing"] == []
    assert data["source_mutations"] == data["accounted"] == 600
    assert data["verdict"].startswith("NOT ALL MUTATIONS ACCOUNTED FOR")


def test_verify_command_errors_name_the_fix(data_dir, processed, capsys):
    code, _, err = cli(capsys, "verify", "fn_nope", "--data-dir", data_dir)
    assert code == 2 and "unknown function 'fn_nope'" in err
    lifecycle.undeploy(data_dir, "fn_v")
    code, _, err = cli(capsys, "verify", "fn_v", "--data-dir", data_dir)
    assert code == 2 and "has no checkpoints (it is undeployed)" in err
