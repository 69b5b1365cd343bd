"""Cluster mode on a PostgreSQL store, on a real two-node Ray cluster on this machine: a head node and a node
`n2` that cannot see this checkout (an empty tmpfs over its packages, in its own mount namespace, as on a
second machine: its code comes with the job's runtime_env). No data directory exists anywhere: the workers of
both nodes talk to PostgreSQL themselves, and no data service runs.

- the second node's workers handle their share (the vBuckets of the eventing node pinned to it, in
  processes under its raylet), while worker processes of both nodes are killed (kill -9);
- the driver (`eventing run`, a subprocess) is killed (kill -9) mid-run and run again;
- the second node is killed (kill -9 of its raylet) mid-run and its vBuckets failed over.

Each ends with the ledger check (`eventing verify`): every mutation handled once, none applied twice, each
document in seqno order. One PostgreSQL server and one Ray cluster for the module; every process is ended by
its pid (or, for the server, its data directory)."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

import eventing
from eventing.cli.app import main as cli
from eventing.control.service import EventingService
from eventing.ops.verify import verify_function
from eventing.storage.postgres.state import PostgresState
from eventing.testing import BackgroundLoop, deploy_function, ledger_definition, load_source, wait_for
from eventing.testing.cluster import LocalRayCluster, RayNode, descendants
from eventing.testing.commands import Commands
from eventing.testing.postgres import ThrowawayPostgres
from eventing.workers.executor import RayExecutor, init_ray
from eventing.workers.ray_instance import cmdline
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration

ROOT = Path(eventing.__file__).resolve().parents[1]
PACKAGES = [str(ROOT / name) for name in ("eventing", "metadata", "sharding")]
FAILOVER_TIMEOUT_S = 3.0


@dataclass
class Env:
    pg: ThrowawayPostgres
    ray: LocalRayCluster
    n2: RayNode

    @property
    def head_id(self) -> str:
        return self.ray.nodes[0].node_id


@pytest.fixture(scope="module")
def env():
    if not LocalRayCluster.can_hide():
        pytest.fail("a node hidden from the checkout needs root and unshare (mount namespaces), as in CI")
    import ray

    was_up = ray.is_initialized()
    if was_up:
        ray.shutdown()  # this process joins the module's cluster instead of the session's local instance
    pg = ThrowawayPostgres()
    cluster = LocalRayCluster()
    try:
        pg.start()
        cluster.start()
        n2 = cluster.add_node("n2", hidden=PACKAGES)
        init_ray(cluster.address)
        yield Env(pg, cluster, n2)
    finally:
        ray.shutdown()
        cluster.stop()
        pg.stop()
        if was_up:
            init_ray(num_cpus=2)


@pytest.fixture
def url(env, request) -> str:
    return env.pg.create_database(request.node.name[5:40].lower())


def pin(url: str, placement: dict[str, str]) -> None:
    """Eventing nodes pinned to Ray nodes ({eventing node: Ray node id}), the default node removed and the
    vBuckets spread over them (recorded; no service runs yet)."""
    for node, ray_node_id in placement.items():
        assert cli(["--store", url, "node", "add", node, "--ray-node-id", ray_node_id]) == 0
    assert cli(["--store", url, "node", "remove", "local"]) == 0
    assert cli(["--store", url, "rebalance"]) == 0


def owners(state: PostgresState, function: str) -> dict[int, tuple[str | None, int, bool, int]]:
    """vBucket -> (owner, epoch, leased, checkpoint seqno)."""
    return {
        vb: (cp.owner, cp.epoch, cp.leased, cp.seqno)
        for vb, cp in state.metadata.checkpoints(function).items()
    }


def caught_up(state: PostgresState, function: str) -> bool:
    cps = state.metadata.checkpoints(function)
    with state.open_bucket("src") as source:
        highs = source.high_seqnos()
    return len(cps) == NUM_VBUCKETS and all(cps[vb].seqno == highs[vb] for vb in range(NUM_VBUCKETS))


def assert_ledger_exact(url: str, function: str) -> None:
    state = PostgresState(url)
    report = verify_function(state, function)
    assert report.ok and report.past_checkpoint == 0, report.summary()
    with state.open_bucket("src") as source:
        assert report.handled == sum(source.high_seqnos()), report.summary()
    assert cli(["--store", url, "verify", function]) == 0


class Stream(BackgroundLoop):
    """Writes source mutations while the test does its worst."""

    interval_s = 0.002

    def __init__(self, state: PostgresState, docs: int = 200):
        super().__init__()
        self.bucket = state.open_bucket("src")
        self.docs = docs
        self.written = 0

    def tick(self) -> None:
        self.bucket.upsert(f"live::{self.written % self.docs}", {"rev": self.written})
        self.written += 1

    def finish(self) -> None:
        self.bucket.close()


class WorkerPids:
    """on_progress hook: every worker process of a function seen, and which node's raylet it runs under."""

    def __init__(self, env: Env, function: str):
        self.env, self.function = env, function
        self.on_n2: dict[int, bool] = {}
        self.restarts: dict[str, int] = {}
        self.service: EventingService | None = None

    def __call__(self, summary) -> None:
        sup = self.service.supervisors.get(self.function) if self.service else None
        if sup is None:
            return
        self.restarts = {wid: slot.restarts for wid, slot in sup.slots.items()}
        new = [s.pid for s in sup.slots.values() if s.pid and s.pid not in self.on_n2]
        if new:
            n2 = descendants(self.env.n2.pid)
            for pid in new:
                self.on_n2[pid] = pid in n2


