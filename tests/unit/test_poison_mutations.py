"""Poison mutations: a mutation whose handler call ends the worker's process is counted from the worker's
call notes (eventing.workers.crash_guard) and dead-lettered as `crashed` after two deaths with it alone in
flight, while every other mutation is handled exactly once (the ledger); a JavaScript handler that throws
a value V8 cannot describe (a cyclic object, a Proxy whose traps throw, a Symbol) gets an ordinary dead
letter. Real process deaths (os._exit on Ray, in-process runs, sandboxed children) are in
tests/integration/test_poison_deaths.py; here a death is the state a killed process leaves: the handler
copies the worker's notes file at the poison mutation and raises SystemExit, which ends the worker's step,
and the copy is put back as the notes the next worker reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eventing.api import Eventing
from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.ops import dlq as dlq_ops
from eventing.storage.factory import create_bucket, open_bucket
from eventing.testing import (
    BATCH_LEDGER_HANDLER,
    LEDGER_HANDLER,
    check_ledger,
    deploy_function,
    ledger_definition,
)
from eventing.workers.crash_guard import _active, notes_path
from eventing.workers.executor import InProcessExecutor
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata import TIMER_VB_BASE
from metadata.factory import open_store
from sharding import NUM_VBUCKETS, vbucket_of

WORKER = "local/w0"  # the id a service gives the function's one worker: its notes file is this worker's

# The ledger handler, with a poison key that "kills" the worker: it leaves the notes as they are at that
# moment in SNAPSHOT and ends the step (SystemExit propagates out of the worker, as a death would stop it).
POISONED = (
    LEDGER_HANDLER
    + """

def _die():
    import shutil
    shutil.copyfile(NOTES, SNAPSHOT)
    raise SystemExit(7)


_on_update = on_update


def on_update(doc, meta):
    if meta.id == "poison":
        if SLEEP_MS:  # with a pool: the other calls in flight by now
            import time
            time.sleep(SLEEP_MS / 2000)
        _die()
    _on_update(doc, meta)
"""
)


# The batch ledger handler (on_batch), dying on the poison item in the middle of its batch.
POISONED_BATCH = (
    BATCH_LEDGER_HANDLER
    + """

def _die():
    import shutil
    shutil.copyfile(NOTES, SNAPSHOT)
    raise SystemExit(7)


_on_batch = on_batch


def on_batch(batch):
    if any(item.id == "poison" for item in batch):
        _die()
    return _on_batch(batch)
