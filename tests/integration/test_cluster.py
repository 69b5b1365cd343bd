"""Cluster mode on a real multi-node Ray cluster on this machine: a head node and a node `n2` that cannot see
the data directory, nor this project's packages (an empty tmpfs over each, in its own mount namespace), as
on a second machine. Workers there reach the data through the data service and get the code through Ray's
runtime_env. Each test ends with the ledger check (every mutation handled, effects exactly once, per-document
order). Functions run sandboxed here (the machine's default set to the sandbox for the module): a sandboxed
worker's child on n2 reaches the data through its host. One cluster for the module; every process it
started is ended by pid."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import eventing
from eventing.cli.app import main as cli
from eventing.control import lifecycle
from eventing.control.failover import LEADER_LEASE
from eventing.control.nodes import Topology
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, decode_document
from eventing.storage.bucket import LocalBucket
from eventing.testing import (
    BackgroundLoop,
    check_ledger,
    deploy_function,
    ledger_definition,
    load_source,
    wait_for,
)
from eventing.testing.cluster import (
    LocalRayCluster,
    LocalSparkCluster,
    LocalSparkConnectServer,
    RayNode,
    ServiceProcess,
    descendants,
    environment_without,
)
from eventing.testing.windows import assert_same_results, reference_results
from eventing.windows.runtime.paths import WindowPaths
from eventing.windows.semantics import WindowSpec
from eventing.windows.spark.sink import ParquetWindowSink
from eventing.workers.executor import RayExecutor, init_ray
from eventing.workers.ray_instance import cmdline
from eventing.workers.sandbox.zygote import is_sandboxed_child
from metadata.factory import open_store
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration

ROOT = Path(eventing.__file__).resolve().parents[1]
PACKAGES = [str(ROOT / name) for name in ("eventing", "metadata", "sharding")]


@dataclass
class Env:
    ray: LocalRayCluster
    data_root: str  # hidden from n2: every test's data directory is inside
    n2: RayNode

    def new_data_dir(self) -> str:
        return tempfile.mkdtemp(prefix="d-", dir=self.data_root)

    @property
    def head_id(self) -> str:
        return self.ray.nodes[0].node_id


@pytest.fixture(scope="module", autouse=True)
def sandboxed_by_default():
    """Every function of the module sandboxed (EVENTING_DEFAULT_ISOLATION=sandbox), as on a machine that
    makes the sandbox its default: cluster mode's paths with a child per worker."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVENTING_DEFAULT_ISOLATION", "sandbox")
        yield


@pytest.fixture(scope="module")
def env():
    if not LocalRayCluster.can_hide():
        pytest.skip("a node hidden from the data directory needs root and unshare (mount namespaces)")
    import ray

    was_up = ray.is_initialized()
    if was_up:
        ray.shutdown()  # this process joins the test's cluster instead of the session's local instance
    data_root = tempfile.mkdtemp(prefix="eventing-cluster-data-")
    cluster = LocalRayCluster()
    try:
        cluster.start()
        n2 = cluster.add_node("n2", hidden=[data_root, *PACKAGES])
        init_ray(cluster.address)
        yield Env(cluster, data_root, n2)
    finally:
        ray.shutdown()
        cluster.stop()
        shutil.rmtree(data_root, ignore_errors=True)
        if was_up:
            init_ray(num_cpus=2)


def on_n2(fn, *args):
    import ray

    return ray.get(ray.remote(num_cpus=0, resources={"n2": 0.01})(fn).remote(*args), timeout=60)


def pin_all_workers(data_dir: str, node: str, ray_node_id: str) -> None:
    """Every vBucket on eventing node `node`, pinned to a Ray node (recorded; no service runs yet)."""
    assert cli(["--data-dir", data_dir, "node", "add", node, "--ray-node-id", ray_node_id]) == 0
    assert cli(["--data-dir", data_dir, "node", "remove", "local"]) == 0
    assert cli(["--data-dir", data_dir, "rebalance"]) == 0


