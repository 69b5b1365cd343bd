"""The runtime on the in-process executor: order, exactly-once effects, recursion guard, dead letters,
timeouts, retries, crash and restart. Scenarios taking the `executor_kind` fixture run on both executors:
in-process in the unit run, on real Ray in the integration run (tests/conftest.py); the Ray-only scenarios
(worker processes killed, a driver killed, a live service) are in tests/integration/test_ray_runtime.py."""

from __future__ import annotations

import time

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import unpack_mutation
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import open_bucket
from eventing.testing import (
    check_ledger,
    deploy_function,
    ledger_definition,
    load_source,
    read_call_log,
)
from eventing.workers.executor import InProcessExecutor
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata.factory import open_store
from sharding import NUM_VBUCKETS


def load(data_dir: str, documents: int = 300, mutations: int = 3000, seed: int = 1) -> LocalBucket:
    return load_source(data_dir, documents, mutations, chunk=5000, seed=seed)


deploy = deploy_function


def run(data_dir: str, **kwargs):
    return EventingService(data_dir, InProcessExecutor(), until_caught_up=True, **kwargs).run()


def test_several_functions_handle_every_mutation_once_in_per_document_order(
    data_dir, tmp_path, executor_kind, executor
):
    mutations = 15_000 if executor_kind == "ray" else 3000
    source = load(data_dir, documents=mutations // 10, mutations=mutations, seed=3)
    workers = {"fn_four": 4, "fn_three": 3, "fn_two": 2}
    logs = {}
    for name, count in workers.items():
        logs[name] = tmp_path / f"{name}.calls"
        deploy(
            data_dir,
            ledger_definition(
                name, "src", f"ledger_{name}", workers=count, call_log=str(logs[name]), batch_size=500
            ),
        )
    summary = EventingService(data_dir, executor, until_caught_up=True).run()
    assert not summary.errors
    store = open_store(data_dir)
    for name, count in workers.items():
        assert summary.functions[name].handled == mutations
        report = check_ledger(source, open_bucket(data_dir, f"ledger_{name}"))
        assert report.ok, f"{name}: {report.summary()}"
        assert report.handled == mutations
        calls = read_call_log(logs[name])
        assert sum(len(v) for v in calls.values()) == mutations  # no fault: exactly one call per mutation
        assert all(seqs == sorted(set(seqs)) for seqs in calls.values())
        owners: dict[str, int] = {}
        for cp in store.checkpoints(name).values():
            owners[cp.owner] = owners.get(cp.owner, 0) + 1
        expected = {4: [256] * 4, 3: [342, 341, 341], 2: [512, 512]}[count]
        assert [owners[f"local/w{i}"] for i in range(count)] == expected
        if executor_kind == "ray":
            assert len(read_pids(logs[name])) == count  # really on `count` processes


def read_pids(path) -> set[str]:
    with open(path) as f:
        return {line.split()[2] for line in f}


def test_checkpoints_reach_the_high_seqnos_and_stats_count_calls(data_dir):
    source = load(data_dir)
    deploy(data_dir, ledger_definition("fn_a", "src", "ledger"))
    run(data_dir)
    store = open_store(data_dir)
    cps = store.checkpoints("fn_a")
    assert [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()
    counters = store.counters("fn_a")
    assert counters["on_update_success"] + counters["on_delete_success"] == 3000
    assert all(not cp.leased for cp in cps.values())


def test_from_now_boundary_skips_existing_mutations(data_dir):
    source = load(data_dir)
    deploy(data_dir, ledger_definition("fn_a", "src", "ledger"), boundary="from_now")
    source.upsert("late-comer", {"rev": 1})
    run(data_dir)
    ledger = LocalBucket.open(data_dir, "ledger")
    assert [k for k in ledger.keys() if k.startswith("e|")] == [
        f"e|fn_a|late-comer|{source.get_meta('late-comer')['seqno']}"
    ]


def test_a_function_writing_to_its_own_source_does_not_trigger_itself(data_dir):
    source = LocalBucket.create(data_dir, "src")
    source.upsert("a", {"n": 1})
    handler = (
        "def on_update(doc, meta):\n    if 'copy' not in doc:\n        src[meta.id + '-copy'] = {'copy': "
        "True, **doc}\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_self",
            "source_bucket": "src",
            "bindings": [{"alias": "src", "bucket": "src", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, handler)
    run(data_dir)
    run(data_dir)  # the copy was written after the first run's targets; the second run sees it
    assert source.get("a-copy") == {"copy": True, "n": 1}
    counters = open_store(data_dir).counters("fn_self")
    assert counters["recursion_filtered"] == 1 and counters["on_update_success"] == 1
    assert source.get("a-copy-copy") is None


def test_a_handler_error_goes_to_the_dlq_and_the_vbucket_moves_on(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(20):
        source.upsert(f"k{i}", {"i": i})
    handler = (
        "def on_update(doc, meta):\n    if doc['i'] % 5 == 0:\n        raise ValueError('poison ' + "
        "meta.id)\n    out[meta.id] = doc\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_p",
            "source_bucket": "src",
            "retries": 2,
            "retry_backoff": "1ms",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, handler)
    run(data_dir)
    store = open_store(data_dir)
    rows = store.dlq_rows("fn_p")
    assert sorted(r.key for r in rows) == ["k0", "k10", "k15", "k5"]
    assert all(
        r.reason == "error" and r.attempts == 3 and "poison" in r.error and "ValueError" in r.traceback
        for r in rows
    )
    assert unpack_mutation(rows[0].mutation).key == rows[0].key
    assert len(LocalBucket.open(data_dir, "out").keys()) == 16
    assert store.counters("fn_p")["retries"] == 8


def test_a_call_that_fails_once_succeeds_on_its_retry_with_only_the_retry_s_writes(data_dir):
    # The worker makes each update's first attempt itself (its inlined hot loop) and hands a failure to
    # the runner's retry path: the failed attempt's writes are dropped, the retry's kept, counted once.
    source = LocalBucket.create(data_dir, "src")
    for i in range(12):
        source.upsert(f"k{i}", {"i": i})
    handler = (
        "attempts = {}\n"
        "def on_update(doc, meta):\n"
        "    n = attempts[meta.id] = attempts.get(meta.id, 0) + 1\n"
        "    out[meta.id] = {'i': doc['i'], 'attempt': n}\n"
        "    if doc['i'] % 4 == 0 and n == 1:\n"
        "        raise ValueError('first attempt of ' + meta.id)\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_r",
            "source_bucket": "src",
            "retries": 1,
            "retry_backoff": "1ms",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, handler)
    run(data_dir)
    store = open_store(data_dir)
    assert store.dlq_rows("fn_r") == []
    out = LocalBucket.open(data_dir, "out")
    assert {k: out.get(k)["attempt"] for k in out.keys()} == {
        f"k{i}": 2 if i % 4 == 0 else 1 for i in range(12)
    }
    counters = store.counters("fn_r")
    assert counters["on_update_success"] == 12
    assert counters["retries"] == 3
    assert counters.get("on_update_failure", 0) == 0


def test_a_failed_attempt_leaves_no_partial_effects(data_dir):
    source = LocalBucket.create(data_dir, "src")
    source.upsert("k", {"i": 1})
    handler = (
        "def on_update(doc, meta):\n    out['partial'] = {'x': 1}\n    raise RuntimeError('after a write')\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_p",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, handler)
    run(data_dir)
    assert LocalBucket.open(data_dir, "out").get("partial") is None
    assert len(open_store(data_dir).dlq_rows("fn_p")) == 1


def test_a_hung_handler_is_abandoned_and_dead_lettered_as_timeout(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(6):
        source.upsert(f"k{i}", {"i": i})
    handler = (
        "import time\n"
        "def on_update(doc, meta):\n"
        "    if doc['i'] == 3:\n"
        "        while True:\n"
        "            time.sleep(0.01)\n"
        "    out[meta.id] = doc\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_h",
            "source_bucket": "src",
            "execution_timeout": "300ms",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, handler)
    run(data_dir)
    rows = open_store(data_dir).dlq_rows("fn_h")
    assert [(r.key, r.reason) for r in rows] == [("k3", "timeout")]
    assert sorted(LocalBucket.open(data_dir, "out").keys()) == ["k0", "k1", "k2", "k4", "k5"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_timeout_that_lands_where_python_cannot_raise_it_is_raised_again(data_dir):
    # SIGALRM can land while a call runs a __del__ or a weakref callback: Python prints an exception raised
    # there as unraisable and goes on. The call must time out all the same.
    source = LocalBucket.create(data_dir, "src")
    for i in range(3):
        source.upsert(f"k{i}", {"i": i})
    handler = (
        "import time\n"
        "class Slow:\n"
        "    def __del__(self):\n"
        "        ends = time.monotonic() + 0.6\n"
        "        while time.monotonic() < ends:\n"
        "            pass\n"
        "def on_update(doc, meta):\n"
        "    if doc['i'] == 1:\n"
        "        Slow()  # dropped at once: its __del__ runs in the call, past execution_timeout\n"
        "        ends = time.monotonic() + 5\n"
        "        while time.monotonic() < ends:\n"
        "            time.sleep(0.01)\n"
        "    out[meta.id] = doc\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_h",
            "source_bucket": "src",
            "execution_timeout": "300ms",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, handler)
    started = time.monotonic()
    run(data_dir)
    rows = open_store(data_dir).dlq_rows("fn_h")
    assert [(r.key, r.reason) for r in rows] == [("k1", "timeout")]
    assert sorted(LocalBucket.open(data_dir, "out").keys()) == ["k0", "k2"]
    assert time.monotonic() - started < 4


def test_an_oversize_document_is_dead_lettered_before_the_handler(data_dir):
    source = LocalBucket.create(data_dir, "src")
    source.upsert("small", {"s": "x"})
    source.upsert("big", {"s": "x" * 5000})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_o",
            "source_bucket": "src",
            "max_document_bytes": 1000,
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, "def on_update(doc, meta):\n    out[meta.id] = {'len': len(doc['s'])}\n")
    run(data_dir)
    rows = open_store(data_dir).dlq_rows("fn_o")
    assert [(r.key, r.reason) for r in rows] == [("big", "oversize")]
    assert LocalBucket.open(data_dir, "out").keys() == ["small"]


def test_an_undecodable_document_is_dead_lettered(data_dir):
    source = LocalBucket.create(data_dir, "src")
    source.upsert("good", {"a": 1})
    vb, seqno = source.upsert("bad", {"a": 2})
    source.file.db.execute("UPDATE log SET doc=? WHERE vb=? AND seqno=?", (b"\xc1\xc1", vb, seqno))
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_u",
            "source_bucket": "src",
            "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
        }
    )
    deploy(data_dir, defn, "def on_update(doc, meta):\n    out[meta.id] = doc\n")
    run(data_dir)
    rows = open_store(data_dir).dlq_rows("fn_u")
    assert [(r.key, r.reason) for r in rows] == [("bad", "undecodable")]
    assert LocalBucket.open(data_dir, "out").keys() == ["good"]


def test_writing_through_a_read_only_binding_is_a_dlq_error(data_dir):
    source = LocalBucket.create(data_dir, "src")
    source.upsert("k", {"a": 1})
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_r",
            "source_bucket": "src",
            "bindings": [{"alias": "ro", "bucket": "other", "access": "r"}],
        }
    )
    deploy(data_dir, defn, "def on_update(doc, meta):\n    ro[meta.id] = doc\n")
    run(data_dir)
    rows = open_store(data_dir).dlq_rows("fn_r")
    assert len(rows) == 1 and "read-only" in rows[0].error


def test_a_crashed_worker_resumes_after_its_checkpoint_without_duplicate_effects(data_dir):
    source = load(data_dir, 200, 2000)
    # A checkpoint interval no step reaches, however slow the machine: the second step must not checkpoint.
    deploy(
        data_dir,
        ledger_definition("fn_c", "src", "ledger", workers=1, batch_size=100, checkpoint_interval="1h"),
    )
    generation = open_store(data_dir).get_function("fn_c").generation
    spec = WorkerSpec(data_dir, "fn_c", generation, "local/w0", tuple(range(NUM_VBUCKETS)))
    first = WorkerCore(spec)
    first.step(300)
    first.commit()
    first.step(300)
    first.flush_effects()  # effects durable, checkpoint not yet: the worst moment to die
    committed = open_store(data_dir).checkpoints("fn_c")
    del first  # crash: no stop, no release
    second = WorkerCore(spec)
    assert all(second.positions[vb] == committed[vb].seqno for vb in range(NUM_VBUCKETS))
    while not second.step(500).caught_up:
        pass
    second.stop()
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"))
    assert report.ok, report.summary()
    counters = open_store(data_dir).counters("fn_c")
    assert counters["effects_duplicate"] > 0  # the replayed mutations' effects were recognised and skipped


def test_a_zombie_worker_is_fenced_from_checkpoints_and_effects(data_dir):
    source = load(data_dir, 100, 1000)
    deploy(data_dir, ledger_definition("fn_z", "src", "ledger", workers=1))
    generation = open_store(data_dir).get_function("fn_z").generation
    spec = WorkerSpec(data_dir, "fn_z", generation, "local/w0", tuple(range(NUM_VBUCKETS)))
    zombie = WorkerCore(spec)
    successor = WorkerCore(WorkerSpec(data_dir, "fn_z", generation, "local/w1", tuple(range(NUM_VBUCKETS))))
    report = zombie.step(400)
    assert report.handled == 400
    zombie_fenced = zombie.commit()
    assert zombie.owned() == []  # every vBucket it touched was rejected, and it let them go
    assert zombie_fenced or report.fenced
    assert open_store(data_dir).counters("fn_z")["effects_fenced"] > 0
    while not successor.step(1000).caught_up:
        pass
    successor.stop()
    assert check_ledger(source, LocalBucket.open(data_dir, "ledger")).ok


def test_pause_and_resume_continue_after_the_checkpoint(data_dir):
    source = load(data_dir, 100, 1000)
    deploy(data_dir, ledger_definition("fn_pr", "src", "ledger"))
    run(data_dir)
    lifecycle.pause(data_dir, "fn_pr")
    for i in range(50):
        source.upsert(f"new{i}", {"rev": 1})
    assert run(data_dir).functions == {}  # paused: nothing runs
    lifecycle.resume(data_dir, "fn_pr")
    summary = run(data_dir)
    assert summary.functions["fn_pr"].handled == 50
    assert check_ledger(source, LocalBucket.open(data_dir, "ledger")).ok


def test_redeploy_starts_again_from_the_boundary(data_dir):
    load(data_dir, 50, 200)
    deploy(data_dir, ledger_definition("fn_re", "src", "ledger"))
    run(data_dir)
    lifecycle.undeploy(data_dir, "fn_re")
    assert open_store(data_dir).checkpoints("fn_re") == {}
    lifecycle.deploy(data_dir, "fn_re")
    assert run(data_dir).functions["fn_re"].handled == 200


def test_a_handler_that_does_not_import_is_refused_at_deploy(data_dir):
    LocalBucket.create(data_dir, "src")
    defn = FunctionDefinition.from_dict({"name": "fn_bad", "source_bucket": "src"})
    from eventing.errors import HandlerLoadError

    with pytest.raises(HandlerLoadError, match="syntax error at line 1"):
        lifecycle.save_function(data_dir, defn, "def on_update(doc, meta)\n    pass\n")
    with pytest.raises(HandlerLoadError, match="defines neither on_update"):
        lifecycle.save_function(data_dir, defn, "x = 1\n")
    assert open_store(data_dir).list_functions() == []  # nothing half-written
    # Saving runs none of the handler's code: an import that fails is found when deploy imports it.
    lifecycle.save_function(data_dir, defn, "import no_such_module_here\ndef on_update(d, m): pass\n")
    with pytest.raises(HandlerLoadError, match="fails on import"):
        lifecycle.deploy(data_dir, "fn_bad")
    assert open_store(data_dir).get_function("fn_bad").state.value == "undeployed"


def test_two_aliases_of_one_bucket_share_their_writes(data_dir):
    source = LocalBucket.create(data_dir, "src")
    for i in range(3):
        source.upsert(f"k{i}", {"i": i})
    handler = (
        "def on_update(doc, meta):\n"
        "    a[meta.id + '-a'] = {'i': doc['i']}\n"
        "    b[meta.id + '-b'] = {'seen_a': meta.id + '-a' in b}\n"
    )
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_two",
            "source_bucket": "src",
            "bindings": [
                {"alias": "a", "bucket": "out", "access": "rw"},
                {"alias": "b", "bucket": "out", "access": "rw"},
            ],
        }
    )
    deploy(data_dir, defn, handler)
    run(data_dir)
    out = LocalBucket.open(data_dir, "out")
    assert sorted(out.keys()) == ["k0-a", "k0-b", "k1-a", "k1-b", "k2-a", "k2-b"]
    assert all(out.get(f"k{i}-b") == {"seen_a": True} for i in range(3))
    assert open_store(data_dir).counters("fn_two").get("effects_duplicate", 0) == 0