"""
)


def same_vbucket_keys(key: str, count: int) -> list[str]:
    vb = vbucket_of(key)
    return [k for k in (f"n{i}" for i in range(100_000)) if vbucket_of(k) == vb][:count]


def setup(data_dir: str, tmp_path: Path, handler: str = POISONED, **settings) -> tuple[str, Path, Path]:
    """A source of 40 documents, 6 of them (the poison among them) in the poison's vBucket, and the poisoned
    ledger function on one worker."""
    source = create_bucket(data_dir, "src")
    keys = [*same_vbucket_keys("poison", 5), "poison", *(f"k{i}" for i in range(34))]
    for i, key in enumerate(keys):
        source.upsert(key, {"rev": i})
    source.close()
    snapshot = tmp_path / "notes-at-death"
    notes = notes_path(data_dir, "fn_p", WORKER, Path(data_dir))
    defn = ledger_definition("fn_p", "src", "ledger", workers=1, **settings)
    defn = FunctionDefinition.from_dict(
        {
            **defn.to_dict(),
            "constants": {
                **defn.constants,
                "NOTES": str(notes),
                "SNAPSHOT": str(snapshot),
                "FAIL_EVERY": 0,
                "FAIL_ATTEMPTS": 0,
            },
        }
    )
    deploy_function(data_dir, defn, handler)
    return "fn_p", notes, snapshot


def start(data_dir: str) -> WorkerCore:
    store = open_store(data_dir)
    generation = store.get_function("fn_p").generation
    store.close()
    return WorkerCore(WorkerSpec(data_dir, "fn_p", generation, WORKER, tuple(range(NUM_VBUCKETS))))


def die_on_the_poison(data_dir: str, notes: Path, snapshot: Path) -> list[tuple[int, int, int]]:
    """A worker starts, steps until the poison ends it, and leaves the notes it had at that moment (the worker
    is abandoned: no stop, no checkpoint). Returns those notes."""
    core = start(data_dir)
    with pytest.raises(SystemExit):
        while True:
            core.step()
    shutil.copyfile(snapshot, notes)
    generation = open_store(data_dir).get_function("fn_p").generation
    return _active(notes.read_bytes(), generation)


def check_the_rest_was_handled_once(data_dir: str) -> None:
    letters = dlq_ops.list_rows(data_dir, "fn_p")
    assert [(r.key, r.reason, r.attempts) for r in letters] == [("poison", "crashed", 2)]
    assert "died 2 times while the handler ran on this mutation alone" in letters[0].error
    report = check_ledger(
        open_bucket(data_dir, "src"),
        open_bucket(data_dir, "ledger"),
        dead_letters=[(r.vb, r.seqno) for r in letters],
    )
    assert report.ok, report.summary()
    assert report.handled == 39 and report.missing == []


def test_a_mutation_its_worker_dies_on_is_dead_lettered_after_two_deaths_alone(data_dir, tmp_path):
    _, notes, snapshot = setup(data_dir, tmp_path)
    poison = vbucket_of("poison")
    first = die_on_the_poison(data_dir, notes, snapshot)
    # The worker's thread notes a run of the vBucket at a time: the death names the run, not the mutation.
    assert len(first) == 1 and first[0][0] == poison and first[0][1] < first[0][2]
    second = die_on_the_poison(data_dir, notes, snapshot)
    assert open_store(data_dir).deaths("fn_p") == {}  # a run: its mutations became suspects, none counted
    ((vb, seqno, last),) = second  # handled alone now: the note names the poison
    assert (vb, seqno) == (poison, last)
    die_on_the_poison(data_dir, notes, snapshot)
    assert open_store(data_dir).deaths("fn_p") == {(poison, seqno): 1}
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors
    assert open_store(data_dir).deaths("fn_p") == {(poison, seqno): 2}
    check_the_rest_was_handled_once(data_dir)
    # Later starts skip it by its dead letter, and a clean stop leaves no note.
    assert _active(notes.read_bytes(), open_store(data_dir).get_function("fn_p").generation) == []


def test_a_pool_hands_the_calls_in_flight_at_a_death_to_its_worker_thread_one_at_a_time(data_dir, tmp_path):
    _, notes, snapshot = setup(data_dir, tmp_path, concurrency=4, sleep_ms=40)
    poison = vbucket_of("poison")
    first = die_on_the_poison(data_dir, notes, snapshot)
    assert len(first) > 1  # the poison's call and the other calls in flight on the pool at that moment
    assert all(vb_first == vb_last for _, vb_first, vb_last in first)  # a pool thread notes each call
    assert open_store(data_dir).deaths("fn_p") == {}  # several calls: none of them counted
    second = die_on_the_poison(data_dir, notes, snapshot)
    ((vb, seqno, last),) = second  # the pool finished its calls; the poison ran alone on the worker's thread
    assert (vb, seqno) == (poison, last)
    die_on_the_poison(data_dir, notes, snapshot)
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors
    assert open_store(data_dir).deaths("fn_p") == {(poison, seqno): 2}
    check_the_rest_was_handled_once(data_dir)


def test_a_batch_handler_that_dies_on_one_item_has_that_item_dead_lettered_and_the_rest_handled(
    data_dir, tmp_path
):
    _, notes, snapshot = setup(data_dir, tmp_path, POISONED_BATCH)
    poison = vbucket_of("poison")
    first = die_on_the_poison(data_dir, notes, snapshot)
    # on_batch ran on the whole batch: every vBucket's span of it is noted, so none is counted yet.
    assert len(first) > 1 and poison in {vb for vb, _, _ in first}
    assert open_store(data_dir).deaths("fn_p") == {}
    second = die_on_the_poison(data_dir, notes, snapshot)
    ((vb, seqno, last),) = second  # the suspects ran one at a time, each a batch of one: the poison alone
    assert (vb, seqno) == (poison, last)
    die_on_the_poison(data_dir, notes, snapshot)
    assert open_store(data_dir).deaths("fn_p") == {(poison, seqno): 1}
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors
    check_the_rest_was_handled_once(data_dir)


def test_deaths_of_an_earlier_deployment_do_not_count(data_dir, tmp_path):
    _, notes, snapshot = setup(data_dir, tmp_path)
    die_on_the_poison(data_dir, notes, snapshot)
    die_on_the_poison(data_dir, notes, snapshot)
    die_on_the_poison(data_dir, notes, snapshot)
    assert len(open_store(data_dir).deaths("fn_p")) == 1
    lifecycle.undeploy(data_dir, "fn_p")
    lifecycle.deploy(data_dir, "fn_p")
    assert open_store(data_dir).deaths("fn_p") == {}
    core = start(data_dir)  # the notes name the last deployment's call: no death is counted
    assert core.crash_guard.deaths == {} and core.crash_guard.suspects == {}
    core.close()


# A timer whose callback "kills" the worker (as POISONED does for a mutation); the other timers write a mark.
TIMER_POISON = """
import shutil
import time


