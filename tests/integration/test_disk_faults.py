"""A real full disk under the `eventing` commands: the data directory on a size-limited tmpfs, filled up
by a filler file so that a load and a run meet ENOSPC mid-work. Each stops with one line naming the file
system and the fix, exits non-zero, keeps what it committed and damages no file; once the filler is
deleted the same command completes, and `eventing verify` finds every mutation handled exactly once.
The same for a window sink on a full disk (its windows equal the plain computation once space is freed),
for the metadata store alone on a full disk, and for a run on Ray workers.
Then damaged files through the same commands: a bucket file overwritten in the middle or cut short."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from eventing.control import lifecycle
from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.core.mutation import OP_UPDATE, decode_document
from eventing.ops.windows import window_status
from eventing.testing import load_source
from eventing.testing.windows import assert_same_results, python_aggregator, reference_results
from eventing.windows.runtime import host
from eventing.windows.runtime.host import WindowOptions
from eventing.windows.semantics import WindowSpec
from eventing.windows.spark.sink import ParquetWindowSink, SqliteWindowSink
from eventing.workers.executor import InProcessExecutor
from metadata.factory import open_store

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FS_MB = 64


@contextmanager
def small_filesystem(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` at path, unmounted on the way out; skipped where mounting is not allowed."""
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited tmpfs needs root (and mount)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_leaving(fs: Path, room_bytes: int) -> Path:
    """A filler file that leaves about ``room_bytes`` free on the file system of ``fs``."""
    stats = os.statvfs(fs)
    free = stats.f_bavail * stats.f_frsize
    filler = fs / "filler"
    size = max(0, free - room_bytes)
    subprocess.run(["fallocate", "-l", str(size), str(filler)], check=True)
    return filler


def eventing(data_dir: str, *argv: str, wait_s: str = "1") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eventing", "--data-dir", data_dir, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={
            **os.environ,
            "EVENTING_STORE_WAIT_S": wait_s,
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
        },
    )


def set_up_ledger(data_dir: str, *, documents: int = 0, mutations: int = 0) -> None:
    """Buckets `customers` and `ledger` (customers loaded when `mutations`), and fn_ledger deployed, through
    the CLI as a user would."""
    steps = [["bucket", "create", "customers"], ["bucket", "create", "ledger"]]
    if mutations:
        steps.append(
            [
                "bucket",
                "load",
                "customers",
                "--documents",
                str(documents),
                "--mutations",
                str(mutations),
                "--seed",
                "1",
            ]
        )
    steps.append(["deploy", str(ROOT / "functions" / "fn_ledger.json")])
    for argv in steps:
        assert eventing(data_dir, *argv).returncode == 0


def one_error_line(done: subprocess.CompletedProcess) -> str:
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output
    return errors[0]


def assert_every_file_intact(data_dir: str) -> None:
    files = [Path(data_dir) / "metadata.sqlite3", *sorted((Path(data_dir) / "buckets").glob("*.sqlite3"))]
    for file in files:
        db = sqlite3.connect(file)
        try:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", file
        finally:
            db.close()


def logged_mutations(data_dir: str, bucket: str) -> int:
    db = sqlite3.connect(Path(data_dir) / "buckets" / f"{bucket}.sqlite3")
    try:
        return db.execute("SELECT COUNT(*) FROM log").fetchone()[0]
    finally:
        db.close()


