"""A sandboxed worker hands its writes over to its host and goes on with its next batch while the host
applies them (eventing.workers.handover). Whatever happens to a hand-over while the child has gone on (the
host applies it and the child is killed before it hears so, the child is killed before anything is
applied, or applying fails), every mutation's effect is in the ledger exactly once and each document's
history is in seqno order (read-your-writes across the hand-over): counted by check_ledger."""

from __future__ import annotations

import os
import threading

import pytest

from eventing.errors import StoreError
from eventing.storage.bucket import LocalBucket
from eventing.testing import LEDGER_HANDLER, check_ledger, deploy_function, ledger_definition, load_source
from eventing.workers.sandbox import host
from eventing.workers.sandbox.landlock import sandbox_unavailable
from eventing.workers.worker import WorkerSpec
from eventing.workers.worker_died import WorkerDied
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]

MUTATIONS = 2000
CAUGHT = 3  # the hand-over acted on: the third


@pytest.mark.parametrize("fate", ["applied_then_killed", "killed_before_applied", "failed"])
def test_writes_handed_over_are_applied_once_whatever_happens_meanwhile(data_dir, monkeypatch, fate):
    source = load_source(data_dir, 200, MUTATIONS, chunk=5000, seed=3)
    deploy_function(
        data_dir,
        ledger_definition("fn_h", "src", "ledger", workers=1, batch_size=100, isolation="sandbox"),
        LEDGER_HANDLER,
    )
    generation = open_store(data_dir).get_function("fn_h").generation
    spec = WorkerSpec(data_dir, "fn_h", generation, "local/w0", tuple(range(NUM_VBUCKETS)))

    handed, acted = [], []
    next_call = threading.Event()  # the host called the child again: it went on past its hand-over
    answer_later, send = host._Sandboxed._answer_later, host._Sandboxed._send

    def watched_send(self, message):
        if message[0] == "call" and handed and not acted:
            next_call.set()
        send(self, message)

    def intercepted(self, ident, method, args):
        if not threading.current_thread().name.startswith("sandbox-effects"):
            return answer_later(self, ident, method, args)
        handed.append(ident)
        if len(handed) != CAUGHT:
            return answer_later(self, ident, method, args)
        assert next_call.wait(60), "the child did not go on while its writes were being applied"
        acted.append(fate)
        if fate == "applied_then_killed":
            self.service.call(method, *args)  # in the bucket, with its marks; the child never hears so
            self.proc.kill()
        elif fate == "killed_before_applied":
            self.proc.kill()
        else:
            self._send(("ans", ident, False, ("StoreError", "the disk is full (a test's failure)")))

    monkeypatch.setattr(host._Sandboxed, "_answer_later", intercepted)
    monkeypatch.setattr(host._Sandboxed, "_send", watched_send)

    core = host.SandboxedCore(spec)
    store = open_store(data_dir)
    died = failed = steps = 0
    try:
        while True:
            steps += 1
            assert steps < 500, "the worker did not catch up"
            try:
                if core.step(100).caught_up:
                    break
            except WorkerDied:
                died += 1
                core.close()
                core = host.SandboxedCore(spec)  # claims again, resumes after its last checkpoint
            except StoreError as exc:
                assert "disk is full" in str(exc)
                failed += 1  # the child rewound to its checkpoint: the same core goes on
    finally:
        core.stop()

    assert acted == [fate] and len(handed) > CAUGHT
    assert (died, failed) == ((0, 1) if fate == "failed" else (1, 0))
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"))
    assert report.ok and report.handled == MUTATIONS, report.summary()
    counters = store.counters("fn_h")
    if fate == "applied_then_killed":
        assert counters["effects_duplicate"] > 0  # applied before the kill, recognised and skipped after it


def test_stop_ends_the_child_and_leaves_the_hosts_connections_to_close(data_dir):
    """A stop ends the child and removes its folder at once, but the host's bucket connections are closed
    only by close() (or with the process): closing the last connection to a written bucket checkpoints its
    WAL, which an unsandboxed worker's stop does not wait for either."""
    source = load_source(data_dir, 50, 300, chunk=300, seed=5)
    deploy_function(
        data_dir,
        ledger_definition("fn_s", "src", "ledger", workers=1, batch_size=100, isolation="sandbox"),
        LEDGER_HANDLER,
    )
    generation = open_store(data_dir).get_function("fn_s").generation
    core = host.SandboxedCore(
        WorkerSpec(data_dir, "fn_s", generation, "local/w0", tuple(range(NUM_VBUCKETS)))
    )
    while not core.step(100).caught_up:
        pass
    backend = core.service.backend
    core.stop()
    assert core.proc.poll() is not None and not os.path.exists(core.tmp)
    assert core.service.backend is backend and backend._buckets, "stop closed the host's connections"
    core.close()
    assert core.service.backend is None and not backend._buckets
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"))
    assert report.ok and report.handled == 300, report.summary()


