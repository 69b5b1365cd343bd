"""The data service's two paths give the same answers: a worker reaching the data directory through the
service (every call pickled both ways, as Ray would) handles every mutation exactly as one opening the
files, for handlers with bindings and for windowed functions."""

from __future__ import annotations

import pickle
from typing import Any

import msgpack
import pytest

from eventing.control.service import EventingService
from eventing.core.mutation import OP_UPDATE
from eventing.storage.bucket import LocalBucket
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.remote import LOCALITY_ENV, DataAccess, DataService, RemoteBucket
from eventing.storage.rows_ahead import rows_of_columns
from eventing.storage.values import Write
from eventing.testing import check_ledger, deploy_function, ledger_definition, load_source
from eventing.workers.data_service import ServedData
from eventing.workers.executor import InProcessExecutor
from sharding import vbucket_of

HANDLER = "def on_update(doc, meta):\n    pass\n"


class PickledDataService:
    """A DataServiceRef stand-in: calls a DataService in this process, pickling arguments and answers."""

    node_id = "in-process"

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.service = ServedData(data_dir)
        self.calls: dict[str, int] = {}

    def client(self, key: str) -> PickledDataService:
        return self

    def call(self, method: str, *args: Any) -> Any:
        self.calls[method] = self.calls.get(method, 0) + 1
        return pickle.loads(pickle.dumps(self.service.call(method, *pickle.loads(pickle.dumps(args)))))

    def submit(self, method: str, *args: Any):
        answer = self.call(method, *args)
        return lambda: answer


class ServedExecutor(InProcessExecutor):
    """The in-process executor with a data service: workers get it in their spec, as on a Ray cluster."""

    def __init__(self, data_dir: str):
        self.data_service = PickledDataService(data_dir)


def test_remote_bucket_reads_equal_local_reads(data_dir):
    source = load_source(data_dir, 50, 2000, seed=3)
    remote = RemoteBucket(PickledDataService(data_dir).client("w"), "src")
    assert remote.uuid == source.uuid
    assert remote.high_seqnos() == source.high_seqnos()
    for vb in (0, 17, 1023):
        assert remote.read_vb(vb, 0, 1000) == source.read_vb(vb, 0, 1000)
        assert remote.read_vb(vb, 1, 2) == source.read_vb(vb, 1, 2)
        assert remote.read_vb_packed(vb, 0, 5, "x") == source.read_vb_packed(vb, 0, 5, "x")
    remote.prefetch([(5, 0, 3), (6, 1, 2)])
    assert remote.read_vb(6, 1, 2) == source.read_vb(6, 1, 2)
    assert remote.read_vb(5, 0, 3) == source.read_vb(5, 0, 3)
    assert remote.high_seqnos(prefetched=True) == source.high_seqnos()
    key = source.keys()[0]
    assert remote.get_raw(key) == source.get_raw(key)


def test_a_run_shipped_as_columns_gives_the_rows_a_local_read_gives(data_dir):
    source = load_source(data_dir, 30, 3000, seed=4)  # updates and deletes
    key = source.keys()[0]
    source.write([Write(key, OP_UPDATE, b"")])  # an empty document is not a missing one
    busy = sorted(range(1024), key=lambda v: -source.high_seqnos()[v])[:20]
    vb_of_key = vbucket_of(key)
    for vb in [*busy, vb_of_key]:
        for after, limit in ((0, 10_000), (2, 3), (1, 1)):
            columns = source.read_vb_columns(vb, after, limit)
            assert columns is not None
            assert list(rows_of_columns(vb, after, columns)) == source.read_vb_rows(vb, after, limit)
    deletes = [m for vb in busy for m in source.read_vb(vb, 0, 10_000) if m.op != OP_UPDATE]
    assert deletes, "the test data must hold deletes"
    assert source.read_vb_columns(busy[0], source.high_seqnos()[busy[0]], 10) is None  # nothing to read
    source.write([Write(key, OP_UPDATE, b"\x80", expiry=2_000_000_000)])  # an expiry: rows, not columns
    last = source.high_seqnos()[vb_of_key]
    assert source.read_vb_columns(vb_of_key, last - 1, 10) is None
    remote = RemoteBucket(PickledDataService(data_dir).client("w"), "src")
    remote.prefetch([(vb_of_key, 0, 10_000), (busy[0], 0, 10_000)])
    assert remote.read_vb(vb_of_key, 0, 10_000) == source.read_vb(vb_of_key, 0, 10_000)
    assert remote.read_vb(busy[0], 0, 10_000) == source.read_vb(busy[0], 0, 10_000)


