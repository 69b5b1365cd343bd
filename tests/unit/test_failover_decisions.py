"""Node failover decisions and the leader lease, in-process: the pure detector, the failed node's place in the
topology, a failover and a standby takeover with the in-process executor, each closed by the ledger check."""

from __future__ import annotations

import logging
import threading
from collections import Counter

import pytest

from eventing.cli.app import main as cli
from eventing.control.failover import LEADER_LEASE, FailoverDetector, failover_survivors, failover_timeout_s
from eventing.control.nodes import Topology
from eventing.control.service import EventingService
from eventing.errors import ConfigError, EventingError
from eventing.storage.bucket import LocalBucket
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source, wait_for
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store
from sharding import NUM_VBUCKETS
from sharding.rebalance import minimum_moves

UP, DOWN = (True, ""), (False, "its raylet does not answer")


# -- the decision -----------------------------------------------------------------------------------------


def test_a_node_is_due_only_after_being_down_for_the_whole_timeout():
    d = FailoverDetector(10)
    assert d.observe(0, {"n1": UP, "n2": DOWN}) == []
    assert d.observe(9.9, {"n1": UP, "n2": DOWN}) == []
    assert d.observe(10.0, {"n1": UP, "n2": DOWN}) == ["n2"]
    assert d.why["n2"] == "its raylet does not answer"


def test_a_blip_shorter_than_the_timeout_starts_the_count_again():
    d = FailoverDetector(10)
    d.observe(0, {"n2": DOWN})
    d.observe(8, {"n2": UP})
    assert d.observe(12, {"n2": DOWN}) == []
    assert d.observe(21.9, {"n2": DOWN}) == []
    assert d.observe(22, {"n2": DOWN}) == ["n2"]


def test_nodes_no_longer_watched_are_forgotten_and_several_come_due_in_order():
    d = FailoverDetector(5)
    d.observe(0, {"n2": DOWN, "n3": UP})
    d.observe(1, {"n2": DOWN, "n3": DOWN})
    assert d.observe(6, {"n2": DOWN, "n3": DOWN}) == ["n2", "n3"]
    d.observe(7, {"n3": DOWN})  # n2 was failed over: not watched any more
    assert "n2" not in d.down_since


def test_a_timeout_of_zero_turns_automatic_failover_off():
    d = FailoverDetector(0)
    assert d.observe(0, {"n2": DOWN}) == []
    assert d.observe(1000, {"n2": DOWN}) == []
    assert "n2" in d.down_since  # still seen (and logged) as down


def test_the_survivors_are_the_owning_nodes_but_the_failing_ones():
    assert failover_survivors(["local", "n2", "n3"], ["n2"]) == ["local", "n3"]
    assert failover_survivors(["n2"], ["n2"]) == []


def test_the_failover_timeout_comes_from_the_flag_then_the_environment_then_the_default(monkeypatch):
    monkeypatch.delenv("EVENTING_FAILOVER_TIMEOUT", raising=False)
    assert failover_timeout_s() == 10.0
    monkeypatch.setenv("EVENTING_FAILOVER_TIMEOUT", "3s")
    assert failover_timeout_s() == 3.0
    assert failover_timeout_s("500ms") == 0.5
    assert failover_timeout_s("0") == 0.0
    with pytest.raises(ConfigError, match="--failover-timeout 'soon'"):
        failover_timeout_s("soon")
    monkeypatch.setenv("EVENTING_FAILOVER_TIMEOUT", "-1")
    with pytest.raises(ConfigError, match="EVENTING_FAILOVER_TIMEOUT"):
        failover_timeout_s()