def on_update(doc, meta):
    create_timer(ring, time.time() - 1, meta.id, {"key": meta.id})


def ring(context):
    if context["key"] == "poison":
        shutil.copyfile(NOTES, SNAPSHOT)
        raise SystemExit(7)
    out[context["key"]] = {"rang": True}
"""


def test_a_timer_callback_its_worker_dies_on_is_dead_lettered_after_two_deaths(data_dir, tmp_path):
    source = create_bucket(data_dir, "src")
    for key in ("a", "poison", "b"):
        source.upsert(key, {"k": key})
    source.close()
    snapshot, notes = tmp_path / "notes-at-death", notes_path(data_dir, "fn_p", WORKER, Path(data_dir))
    deploy_function(
        data_dir,
        FunctionDefinition.from_dict(
            {
                "name": "fn_p",
                "source_bucket": "src",
                "worker_count": 1,
                "checkpoint_interval": "10ms",
                "bindings": [{"alias": "out", "bucket": "out", "access": "rw"}],
                "constants": {"NOTES": str(notes), "SNAPSHOT": str(snapshot)},
            }
        ),
        TIMER_POISON,
    )
    for _ in range(2):
        ((vb, fire_seq, last),) = die_on_the_poison(data_dir, notes, snapshot)  # each callback is noted alone
        assert vb >= TIMER_VB_BASE and fire_seq == last
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert not summary.errors
    assert open_store(data_dir).deaths("fn_p") == {(vb, fire_seq): 2}
    letters = dlq_ops.list_rows(data_dir, "fn_p")
    assert [(r.vb, r.seqno, r.reason) for r in letters] == [(vb, fire_seq, "crashed")]
    assert sorted(open_bucket(data_dir, "out").keys()) == ["a", "b"]
    assert open_store(data_dir).counters("fn_p")["timers_fired"] == 2


# -- JavaScript: what a handler throws becomes a plain error -------------------------------------------


@pytest.mark.parametrize(
    ("thrown", "message"),
    [
        (
            "var o = {a: 1}; o.self = o; throw o;",
            "Uncaught [object Object] (Converting circular structure to JSON",
        ),
        (
            "throw new Proxy({}, {get: trap, getPrototypeOf: trap, has: trap, ownKeys: trap, "
            "getOwnPropertyDescriptor: trap});",
            "Uncaught a value whose properties cannot be read (a Proxy whose traps throw)",
        ),
        ("throw Symbol('poison');", "Uncaught Symbol(poison)"),
        ("throw 10n;", "Uncaught 10n"),  # as V8 shows it (JSON has no BigInt)
        # Past the prelude's catch (its describer replaced): V8's exception becomes a plain error all the
        # same.
        ("__describe = trap; throw 1;", "Error: trap"),
    ],
)
def test_a_javascript_throw_of_any_value_is_an_ordinary_dead_letter(data_dir, thrown, message):
    pytest.importorskip("STPyV8")
    source = """
function trap() { throw new Error('trap'); }
function OnUpdate(doc, meta) {
    if (meta.id === 'poison') { THROWN }
    dst[meta.id] = doc;
}
function OnDelete(meta, options) {
    if (meta.id === 'poison') { THROWN }
    dst[meta.id] = {deleted: true};
}
""".replace("THROWN", thrown)
    app = Eventing(data_dir, executor="in-process")
    app.create_bucket("src")
    app.create_bucket("dst")
    keys = [*(f"k{i}" for i in range(10)), "poison", *(f"m{i}" for i in range(10))]
    for key in keys:
        app.upsert("src", key, {"key": key})
    app.remove("src", "poison")  # OnDelete runs through the single-call path, OnUpdate in batches
    app.upsert("src", "after", {"key": "after"})
    app.deploy(
        {
            "name": "fn_js",
            "source_bucket": "src",
            "language": "javascript",
            "bindings": [{"alias": "dst", "bucket": "dst", "access": "rw"}],
        },
        source,
    )
    summary = app.run(until_caught_up=True)
    assert not summary.errors, summary.errors
    letters = dlq_ops.list_rows(data_dir, "fn_js")
    assert [(r.key, r.reason) for r in letters] == [("poison", "error"), ("poison", "error")]
    assert all(r.error.startswith(message) and "\n" not in r.error for r in letters)
    dst = open_bucket(data_dir, "dst")
    assert sorted(dst.keys()) == sorted(k for k in keys + ["after"] if k != "poison")
    assert open_store(data_dir).counters("fn_js")["on_update_success"] == 21