def test_rows_read_ahead_as_columns_stay_columns_until_the_first_is_taken(data_dir):
    """A worker reading through the data service holds the runs it read ahead as their columns (~150 bytes
    a row against ~400 for a row tuple) and builds a vBucket's rows when it takes the first of them; taken
    in parts, they are the rows a local read gives."""
    source = load_source(data_dir, 40, 4000, seed=7)
    busy = sorted(range(1024), key=lambda v: -source.high_seqnos()[v])[:5]
    remote = RemoteBucket(PickledDataService(data_dir).client("w"), "src")
    remote.prefetch([(vb, 0, 10_000) for vb in busy])
    assert remote.read_vb(busy[0], 0, 2) == source.read_vb(busy[0], 0, 2)
    held = remote._ahead
    assert held[busy[0]]._columns == () and held[busy[0]]._rows  # built when its first rows were taken
    assert all(held[vb]._columns and held[vb]._rows == () for vb in busy[1:])
    assert remote.ahead()[0] == sum(source.high_seqnos()[vb] for vb in busy) - 2
    for vb in busy:
        after, rows = (
            (2, source.read_vb(vb, 2, 10_000)) if vb == busy[0] else (0, source.read_vb(vb, 0, 10_000))
        )
        half = len(rows) // 2
        assert remote.read_vb(vb, after, half) == rows[:half]
        assert remote.read_vb(vb, rows[half - 1].seqno, 10_000) == rows[half:]
    assert remote.ahead() == (0, False)


def test_a_key_holding_a_nul_byte_is_read_on_the_spot(data_dir):
    bucket = create_bucket(data_dir, "src")
    bucket.write([Write("a\x00b", OP_UPDATE, b"\x80"), Write("a\x00b", OP_UPDATE, b"\x81\xa1x\x01")])
    vb = vbucket_of("a\x00b")
    assert rows_of_columns(vb, 0, bucket.read_vb_columns(vb, 0, 10)) is None
    served = PickledDataService(data_dir)
    remote = RemoteBucket(served.client("w"), "src")
    remote.prefetch([(vb, 0, 10)])
    assert remote.read_vb(vb, 0, 10) == bucket.read_vb(vb, 0, 10)
    assert served.calls["read_vb"] == 1


def test_rows_read_ahead_are_taken_from_the_front_and_a_read_they_do_not_cover_is_made_on_the_spot(data_dir):
    source = load_source(data_dir, 20, 3000, seed=6)
    served = PickledDataService(data_dir)
    remote = RemoteBucket(served.client("w"), "src")
    vb = max(range(1024), key=lambda v: source.high_seqnos()[v])
    remote.prefetch([(vb, 0, 5), (vb + 1 if vb < 1023 else 0, 0, 1000)])
    assert remote.ahead() == (0, True) and remote.has_ahead(vb)
    seqnos = [m.seqno for m in source.read_vb(vb, 0, 10)]
    reads = served.calls.get("read_vb", 0)
    assert remote.read_vb(vb, 0, 2) == source.read_vb(vb, 0, 2)  # settles the read ahead
    assert remote.read_vb(vb, seqnos[1], 2) == source.read_vb(vb, seqnos[1], 2)
    assert served.calls.get("read_vb", 0) == reads  # both from the rows read ahead
    # past the read ahead's own limit (5): its last row, then the rest on the spot
    assert remote.read_vb(vb, seqnos[3], 4) == source.read_vb(vb, seqnos[3], 4)
    assert served.calls["read_vb"] == reads + 1
    assert remote.read_vb(vb, seqnos[2], 1) == source.read_vb(vb, seqnos[2], 1)  # not read ahead: on the spot
    remote.forget_prefetched({})
    assert remote.ahead() == (0, False)