def test_the_hidden_nodes_workers_handle_their_share_on_postgresql_and_killed_workers_lose_nothing(env, url):
    state = PostgresState(url)
    assert state.directory is None
    load_source(state, 300, 4000, seed=21)
    deploy_function(
        state, ledger_definition("fn_share", "src", "ledger", workers=2, sleep_ms=1, batch_size=50)
    )
    pin(url, {"n1": env.head_id, "n2": env.n2.node_id})
    places = WorkerPids(env, "fn_share")
    service = EventingService(url, RayExecutor(env.ray.address), until_caught_up=True, on_progress=places)
    places.service = service
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()), daemon=True)
    thread.start()
    killed: list[str] = []
    try:
        # kill -9 of a worker process on each node, mid-run
        for wid in ("n1/w0", "n2/w1"):

            def busy(wid: str = wid) -> bool:
                sup = service.supervisors.get("fn_share")
                slot = sup.slots.get(wid) if sup else None
                return bool(slot and slot.ready and slot.pid and not slot.caught_up and slot.backlog)

            wait_for(busy, f"worker {wid} to be handling mutations", timeout=120)
            os.kill(service.supervisors["fn_share"].slots[wid].pid, signal.SIGKILL)
            killed.append(wid)
        titles = [cmdline(pid) for pid in env.ray.processes()]
        assert any(t.startswith("ray::WorkerHost") for t in titles), titles
        assert not any(t.startswith("ray::ServedData") for t in titles), titles  # no data service runs
    finally:
        thread.join(timeout=240)
    assert not thread.is_alive() and not result["summary"].errors, result.get("summary")
    assert killed == ["n1/w0", "n2/w1"]
    assert places.restarts["n1/w0"] >= 1 and places.restarts["n2/w1"] >= 1, places.restarts
    # The second node's share: its eventing node's half of the vBuckets, every one handled to its high seqno
    # by workers that ran in processes under n2's raylet (and the head's half by the head's).
    final = owners(state, "fn_share")
    with state.open_bucket("src") as source:
        highs = source.high_seqnos()
    on_n2 = [vb for vb, (owner, _, _, _) in final.items() if owner and owner.startswith("n2/")]
    assert len(on_n2) == NUM_VBUCKETS // 2
    assert all(final[vb][3] == highs[vb] for vb in range(NUM_VBUCKETS))
    assert sum(highs[vb] for vb in on_n2) > 1000  # a real share of the 4,000 mutations
    assert sorted(places.on_n2.values()).count(True) >= 3, places.on_n2  # n2's two workers, one restarted
    assert sorted(places.on_n2.values()).count(False) >= 3, places.on_n2
    assert_ledger_exact(url, "fn_share")
    state.close()


def test_an_error_a_worker_raises_reaches_the_service_as_itself(env):
    """An EventingError raised in a worker on another node (the store away longer than the wait) comes back
    from Ray as itself, its one line and its fields, not wrapped in Ray's traceback: the run stops on that
    line (`function ... stopped: PostgreSQL at ... is unreachable ...`)."""
    import ray

    from metadata.errors import StoreUnavailableError

    def fails_on_n2() -> None:
        from metadata.errors import StoreUnavailableError

        raise StoreUnavailableError(
            "PostgreSQL at 127.0.0.1:5432 is unreachable (Connection refused); start the "
            "server or fix the host and port in --store (waited 60s)",
            ambiguous=True,
        )

    future = ray.remote(num_cpus=0, resources={"n2": 0.01})(fails_on_n2).remote()
    with pytest.raises(StoreUnavailableError) as caught:
        RayExecutor(env.ray.address).result(future)
    assert str(caught.value).startswith("PostgreSQL at 127.0.0.1:5432 is unreachable") and "\n" not in str(
        caught.value
    )
    assert "ray::" not in str(caught.value) and caught.value.ambiguous


