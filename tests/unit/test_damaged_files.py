"""Damaged files: a bucket file cut short or overwritten in the middle, a window row file that no longer
reads or no longer matches its checksum, and a window file that meets a full disk. Each gets one line
naming the file and the way out, never a traceback, a wrong answer or a silent skip."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyarrow as pa
import pytest

from eventing.cli.app import main
from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, Mutation
from eventing.errors import StoreCorruptError, StoreError
from eventing.storage.factory import create_bucket, open_bucket
from eventing.storage.file_health import header_problem
from eventing.storage.files import bucket_path
from eventing.testing import load_source
from eventing.testing.windows import python_aggregator
from eventing.windows import batches
from eventing.windows.runtime import host
from eventing.windows.runtime.paths import WindowPaths
from eventing.windows.runtime.row_writer import RowLayout, WindowRowWriter
from eventing.workers.executor import InProcessExecutor

FN = "fn_w"
WINDOW = {
    "kind": "tumbling",
    "size": "1m",
    "time_field": "ts",
    "group_by": ["country"],
    "aggregates": ["count", {"op": "sum", "field": "amount"}],
}
T0 = 1_767_225_600_000


def cli(capsys, data_dir: str, *argv: str) -> tuple[int, str]:
    status = main(["--data-dir", data_dir, *argv])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error: ")]


def overwrite_middle(path: Path, size: int = 16_384) -> None:
    """Random bytes over the middle of a file, as a bad sector or a stray write leaves it."""
    length = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(length // 2 - size // 2)
        f.write(os.urandom(size))


@pytest.fixture
def deployed(data_dir: str) -> Path:
    """Bucket src (1,000 mutations) and ledger, a ledger function deployed on them; the source's path."""
    load_source(data_dir, 100, 1000, seed=3).close()  # closed: this process then holds no connection to it
    create_bucket(data_dir, "ledger").close()
    defn = FunctionDefinition.from_dict(
        {
            "name": "fn_l",
            "source_bucket": "src",
            "bindings": [{"alias": "dst", "bucket": "ledger", "access": "rw"}],
        }
    )
    lifecycle.save_function(data_dir, defn, "def on_update(doc, meta):\n    dst[meta.id] = doc\n")
    lifecycle.deploy(data_dir, "fn_l")
    return bucket_path(data_dir, "src")