@pytest.mark.parametrize("batch_size", [1000, 37])
def test_a_worker_without_the_files_handles_everything_exactly_once(data_dir, monkeypatch, batch_size):
    monkeypatch.setenv(LOCALITY_ENV, "0")
    source = load_source(data_dir, 200, 3000, seed=5)
    deploy_function(
        data_dir, ledger_definition("fn_remote", "src", "ledger", workers=3, batch_size=batch_size)
    )
    executor = ServedExecutor(data_dir)
    summary = EventingService(data_dir, executor, until_caught_up=True).run()
    assert summary.functions["fn_remote"].handled == 3000, summary
    report = check_ledger(source, open_bucket(data_dir, "ledger"))
    assert report.ok, report.summary()
    assert report.handled == 3000
    calls = executor.data_service.calls
    assert calls.get("read_many", 0) + calls.get("read_changed", 0) >= 3  # rows read ahead, in bulk
    assert calls["meta"] > 0 and calls["bucket"] > 0


def test_partitioned_source_and_ledger_through_the_service_handle_everything_exactly_once(
    data_dir, monkeypatch
):
    monkeypatch.setenv(LOCALITY_ENV, "0")
    create_bucket(data_dir, "src", partitions=4)
    create_bucket(data_dir, "ledger", partitions=3)
    source = load_source(data_dir, 200, 3000, seed=6)
    deploy_function(data_dir, ledger_definition("fn_remote", "src", "ledger", workers=4, batch_size=500))
    summary = EventingService(data_dir, ServedExecutor(data_dir), until_caught_up=True).run()
    assert summary.functions["fn_remote"].handled == 3000, summary
    ledger = open_bucket(data_dir, "ledger")
    assert ledger.stats()["partitions"] == 3
    report = check_ledger(source, ledger)
    assert report.ok and report.handled == 3000, report.summary()


def test_locality_opens_the_files_when_they_are_visible(data_dir, monkeypatch):
    load_source(data_dir, 10, 10)
    from metadata.factory import open_store

    open_store(data_dir).close()
    ref: Any = PickledDataService(data_dir)
    import ray

    if ray.is_initialized():  # an earlier test's Ray instance in this process: the service is on its node
        ref.node_id = ray.get_runtime_context().get_node_id()
    assert DataAccess(data_dir, ref).local
    assert isinstance(DataAccess(data_dir, ref).bucket("src"), LocalBucket)
    monkeypatch.setenv(LOCALITY_ENV, "0")
    assert not DataAccess(data_dir, ref).local


def test_put_file_stays_inside_the_data_directory(data_dir):
    from eventing.errors import ConfigError

    service = DataService(data_dir)
    service.call("put_file", "windows/fn/incoming/a.arrow", b"abc")
    assert (
        pytest.importorskip("pathlib").Path(data_dir) / "windows/fn/incoming/a.arrow"
    ).read_bytes() == b"abc"
    with pytest.raises(ConfigError):
        service.call("put_file", "../outside", b"x")


def test_put_file_on_a_server_s_store_writes_into_its_file_area(pg_url):
    """A sandboxed or remote windowed worker's row batch on a PostgreSQL store: into the function's file
    area on the server, where the coordinator lists and reads it."""
    from eventing.errors import ConfigError
    from eventing.storage.state import open_state
    from eventing.windows.runtime.paths import window_area

    service = DataService(pg_url)
    state = open_state(pg_url)
    try:
        service.call("put_file", "windows/fn/incoming/a.arrow", b"abc")
        area = window_area(state, "fn")
        assert area.list("incoming") == ["a.arrow"] and area.read("incoming/a.arrow") == b"abc"
        for outside in ("../outside", "buckets/x", "windows/fn"):
            with pytest.raises(ConfigError):
                service.call("put_file", outside, b"x")
    finally:
        state.close()
        service.close()