class WorkerPlaces:
    """on_progress hook: which Ray node each worker process runs on (n2's processes descend from its pid)."""

    def __init__(self, env: Env, function: str):
        self.env, self.function = env, function
        self.seen: dict[int, bool] = {}  # worker pid -> runs on n2
        self.sandboxed: dict[int, bool] = {}  # worker pid -> its handler runs in a sandbox's child process
        self.service: EventingService | None = None

    def __call__(self, summary) -> None:
        sup = self.service.supervisors.get(self.function) if self.service else None
        if sup is None:
            return
        new = [s.pid for s in sup.slots.values() if s.pid and s.pid not in self.seen]
        if new:
            on_n2 = descendants(self.env.n2.pid)
            for pid in new:
                self.seen[pid] = pid in on_n2
                self.sandboxed[pid] = any(is_sandboxed_child(p) for p in (pid, *descendants(pid)))


class Stream(BackgroundLoop):
    def __init__(self, bucket: LocalBucket, docs: int = 200, pause_s: float = 0.002):
        super().__init__()
        self.bucket, self.docs, self.interval_s = bucket, docs, pause_s
        self.written = 0

    def tick(self) -> None:
        self.bucket.upsert(f"doc::{self.written % self.docs}", {"rev": self.written})
        self.written += 1


def caught_up(data_dir: str, name: str, source: LocalBucket) -> bool:
    cps = open_store(data_dir).checkpoints(name)
    return bool(cps) and [cps[vb].seqno for vb in range(NUM_VBUCKETS)] == source.high_seqnos()


def assert_ledger(data_dir: str, source: LocalBucket, expected: int | None = None) -> None:
    report = check_ledger(source, LocalBucket.open(data_dir, "ledger"))
    assert report.ok, report.summary()
    assert report.handled == (expected if expected is not None else report.source_mutations)
    assert cli(["--data-dir", data_dir, "verify", "fn_c", "--ledger", "ledger"]) == 0


# -- the hidden node ---------------------------------------------------------------------------------


def test_the_second_node_cannot_see_the_data_directory_nor_the_checkout(env):
    data_dir = env.new_data_dir()
    Path(data_dir, "probe").write_text("x")

    def look(path: str, package_dir: str) -> tuple[bool, bool, str]:
        import os

        import eventing as shipped

        return (
            os.path.exists(path),
            os.path.exists(os.path.join(package_dir, "__init__.py")),
            shipped.__file__,
        )

    sees_data, sees_code, shipped = on_n2(look, os.path.join(data_dir, "probe"), PACKAGES[0])
    assert not sees_data and not sees_code
    assert not shipped.startswith(str(ROOT)), "the code on n2 came with the job's runtime_env"


def test_replies_across_nodes_may_be_sent_inline_up_to_the_data_services_read_ahead(env):
    """A read ahead (~5 MB) comes back in the call's reply, not through the object stores (see
    INLINE_REPLY_BYTES)."""
    from eventing.workers.executor import INLINE_LIMIT_ENV, INLINE_REPLY_BYTES

    def limit() -> str | None:
        import os

        return os.environ.get(INLINE_LIMIT_ENV)

    assert on_n2(limit) == str(INLINE_REPLY_BYTES)
    assert INLINE_REPLY_BYTES >= 8 << 20


# -- (a) every worker on the hidden node -------------------------------------------------------------


def test_workers_on_the_hidden_node_handle_every_mutation_once_in_order(env):
    data_dir = env.new_data_dir()
    source = load_source(data_dir, 300, 6000, seed=11)
    deploy_function(data_dir, ledger_definition("fn_c", "src", "ledger", workers=3))
    pin_all_workers(data_dir, "n2", env.n2.node_id)
    places = WorkerPlaces(env, "fn_c")
    service = EventingService(
        data_dir, RayExecutor(env.ray.address), until_caught_up=True, on_progress=places
    )
    places.service = service
    summary = service.run()
    assert not summary.errors, summary.errors
    assert summary.functions["fn_c"].handled == 6000
    assert len(places.seen) == 3 and all(places.seen.values()), places.seen  # all three ran on n2
    assert all(places.sandboxed.values()), places.sandboxed  # each in a sandbox's child process
    assert_ledger(data_dir, source, 6000)
    owners = {cp.owner for cp in open_store(data_dir).checkpoints("fn_c").values()}
    assert owners == {"n2/w0", "n2/w1", "n2/w2"}


