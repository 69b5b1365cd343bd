"""A pooled worker process (eventing ray start): one run at a time, fresh core per run, given back on
release."""

from __future__ import annotations

import pickle

import pytest

from eventing.errors import EventingError
from eventing.testing import deploy_function, ledger_definition, load_source
from eventing.workers import hosting
from eventing.workers.executor import PooledWorkerHost
from eventing.workers.worker import WorkerSpec
from metadata import open_store
from sharding import NUM_VBUCKETS


def spec_for(data_dir: str, function: str, worker_id: str) -> bytes:
    generation = open_store(data_dir).get_function(function).generation
    return pickle.dumps(WorkerSpec(data_dir, function, generation, worker_id, tuple(range(NUM_VBUCKETS))))


def test_a_pooled_worker_serves_one_run_at_a_time_and_starts_each_run_with_a_fresh_core(
    data_dir, monkeypatch
):
    load_source(data_dir, 50, 400, seed=5)
    deploy_function(data_dir, ledger_definition("fn_a", "src", "ledger"))
    host = PooledWorkerHost()
    assert host.adopt("run-1", spec_for(data_dir, "fn_a", "local/w0"))
    host.call("start")
    first = host.core
    assert host.call("step").handled == 400

    # Another run may not take it while run 1 is calling...
    assert not host.adopt("run-2", spec_for(data_dir, "fn_a", "local/w1"))
    assert host.core is first
    # ...but may once run 1 went quiet for POOL_STALE_S (its driver died), or gave it back.
    monkeypatch.setattr(hosting, "POOL_STALE_S", 0.0)
    assert host.adopt("run-2", spec_for(data_dir, "fn_a", "local/w1"))
    assert host.core is None and first._closed  # the old core is closed, not reused
    host.call("start")
    assert host.core is not first and host.core.spec.worker_id == "local/w1"
    monkeypatch.setattr(hosting, "POOL_STALE_S", 30.0)
    host.release("run-1")  # not the owner any more: nothing happens
    assert host.core is not None
    host.release("run-2")
    assert host.core is None and host.owner is None
    assert host.adopt("run-3", spec_for(data_dir, "fn_a", "local/w0"))


def test_a_worker_serves_the_calls_of_its_table_and_refuses_any_other_name(data_dir):
    load_source(data_dir, 10, 40, seed=3)
    deploy_function(data_dir, ledger_definition("fn_t", "src", "ledger"))
    host = hosting.WorkerHost(spec_for(data_dir, "fn_t", "local/w0"))
    host.call("start")
    try:
        assert host.call("owned") == list(range(NUM_VBUCKETS))
        assert host.call("step").handled == 40
        for name in (
            "_write_commit",
            "commit",
            "__class__",
            "store",
        ):  # methods and members outside the table
            with pytest.raises(EventingError, match="is not a call a worker serves"):
                host.call(name)
    finally:
        host.call("close")