def test_the_service_answers_the_calls_of_its_tables_and_refuses_any_other_name(data_dir):
    """Calls are looked up in explicit tables (DataService.calls, BUCKET_CALLS, META_CALLS): no other name
    reaches a method, not the service's own (close), nor the store's beyond a worker's calls."""
    from eventing.control import lifecycle
    from eventing.core.definition import FunctionDefinition
    from eventing.errors import ConfigError

    load_source(data_dir, 10, 20, seed=1).close()
    lifecycle.save_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn", "source_bucket": "src"}), HANDLER
    )
    service = ServedData(data_dir)
    try:
        assert service.call("meta", "get_function", ("fn",), {}).name == "fn"
        assert (
            service.call("bucket", "src", "count", (), {})
            == service.call("bucket", "src", "scan", (), {}).__len__()
        )
        assert (
            service.call("collection_list", "src")
            == service.call("bucket", "src", "collection_list", (), {})
            == []
        )
        for method, args in [("close", ()), ("_bucket", ("src",)), ("state", ()), ("app_logs", ())]:
            with pytest.raises(ConfigError, match=rf"'{method}' is not a call the data service serves"):
                service.call(method, *args)
        for call in ("delete_function", "put_user", "transition", "close", "_tx", "window_states"):
            with pytest.raises(
                ConfigError, match=rf"metadata method '{call}' is not served to remote workers"
            ):
                service.call("meta", call, ("fn",), {})
        for call in ("stats", "copy_to", "load_rows", "close", "_reader", "file"):
            with pytest.raises(ConfigError, match=rf"bucket method '{call}' is not served to remote workers"):
                service.call("bucket", "src", call, (), {})
        assert service.state.metadata.get_function("fn").name == "fn"  # nothing was deleted or closed
    finally:
        service.close()


def test_a_remote_metadata_store_answers_the_worker_calls_and_has_no_others(data_dir):
    from eventing.control import lifecycle
    from eventing.core.definition import FunctionDefinition
    from eventing.storage.remote import META_CALLS, RemoteMetadataStore
    from metadata import MetadataStore, WorkerMetadata

    load_source(data_dir, 10, 20, seed=1).close()
    lifecycle.save_function(
        data_dir, FunctionDefinition.from_dict({"name": "fn", "source_bucket": "src"}), HANDLER
    )
    lifecycle.deploy(data_dir, "fn")
    line = PickledDataService(data_dir)
    store = RemoteMetadataStore(line)
    claimed = store.claim("fn", (vb for vb in (1, 2)), "w0")  # a generator travels as a list
    assert sorted(claimed) == [1, 2] and store.get_function("fn").name == "fn"
    assert store.commit("fn", {vb: cp.epoch for vb, cp in claimed.items()}, {1: 0}) == set()
    assert (
        store.deaths("fn") == {}
        and store.find_dlq_rows("fn") == []
        and store.get_timer("fn", "cb", "r") is None
    )
    worker_calls = {name for name in vars(WorkerMetadata) if not name.startswith("_")} - {"close"}
    assert set(META_CALLS) == worker_calls and not hasattr(store, "put_user") and not hasattr(store, "backup")
    assert worker_calls < {name for klass in MetadataStore.__mro__ for name in vars(klass)}
    line.service.close()