def test_writes_through_the_data_api_are_handled_by_workers_on_the_hidden_node(env):
    """`eventing run --serve` serves the Data API where the data directory (and the data service) is; what
    an application writes through it is handled by workers on a node that cannot see the files."""
    import socket

    import httpx

    data_dir = env.new_data_dir()
    source = load_source(data_dir, 50, 100, seed=12)
    deploy_function(data_dir, ledger_definition("fn_c", "src", "ledger", workers=2))
    pin_all_workers(data_dir, "n2", env.n2.node_id)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    service = ServiceProcess(data_dir, env.ray.address, "--serve", str(port))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as api:
            wait_for(lambda: _answers(api), "the Data API of the running service answers", timeout=120)
            url = "/v1/buckets/src/scopes/_default/collections/_default/documents/"
            for i in range(40):
                reply = api.put(url + f"api::{i}", json={"rev": i, "via": "data api"})
                assert reply.status_code == 200, reply.text
                assert reply.headers["ETag"]
        wait_for(lambda: caught_up(data_dir, "fn_c", source), "the API's writes are handled", timeout=120)
    finally:
        service.stop()
    assert_ledger(data_dir, source, 140)
    owners = {cp.owner for cp in open_store(data_dir).checkpoints("fn_c").values()}
    assert owners == {"n2/w0", "n2/w1"}  # every vBucket, the API's writes with them, handled on n2


def _answers(api) -> bool:
    import httpx

    try:
        return api.get("/v1/callerIdentity").status_code == 200
    except httpx.HTTPError:
        return False


LOG_HANDLER = """
from eventing.handler import log

def on_update(doc, meta):
    log("seen", meta.id)
"""


def test_log_lines_of_hidden_node_workers_reach_the_application_log(env, capsys):
    data_dir = env.new_data_dir()
    source = load_source(data_dir, 200, 4000, seed=15)
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_log",
            "source_bucket": "src",
            "worker_count": 2,
            "app_log_max_size": 64 * 1024,
            "app_log_max_files": 100,
        }
    )
    deploy_function(data_dir, defn, LOG_HANDLER)
    pin_all_workers(data_dir, "n2", env.n2.node_id)
    places = WorkerPlaces(env, "fn_log")
    service = EventingService(
        data_dir, RayExecutor(env.ray.address), until_caught_up=True, on_progress=places
    )
    places.service = service
    summary = service.run()
    assert not summary.errors, summary.errors
    assert not open_store(data_dir).counters("fn_log").get("dlq_error")
    assert places.seen and all(places.seen.values()), places.seen  # every worker ran on n2
    updates = sorted((m.vb, m.seqno) for batch in source.scan_log() for m in batch if m.op == OP_UPDATE)
    capsys.readouterr()
    assert cli(["--data-dir", data_dir, "log", "fn_log", "--lines", "100000", "--json"]) == 0
    lines = json.loads(capsys.readouterr().out)["lines"]
    # <time> [INFO] fn_log <vb>:<seqno> <key> seen <key>: one line per update, none twice
    logged = sorted(tuple(map(int, line.split(" ")[3].split(":"))) for line in lines)
    assert logged == updates
    files = list(Path(data_dir, "logs").glob("fn_log.log*"))
    assert len([f for f in files if not f.name.endswith(".lock")]) > 1  # rotated by the data service
    assert all(f.stat().st_size <= 64 * 1024 for f in files)


# -- (b) live rebalance onto and off the hidden node -------------------------------------------------