def test_a_bad_failover_timeout_is_one_clear_line(data_dir, capsys):
    LocalBucket.create(data_dir, "src")
    open_store(data_dir).close()
    assert cli(["--data-dir", data_dir, "run", "--executor", "in-process", "--failover-timeout", "soon"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--failover-timeout 'soon'" in err[0] and "Traceback" not in err[0]


# -- the failed node in the topology ----------------------------------------------------------------------


def _two_nodes(data_dir: str) -> Topology:
    topology = Topology(open_store(data_dir))
    topology.add_node("n2", "ray-2")
    topology.complete(list(topology.plan().after.owners))
    return topology


def test_a_failover_plan_moves_only_the_failed_nodes_vbuckets(data_dir):
    topology = _two_nodes(data_dir)
    topology.add_node("n3", "ray-3")  # joining: a failover does not hand it vBuckets
    topology.store.put_node("n2", "failed")
    plan = topology.plan(targets=failover_survivors(topology.owning_nodes(), ["n2"]))
    assert plan.counts_after() == {"local": NUM_VBUCKETS}
    assert plan.move_count == minimum_moves(plan.before, ["local"]) == 512
    topology.complete(list(plan.after.owners))
    states = {n["name"]: n["state"] for n in topology.nodes()}
    assert states == {
        "local": "active",
        "n2": "failed",
        "n3": "joining",
    }  # listed until added back or removed
    assert topology.target_nodes() == ["local", "n3"]


def test_a_failed_node_is_added_back_as_joining_or_removed(data_dir, capsys):
    topology = _two_nodes(data_dir)
    topology.store.put_node("n2", "failed")
    topology.complete(list(topology.plan(targets=["local"]).after.owners))
    assert cli(["--data-dir", data_dir, "node", "list"]) == 0
    out = capsys.readouterr().out
    assert "failed" in out and "eventing node add NAME --ray-node-id" in out
    node = topology.add_node("n2", "ray-2-again")
    assert (node["state"], node["ray_node_id"]) == ("joining", "ray-2-again")
    assert topology.plan().counts_after() == {"local": 512, "n2": 512}
    topology.store.put_node("n2", "failed")
    assert topology.remove_node("n2")["state"] == "removed"
    assert [n["name"] for n in topology.nodes()] == ["local"]


# -- failover and standby with the in-process executor -------------------------------------------------


def _deploy(data_dir: str, mutations: int = 4000) -> LocalBucket:
    source = load_source(data_dir, 400, mutations, bucket="src")
    deploy_function(data_dir, ledger_definition("fn", "src", "ledger", workers=2))
    return source


def _run(service: EventingService) -> threading.Thread:
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    return thread


def _caught_up(data_dir: str, source: LocalBucket) -> bool:
    cps = open_store(data_dir).checkpoints("fn")
    return [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()


def _verify(data_dir: str, source: LocalBucket) -> None:
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"))
    assert report.ok, report.summary()
    assert report.handled == report.source_mutations


def test_a_node_down_for_the_timeout_is_failed_over_and_nothing_is_lost(data_dir):
    source = _deploy(data_dir)
    _two_nodes(data_dir)
    health = {"ray-2": UP}
    service = EventingService(data_dir, InProcessExecutor(), failover_timeout_s=0.3)
    service.node_health = lambda ids: {i: health.get(i, UP) for i in ids}
    thread = _run(service)
    wait_for(lambda: "fn" in service.supervisors and service.supervisors["fn"].ready)
    health["ray-2"] = DOWN
    wait_for(lambda: {n["name"]: n["state"] for n in open_store(data_dir).nodes()}.get("n2") == "failed")
    source.upsert("late::1", {"rev": 1})  # new mutations after the failover go to the survivors
    wait_for(lambda: _caught_up(data_dir, source))
    wait_for(lambda: (Topology(open_store(data_dir)).request() or {}).get("status") == "done")
    service.stop()
    thread.join(30)
    owners = Counter(cp.owner for cp in open_store(data_dir).checkpoints("fn").values())
    assert set(owners) == {"local/w0", "local/w1"} and sum(owners.values()) == NUM_VBUCKETS
    request = Topology(open_store(data_dir)).request()
    assert (
        request is not None
        and request["failover"]["nodes"] == ["n2"]
        and request["failover_unowned_s"] >= 0.3
    )
    assert service.summary.failovers and service.summary.failovers[0]["nodes"] == ["n2"]
    _verify(data_dir, source)


class _Hung:
    """A call to a worker on a dead node: it never completes."""


class _Pinned:
    def __init__(self, inner, ray_node: str | None, dead: set[str]):
        self.inner, self.ray_node, self.dead = inner, ray_node, dead

    def call(self, method: str, *args):
        return _Hung() if self.ray_node in self.dead else self.inner.call(method, *args)


class NodeLosingExecutor(InProcessExecutor):
    """In-process workers, except that workers pinned to a Ray node in `dead` never answer again (their
    calls hang, as on a Ray node whose raylet was killed)."""

    def __init__(self) -> None:
        self.dead: set[str] = set()

    def start_worker(self, spec, ray_node_id=None):
        return _Pinned(super().start_worker(spec, ray_node_id), ray_node_id, self.dead)

    def wait(self, futures, timeout):
        return [f for f in futures if not isinstance(f, _Hung)]

    def kill(self, handle) -> None:
        super().kill(handle.inner)


def test_a_node_that_dies_while_joining_in_a_rebalance_is_failed_over_once_the_rebalance_ends(data_dir):
    source = _deploy(data_dir)
    topology = _two_nodes(data_dir)
    executor = NodeLosingExecutor()
    service = EventingService(data_dir, executor, failover_timeout_s=0.3)
    service.node_health = lambda ids: {i: (DOWN if i in executor.dead else UP) for i in ids}
    thread = _run(service)
    wait_for(lambda: "fn" in service.supervisors and service.supervisors["fn"].ready)
    topology.add_node("n3", "ray-3")
    executor.dead.add("ray-3")  # n3's workers will never start: its Ray node is gone
    topology.request_rebalance(topology.plan())
    wait_for(lambda: {n["name"]: n["state"] for n in open_store(data_dir).nodes()}.get("n3") == "failed")
    wait_for(lambda: (Topology(open_store(data_dir)).request() or {}).get("status") == "done")
    source.upsert("late::1", {"rev": 1})
    wait_for(lambda: _caught_up(data_dir, source))
    service.stop()
    thread.join(30)
    owners = Counter(str(cp.owner).split("/")[0] for cp in open_store(data_dir).checkpoints("fn").values())
    assert owners == {"local": 512, "n2": 512}
    _verify(data_dir, source)


def test_a_second_service_without_standby_is_refused_as_before(data_dir):
    _deploy(data_dir, 1000)
    leader = EventingService(data_dir, InProcessExecutor())
    thread = _run(leader)
    wait_for(lambda: open_store(data_dir).lease(LEADER_LEASE) is not None)
    with pytest.raises(EventingError, match="another eventing service .* is running on this data directory"):
        EventingService(data_dir, InProcessExecutor()).run()
    leader.stop()
    thread.join(30)


def test_a_standby_takes_over_when_the_leader_stops_and_finishes_the_stream(data_dir, capsys):
    source = _deploy(data_dir)
    leader = EventingService(data_dir, InProcessExecutor())
    leader_thread = _run(leader)
    wait_for(lambda: "fn" in leader.supervisors and leader.supervisors["fn"].handled > 0)
    standby = EventingService(data_dir, InProcessExecutor(), standby=True)
    standby_thread = _run(standby)
    wait_for(lambda: standby.service_id in open_store(data_dir).live_services(5))
    assert cli(["--data-dir", data_dir, "status"]) == 0
    out = capsys.readouterr().out
    assert f"leader: {leader.service_id}" in out and f"standby: {standby.service_id}" in out
    wait_for(lambda: len(standby.warm) == 2)  # waiting, its workers started ahead of time (idle)
    assert not standby.supervisors
    warm = dict(standby.warm)
    assert sorted(wid for _, wid, _ in warm) == ["local/w0", "local/w1"]
    leader.stop()
    leader_thread.join(30)
    wait_for(lambda: "fn" in standby.supervisors and standby.supervisors["fn"].ready)
    assert {s.handle for s in standby.supervisors["fn"].slots.values()} == set(
        warm.values()
    )  # taken, not restarted
    assert standby.summary.leadership["took_over_from"] == leader.service_id
    lease = open_store(data_dir).lease(LEADER_LEASE)
    assert lease is not None and lease.term == 2
    source.upsert("after::1", {"rev": 1})
    wait_for(lambda: _caught_up(data_dir, source))
    standby.stop()
    standby_thread.join(30)
    _verify(data_dir, source)


def test_a_leader_that_loses_its_lease_stops(data_dir, monkeypatch):
    monkeypatch.setattr("eventing.control.leadership.LEASE_RENEW_S", 0.05)
    _deploy(data_dir, 1000)
    leader = EventingService(data_dir, InProcessExecutor())
    thread = _run(leader)
    wait_for(lambda: "fn" in leader.supervisors)
    store = open_store(data_dir)
    assert store.acquire_lease(LEADER_LEASE, "elsewhere:1:x", 60, take_from=leader.service_id) is not None
    thread.join(30)
    assert not thread.is_alive()
    assert any("lost the leader lease to elsewhere:1:x" in e for e in leader.summary.errors)


def test_a_worker_pinned_to_a_dead_node_is_a_dead_worker_not_a_crash_of_the_run():
    """Ray answers a call of a worker pinned (hard affinity) to a node that died with
    ActorUnschedulableError: the supervisor must see a dead worker, which failover then moves."""
    from ray.exceptions import ActorUnschedulableError

    from eventing.workers.executor import RayExecutor
    from eventing.workers.worker_died import WorkerDied

    class DeadNodeRay:
        def get(self, future):
            raise ActorUnschedulableError("NodeAffinitySchedulingStrategy ... soft=False: the node is dead")

    executor = object.__new__(RayExecutor)
    executor._ray, executor.shared = DeadNodeRay(), None
    with pytest.raises(WorkerDied, match="NodeAffinitySchedulingStrategy"):
        executor.result(object())


def test_a_zero_timeout_says_there_is_no_automatic_failover(caplog):
    detector = FailoverDetector(0.0)
    with caplog.at_level(logging.WARNING):
        assert detector.observe(0.0, {"n2": (False, "dead in Ray's node table")}) == []
    assert "no automatic failover" in caplog.text and "failover in 0s" not in caplog.text