@pytest.mark.soak
def test_soak_killing_workers_of_both_nodes_again_and_again_on_postgresql(env, url):
    state = PostgresState(url)
    load_source(state, 1000, 40_000, seed=24)
    deploy_function(
        state, ledger_definition("fn_kills", "src", "ledger", workers=2, sleep_ms=1, batch_size=100)
    )
    pin(url, {"n1": env.head_id, "n2": env.n2.node_id})
    service = EventingService(url, RayExecutor(env.ray.address), until_caught_up=True)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(summary=service.run()), daemon=True)
    thread.start()
    kills = 0
    try:
        for wid in ["n1/w0", "n2/w0", "n1/w1", "n2/w1"] * 4:

            def busy(wid: str = wid) -> bool:
                sup = service.supervisors.get("fn_kills")
                slot = sup.slots.get(wid) if sup else None
                return bool(slot and slot.ready and slot.pid and not slot.caught_up and slot.backlog)

            if not thread.is_alive():
                break
            wait_for(
                lambda wid=wid: busy(wid) or not thread.is_alive(), f"worker {wid} to be busy", timeout=120
            )
            if thread.is_alive():
                os.kill(service.supervisors["fn_kills"].slots[wid].pid, signal.SIGKILL)
                kills += 1
    finally:
        thread.join(timeout=600)
    assert not result["summary"].errors and kills >= 8, (kills, result.get("summary"))
    assert_ledger_exact(url, "fn_kills")
    state.close()


def test_a_driver_killed_mid_run_on_postgresql_resumes_from_its_checkpoints(env, url, tmp_path):
    state = PostgresState(url)
    load_source(state, 300, 4000, seed=22)
    deploy_function(
        state, ledger_definition("fn_driver", "src", "ledger", workers=2, sleep_ms=1, batch_size=50)
    )
    pin(url, {"n1": env.head_id, "n2": env.n2.node_id})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cmd = Commands(cwd, {"EVENTING_STORE": url}, logs=str(tmp_path / "logs"))
    driver = cmd.start("run", "--until-caught-up", "--quiet", "--ray-address", env.ray.address, name="driver")
    try:
        wait_for(
            lambda: sum(o[3] for o in owners(state, "fn_driver").values()) > 500,
            "the driver to make progress",
        )
    finally:
        driver.kill()  # kill -9 mid-run
    before = {vb: o[3] for vb, o in owners(state, "fn_driver").items()}
    assert 500 < sum(before.values()) < 4000, "the driver should have been killed mid-run"
    again = cmd.start("run", "--until-caught-up", "--quiet", "--ray-address", env.ray.address, name="again")
    assert again.proc.wait(240) == 0, again.describe()
    after = owners(state, "fn_driver")
    assert all(after[vb][3] >= seqno for vb, seqno in before.items())
    assert caught_up(state, "fn_driver")
    assert_ledger_exact(url, "fn_driver")
    assert list(cwd.iterdir()) == []
    state.close()


def test_a_ray_node_killed_mid_run_on_postgresql_is_failed_over_and_nothing_is_lost(env, url):
    """Last of the module: the hidden node's raylet is killed (kill -9), and stays dead."""
    state = PostgresState(url)
    load_source(state, 300, 2000, seed=23)
    deploy_function(
        state, ledger_definition("fn_node", "src", "ledger", workers=2, sleep_ms=1, batch_size=50)
    )
    pin(url, {"n1": env.head_id, "n2": env.n2.node_id})
    service = EventingService(url, RayExecutor(env.ray.address), failover_timeout_s=FAILOVER_TIMEOUT_S)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:

        def n2_leased() -> set[int]:
            return {
                vb
                for vb, (o, _, leased, _) in owners(state, "fn_node").items()
                if o and o.startswith("n2/") and leased
            }

        wait_for(
            lambda: len(n2_leased()) == NUM_VBUCKETS // 2, "n2's workers to claim their vBuckets", timeout=120
        )
        moved = n2_leased()
        epochs = {vb: o[1] for vb, o in owners(state, "fn_node").items()}
        with Stream(state) as stream:
            wait_for(lambda: stream.written > 200, "the stream to start")
            env.ray.kill_node(env.n2)
            wait_for(
                lambda: all(
                    str(o[0]).startswith("n1/") and o[2] and o[1] > epochs[vb]
                    for vb, o in owners(state, "fn_node").items()
                    if vb in moved
                ),
                "n2's vBuckets to be failed over to n1",
                timeout=FAILOVER_TIMEOUT_S + 60,
            )
            mark = stream.written
            wait_for(lambda: stream.written > mark + 200, "more mutations after the failover")
        wait_for(lambda: caught_up(state, "fn_node"), "the function to catch up", timeout=120)
    finally:
        service.stop()
        thread.join(timeout=120)
    assert not service.summary.errors, service.summary.errors
    assert [f["nodes"] for f in service.summary.failovers] == [["n2"]]
    assert_ledger_exact(url, "fn_node")
    state.close()