def _window_worker(data_dir: str, service: Any, handler: str) -> dict[str, Any]:
    from eventing.control import lifecycle
    from eventing.core.definition import FunctionDefinition
    from eventing.windows.batches import read_row_batch
    from eventing.windows.runtime.paths import WindowPaths
    from eventing.workers.worker import WorkerCore, WorkerSpec
    from metadata.factory import open_store
    from sharding import NUM_VBUCKETS

    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_w",
            "source_bucket": "src",
            "batch_size": 500,
            "checkpoint_interval": "1h",
            "window": {
                "kind": "tumbling",
                "size": "1m",
                "time_field": "ts",
                "group_by": ["country"],
                "aggregates": ["count", {"op": "sum", "field": "amount"}],
            },
        }
    )
    lifecycle.save_function(data_dir, defn, handler)
    lifecycle.deploy(data_dir, "fn_w")
    store = open_store(data_dir)
    spec = WorkerSpec(
        data_dir,
        "fn_w",
        store.get_function("fn_w").generation,
        "local/w0",
        tuple(range(NUM_VBUCKETS)),
        data_service=service,
    )
    core = WorkerCore(spec)
    assert core.data.local == (service is None)
    while not core.step().caught_up:
        pass
    core.stop()
    files = sorted(WindowPaths.of(data_dir, "fn_w").incoming.glob("*.arrow"))
    rows = sorted(r for p in files for r in map(lambda d: tuple(d.values()), read_row_batch(p).to_pylist()))
    counters = store.counters("fn_w")
    return {
        "rows": rows,
        "checkpoints": {vb: cp.seqno for vb, cp in store.checkpoints("fn_w").items()},
        "counters": {
            k: v for k, v in counters.items() if not k.startswith(("last_", "throughput", "latency_"))
        },
    }  # clock-dependent


@pytest.mark.parametrize("handler", ["", "def on_update(doc, meta):\n    pass\n"])
def test_window_rows_of_a_worker_without_the_files_equal_those_of_a_local_worker(
    tmp_path, monkeypatch, handler
):
    import shutil

    base = tmp_path / "base"
    load_source(str(base), 100, 3000, seed=9, span_ms=5 * 60_000)
    shutil.copytree(base, tmp_path / "remote")
    local = _window_worker(str(base), None, handler)
    monkeypatch.setenv(LOCALITY_ENV, "0")
    served = PickledDataService(str(tmp_path / "remote"))
    remote = _window_worker(str(tmp_path / "remote"), served, handler)
    assert served.calls["put_file"] >= 1
    assert len(local["rows"]) > 2000
    assert remote == local


LOG_HANDLER = """
from eventing.handler import log

def on_update(doc, meta):
    log("seen", meta.id)
"""


def test_log_lines_of_a_worker_without_the_files_reach_the_application_log_in_batches(tmp_path, monkeypatch):
    import shutil

    from eventing.core.definition import FunctionDefinition
    from eventing.execution.app_log import files_oldest_first, log_path

    base = tmp_path / "base"
    load_source(str(base), 100, 3000, seed=4)
    shutil.copytree(base, tmp_path / "remote")
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_log",
            "source_bucket": "src",
            "worker_count": 2,
            "app_log_max_size": 40_000,
            "app_log_max_files": 50,
        }
    )
    contents = {}
    for name in ("base", "remote"):
        data_dir = str(tmp_path / name)
        deploy_function(data_dir, defn, LOG_HANDLER)
        executor: Any = InProcessExecutor()
        if name == "remote":
            monkeypatch.setenv(LOCALITY_ENV, "0")
            executor = ServedExecutor(data_dir)
        EventingService(data_dir, executor, until_caught_up=True).run()
        files = files_oldest_first(log_path(data_dir, "fn_log"))
        assert len(files) > 2 and all(f.stat().st_size <= 40_000 for f in files)  # rotated as a local writer
        # <time> [INFO] fn_log <vb>:<seqno> <key> seen <key>; worker order differs, the lines must not
        contents[name] = sorted(line.split(" ", 2)[2] for f in files for line in f.read_text().splitlines())
    assert len(contents["remote"]) > 2500  # every update (the load has deletes too)
    assert contents["remote"] == contents["base"]
    assert executor.data_service.calls["app_log"] < 3000 / 100  # batched, not a call per line


def test_a_bucket_in_partitions_tells_remote_workers_each_partitions_effect_marks(data_dir):
    from eventing.storage.partitions import PartitionedBucket
    from eventing.storage.values import EffectGroup

    ledger = create_bucket(data_dir, "ledger", partitions=4)
    assert isinstance(ledger, PartitionedBucket)
    ledger.fence("fn", {7: 1})
    ledger.apply_effects(
        "fn", [EffectGroup(7, 1, [(3, Write("a", OP_UPDATE, b"\x80")), (5, Write("zz", OP_UPDATE, b"\x80"))])]
    )
    service = PickledDataService(data_dir)
    remote = RemoteBucket(service.client("w"), "ledger")
    assert remote.partition_marks("fn") == ledger.partition_marks("fn")
    assert any(marks.get(7) == 5 for marks in ledger.partition_marks("fn")[1])
    load_source(data_dir, 5, 10, seed=1)  # a bucket in one piece has none
    assert RemoteBucket(service.client("w"), "src").partition_marks("fn") is None