def _applies_seen(monkeypatch) -> list[str]:
    """The kind of each apply_effects request the host reads from its child ("wait", "req" or "tail")."""
    kinds: list[str] = []
    values = host._values

    def seen(data):
        message = values(data)
        if message[2] == "bucket" and isinstance(message[3], tuple) and message[3][1:2] == ("apply_effects",):
            kinds.append(message[0])
        return message

    monkeypatch.setattr(host, "_values", seen)
    return kinds


def _sandboxed_core(data_dir, name: str):
    source = load_source(data_dir, 50, 200, chunk=200, seed=7)
    deploy_function(
        data_dir,
        ledger_definition(name, "src", "ledger", workers=1, batch_size=100, isolation="sandbox"),
        LEDGER_HANDLER,
    )
    generation = open_store(data_dir).get_function(name).generation
    spec = WorkerSpec(data_dir, name, generation, "local/w0", tuple(range(NUM_VBUCKETS)))
    return source, host.SandboxedCore(spec)


def test_a_caught_up_steps_writes_are_sent_as_it_ends_and_durable_when_it_reports(data_dir, monkeypatch):
    """The child does not wait for its last flush: it sends it as a tail, which the host applies before
    it reads the rest of the step, so the effect is in the bucket the moment the step reports."""
    source, core = _sandboxed_core(data_dir, "fn_t")
    ledger = LocalBucket.open(data_dir, "ledger")
    try:
        while not core.step(100).caught_up:
            pass
        kinds = _applies_seen(monkeypatch)
        for i in range(5):
            source.upsert(f"late-{i}", {"n": i})
            report = core.step(None)
            assert report.caught_up and report.handled == 1
            assert ledger.keys(f"e|fn_t|late-{i}|"), (
                f"write {i}'s effect was not durable when its step reported"
            )
        assert kinds == ["tail"] * 5, kinds
    finally:
        core.stop()
        core.close()
    report = check_ledger(source, ledger)
    assert report.ok and report.handled == 205, report.summary()


def test_a_step_whose_last_writes_fail_fails_and_its_mutations_are_handled_again(data_dir, monkeypatch):
    """A step's tail that fails to apply fails that step (its report would say the writes are durable);
    the child rewinds to its checkpoint as it takes the answer, and every mutation is applied once."""
    source, core = _sandboxed_core(data_dir, "fn_f")
    answer = host._Sandboxed._answer
    tails: list[int] = []
    counting = threading.Event()  # set once the worker caught up with the documents loaded

    def failing(self, ident, method, args):
        if method == "bucket" and args[1] == "apply_effects" and counting.is_set():
            tails.append(ident)
            if len(tails) == 2:  # the second step's writes: not applied, the disk "full"
                failed = (False, ("StoreError", "the disk is full (a test's failure)"))
                self._send(("ans", ident, *failed))
                return failed
        return answer(self, ident, method, args)

    kinds = _applies_seen(monkeypatch)
    monkeypatch.setattr(host._Sandboxed, "_answer", failing)
    failures = 0
    try:
        while not core.step(100).caught_up:
            pass
        counting.set()
        for i in range(4):
            source.upsert(f"late-{i}", {"n": i})
            for _attempt in range(5):
                try:
                    if core.step(None).caught_up:
                        break
                except StoreError as exc:
                    assert "disk is full" in str(exc)
                    failures += 1
    finally:
        core.stop()
        core.close()
    assert len(tails) > 2 and "tail" in kinds
    assert failures == 1  # the step whose tail failed, not the next one too: the child rewound within it
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"))
    assert report.ok and report.handled == 204, report.summary()


COUNTER_HANDLER = """
def on_update(doc, meta):
    ledger.increment("count")
"""


def test_a_counter_written_by_the_last_steps_tail_is_read_at_once(data_dir):
    """An advanced accessor (increment) reads the document a tail is writing: the worker takes the tail's
    answer on its own thread instead of waiting for a thread that would never come (until the call's
    execution timeout, a dead letter). Every mutation adds one."""
    source = load_source(data_dir, 5, 5, chunk=5, seed=1)
    deploy_function(
        data_dir,
        ledger_definition(
            "fn_c",
            "src",
            "ledger",
            workers=1,
            isolation="sandbox",
            checkpoint_interval="60s",  # no checkpoint settles a tail between the steps
            execution_timeout="20s",
        ),
        COUNTER_HANDLER,
    )
    generation = open_store(data_dir).get_function("fn_c").generation
    core = host.SandboxedCore(
        WorkerSpec(data_dir, "fn_c", generation, "local/w0", tuple(range(NUM_VBUCKETS)))
    )
    try:
        while not core.step(100).caught_up:
            pass
        for i in range(4):
            source.upsert(f"late-{i}", {"n": i})
            report = core.step(None)
            assert report.caught_up and report.handled == 1
    finally:
        core.stop()
        core.close()
    counters = open_store(data_dir).counters("fn_c")
    assert not counters.get("dlq_timeout"), counters
    assert LocalBucket.open(data_dir, "ledger").get("count") == {"count": 9}