def test_a_live_rebalance_onto_and_off_the_hidden_node_loses_nothing(env):
    data_dir = env.new_data_dir()
    source = load_source(data_dir, 200, 2000, seed=12)
    deploy_function(data_dir, ledger_definition("fn_c", "src", "ledger", workers=2))
    pin_all_workers(data_dir, "head", env.head_id)
    places = WorkerPlaces(env, "fn_c")
    service = EventingService(data_dir, RayExecutor(env.ray.address), on_progress=places)
    places.service = service
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: "fn_c" in service.supervisors and service.supervisors["fn_c"].ready)
        with Stream(source) as stream:
            assert cli(["--data-dir", data_dir, "node", "add", "n2", "--ray-node-id", env.n2.node_id]) == 0
            assert cli(["--data-dir", data_dir, "rebalance", "--wait", "120"]) == 0
            owners = [cp.owner for cp in open_store(data_dir).checkpoints("fn_c").values()]
            assert sum(o.startswith("n2/") for o in owners) == NUM_VBUCKETS // 2
            time.sleep(1.0)  # n2's workers handle part of the stream
            assert cli(["--data-dir", data_dir, "node", "remove", "n2"]) == 0
            assert cli(["--data-dir", data_dir, "rebalance", "--wait", "120"]) == 0
        assert stream.written > 100
        wait_for(lambda: caught_up(data_dir, "fn_c", source))
    finally:
        service.stop()
        thread.join(timeout=60)
    assert any(places.seen.values()) and not all(places.seen.values())  # workers ran on both nodes
    assert {cp.owner.split("/")[0] for cp in open_store(data_dir).checkpoints("fn_c").values()} == {"head"}
    assert_ledger(data_dir, source)


# -- (c) a standby takes over from a killed leader while every worker is on the hidden node ------------


def worker_hosts_on(node: RayNode) -> int:
    """Worker actors running on ``node`` (a process of Ray's is titled after its actor's class)."""
    return sum(1 for pid in descendants(node.pid) if cmdline(pid).startswith("ray::WorkerHost"))


def test_a_standby_takes_over_hidden_node_workers_from_a_killed_leader_and_loses_nothing(env):
    data_dir = env.new_data_dir()
    source = load_source(data_dir, 300, 3000, seed=16)
    deploy_function(data_dir, ledger_definition("fn_c", "src", "ledger", workers=2))
    pin_all_workers(data_dir, "n2", env.n2.node_id)

    def owners() -> dict[int, tuple[str, int, bool]]:
        store = open_store(data_dir)
        try:
            return {vb: (str(cp.owner), cp.epoch, cp.leased) for vb, cp in store.checkpoints("fn_c").items()}
        finally:
            store.close()

    def holder() -> str:
        store = open_store(data_dir)
        try:
            lease = store.lease(LEADER_LEASE)
            return lease.holder if lease is not None else ""
        finally:
            store.close()

    leader = ServiceProcess(data_dir, env.ray.address, log_name="leader")
    standby = None
    try:
        wait_for(
            lambda: (
                len(owners()) == NUM_VBUCKETS
                and all(o.startswith("n2/") and leased for o, _, leased in owners().values())
            )
        )
        standby = ServiceProcess(data_dir, env.ray.address, "--standby", log_name="standby")
        wait_for(lambda: any(f":{standby.proc.pid}:" in s for s in open_store(data_dir).live_services(5)))
        # The standby runs long before the leader dies: its data service is up, and so are the workers it
        # starts ahead of time on n2, next to the leader's two.
        wait_for(lambda: worker_hosts_on(env.n2) >= 4, "the standby's two workers are up on n2", timeout=60)
        before = {vb: epoch for vb, (_, epoch, _) in owners().items()}
        with Stream(source, docs=300) as stream:
            wait_for(lambda: stream.written > 300)
            killed_at = leader.kill()  # kill -9 mid-stream
            wait_for(lambda: f":{standby.proc.pid}:" in holder(), timeout=30)
            lease_at = time.time()

            def reclaimed() -> bool:
                now = owners()
                return all(
                    o.startswith("n2/") and leased and e > before[vb] for vb, (o, e, leased) in now.items()
                )

            wait_for(reclaimed, timeout=60)
            claimed_at = time.time()
            handled_mark = sum(cp.seqno for cp in open_store(data_dir).checkpoints("fn_c").values())
            wait_for(
                lambda: (
                    sum(cp.seqno for cp in open_store(data_dir).checkpoints("fn_c").values())
                    > handled_mark + 100
                ),
                timeout=60,
            )
            moving_at = time.time()
            mark = stream.written
            wait_for(lambda: stream.written > mark + 300)
        wait_for(lambda: caught_up(data_dir, "fn_c", source), timeout=120)
        summary = standby.stop()
    finally:
        leader.end()
        if standby is not None:
            standby.end()
    assert summary["leadership"]["took_over_from"], summary["leadership"]
    assert not summary["errors"], summary["errors"]
    assert {o.split("/")[0] for o, _, _ in owners().values()} == {"n2"}
    print(
        f"\nstandby over the data service: lease seen {lease_at - killed_at:.2f}s after the leader's kill "
        f"-9, every vBucket claimed again by hidden-node workers after {claimed_at - killed_at:.2f}s, "
        f"checkpoints moving again after {moving_at - killed_at:.2f}s (the standby's own figure, lease to "
        f"workers ready: {summary['leadership'].get('workers_ready_s')}s); the stream wrote {stream.written} "
        "mutations"
    )
    assert claimed_at - killed_at < 15.0
    assert_ledger(data_dir, source)


