"""Fault injection on the real runtime, each scenario closed by the ledger check (`eventing verify`):
a locked metadata store, a damaged metadata store, a full disk, a 10x burst, replayed and duplicated
deliveries, and one document mutated a thousand times.

Every scenario records its figures (mutations produced and handled, duplicate handler calls, recovery
time) as JSON under $EVENTING_FAULT_FIGURES (default: <tmp>/eventing-fault-figures) and prints them
(`pytest -s`); scripts/fault_report.py runs this file and tabulates them. Long variants are marked `soak`
and run by scripts/soak.sh.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from eventing.control.service import EventingService
from eventing.core.definition import FunctionDefinition
from eventing.ops.verify import effect_key, history_key, verify_function
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket
from eventing.storage.writes import chunked
from eventing.testing import (
    call_log_figures,
    deploy_function,
    ledger_definition,
    load_source,
    read_call_log,
    wait_for,
)
from eventing.workers import worker as worker_module
from eventing.workers.executor import InProcessExecutor
from metadata import sqlite_io
from metadata.factory import SQLITE_FILE, open_store
from sharding import NUM_VBUCKETS

pytestmark = pytest.mark.integration

FIGURES_DIR = Path(
    os.environ.get("EVENTING_FAULT_FIGURES") or Path(tempfile.gettempdir()) / "eventing-fault-figures"
)
ROOT = Path(__file__).resolve().parents[2]

# Holds the write lock of a SQLite file, as any other process could: prints "locked", sleeps, lets go.
LOCK_HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


# -- harness ------------------------------------------------------------------------------------------


def load(
    data_dir: str, documents: int, mutations: int, *, seed: int = 7, prefix: str = "customer"
) -> LocalBucket:
    return load_source(data_dir, documents, mutations, seed=seed, prefix=prefix)


def deploy(data_dir: str, defn: FunctionDefinition) -> None:
    deploy_function(data_dir, defn)


class Checkpoints:
    """Reads checkpoints through its own read-only connection: it works while another process holds
    the write lock or the disk is full, and it notes any checkpoint it ever sees move backwards."""

    def __init__(self, data_dir: str, function: str):
        path = Path(data_dir) / SQLITE_FILE
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10, check_same_thread=False)
        self.function = function
        self.seen: dict[int, int] = {}
        self.backwards: list[tuple[int, int, int]] = []

    def read(self) -> dict[int, int]:
        rows = self.db.execute(
            "SELECT vb, seqno FROM checkpoints WHERE function=?", (self.function,)
        ).fetchall()
        current = dict(rows)
        for vb, seqno in current.items():
            if seqno < self.seen.get(vb, 0):
                self.backwards.append((vb, self.seen[vb], seqno))
            self.seen[vb] = seqno
        return current

    def total(self) -> int:
        return sum(self.read().values())

    def lag(self, source: LocalBucket) -> int:
        current = self.read()
        highs = source.high_seqnos()
        return sum(highs[vb] - current.get(vb, 0) for vb in range(NUM_VBUCKETS))

    def close(self) -> None:
        self.db.close()


class RunningService:
    """An EventingService in a background thread, as `eventing run` would be, stopped on exit."""

    def __init__(self, data_dir: str, executor, **kwargs):
        self.service = EventingService(data_dir, executor, **kwargs)
        self.summary = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.summary = self.service.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def __enter__(self) -> RunningService:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.service.stop()
        self.thread.join(timeout=120)


def run_until_caught_up(data_dir: str, executor) -> None:
    summary = EventingService(data_dir, executor, until_caught_up=True).run()
    assert not summary.errors, summary.errors


def assert_verified(data_dir: str, function: str, *, owed: int | None = None):
    report = verify_function(data_dir, function)
    assert report.ok, report.summary()
    assert report.past_checkpoint == 0, report.summary()
    if owed is not None:
        assert report.source_mutations == owed, report.summary()
    return report


def checkpoint_wal(path: Path) -> None:
    """Fold the WAL into the database file and empty it."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()