def test_a_load_and_a_run_on_a_full_disk_stop_with_one_line_and_complete_once_space_is_freed(tmp_path):
    with small_filesystem(tmp_path / "small", FS_MB) as fs:
        data_dir = str(fs / "data")
        set_up_ledger(data_dir)

        # A load of ~5 MB with 1 MB free: its first batches commit, then the disk is full.
        load = ["bucket", "load", "customers", "--documents", "1000", "--mutations", "20000", "--seed", "1"]
        filler = fill_leaving(fs, 1 << 20)
        line = one_error_line(eventing(data_dir, *load))
        assert (
            "the disk is full" in line and f"free space on the file system of {data_dir}/buckets" in line
        ), line
        assert "run the command again" in line
        committed = int(
            re.search(r"([\d,]+) mutations of this load were committed", line)[1].replace(",", "")
        )
        assert committed < 20_000
        assert logged_mutations(data_dir, "customers") == committed  # kept whole: nothing more, nothing less
        filler.unlink()
        assert_every_file_intact(data_dir)
        done = eventing(data_dir, *load)
        assert done.returncode == 0, done.stderr
        owed = committed + 20_000
        assert logged_mutations(data_dir, "customers") == owed

        # A run with 2 MB free: the ledger's effects and the checkpoints meet the full disk mid-run.
        filler = fill_leaving(fs, 2 << 20)
        run = ["run", "--until-caught-up", "--executor", "in-process", "--quiet"]
        line = one_error_line(eventing(data_dir, *run))
        assert (
            "the disk is full" in line and "free space on the file system of" in line and data_dir in line
        ), line
        assert "run the command again" in line
        # Even a read needs room (SQLite's shared-memory index): verify says the disk is full, too.
        assert "the disk is full" in one_error_line(
            eventing(data_dir, "verify", "fn_ledger", "--ledger", "ledger")
        )
        filler.unlink()
        assert_every_file_intact(data_dir)
        partial = eventing(data_dir, "verify", "fn_ledger", "--ledger", "ledger")
        assert partial.returncode == 0, partial.stdout + partial.stderr  # what it checkpointed is all there
        assert f"({owed} of {owed})" not in partial.stdout, partial.stdout  # and it stopped mid-run
        done = eventing(data_dir, *run)
        assert done.returncode == 0, done.stdout + done.stderr
        verified = eventing(data_dir, "verify", "fn_ledger", "--ledger", "ledger")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert f"ALL MUTATIONS ACCOUNTED FOR ({owed} of {owed})" in verified.stdout, verified.stdout
        assert_every_file_intact(data_dir)


MIN = 60_000


def integrity_ok(path: Path) -> None:
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", path
    finally:
        db.close()


@pytest.mark.parametrize("kind", ["parquet", "sqlite"])
def test_a_window_sink_on_a_full_disk_stops_the_run_with_one_line_and_writes_every_window_once_space_is_freed(
    tmp_path, monkeypatch, kind
):
    """The data directory has room; the sink's folder (or file) is on a full file system. The run stops with
    the one line every full disk gives, no window is recorded as emitted that the sink does not hold, and
    the next run writes exactly the windows of the plain computation."""
    monkeypatch.setattr(host, "make_aggregator", lambda master=None: python_aggregator)  # no Spark here
    monkeypatch.setenv("EVENTING_STORE_WAIT_S", "1")
    data_dir = str(tmp_path / "data")
    source = load_source(data_dir, 200, 3000, seed=5, span_ms=30 * MIN)
    with small_filesystem(tmp_path / "small", 8) as fs:
        location = fs / ("results.sqlite3" if kind == "sqlite" else "results")
        window = {
            "kind": "tumbling",
            "size": "1m",
            "time_field": "ts",
            "group_by": ["country"],
            "aggregates": ["count", {"op": "sum", "field": "amount"}],
            "sink": {"kind": kind, "path": str(location)},
        }
        defn = FunctionDefinition.from_dict(
            {
                "name": "fn_w",
                "source_bucket": "src",
                "worker_count": 2,
                "checkpoint_interval": "100ms",
                "batch_size": 500,
                "window": window,
            }
        )
        lifecycle.save_function(data_dir, defn, "")
        lifecycle.deploy(data_dir, "fn_w")

        def run() -> list[str]:
            service = EventingService(
                data_dir, InProcessExecutor(), until_caught_up=True, windows=WindowOptions(close_windows=True)
            )
            return service.run().errors

        def sink() -> ParquetWindowSink | SqliteWindowSink:
            return SqliteWindowSink(location) if kind == "sqlite" else ParquetWindowSink(location)

        filler = fill_leaving(fs, 8192)
        errors = run()
        assert len(errors) == 1, errors
        line = errors[0]
        assert line.startswith("fn_w: cannot write ") and "\n" not in line, line
        assert "the disk is full" in line and f"free space on the file system of {location.parent}" in line, (
            line
        )
        assert "run the command again" in line and "Error:" not in line, line
        filler.unlink()
        # Nothing was recorded as emitted that the sink does not hold, and no file is damaged.
        status = window_status(data_dir, "fn_w")
        assert status["windows_emitted"] == len(sink().written_windows("fn_w")) == 0, status
        for path in [Path(data_dir) / "metadata.sqlite3", Path(data_dir) / "buckets" / "src.sqlite3"]:
            integrity_ok(path)
        if kind == "sqlite" and location.exists():
            integrity_ok(location)

        assert run() == []
        with open_store(data_dir) as store:
            late = {(r.vb, r.seqno) for r in store.dlq_rows("fn_w")}
        docs = [
            (m.vb, m.seqno, decode_document(m.doc))
            for batch in source.scan_log()
            for m in batch
            if m.op == OP_UPDATE
        ]
        windows = sorted(
            {
                (t - t % MIN, t - t % MIN + MIN)
                for vb, seqno, doc in docs
                if (vb, seqno) not in late
                for t in [doc["ts"]]
            }
        )
        assert sorted(sink().written_windows("fn_w")) == windows
        assert_same_results(
            sink().read("fn_w"), reference_results(docs, WindowSpec.from_dict(window), windows, exclude=late)
        )
        status = window_status(data_dir, "fn_w")
        assert status["windows_emitted"] == len(windows) and status["closed_not_emitted"] == 0, status
        if kind == "sqlite":
            integrity_ok(location)