# -- faults and bad input ----------------------------------------------------------------------------


def test_a_killed_data_service_actor_is_restarted_and_nothing_is_lost(env):
    from eventing.workers.data_service import ping

    data_dir = env.new_data_dir()
    source = load_source(data_dir, 200, 3000, seed=13)
    deploy_function(data_dir, ledger_definition("fn_c", "src", "ledger", workers=2, batch_size=100))
    pin_all_workers(data_dir, "n2", env.n2.node_id)
    executor = RayExecutor(env.ray.address)
    service = EventingService(data_dir, executor)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: "fn_c" in service.supervisors and service.supervisors["fn_c"].ready)
        with Stream(source):
            time.sleep(0.5)
            pids = [answer["pid"] for answer in ping(executor.data_service)]
            for pid in pids:
                os.kill(pid, 9)
            time.sleep(1.0)
        wait_for(lambda: caught_up(data_dir, "fn_c", source))
        restarted = [answer["pid"] for answer in ping(executor.data_service)]
        assert not set(restarted) & set(pids)
    finally:
        service.stop()
        thread.join(timeout=60)
    assert_ledger(data_dir, source)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "eventing", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_a_ray_address_that_does_not_answer_fails_fast_in_one_line(env):
    data_dir = env.new_data_dir()
    open_store(data_dir).close()
    started = time.monotonic()
    result = run_cli("--data-dir", data_dir, "run", "--ray-address", "127.0.0.1:9", "--until-caught-up")
    assert time.monotonic() - started < 15
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Ray cluster answers at 127.0.0.1:9" in lines[0] and "ray start" in lines[0]


def test_a_ray_node_id_that_does_not_exist_is_named(env):
    data_dir = env.new_data_dir()
    load_source(data_dir, 10, 100)
    deploy_function(data_dir, ledger_definition("fn_c", "src", "ledger", workers=1))
    pin_all_workers(data_dir, "ghost", "ab" * 28)
    result = run_cli("--data-dir", data_dir, "run", "--ray-address", env.ray.address, "--until-caught-up")
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'ghost'" in errors[0] and "not in this Ray cluster" in errors[0], (
        result.stderr
    )
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("master", ["spark://127.0.0.1:9", "sc://127.0.0.1:9"])
def test_a_spark_master_that_does_not_answer_fails_fast_in_one_line(env, master):
    data_dir = env.new_data_dir()
    open_store(data_dir).close()
    result = run_cli("--data-dir", data_dir, "run", "--executor", "in-process", "--spark-master", master)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no Spark master answers at {master}" in lines[0], result.stderr


def test_a_node_missing_a_dependency_is_named_with_the_fix(env, tmp_path):
    # A third node whose Python environment lacks msgspec (a dependency of the workers, not of Ray).
    python = environment_without(["msgspec"], str(tmp_path / "venv"))
    n3 = env.ray.add_node("n3", hidden=[env.data_root], python=python)
    try:
        data_dir = env.new_data_dir()
        load_source(data_dir, 10, 100)
        deploy_function(data_dir, ledger_definition("fn_c", "src", "ledger", workers=1))
        pin_all_workers(data_dir, "n3", n3.node_id)
        result = run_cli(
            "--data-dir",
            data_dir,
            "run",
            "--ray-address",
            env.ray.address,
            "--until-caught-up",
            "--json",
            timeout=120,
        )
    finally:
        env.ray.stop_node(n3)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error") or "msgspec" in line]
    assert any("Python package 'msgspec' is not installed there" in line for line in errors), result.stderr[
        -3000:
    ]
    assert "Traceback" not in result.stderr


