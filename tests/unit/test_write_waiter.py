"""A caught-up worker waits for its next write inside its step (eventing.workers.write_waiter): a write
forwarded to its socket is handled in that same step, with no call from the service in between."""

from __future__ import annotations

import threading
import time

from eventing.storage import wake
from eventing.testing import deploy_function, ledger_definition, load_source
from eventing.workers import write_waiter
from eventing.workers.worker import WorkerCore, WorkerSpec
from metadata import open_store
from sharding import NUM_VBUCKETS
from sharding.vbucket import vbucket_of


def _core(data_dir, address: str | None) -> WorkerCore:
    load_source(data_dir, 20, 100, seed=3)
    deploy_function(data_dir, ledger_definition("fn_w", "src", "ledger", workers=1))
    generation = open_store(data_dir).get_function("fn_w").generation
    spec = WorkerSpec(
        data_dir, "fn_w", generation, "local/w0", tuple(range(NUM_VBUCKETS)), wake_address=address
    )
    return WorkerCore(spec)


def test_a_waiting_step_handles_a_write_notified_while_it_waits_and_commits_it_before_waiting_on(data_dir):
    address = write_waiter.new_address()
    core = _core(data_dir, address)
    try:
        assert core.step().handled == 100  # caught up: the next step finds nothing
        from eventing.storage.factory import open_bucket

        source, ledger = open_bucket(data_dir, "src"), open_bucket(data_dir, "ledger")
        before = ledger.count()
        sender = write_waiter.sender_socket()
        waiting = threading.Event()
        assert core.waiter is not None
        real_wait = core.waiter.wait

        def wait(timeout_s: float) -> bool:
            waiting.set()
            return real_wait(timeout_s)

        core.waiter.wait = wait  # type: ignore[method-assign]
        seen_at: list[float] = []

        def write_and_watch() -> None:
            assert waiting.wait(30)  # the step found nothing and waits
            waiting.clear()
            source.upsert("late", {"n": 1})
            write_waiter.forward(sender, address, wake.encode("src", [vbucket_of("late")]))
            # The effect is committed while the step still waits for more writes.
            assert waiting.wait(30)
            if (
                ledger.get("h|fn_w|late") is not None and ledger.count() == before + 2
            ):  # its effect and history
                seen_at.append(time.monotonic())

        writer = threading.Thread(target=write_and_watch)
        writer.start()
        report = core.step(None, 1.0)
        returned_at = time.monotonic()
        writer.join()
        sender.close()
        source.close()
        ledger.close()
        assert report.waited and report.handled == 1 and report.caught_up
        assert seen_at and seen_at[0] < returned_at  # committed within the step, before its wait ended
    finally:
        core.close()


def test_a_waiting_step_without_writes_returns_after_its_wait_and_a_stale_notification_is_not_work(data_dir):
    address = write_waiter.new_address()
    core = _core(data_dir, address)
    try:
        core.step()
        sender = write_waiter.sender_socket()
        # Notified before the step began (already handled writes): drained, then the step waits its time.
        write_waiter.forward(sender, address, wake.encode("src", [1, 2]))
        started = time.monotonic()
        report = core.step(None, 0.2)
        assert report.waited and report.handled == 0
        assert time.monotonic() - started >= 0.2
        sender.close()
    finally:
        core.close()


def test_without_a_wait_or_an_address_a_step_never_waits(data_dir):
    core = _core(data_dir, None)
    try:
        core.step()
        started = time.monotonic()
        report = core.step(None, 30.0)  # no waiter: the wait is ignored
        assert not report.waited and time.monotonic() - started < 10.0
    finally:
        core.close()


def test_an_address_already_taken_leaves_the_worker_polled(data_dir):
    address = write_waiter.new_address()
    holder = write_waiter.WriteWaiter.open(address)
    assert holder is not None
    try:
        assert write_waiter.WriteWaiter.open(address) is None
    finally:
        holder.close()