def vm_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@pytest.fixture
def figures(request):
    """record(scenario, **numbers): print the figures and keep them as JSON for scripts/fault_report.py."""

    def record(scenario: str, **values) -> None:
        data = {"scenario": scenario, "test": request.node.name, **values}
        print(f"\n[fault figures] {json.dumps(data)}")
        FIGURES_DIR.mkdir(parents=True, exist_ok=True)
        (FIGURES_DIR / f"{request.node.name}.json").write_text(json.dumps(data, indent=2))

    return record


# -- 5: the metadata store locked by another process ------------------------------------------------


def lock_metadata(data_dir: str, seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(Path(data_dir) / SQLITE_FILE), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_a_locked_metadata_store_pauses_processing_which_resumes_with_nothing_skipped(
    data_dir, tmp_path, ray_executor, caplog, figures
):
    caplog.set_level(logging.WARNING, logger="eventing.metadata")
    source = load(data_dir, 300, 6000)
    calls = tmp_path / "calls.log"
    deploy(
        data_dir,
        ledger_definition(
            "fn_lock", "src", "ledger", workers=2, call_log=str(calls), sleep_ms=1, batch_size=100
        ),
    )
    cps = Checkpoints(data_dir, "fn_lock")
    lock_s = 4.0
    with RunningService(data_dir, ray_executor) as running:
        wait_for(lambda: cps.total() > 1000, "processing is under way")
        holder = lock_metadata(data_dir, lock_s)
        locked_at = time.monotonic()
        at_lock = cps.total()
        # No checkpoint can move while another process holds the lock: looked at until just before the
        # holder lets go (its process lives on a moment after its ROLLBACK, more so on a busy machine).
        while time.monotonic() < locked_at + lock_s - 0.5:
            assert cps.total() == at_lock
            time.sleep(0.1)
        stalled = time.monotonic() - locked_at
        holder.wait(30)
        released = time.monotonic()
        wait_for(lambda: cps.total() > at_lock, "checkpoints move again after the lock is released")
        recovered = time.monotonic()
        recovery_s = recovered - released
        wait_for(lambda: cps.lag(source) == 0, "fn_lock catches up")
        catch_up_s = time.monotonic() - recovered
    assert running.error is None and not running.summary.errors
    assert any("is locked by another process; waiting" in r.getMessage() for r in caplog.records)
    assert 1000 < at_lock < 6000 and stalled >= lock_s - 1
    assert cps.backwards == []
    report = assert_verified(data_dir, "fn_lock", owed=6000)
    calls_seen = call_log_figures(calls)
    figures(
        "5 metadata store locked",
        mutations=6000,
        handled=report.handled,
        lock_s=lock_s,
        checkpoint_at_lock=at_lock,
        handler_calls=calls_seen.calls,
        duplicate_handler_calls=calls_seen.duplicate_calls,
        recovery_s=round(recovery_s, 2),
        catch_up_after_release_s=round(recovery_s + catch_up_s, 2),
    )


# -- 6: the metadata store truncated or corrupted ----------------------------------------------------


def _truncate_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _truncate_header(path: Path) -> None:
    os.truncate(path, 100)


def _garbage_at(fraction: float) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with open(path, "r+b") as f:
            f.seek(int(path.stat().st_size * fraction) // 4096 * 4096)
            f.write(bytes(range(256)) * 16)

    return damage


DAMAGE = {
    "truncated to half": _truncate_half,
    "truncated inside the header": _truncate_header,
    "a page overwritten mid-file": _garbage_at(0.5),
    "the header overwritten": _garbage_at(0.0),
}


def backup_metadata(data_dir: str, to: Path) -> None:
    """A consistent copy of a live SQLite file (the documented backup: the sqlite3 backup API)."""
    src = sqlite3.connect(Path(data_dir) / SQLITE_FILE)
    dst = sqlite3.connect(to)
    src.backup(dst)
    dst.close()
    src.close()


def restore_metadata(data_dir: str, backup: Path) -> None:
    meta = Path(data_dir) / SQLITE_FILE
    for suffix in ("", "-wal", "-shm"):
        Path(f"{meta}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(backup, meta)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_metadata_store_fails_closed_and_a_restored_backup_loses_nothing(
    data_dir, tmp_path, ray_session, damage, figures
):
    load(data_dir, 200, 2000)
    calls = tmp_path / "calls.log"
    deploy(data_dir, ledger_definition("fn_meta", "src", "ledger", call_log=str(calls), batch_size=200))
    run_until_caught_up(data_dir, InProcessExecutor())
    backup = tmp_path / "metadata.backup.sqlite3"
    backup_metadata(data_dir, backup)
    load(data_dir, 100, 1000, seed=8, prefix="later")
    run_until_caught_up(data_dir, InProcessExecutor())
    run_until_caught_up(
        data_dir, InProcessExecutor()
    )  # a later claim: the backup's epochs fall behind the marks
    load(data_dir, 100, 1000, seed=9, prefix="pending")  # work an unsafe start could skip over
    meta = Path(data_dir) / SQLITE_FILE
    checkpoint_wal(meta)
    ledger = LocalBucket.open(data_dir, "ledger")
    ledger_rows = ledger.stats()["mutations"]
    DAMAGE[damage](meta)

    address = ray_session.get_runtime_context().gcs_address
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventing",
            "--data-dir",
            data_dir,
            "run",
            "--until-caught-up",
            "--quiet",
            "--ray-address",
            address,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    failed_in_s = time.monotonic() - started
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    assert f"metadata store {meta}" in errors[0]
    assert "restore it from a backup" in errors[0] and "Damaged metadata store" in errors[0]
    assert ledger.stats()["mutations"] == ledger_rows  # nothing ran, nothing skipped ahead

    restore_metadata(data_dir, backup)  # the documented recovery: restore the last backup, run again
    started = time.monotonic()
    run_until_caught_up(data_dir, InProcessExecutor())
    recovery_s = time.monotonic() - started
    report = assert_verified(data_dir, "fn_meta", owed=4000)
    counters = open_store(data_dir).counters("fn_meta")
    # The backup's checkpoints are 1000 mutations behind: those are handled again, their effects skipped.
    assert counters["effects_duplicate"] == 2 * 1000
    calls_seen = call_log_figures(calls)
    assert calls_seen.duplicate_calls == 1000
    figures(
        "6 metadata store damaged",
        damage=damage,
        mutations=4000,
        handled=report.handled,
        duplicate_handler_calls=calls_seen.duplicate_calls,
        recovery_s=round(recovery_s, 2),
        error=errors[0].replace(data_dir, "DATA")[:200],
        failed_closed_in_s=round(failed_in_s, 2),
        replayed_after_restore=1000,
        effects_skipped_as_duplicates=int(counters["effects_duplicate"]),
    )


def test_an_empty_metadata_file_runs_nothing(data_dir, figures):
    """A metadata file truncated to zero bytes is a damaged store, never a new, empty one: the run stops with
    one line naming it and the way out, and nothing runs or skips ahead."""
    load(data_dir, 50, 300)
    deploy(data_dir, ledger_definition("fn_zero", "src", "ledger"))
    meta = Path(data_dir) / SQLITE_FILE
    checkpoint_wal(meta)
    os.truncate(meta, 0)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "eventing",
            "--data-dir",
            data_dir,
            "run",
            "--until-caught-up",
            "--executor",
            "in-process",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert f"metadata store {meta} is damaged (truncated to 0 bytes)" in done.stderr, done.stderr
    assert LocalBucket.open(data_dir, "ledger").stats()["mutations"] == 0


# -- 7: the disk fills up while checkpoints and effects are written ----------------------------------


class DiskFull:
    """A write fault (metadata.sqlite_io.write_fault): while active, transactions on the named files
    (all files if none) fail as SQLite fails them on a full disk."""

    def __init__(self, *names: str, after: int = 0):
        self.names = set(names)
        self.after = after  # let this many transactions through first
        self.active = False
        self.calls = 0
        self.hits = 0

    def __call__(self, path: Path) -> None:
        if self.names and path.name not in self.names:
            return
        self.calls += 1
        if self.active and self.calls > self.after:
            self.hits += 1
            raise sqlite3.OperationalError("database or disk is full")


def test_a_full_disk_pauses_processing_until_space_returns(data_dir, tmp_path, monkeypatch, caplog, figures):
    caplog.set_level(logging.WARNING, logger="eventing.metadata")
    source = load(data_dir, 200, 3000)
    calls = tmp_path / "calls.log"
    deploy(
        data_dir,
        ledger_definition("fn_full", "src", "ledger", call_log=str(calls), sleep_ms=1, batch_size=100),
    )
    full = DiskFull()
    monkeypatch.setattr(sqlite_io, "write_fault", full)
    cps = Checkpoints(data_dir, "fn_full")
    with RunningService(data_dir, InProcessExecutor()) as running:
        wait_for(lambda: cps.total() > 500, "processing is under way")
        full.active = True
        wait_for(lambda: full.hits > 0, "a write meets the full disk")
        at_full = cps.total()
        time.sleep(2.0)
        assert cps.total() == at_full  # paused: no checkpoint moves without space
        full.active = False
        freed = time.monotonic()
        wait_for(lambda: cps.total() > at_full, "processing resumes once space returns")
        recovery_s = time.monotonic() - freed
        wait_for(lambda: cps.lag(source) == 0, "fn_full catches up")
    assert running.error is None and not running.summary.errors
    assert any("the disk is full; waiting for free space" in r.getMessage() for r in caplog.records)
    report = assert_verified(data_dir, "fn_full", owed=3000)
    calls_seen = call_log_figures(calls)
    figures(
        "7 disk full (injected), space back within the wait",
        mutations=3000,
        handled=report.handled,
        failed_writes=full.hits,
        handler_calls=calls_seen.calls,
        duplicate_handler_calls=calls_seen.duplicate_calls,
        recovery_s=round(recovery_s, 2),
    )


def test_a_disk_full_for_too_long_stops_cleanly_and_a_rerun_loses_nothing(
    data_dir, tmp_path, monkeypatch, figures
):
    load(data_dir, 200, 3000)
    calls = tmp_path / "calls.log"
    deploy(data_dir, ledger_definition("fn_stop", "src", "ledger", call_log=str(calls), batch_size=200))
    monkeypatch.setenv(sqlite_io.STORE_WAIT_ENV, "1")
    monkeypatch.setattr(worker_module, "EFFECT_FLUSH_MIN", 1)  # one effects transaction per batch, as mid-run
    full = DiskFull("ledger.sqlite3", after=8)  # effects cannot be written: they fail mid-run
    full.active = True
    monkeypatch.setattr(sqlite_io, "write_fault", full)
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    assert len(summary.errors) == 1
    assert "the disk is full" in summary.errors[0] and "free space" in summary.errors[0]
    assert summary.functions["fn_stop"].state == "failed"
    # Stopped, not skipped: the checkpoints cover only effects that are durable.
    report = verify_function(data_dir, "fn_stop")
    assert report.ok and report.past_checkpoint > 0, report.summary()
    stopped_at = report.source_mutations

    full.active = False  # space returns
    started = time.monotonic()
    run_until_caught_up(data_dir, InProcessExecutor())
    report = assert_verified(data_dir, "fn_stop", owed=3000)
    calls_seen = call_log_figures(calls)
    figures(
        "7 disk full (injected), longer than the wait",
        mutations=3000,
        handled=report.handled,
        checkpointed_before_stop=stopped_at,
        failed_writes=full.hits,
        handler_calls=calls_seen.calls,
        duplicate_handler_calls=calls_seen.duplicate_calls,
        recovery_s=round(time.monotonic() - started, 2),
    )


@contextmanager
def small_filesystem(path: Path, size_mb: int) -> Iterator[Path]:
    """A size-limited tmpfs at path; the test is skipped where mounting is not allowed."""
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited tmpfs needs root; the injected disk-full tests cover this")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.strip()}); the injected disk-full tests cover this"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_up(folder: Path) -> Path:
    """Write a file until the file system has no space left; deleting it gives the space back."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12):
            block = b"\0" * size
            while True:
                try:
                    f.write(block)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    return filler


def test_a_real_full_disk_pauses_ray_workers_and_a_run_that_cannot_wait_stops_cleanly(
    tmp_path, ray_executor, figures
):
    with small_filesystem(tmp_path / "small", 48) as fs:
        data_dir = str(fs / "data")
        source = load(data_dir, 300, 6000)
        calls = tmp_path / "calls.log"  # outside the full file system
        deploy(
            data_dir,
            ledger_definition(
                "fn_disk", "src", "ledger", workers=2, call_log=str(calls), sleep_ms=1, batch_size=100
            ),
        )
        cps = Checkpoints(data_dir, "fn_disk")
        with RunningService(data_dir, ray_executor) as running:
            wait_for(lambda: cps.total() > 800, "processing is under way")
            filler = fill_up(fs)
            at_full = cps.total()
            time.sleep(3.0)  # writes that still fit in already-allocated WAL space may land; then none
            during = cps.total()
            filler.unlink()
            freed = time.monotonic()
            wait_for(lambda: cps.total() > during, "processing resumes once space returns")
            recovery_s = time.monotonic() - freed
            wait_for(lambda: cps.lag(source) == 0, "fn_disk catches up")
        assert running.error is None and not running.summary.errors, running.summary.errors
        assert during < 6000
        report = assert_verified(data_dir, "fn_disk", owed=6000)
        calls_seen = call_log_figures(calls)

        # `eventing run` on a disk that stays full, told to wait 1s: it stops with one clear line.
        load(data_dir, 100, 2000, seed=11, prefix="more")
        # No spare WAL space to write into, and none a closing connection could give back: the
        # service's first write (its heartbeat) meets the full disk.
        for name in (SQLITE_FILE, "buckets/ledger.sqlite3", "buckets/src.sqlite3"):
            checkpoint_wal(Path(data_dir) / name)
        filler = fill_up(fs)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "eventing",
                "--data-dir",
                data_dir,
                "run",
                "--until-caught-up",
                "--executor",
                "in-process",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=ROOT,
            env={**os.environ, sqlite_io.STORE_WAIT_ENV: "1"},
        )
        output = done.stdout + done.stderr
        assert done.returncode != 0 and "Traceback" not in output, output
        stops = [line for line in output.splitlines() if "stayed full for 1s; free space" in line]
        assert stops, output
        filler.unlink()
        run_until_caught_up(data_dir, InProcessExecutor())
        final = assert_verified(data_dir, "fn_disk", owed=8000)
        message = stops[-1].replace(data_dir, "DATA")
        exit_code = done.returncode
    figures(
        "7 disk full (tmpfs)",
        mutations=8000,
        handled=final.handled,
        checkpoint_at_full=at_full,
        checkpoint_moves_while_full=during - at_full,
        handler_calls=calls_seen.calls,
        duplicate_handler_calls=calls_seen.duplicate_calls,
        recovery_s=round(recovery_s, 2),
        first_pass_handled=report.handled,
        stop_exit_code=exit_code,
        stop_message=message[:240],
    )


# -- 8: a 10x burst ------------------------------------------------------------------------------------


def test_a_10x_burst_keeps_worker_memory_bounded_and_the_lag_recovers(data_dir, ray_executor, figures):
    base, docs, workers, batch = 10_000, 1000, 2, 500
    source = load(data_dir, docs, base)
    deploy(data_dir, ledger_definition("fn_burst", "src", "ledger", workers=workers, batch_size=batch))
    cps = Checkpoints(data_dir, "fn_burst")
    with RunningService(data_dir, ray_executor) as running:
        wait_for(lambda: cps.lag(source) == 0, "the base load is handled")
        slots = list(running.service.supervisors["fn_burst"].slots.values())
        pids = [s.pid for s in slots if s.pid]
        assert len(pids) == workers
        baseline = {pid: vm_rss_mb(pid) for pid in pids}
        peak = dict(baseline)
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                for pid in pids:
                    peak[pid] = max(peak[pid], vm_rss_mb(pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        burst_bytes = 0
        for chunk in chunked(loadgen.generate(docs, 10 * base, seed=12, prefix="burst"), 10_000):
            burst_bytes += sum(len(w.doc or b"") for w in chunk)
            source.write(chunk)
        written = time.monotonic()
        peak_lag = cps.lag(source)
        wait_for(lambda: cps.lag(source) == 0, "the lag is back to 0", timeout=120)
        recovery_s = time.monotonic() - written
        sampling.set()
        sampler.join()
        after = {pid: vm_rss_mb(pid) for pid in pids}
    assert running.error is None and not running.summary.errors
    growth = max(peak[pid] - baseline[pid] for pid in pids)
    # In flight per worker: CREDITS (2) steps of batch_size mutations, well under 1 MB. A worker that kept
    # each burst mutation as a row tuple (its document bytes plus ~300 bytes of objects) would grow by more
    # than the bound; one that kept decoded documents, by several times more.
    bound_mb = 10.0
    leak_mb = (burst_bytes + 300 * 10 * base) / workers / 2**20
    assert leak_mb > bound_mb
    assert growth < bound_mb, f"worker RSS grew by {growth:.1f} MB during the burst (bound {bound_mb} MB)"
    report = assert_verified(data_dir, "fn_burst", owed=11 * base)
    figures(
        "8 10x burst",
        mutations=11 * base,
        burst=10 * base,
        handled=report.handled,
        burst_write_s=round(written - started, 2),
        peak_lag=peak_lag,
        recovery_s=round(recovery_s, 2),
        burst_rate_mps=round(10 * base / (written - started + recovery_s)),
        rss_baseline_mb={str(p): round(v, 1) for p, v in baseline.items()},
        rss_peak_mb={str(p): round(v, 1) for p, v in peak.items()},
        rss_after_mb={str(p): round(v, 1) for p, v in after.items()},
        rss_growth_mb=round(growth, 1),
        bound_mb=bound_mb,
        leak_would_add_mb=round(leak_mb, 1),
    )


# -- 9: mutations delivered again ------------------------------------------------------------------------


def test_a_replayed_range_applies_no_effect_twice(data_dir, tmp_path, ray_executor, figures):
    load(data_dir, 300, 4000)
    calls = tmp_path / "calls.log"
    deploy(
        data_dir,
        ledger_definition("fn_replay", "src", "ledger", workers=2, call_log=str(calls), batch_size=200),
    )
    run_until_caught_up(data_dir, ray_executor)
    before = open_store(data_dir).counters("fn_replay").get("effects_duplicate", 0)
    # The fault: rewind 64 vBuckets' checkpoints by up to 5 seqnos, as a stale writer would.
    store = open_store(data_dir)
    rewound = {vb: cp.seqno for vb, cp in store.checkpoints("fn_replay").items() if cp.seqno >= 5}
    rewound = dict(list(rewound.items())[:64])
    for vb in rewound:
        store._db.execute("UPDATE checkpoints SET seqno=seqno-5 WHERE function=? AND vb=?", ("fn_replay", vb))
    replayed = 5 * len(rewound)
    started = time.monotonic()
    run_until_caught_up(data_dir, ray_executor)
    rerun_s = time.monotonic() - started

    report = verify_function(data_dir, "fn_replay")
    assert report.missing == [] and report.duplicate_effects == [] and report.out_of_order == []
    assert report.unexpected == [] and report.handled == 4000 and report.past_checkpoint == 0
    # verify reports the injected fault itself: each rewound checkpoint, caught by the store's trigger.
    assert sorted(r["vb"] for r in report.checkpoint_regressions) == sorted(rewound)
    assert {r["how"] for r in report.checkpoint_regressions} == {"applied"}
    duplicates = open_store(data_dir).counters("fn_replay")["effects_duplicate"] - before
    assert duplicates == 2 * replayed  # each replayed mutation's effect and history write, skipped
    calls_seen = call_log_figures(calls)
    assert calls_seen.duplicate_calls == replayed and calls_seen.distinct == 4000
    figures(
        "9 replayed range (checkpoints rewound)",
        mutations=4000,
        handled=report.handled,
        replayed=replayed,
        duplicate_handler_calls=calls_seen.duplicate_calls,
        effects_skipped_as_duplicates=int(duplicates),
        duplicate_effects_in_ledger=0,
        checkpoint_regressions_reported=len(report.checkpoint_regressions),
        recovery_s=round(rerun_s, 2),
    )


def test_a_mutation_delivered_twice_by_the_source_is_refused_and_applied_once(
    data_dir, tmp_path, monkeypatch, figures
):
    source = load(data_dir, 100, 1500)
    calls = tmp_path / "calls.log"
    deploy(
        data_dir, ledger_definition("fn_dup", "src", "ledger", workers=1, call_log=str(calls), batch_size=100)
    )
    read_vb_rows = LocalBucket.read_vb_rows  # what a worker reads (rows in Mutation's field order)
    delivered: list[tuple[int, int]] = []

    def stuttering_read(self, vb, after_seqno, limit):
        rows = read_vb_rows(self, vb, after_seqno, limit)
        if not delivered and rows and after_seqno > 0:
            delivered.append((vb, rows[0][1]))
            return [rows[0], *rows]  # the source sends one mutation twice
        return rows

    monkeypatch.setattr(LocalBucket, "read_vb_rows", stuttering_read)
    summary = EventingService(data_dir, InProcessExecutor(), until_caught_up=True).run()
    vb, seqno = delivered[0]
    assert (
        len(summary.errors) == 1
        and f"vBucket {vb} of bucket 'src' went backwards: seqno {seqno}" in summary.errors[0]
    )
    report = verify_function(data_dir, "fn_dup")
    assert report.ok, report.summary()  # stopped loudly; what the checkpoints cover is whole

    monkeypatch.setattr(LocalBucket, "read_vb_rows", read_vb_rows)
    run_until_caught_up(data_dir, InProcessExecutor())
    report = assert_verified(data_dir, "fn_dup", owed=1500)
    key = source.read_vb(vb, seqno - 1, 1)[0].key
    assert LocalBucket.open(data_dir, "ledger").logged_writes(effect_key("fn_dup", key, seqno)) == {
        effect_key("fn_dup", key, seqno): 1
    }
    calls_seen = call_log_figures(calls)
    figures(
        "9 mutation delivered twice by the source",
        mutations=1500,
        handled=report.handled,
        refused=f"vb {vb} seqno {seqno}",
        duplicate_handler_calls=calls_seen.duplicate_calls,
        duplicate_effects_in_ledger=len(report.duplicate_effects),
    )


# -- 10: one document mutated 1,000 times quickly --------------------------------------------------------


def hot_document(data_dir: str, executor, versions: int, calls: Path, figures, scenario: str) -> None:
    source = load(data_dir, 50, 500)
    deploy(data_dir, ledger_definition("fn_hot", "src", "ledger", workers=2, call_log=str(calls)))
    cps = Checkpoints(data_dir, "fn_hot")
    with RunningService(data_dir, executor) as running:
        wait_for(lambda: cps.lag(source) == 0, "the base load is handled")
        started = time.monotonic()
        seqnos = [source.upsert("hot", {"rev": rev})[1] for rev in range(1, versions + 1)]
        written = time.monotonic()
        wait_for(lambda: cps.lag(source) == 0, "every version is handled")
        catch_up_s = time.monotonic() - written
    assert running.error is None and not running.summary.errors
    report = assert_verified(data_dir, "fn_hot", owed=500 + versions)
    ledger = LocalBucket.open(data_dir, "ledger")
    # Every version was handled, in order, none coalesced: one effect per seqno carrying its revision,
    # and a history listing all of them in seqno order.
    revs = [ledger.get(effect_key("fn_hot", "hot", s))["rev"] for s in seqnos]
    assert revs == list(range(1, versions + 1))
    assert ledger.get(history_key("fn_hot", "hot"))["seqs"] == seqnos
    hot_calls = read_call_log(calls)["hot"]
    assert hot_calls == seqnos
    figures(
        scenario,
        mutations=500 + versions,
        versions=versions,
        handled=report.handled,
        write_rate_mps=round(versions / (written - started)),
        handled_versions=len(revs),
        duplicate_handler_calls=len(hot_calls) - len(set(hot_calls)),
        caught_up_after_last_write_s=round(catch_up_s, 2),
    )


def test_a_document_mutated_1000_times_quickly_has_every_version_handled_in_order(
    data_dir, tmp_path, ray_executor, figures
):
    hot_document(data_dir, ray_executor, 1000, tmp_path / "calls.log", figures, "10 one document x1000")


# -- soak variants (scripts/soak.sh) ---------------------------------------------------------------------


@pytest.mark.soak
def test_soak_repeated_metadata_locks(data_dir, tmp_path, ray_executor, caplog, figures):
    caplog.set_level(logging.WARNING, logger="eventing.metadata")
    source = load(data_dir, 2000, 60_000)
    calls = tmp_path / "calls.log"
    deploy(
        data_dir,
        ledger_definition(
            "fn_lock", "src", "ledger", workers=4, call_log=str(calls), sleep_ms=0.5, batch_size=200
        ),
    )
    cps = Checkpoints(data_dir, "fn_lock")
    locks = 0
    with RunningService(data_dir, ray_executor) as running:
        while cps.lag(source) > 0 and locks < 10:
            lock_metadata(data_dir, 3.0).wait()
            locks += 1
            time.sleep(1.0)
        wait_for(lambda: cps.lag(source) == 0, "caught up", timeout=600)
    assert running.error is None and not running.summary.errors and cps.backwards == []
    report = assert_verified(data_dir, "fn_lock", owed=60_000)
    calls_seen = call_log_figures(calls)
    figures(
        "5 soak: repeated locks",
        mutations=60_000,
        handled=report.handled,
        locks=locks,
        duplicate_handler_calls=calls_seen.duplicate_calls,
    )


@pytest.mark.soak
def test_soak_repeated_bursts_do_not_grow_worker_memory(data_dir, ray_executor, figures):
    docs, burst, rounds = 2000, 100_000, 8
    source = load(data_dir, docs, 10_000)
    deploy(data_dir, ledger_definition("fn_burst", "src", "ledger", workers=2, batch_size=500))
    cps = Checkpoints(data_dir, "fn_burst")
    after_round: list[float] = []
    with RunningService(data_dir, ray_executor) as running:
        wait_for(lambda: cps.lag(source) == 0, "the base load is handled")
        pids = [s.pid for s in running.service.supervisors["fn_burst"].slots.values() if s.pid]
        for i in range(rounds):
            for chunk in chunked(loadgen.generate(docs, burst, seed=100 + i, prefix=f"b{i}"), 10_000):
                source.write(chunk)
            wait_for(lambda: cps.lag(source) == 0, f"burst {i} handled", timeout=600)
            after_round.append(max(vm_rss_mb(pid) for pid in pids))
    assert running.error is None and not running.summary.errors
    assert after_round[-1] - after_round[1] < 16.0, after_round
    report = assert_verified(data_dir, "fn_burst", owed=10_000 + rounds * burst)
    figures(
        "8 soak: repeated bursts",
        mutations=10_000 + rounds * burst,
        handled=report.handled,
        rss_after_each_burst_mb=[round(v, 1) for v in after_round],
    )


@pytest.mark.soak
def test_soak_a_document_mutated_5000_times(data_dir, tmp_path, ray_executor, figures):
    # Every version of the ledger's history document stays in its log (O(n^2) bytes): 5,000 is ~60 MB.
    hot_document(data_dir, ray_executor, 5000, tmp_path / "calls.log", figures, "10 soak: one document x5000")