def _remote_worker(data_dir: str, definition: dict, handler: str, per_key: int, vbuckets: int, doc: bytes):
    """A WorkerCore reading through the data service (pickled both ways) over `per_key` updates of one key
    in each of `vbuckets` vBuckets; returns it and the keys by vBucket."""
    from eventing.core.definition import FunctionDefinition
    from eventing.workers.worker import WorkerCore, WorkerSpec
    from metadata.factory import open_store

    keys: dict[int, str] = {}
    i = 0
    while len(keys) < vbuckets:
        keys.setdefault(vbucket_of(f"k{i}"), f"k{i}")
        i += 1
    source = create_bucket(data_dir, "src")
    source.write([Write(key, OP_UPDATE, doc) for _ in range(per_key) for key in keys.values()])
    name = definition["name"]
    deploy_function(data_dir, FunctionDefinition.from_dict({"source_bucket": "src", **definition}), handler)
    generation = open_store(data_dir).get_function(name).generation
    served = PickledDataService(data_dir)
    spec = WorkerSpec(data_dir, name, generation, "n1/w0", tuple(range(1024)), data_service=served)
    return WorkerCore(spec), keys


def test_a_remote_worker_far_behind_holds_a_bounded_read_ahead_and_takes_up_a_vbucket_left_halfway(
    data_dir, monkeypatch
):
    """A batch that ends halfway through a vBucket whose rows are read ahead resumes there: rotating on
    left the rest in memory for a lap of the rotation, and the reads kept coming (a worker of a sandbox or
    a node without the data directory held a whole backlog: 360 MB for 800,000 mutations)."""
    from eventing.workers import source_reads

    monkeypatch.setenv(LOCALITY_ENV, "0")
    monkeypatch.setattr(source_reads, "REMOTE_READ_AHEAD", 2_000)
    core, _keys = _remote_worker(
        data_dir, {"name": "fn_behind", "batch_size": 300}, HANDLER, 400, 40, b"\x81\xa1n\x01"
    )
    held, handled = [], 0
    try:
        while True:
            report = core.step(300)
            handled += report.handled
            held.append(core.source.ahead()[0])
            if report.caught_up:
                break
    finally:
        core.stop()
        core.close()
    assert handled == 40 * 400
    # At most about two reads ahead (one being taken, the next asked for, each up to a vBucket past its
    # limit), not a lap's rows (13,600 here before).
    assert max(held) <= 3 * 2_000, held


def test_a_remote_window_only_worker_behind_rotates_over_its_vbuckets(data_dir, monkeypatch):
    """A window-only worker reads packed runs, never the rows a look read ahead: a batch that ends halfway
    through a vBucket moves on to the next (taking the vBucket up again would drain one vBucket at a time
    and hold every other vBucket's watermark back)."""
    from eventing.workers import worker as worker_module

    monkeypatch.setenv(LOCALITY_ENV, "0")
    monkeypatch.setattr(worker_module, "WINDOW_ONLY_BATCH", 100)
    doc = msgpack.packb({"ts": 1_767_225_600_000, "country": "KR", "amount": 1}, use_bin_type=True)
    window = {"kind": "tumbling", "size": "1m", "time_field": "ts", "aggregates": ["count"]}
    core, keys = _remote_worker(
        data_dir,
        {"name": "fn_rows", "batch_size": 100, "window": window},
        '"""Window-only."""\n',
        300,
        4,
        doc,
    )
    try:
        for _ in range(4):
            core.step(100)
        moved = {vb: core.progress.positions[vb] for vb in keys}
    finally:
        core.stop()
        core.close()
    assert all(position > 0 for position in moved.values()), moved  # every vBucket moved, none drained