def test_an_explicit_budget_is_one_batch_and_a_supervisor_step_keeps_going_while_behind(
    data_dir, monkeypatch
):
    load(data_dir, 200, 2000)
    deploy(data_dir, ledger_definition("fn_s", "src", "ledger", workers=1, batch_size=100))
    generation = open_store(data_dir).get_function("fn_s").generation
    core = WorkerCore(WorkerSpec(data_dir, "fn_s", generation, "local/w0", tuple(range(NUM_VBUCKETS))))
    assert core.step(100).handled == 100
    monkeypatch.setattr(
        "eventing.workers.worker.STEP_SLICE_S", 60.0
    )  # the slice never runs out: only the backlog ends it
    report = core.step()
    assert report.handled == 1900 and report.caught_up
    monkeypatch.setattr("eventing.workers.worker.STEP_SLICE_S", 0.0)  # an expired slice still takes one batch
    load(data_dir, 200, 300, seed=2)
    assert core.step().handled == 100


def test_a_run_done_within_its_first_report_keeps_its_first_handler_call_time(data_dir):
    """The start-up figure (`eventing run` prints it) of a run so short that the report which handled its
    mutations also finished it: the function leaves the running set before any progress report."""
    source = load(data_dir, documents=10, mutations=20)
    deploy(data_dir, ledger_definition("fn_a", "src", "ledger", workers=1))
    run(data_dir)
    for i in range(5):
        source.upsert(f"late::{i}", {"rev": 1})
    summary = run(data_dir)
    assert summary.functions["fn_a"].handled == 5
    assert summary.functions["fn_a"].first_handled_at > 0