def test_the_metadata_store_on_a_full_disk_stops_a_run_with_one_line_while_the_buckets_have_room(tmp_path):
    """The data directory on a full file system, its buckets/ folder on another one with room: only the
    metadata store's writes (checkpoints, counters, heartbeats) meet the full disk."""
    roomy = tmp_path / "buckets"
    roomy.mkdir()
    with small_filesystem(tmp_path / "small", 16) as fs:
        data_dir = str(fs / "data")
        Path(data_dir).mkdir()
        (Path(data_dir) / "buckets").symlink_to(roomy)
        set_up_ledger(data_dir, documents=1_000, mutations=20_000)

        filler = fill_leaving(fs, 64 << 10)
        run = ["run", "--until-caught-up", "--executor", "in-process", "--quiet"]
        line = one_error_line(eventing(data_dir, *run))
        assert f"cannot write {data_dir}/metadata.sqlite3: the disk is full" in line, line
        assert f"free space on the file system of {data_dir}" in line and "run the command again" in line, (
            line
        )
        filler.unlink()
        assert_every_file_intact(data_dir)
        done = eventing(data_dir, *run)
        assert done.returncode == 0, done.stdout + done.stderr
        verified = eventing(data_dir, "verify", "fn_ledger", "--ledger", "ledger")
        assert "ALL MUTATIONS ACCOUNTED FOR (20000 of 20000)" in verified.stdout, (
            verified.stdout + verified.stderr
        )
        assert_every_file_intact(data_dir)


def test_a_run_on_ray_workers_on_a_full_disk_stops_with_one_line_and_completes_once_space_is_freed(tmp_path):
    with small_filesystem(tmp_path / "small", FS_MB) as fs:
        data_dir = str(fs / "data")
        set_up_ledger(data_dir, documents=1_000, mutations=20_000)

        filler = fill_leaving(fs, 2 << 20)
        run = ["run", "--until-caught-up", "--executor", "ray", "--quiet"]
        line = one_error_line(eventing(data_dir, *run))
        assert (
            "the disk is full" in line and "free space on the file system of" in line and data_dir in line
        ), line
        assert "run the command again" in line
        filler.unlink()
        assert_every_file_intact(data_dir)
        done = eventing(data_dir, *run)
        assert done.returncode == 0, done.stdout + done.stderr
        verified = eventing(data_dir, "verify", "fn_ledger", "--ledger", "ledger")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "ALL MUTATIONS ACCOUNTED FOR (20000 of 20000)" in verified.stdout, verified.stdout
        assert_every_file_intact(data_dir)


def overwrite_middle(path: Path, size: int = 16_384) -> None:
    length = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(length // 2 - size // 2)
        f.write(os.urandom(size))


@pytest.mark.parametrize("damage", ["overwritten in the middle", "truncated"])
def test_a_damaged_bucket_file_stops_get_load_and_run_with_one_line(tmp_path, damage):
    data_dir = str(tmp_path / "data")
    set_up_ledger(data_dir, documents=500, mutations=5_000)
    path = Path(data_dir) / "buckets" / "customers.sqlite3"
    if damage == "truncated":
        os.truncate(path, path.stat().st_size // 2)
    else:
        overwrite_middle(path)
    for argv in (
        ["bucket", "get", "customers", "customer::1"],
        ["bucket", "load", "customers", "--file", str(ROOT / "examples" / "changes.jsonl")],
        ["run", "--until-caught-up", "--executor", "in-process"],
    ):
        line = one_error_line(eventing(data_dir, *argv))
        assert f"bucket file {path} is damaged" in line, (argv, line)
        assert "`eventing bucket drop customers`" in line and "backup" in line
    # Nothing ran past the damage: no effect was written and no checkpoint moved.
    assert logged_mutations(data_dir, "ledger") == 0
    db = sqlite3.connect(Path(data_dir) / "metadata.sqlite3")
    try:
        assert db.execute("SELECT COALESCE(MAX(seqno), 0) FROM checkpoints").fetchone()[0] == 0
    finally:
        db.close()
