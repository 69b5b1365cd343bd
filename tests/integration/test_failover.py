"""Node failover and a standby service on a real multi-node Ray cluster on this machine (every node sees the
data directory here; the data service makes that unnecessary). The service runs as `python -m eventing run`
in a subprocess, as a user runs it. Each test ends with the ledger check (`eventing verify`).

(a) kill -9 of the second Ray node's raylet while mutations stream in: the node is failed over after the
    failover timeout, nothing is lost or reordered, the unowned time is measured; then the node is added
    back (`node add` + `rebalance`) and takes vBuckets again.
(b) kill -9 of the leader service with a standby running: the standby takes the lease, resumes every function
    from its checkpoints and finishes the stream.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from eventing.cli.app import main as cli
from eventing.control.failover import LEADER_LEASE
from eventing.storage.bucket import LocalBucket
from eventing.testing import (
    BackgroundLoop,
    check_ledger,
    deploy_function,
    ledger_definition,
    load_source,
    wait_for,
)
from eventing.testing.cluster import ServiceProcess
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration

RAY = str(Path(sys.executable).with_name("ray"))
FAILOVER_TIMEOUT_S = 4.0
HEAD = "node:__internal_head__"
STANDBY_WARM_S = (
    5.0  # Ray needs ~2-6 s here to start the standby's idle workers  # a resource only the head node has
)


# -- a local multi-node Ray cluster, ended by pid --------------------------------------------------------


class LocalRayCluster:
    """`ray start --head` and more `ray start --address` nodes sharing one temp dir; every process of the
    cluster (and its raylets' children) is found by that dir in the process table and ended by pid."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="evfo")  # short: Ray's socket paths have a length limit
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        self.known: set[int] = (
            set()
        )  # every pid of this cluster seen so far (children outlive a killed raylet)

    def start(self) -> None:
        self._ray(
            "start",
            "--head",
            f"--port={self.port}",
            "--num-cpus=2",
            f"--temp-dir={self.temp_dir}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        )

    def add_node(self, resource: str) -> str:
        """Start a node carrying custom resource `resource`; returns its Ray node id."""
        self._ray(
            "start",
            f"--address={self.address}",
            f"--resources={json.dumps({resource: 100})}",
            f"--temp-dir={self.temp_dir}",
        )
        return self.raylet(resource)[1]

    def raylet(self, resource: str) -> tuple[int, str]:
        """(pid, node id) of the raylet of the node carrying `resource` (the head: node:__internal_head__)."""
        for pid, _, args in _processes():
            listed = re.search(r"--static_resource_list=(\S+)", args)
            if (
                args.split()[0].endswith("/raylet")
                and self.temp_dir in args
                and listed
                and resource in listed.group(1).split(",")[::2]
            ):
                node_id = re.search(r"(?:^|\s)--node_id=([0-9a-f]+)", args)
                assert node_id is not None
                return pid, node_id.group(1)
        raise AssertionError(f"no raylet with resource {resource} under {self.temp_dir}")

    def kill_raylet(self, resource: str) -> tuple[float, set[int]]:
        """kill -9 the node's raylet; returns when, and the pids of its children (its workers) at that
        time."""
        self.remember()
        pid, _ = self.raylet(resource)
        children = {p for p, ppid, _ in _processes() if ppid == pid}
        os.kill(pid, signal.SIGKILL)
        return time.time(), children

    def remember(self) -> set[int]:
        """The cluster's processes now: those naming the temp dir and their descendants."""
        procs = _processes()
        children: dict[int, list[int]] = {}
        for pid, ppid, _ in procs:
            children.setdefault(ppid, []).append(pid)
        found = {pid for pid, _, args in procs if self.temp_dir in args}
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        self.known |= found
        return found

    def shutdown(self) -> None:
        for pid in sorted(self.remember() | self.known):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _ray(self, *args: str) -> None:
        done = subprocess.run([RAY, *args], env=self.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        self.remember()


def _processes() -> list[tuple[int, int, str]]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3:
            rows.append((int(parts[0]), int(parts[1]), parts[2]))
    return rows


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    c = LocalRayCluster()
    try:
        c.start()
        yield c
    finally:
        c.shutdown()


# -- the service as a user runs it ------------------------------------------------------------------------


class Stream(BackgroundLoop):
    """New mutations (several revisions per document) while the test does its damage."""

    interval_s = 0.002

    def __init__(self, bucket: LocalBucket, prefix: str, docs: int = 300):
        super().__init__()
        self.bucket, self.prefix, self.docs = bucket, prefix, docs
        self.written = 0

    def tick(self) -> None:
        self.bucket.upsert(f"{self.prefix}::{self.written % self.docs}", {"rev": self.written})
        self.written += 1


def owners(data_dir: str, fn: str) -> dict[int, tuple[str | None, int, bool]]:
    store = open_store(data_dir)
    try:
        return {vb: (cp.owner, cp.epoch, cp.leased) for vb, cp in store.checkpoints(fn).items()}
    finally:
        store.close()


def caught_up(data_dir: str, fn: str, source: LocalBucket) -> bool:
    store = open_store(data_dir)
    try:
        cps = store.checkpoints(fn)
    finally:
        store.close()
    return [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()


def verify(data_dir: str, fn: str, source: LocalBucket) -> None:
    report = check_ledger(source, LocalBucket.open(data_dir, f"ledger_{fn}"))
    assert report.ok, report.summary()
    assert report.handled == report.source_mutations
    assert cli(["--data-dir", data_dir, "verify", fn]) == 0


def deployed_ledger(data_dir: str, fn: str, mutations: int = 3000) -> LocalBucket:
    source = load_source(data_dir, 300, mutations, bucket="src")
    deploy_function(data_dir, ledger_definition(fn, "src", f"ledger_{fn}", workers=2))
    return source


# -- (a) node failover ------------------------------------------------------------------------------------


def test_a_killed_ray_node_is_failed_over_then_added_back_and_nothing_is_lost(cluster, data_dir, capsys):
    fn = "fn_fo"
    source = deployed_ledger(data_dir, fn)
    n2_id = cluster.add_node("n2")
    # Every eventing node pinned to its Ray node (an unpinned worker may be placed on any Ray node).
    assert cli(["--data-dir", data_dir, "node", "add", "n1", "--ray-node-id", cluster.raylet(HEAD)[1]]) == 0
    assert cli(["--data-dir", data_dir, "node", "add", "n2", "--ray-node-id", n2_id]) == 0
    assert cli(["--data-dir", data_dir, "node", "remove", "local"]) == 0
    assert cli(["--data-dir", data_dir, "rebalance"]) == 0  # no service yet: the plan applies at start
    service = ServiceProcess(
        data_dir, cluster.address, "--failover-timeout", f"{FAILOVER_TIMEOUT_S:g}s", log_name="fo"
    )
    try:

        def on_n2():
            return {
                vb
                for vb, (o, _, leased) in owners(data_dir, fn).items()
                if o and o.startswith("n2/") and leased
            }

        wait_for(lambda: len(on_n2()) == NUM_VBUCKETS // 2, what="n2's workers to claim their vBuckets")
        moved = on_n2()
        epochs_before = {vb: e for vb, (_, e, _) in owners(data_dir, fn).items()}
        with Stream(source, "live") as stream:
            wait_for(lambda: stream.written > 300, what="the stream to start")
            killed_at, n2_workers = cluster.kill_raylet("n2")

            def taken_over() -> bool:
                now = owners(data_dir, fn)
                return all(
                    str(now[vb][0]).startswith("n1/") and now[vb][2] and now[vb][1] > epochs_before[vb]
                    for vb in moved
                )

            wait_for(taken_over, timeout=FAILOVER_TIMEOUT_S + 60, what="the failover")
            owned_at = time.time()
            unowned_s = owned_at - killed_at
            outlived = sorted(
                p for p in n2_workers if _running(p)
            )  # zombies, if any: fenced by the new epochs
            assert FAILOVER_TIMEOUT_S <= unowned_s <= FAILOVER_TIMEOUT_S + 5
            capsys.readouterr()
            assert cli(["--data-dir", data_dir, "node", "list", "--json"]) == 0
            listed = json.loads(capsys.readouterr().out)
            assert {n["name"]: n["state"] for n in listed["nodes"]} == {"n1": "active", "n2": "failed"}
            assert listed["last_rebalance"]["failover"]["nodes"] == ["n2"]
            mark = stream.written
            wait_for(lambda: stream.written > mark + 300, what="more mutations after the failover")

            # Adding it back: a fresh Ray node, `node add` with its new id, `rebalance`.
            new_id = cluster.add_node("n2b")
            assert cli(["--data-dir", data_dir, "node", "add", "n2", "--ray-node-id", new_id]) == 0
            assert cli(["--data-dir", data_dir, "rebalance", "--wait", "120"]) == 0
            back = [vb for vb, (o, _, _) in owners(data_dir, fn).items() if o and o.startswith("n2/")]
            assert len(back) == NUM_VBUCKETS // 2
        wait_for(lambda: caught_up(data_dir, fn, source), what="the function to catch up")
        summary = service.stop()
    finally:
        service.end()
    failovers = summary["failovers"]
    assert [f["nodes"] for f in failovers] == [["n2"]]
    print(
        f"\nfailover: n2's {len(moved)} vBuckets had no live owner for {unowned_s:.2f}s after its raylet's "
        f"kill -9 (failover timeout {FAILOVER_TIMEOUT_S:g}s; the service's own figure, from the first sign "
        f"of death to the last claim: {failovers[0]['unowned_s']:.2f}s); the stream wrote {stream.written} "
        f"mutations; {len(outlived)} of the node's {len(n2_workers)} worker processes outlived its raylet by "
        "then"
    )
    assert failovers[0]["unowned_s"] <= FAILOVER_TIMEOUT_S + 5
    verify(data_dir, fn, source)


@pytest.mark.soak
def test_a_node_dead_longer_than_rays_own_detection_is_failed_over_not_a_crash(cluster, data_dir):
    """A failover timeout past the ~15-30 s Ray takes to mark a node dead: meanwhile the node's workers are
    restarted pinned to it, which Ray refuses (ActorUnschedulableError); the run goes on and fails it over."""
    fn = "fn_slow_fo"
    timeout_s = 40.0
    source = deployed_ledger(data_dir, fn)
    n3_id = cluster.add_node("n3")
    assert cli(["--data-dir", data_dir, "node", "add", "n1", "--ray-node-id", cluster.raylet(HEAD)[1]]) == 0
    assert cli(["--data-dir", data_dir, "node", "add", "n3", "--ray-node-id", n3_id]) == 0
    assert cli(["--data-dir", data_dir, "node", "remove", "local"]) == 0
    assert cli(["--data-dir", data_dir, "rebalance"]) == 0
    service = ServiceProcess(
        data_dir, cluster.address, "--failover-timeout", f"{timeout_s:g}s", log_name="slow"
    )
    try:
        wait_for(
            lambda: (
                sum(
                    1
                    for o, _, leased in owners(data_dir, fn).values()
                    if o and o.startswith("n3/") and leased
                )
                == NUM_VBUCKETS // 2
            ),
            what="n3's workers to claim their vBuckets",
        )
        with Stream(source, "live") as stream:
            wait_for(lambda: stream.written > 300, what="the stream to start")
            cluster.kill_raylet("n3")
            wait_for(
                lambda: all(
                    str(o).startswith("n1/") and leased for o, _, leased in owners(data_dir, fn).values()
                ),
                timeout=timeout_s + 90,
                what="the failover",
            )
            assert service.proc.poll() is None, "the run ended while the node was down"
        wait_for(lambda: caught_up(data_dir, fn, source), what="the function to catch up")
        summary = service.stop()
    finally:
        service.end()
    assert [f["nodes"] for f in summary["failovers"]] == [["n3"]]
    verify(data_dir, fn, source)


# -- (b) a standby service --------------------------------------------------------------------------------


def test_a_standby_takes_over_from_a_killed_leader_and_finishes_the_stream(cluster, data_dir, capsys):
    fn = "fn_sb"
    source = deployed_ledger(data_dir, fn)
    leader = ServiceProcess(data_dir, cluster.address, log_name="leader")
    leader_started = time.time()
    standby = None
    try:

        def lease():
            store = open_store(data_dir)
            try:
                return store.lease(LEADER_LEASE)
            finally:
                store.close()

        wait_for(
            lambda: lease() is not None and f":{leader.pid}:" in lease().holder, what="the leader's lease"
        )
        wait_for(
            lambda: all(leased for _, _, leased in owners(data_dir, fn).values()), what="the leader's workers"
        )
        leader_up = time.time() - leader_started
        standby = ServiceProcess(data_dir, cluster.address, "--standby", log_name="standby")
        wait_for(
            lambda: any(f":{standby.pid}:" in s for s in open_store(data_dir).live_services(5)),
            what="the standby's heartbeat",
        )
        capsys.readouterr()
        assert cli(["--data-dir", data_dir, "status", "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert f":{leader.pid}:" in status["leader"]["id"]
        assert [s for s in status["standbys"] if f":{standby.pid}:" in s]
        epochs_before = {vb: e for vb, (_, e, _) in owners(data_dir, fn).items()}
        time.sleep(STANDBY_WARM_S)  # a standby runs long before the leader dies: its workers are up by then
        with Stream(source, "live") as stream:
            wait_for(lambda: stream.written > 300, what="the stream to start")
            killed_at = leader.kill()
            wait_for(
                lambda: f":{standby.pid}:" in lease().holder, timeout=30, what="the takeover", every=0.05
            )
            taken_at = time.time()
            took = lease()
            wait_for(
                lambda: any(
                    leased and e > epochs_before[vb] for vb, (_, e, leased) in owners(data_dir, fn).items()
                ),
                timeout=60,
                what="a first claim",
                every=0.05,
            )
            first_claim = time.time()
            wait_for(
                lambda: all(
                    leased and e > epochs_before[vb] for vb, (_, e, leased) in owners(data_dir, fn).items()
                ),
                timeout=60,
                what="the standby's workers to claim every vBucket",
            )
            resumed_at = time.time()
            assert took.term >= 2
            assert took.acquired_at - killed_at < 5.0
            assert resumed_at - killed_at < 10.0  # ~1 s here: the standby's workers were started ahead
            mark = stream.written
            wait_for(lambda: stream.written > mark + 300, what="more mutations after the takeover")
        wait_for(lambda: caught_up(data_dir, fn, source), what="the standby to finish the stream")
        summary = standby.stop()
        ready_s = summary["leadership"].get("workers_ready_s")
        assert (
            summary["leadership"]["took_over_from"]
            and f":{leader.pid}:" in summary["leadership"]["took_over_from"]
        )
    finally:
        leader.end()
        if standby is not None:
            standby.end()
    verify(data_dir, fn, source)
    print(
        f"\nstandby: lease taken {took.acquired_at - killed_at:.2f}s after the leader's kill -9 (seen by the "
        f"test {taken_at - killed_at:.2f}s); a first vBucket claimed again after "
        f"{first_claim - killed_at:.2f}s, every one after {resumed_at - killed_at:.2f}s (the leader took "
        f"{leader_up:.1f}s from its start to own every vBucket; the standby's own figure, lease to workers "
        f"ready: {ready_s}s); the stream wrote {stream.written} mutations"
    )