@pytest.mark.parametrize("damage", ["overwritten in the middle", "truncated", "emptied"])
def test_a_damaged_bucket_file_gets_one_line_from_get_load_and_run(capsys, data_dir, deployed, damage):
    with open_bucket(data_dir, "src") as source:
        some_key = source.keys(limit=1)[0]
    if damage == "overwritten in the middle":
        overwrite_middle(deployed)
    elif damage == "truncated":
        os.truncate(deployed, deployed.stat().st_size // 3)
    else:
        os.truncate(deployed, 0)
    for argv in (
        ["bucket", "get", "src", some_key],
        ["bucket", "load", "src", "--documents", "5", "--mutations", "5"],
        ["run", "--until-caught-up", "--executor", "in-process", "--quiet"],
    ):
        status, output = cli(capsys, data_dir, *argv)
        assert status != 0, (argv, output)
        assert "Traceback" not in output
        lines = error_lines(output)
        assert len(lines) == 1, (argv, output)
        assert f"bucket file {deployed} is damaged" in lines[0], (argv, output)
        assert "`eventing bucket drop src`" in lines[0] and "backup" in lines[0]
    # Nothing ran past the damage: no checkpoint moved, no effect was written.
    assert open_bucket(data_dir, "ledger").count() == 0


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_damaged_bucket_is_dropped_as_it_is_and_can_be_created_again(capsys, data_dir, partitions):
    create_bucket(data_dir, "src", partitions=partitions).close()
    load_source(data_dir, 50, 200, seed=1).close()
    path = bucket_path(data_dir, "src")
    overwrite_middle(path, 4096)
    os.truncate(path, path.stat().st_size - 4096 * 3)
    status, output = cli(capsys, data_dir, "bucket", "drop", "src")
    assert status == 0, output
    assert not path.exists() and not Path(f"{path}-wal").exists()
    assert not (path.parent / "src.partitions").exists()
    assert cli(capsys, data_dir, "bucket", "create", "src")[0] == 0
    assert open_bucket(data_dir, "src").count() == 0


def test_a_damaged_partition_names_its_own_file(capsys, data_dir):
    create_bucket(data_dir, "parts", partitions=2).close()
    part = bucket_path(data_dir, "parts").parent / "parts.partitions" / "1.sqlite3"
    os.truncate(part, 1000)
    status, output = cli(capsys, data_dir, "bucket", "get", "parts", "k1")
    assert (
        status != 0
        and f"bucket file {part} is damaged" in output
        and "`eventing bucket drop parts`" in output
    )


def test_a_healthy_file_with_a_wal_to_checkpoint_is_not_called_truncated(data_dir):
    """A checkpoint in another process writes the first page (the grown page count) before the pages that
    grow the file: while a WAL is there, the header's count is not held against the file's size."""
    source = load_source(data_dir, 100, 1000, seed=2)
    path = source.path
    source.close()
    assert header_problem(path) is None
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(28)
        f.write(((size // 4096) + 10).to_bytes(4, "big"))  # the header now claims ten pages more
    assert header_problem(path) is not None and "truncated" in header_problem(path)
    Path(f"{path}-wal").write_bytes(b"\0" * 32)  # a WAL still to be checkpointed
    assert header_problem(path) is None


# -- window row files ---------------------------------------------------------------------------------


def row_table(n: int = 200) -> pa.Table:
    schema = batches.row_schema(["country"], ["amount"])
    return batches.build_row_batch(
        schema,
        vb=[i % 4 for i in range(n)],
        seqno=list(range(1, n + 1)),
        key=[f"k{i}" for i in range(n)],
        event_time_ms=[T0 + i for i in range(n)],
        columns={
            "country": ["KR" if i % 2 else "US" for i in range(n)],
            "amount": [float(i) for i in range(n)],
        },
    )


def test_a_row_file_round_trips_and_a_file_without_a_checksum_still_reads(tmp_path):
    table = row_table()
    path = batches.write_row_spool(tmp_path, "g1-w-1-000000000", table)
    assert batches.read_row_batch(path).equals(table)
    legacy = tmp_path / "legacy.arrow"  # written before the checksum trailer existed
    with pa.OSFile(str(legacy), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert batches.read_row_batch(legacy).equals(table)
    assert Path(path).read_bytes()[:-12] == legacy.read_bytes()


@pytest.mark.parametrize("damage", ["a value overwritten", "the middle overwritten", "truncated", "emptied"])
def test_a_damaged_row_file_is_refused_with_its_name_and_the_way_out(tmp_path, damage):
    folder = tmp_path / "windows" / FN / "incoming"
    path = batches.write_row_spool(folder, "g1-w-1-000000000", row_table(2000))
    data = bytearray(path.read_bytes())
    if damage == "a value overwritten":  # one amount in the data: Arrow's structure is intact
        at = bytes(data).find(pa.array([1234.0]).buffers()[1].to_pybytes())
        assert at > 0
        data[at : at + 8] = pa.array([4321.0]).buffers()[1].to_pybytes()
    elif damage == "the middle overwritten":
        data[len(data) // 2 : len(data) // 2 + 512] = os.urandom(512)
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptError) as caught:
        batches.read_row_batch(path)
    message = str(caught.value)
    assert f"window row file {path} is damaged" in message and "\n" not in message
    assert f"`eventing undeploy {FN}`" in message and "delete it" in message


def test_a_row_file_that_meets_a_full_disk_says_so_and_leaves_no_temporary_file(tmp_path):
    def no_space(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    target = tmp_path / "windows" / FN / "incoming" / "g1-w-1-000000000.arrow"
    target.parent.mkdir(parents=True)
    with pytest.raises(StoreError) as caught:
        batches.atomic_write(target, no_space, overwrite=True)
    message = str(caught.value)
    assert f"cannot write {target}: the disk is full" in message
    assert (
        f"free space on the file system of {target.parent}" in message and "run the command again" in message
    )
    assert list(target.parent.iterdir()) == []


def test_a_windowed_run_stops_on_a_damaged_row_file_naming_it(data_dir, monkeypatch):
    monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)
    load_source(data_dir, 50, 300, seed=4, span_ms=5 * 60_000)
    defn = FunctionDefinition.from_dict({"name": FN, "source_bucket": "src", "window": WINDOW})
    lifecycle.save_function(data_dir, defn, "def on_delete(meta, options):\n    pass\n")
    generation = lifecycle.deploy(data_dir, FN).generation
    # A batch handed over by a worker of this deployment, damaged on disk before the coordinator reads it.
    writer = WindowRowWriter(data_dir, FN, generation, "local/w9", RowLayout.for_definition(FN, WINDOW))
    for seqno in range(1, 400):
        writer.add(
            Mutation(0, seqno, f"x{seqno}", OP_UPDATE, 0, b"", None, 0, 0),
            {"ts": T0 + seqno, "country": "KR", "amount": 1.0},
        )
    damaged = writer.flush()
    assert damaged is not None
    overwrite_middle(damaged, 256)
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert len(summary.errors) == 1, summary.errors
    assert f"window row file {damaged} is damaged" in summary.errors[0]
    assert summary.functions[FN].state == "failed"
    assert WindowPaths.of(data_dir, FN).incoming.exists()


def test_opening_a_bucket_on_a_full_disk_waits_for_space_then_says_how_long_it_stayed_full(
    data_dir, monkeypatch
):
    # SQLite says "disk I/O error", not "disk is full", when it cannot create a bucket's shared-memory file.
    from eventing.storage import bucket as bucket_module
    from metadata import sqlite_io

    create_bucket(data_dir, "src")
    path = bucket_path(data_dir, "src")
    tries = []

    def full_disk_connect(at):
        tries.append(at)
        raise bucket_module.sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(bucket_module, "_connect", full_disk_connect)
    monkeypatch.setattr(sqlite_io, "no_space_left", lambda folder: True)
    monkeypatch.setenv(sqlite_io.STORE_WAIT_ENV, "0.3")
    with pytest.raises(StoreError) as caught:
        open_bucket(data_dir, "src")
    assert str(caught.value).startswith(
        f"cannot write {path}: the disk is full (disk I/O error) and stayed full"
    )
    assert len(tries) > 1  # it waited, trying again, before it gave up
