"""A sandboxed worker waits for its next write as an unsandboxed one does: the child cannot listen (no Unix
socket, no credentials), so its host waits on the worker's waiter (the socket the service forwards a data
directory's write notifications to, or a LISTEN connection of its own on a PostgreSQL store) and steps the
child again as each write comes, within one call of the service. The rows a woken step handles are read by
the host when it makes that step's call (the child's read asked for ahead as its last step ended), not in
a round trip of the step. Counted by check_ledger: every write handled once, in order."""

from __future__ import annotations

import threading

import pytest

from eventing.storage import wake
from eventing.storage.state import as_state
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source, wait_for
from eventing.workers import write_waiter
from eventing.workers.sandbox import host
from eventing.workers.sandbox.landlock import sandbox_unavailable
from eventing.workers.worker import WorkerSpec
from sharding import NUM_VBUCKETS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sandbox_unavailable() is not None, reason=str(sandbox_unavailable())),
]

WRITES = 6
WAIT_S = 8.0  # the one step's wait, from its start: the writes and their effects take well under it


@pytest.mark.parametrize("where", ["directory", "postgresql"])
def test_a_sandboxed_step_waits_for_writes_and_handles_each_as_it_comes(where, data_dir, request):
    location = data_dir if where == "directory" else request.getfixturevalue("pg_schema_url")
    source = load_source(location, 20, 100, seed=5)
    deploy_function(location, ledger_definition("fn_w", "src", "ledger", workers=1, isolation="sandbox"))
    generation = as_state(location).metadata.get_function("fn_w").generation
    address = write_waiter.new_address()
    spec = WorkerSpec(
        location, "fn_w", generation, "local/w0", tuple(range(NUM_VBUCKETS)), wake_address=address
    )
    ledger = as_state(location).open_bucket("ledger")
    sender = write_waiter.sender_socket()
    core = host.SandboxedCore(spec)
    try:
        assert core.waiter is not None
        wait_for(lambda: core.step(100).caught_up, "the worker caught up with the documents loaded")
        held_before = core.held_answered

        reports: list = []
        stepping = threading.Thread(target=lambda: reports.append(core.step(None, WAIT_S)))
        stepping.start()
        for i in range(WRITES):
            vb, _ = source.upsert(f"late-{i}", {"n": i})
            if where == "directory":  # what the service's listener does with the writer's datagram
                write_waiter.forward(sender, address, wake.encode("src", [vb]))
            # Each write's effect comes while the one step is still waiting: nothing polls here.
            wait_for(
                lambda i=i: ledger.keys(f"e|fn_w|late-{i}|"),
                f"the effect of write {i}",
                timeout=30,
            )
            assert stepping.is_alive()
        stepping.join(WAIT_S + 30)  # the step ends when its wait is over
        assert not stepping.is_alive()
    finally:
        core.stop()
        core.close()
        sender.close()

    (report,) = reports
    assert report.waited and report.caught_up and not report.fenced
    assert report.handled == WRITES
    # Every woken step but the first started with rows its host read as it made the call.
    assert core.held_answered - held_before >= WRITES - 1
    checked = check_ledger(source, ledger)
    assert checked.ok and checked.handled == 100 + WRITES, checked.summary()