# -- (c) windows on a Spark standalone cluster whose worker cannot see the data ----------------------

MIN = 60_000
WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["country"],
    "aggregates": ["count", {"op": "sum", "field": "amount"}, {"op": "max", "field": "purchases"}],
    "out_of_order_tolerance": "5s",
}


def _windows_with_spark(env, name: str, spark: LocalSparkCluster, seed: int, ran) -> str:
    """Deploy a windowed function on the hidden node, start ``spark`` (a standalone cluster or a Connect
    server) where the data directory is hidden, run until caught up closing every window, and check every
    window against the plain computation. Returns ``ran(spark)``, read before Spark stops: what it ran."""
    data_dir = env.new_data_dir()
    source = load_source(data_dir, 250, 4000, seed=seed, span_ms=8 * MIN, disorder_ms=2_000)
    defn = FunctionDefinition.from_dict(
        {
            "name": name,
            "source_bucket": "src",
            "worker_count": 2,
            "checkpoint_interval": "100ms",
            "batch_size": 500,
            "window": WINDOW,
        }
    )
    lifecycle.save_function(data_dir, defn, "")
    lifecycle.deploy(data_dir, name)
    pin_all_workers(data_dir, "n2", env.n2.node_id)
    try:
        master = spark.start(hidden=[env.data_root])
        result = run_cli(
            "--data-dir",
            data_dir,
            "run",
            "--ray-address",
            env.ray.address,
            "--spark-master",
            master,
            "--until-caught-up",
            "--close-windows",
            "--json",
            timeout=240,
        )
        record = ran(spark)
    finally:
        spark.stop()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    store = open_store(data_dir)
    assert {cp.owner.split("/")[0] for cp in store.checkpoints(name).values()} == {"n2"}
    late = {(r.vb, r.seqno) for r in store.dlq_rows(name)}
    docs = [
        (m.vb, m.seqno, decode_document(m.doc))
        for batch in source.scan_log()
        for m in batch
        if m.op == OP_UPDATE
    ]
    on_time = [d for d in docs if (d[0], d[1]) not in late]
    windows = sorted({(t - t % MIN, t - t % MIN + MIN) for t in (d[2]["ts"] for d in on_time)})
    sink = ParquetWindowSink(WindowPaths.of(data_dir, name).root / "results")
    assert sorted(sink.written_windows(name)) == windows
    assert_same_results(
        sink.read(name), reference_results(docs, WindowSpec.from_dict(WINDOW), windows, exclude=late)
    )
    assert store.counters(name)["window_rows_accepted"] == len(on_time)
    assert Topology(store).node_plan().counts() == {"n2": NUM_VBUCKETS}
    return record


def test_windows_on_hidden_workers_and_a_spark_cluster_equal_the_plain_computation(env):
    # The merge ran on the cluster: its worker started executors for the service's application.
    apps = _windows_with_spark(
        env,
        "fn_w",
        LocalSparkCluster(),
        14,
        lambda spark: [p.name for p in Path(spark.work_dir).glob("app-*")],
    )
    assert apps, "no Spark application ran on the standalone worker"


def test_windows_through_spark_connect_equal_the_plain_computation(env):
    """--spark-master sc://: a Spark Connect server that cannot see the data directory merges the windows
    (partials go to it as Arrow, results come back)."""
    server_log = _windows_with_spark(
        env,
        "fn_sc",
        LocalSparkConnectServer(),
        15,
        lambda server: (Path(server.work_dir) / "spark-connect.log").read_text(errors="replace"),
    )
    # The server ran the merge: its own log names the jobs it executed.
    assert "Job 0 finished" in server_log or "ResultStage" in server_log, server_log[-2000:]
