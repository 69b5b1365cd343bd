"""A worker's guard against a mutation that ends its process (``CrashGuard``, held by ``WorkerCore``,
eventing.workers.worker): a handler that calls ``os._exit``, crashes the interpreter in native code, or
otherwise kills the process on one document would be retried from the checkpoint at every restart, for
ever, and hold up every other vBucket of its worker. So a worker notes what its handler is running, in a
file that outlives the process, and the next start of the worker counts the death against that mutation
in the metadata store; a mutation its worker died on DEATHS_TO_DEAD_LETTER times, with no other call in
flight, is dead-lettered as `crashed` when it comes again, and the worker goes on.

The notes (``CallNotes``) are a few 64-bit numbers in a file mapped in memory (a store costs nanoseconds;
the kernel keeps a shared mapping's writes when the process dies): per thread that runs handler calls
(slot 0 the worker's own, 1.. a pool's threads with `concurrency` > 1), the vBucket and seqnos of the
mutations it is handling now, or none. The worker's thread notes a whole run of one vBucket at a time
(its hot loop stays as it is), a pool thread and a timer each call. So after a death the notes name
either one call, whose death is counted (``MetadataStore.count_death``), or a run of mutations or several
calls at once, which become suspects: until the worker has passed them, each is handled alone (a pool
waits for its calls first) with a note of its own, so a second death names it. A mutation with a death
counted is a suspect too. In all, a mutation that kills its worker every time is dead-lettered after two
or three deaths, and the deaths wait out the supervisor's restart backoff
(eventing.control.supervisor.RESTART_BACKOFF_S).

The file is ``<data-dir>/run/calls/<function>/<worker id>`` where the worker sees the data directory, else
(a worker on another node of a cluster) the same path under the system's temporary folder; a sandboxed
worker gets it open from its host (eventing.workers.sandbox). Any death counts: a worker killed by an
operator (kill -9) or by the kernel's OOM killer while one call was in flight counts a death of that call.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from eventing.core.mutation import Mutation
from eventing.storage.wake import RUN_DIR
from metadata import TIMER_VB_BASE, WorkerMetadata, owner_vb

if TYPE_CHECKING:
    from eventing.workers.source_reads import SourceReader

DEATHS_TO_DEAD_LETTER = 2  # deaths of its worker with the mutation alone in flight
CRASHED = (
    "dlq_crashed"  # WorkerProgress.lettered's mark of a mutation to dead-letter as `crashed` when it comes
)
_HEADER = 4  # 64-bit numbers before the slots: version, generation, slots, spare
log = logging.getLogger("eventing.workers")

_VERSION = 1
_NONE = -1  # a slot's vBucket when its thread runs no handler call


def notes_path(location: str, function: str, worker_id: str, directory: Path | None) -> Path:
    """Where a worker's call notes live: under the data directory (`directory`: the worker sees it), else
    under the temporary folder, in a folder named after the state's location (a worker on another machine,
    or a state on a server)."""
    if directory is not None:
        base = Path(directory) / RUN_DIR / "calls"
    else:
        where = location if "://" in location else os.path.abspath(location)
        digest = hashlib.sha256(where.encode()).hexdigest()[:16]
        base = Path(tempfile.gettempdir()) / "eventing-calls" / digest
    return base / quote(function, safe="") / quote(worker_id, safe="")


def open_notes_file(location: str, function: str, worker_id: str, directory: Path | None) -> int | None:
    """The call notes file of a worker, opened for reading and writing (None where it cannot be made: the
    worker then runs without the guard)."""
    path = notes_path(location, function, worker_id, directory)
    try:
        missing, folder = [], path.parent
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for folder in reversed(missing):
            folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:  # a file grown past what CallNotes reads (a sandboxed handler may write to it): cut back
        if os.fstat(fd).st_size > _READ_MAX:
            os.ftruncate(fd, _READ_MAX)
    except OSError:
        pass
    return fd


_READ_MAX = 1 << 16  # the most of a notes file a new CallNotes reads (far more than any notes take)


class CallNotes:
    """The handler calls in flight, per slot, in a file mapped in memory (see the module docstring)."""

    def __init__(self, fd: int, generation: int, slots: int):
        size = 8 * (_HEADER + 3 * slots)
        try:
            old = os.pread(fd, _READ_MAX, 0)
        except OSError:
            old = b""
        self.left = _active(old, generation)  # what the previous process of this worker had in flight
        os.ftruncate(fd, size)
        # The file's blocks taken now: a write to a mapped page with no block behind it (a full disk) would
        # end the process with SIGBUS, where an OSError here leaves the worker to run without notes.
        os.posix_fallocate(fd, 0, size)
        self._map = mmap.mmap(fd, size)
        self.q = memoryview(self._map).cast("q")
        self.q[0], self.q[1], self.q[2] = _VERSION, generation, slots
        for slot in range(slots):
            self.q[_HEADER + 3 * slot] = _NONE
        self.slots = slots

    def note(self, slot: int, vb: int, first: int, last: int) -> None:
        q, at = self.q, _HEADER + 3 * slot
        q[at + 1] = first
        q[at + 2] = last
        q[at] = vb  # last: a note is whole once its vBucket is set

    def clear(self, slot: int) -> None:
        self.q[_HEADER + 3 * slot] = _NONE

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.q.release()
            self._map.close()


def _active(data: bytes, generation: int) -> list[tuple[int, int, int]]:
    """The notes (vb, first, last) a file holds for `generation` (none from another deployment)."""
    n = len(data) // 8
    if n < _HEADER:
        return []
    q = memoryview(data[: n * 8]).cast("q")
    if q[0] != _VERSION or q[1] != generation:
        return []
    slots = min(q[2], (n - _HEADER) // 3)
    found = []
    for slot in range(max(0, slots)):
        at = _HEADER + 3 * slot
        if q[at] != _NONE:
            found.append((q[at], q[at + 1], q[at + 2]))
    return found


class _NoNotes:
    """Stands for CallNotes where no file could be opened: nothing is noted."""

    left: list[tuple[int, int, int]] = []

    def note(self, slot: int, vb: int, first: int, last: int) -> None:
        pass

    def clear(self, slot: int) -> None:
        pass

    def close(self) -> None:
        pass


class CrashGuard:
    """The call notes of one WorkerCore, the deaths its start counted, and the mutations it handles alone."""

    def __init__(
        self, store: WorkerMetadata, function: str, generation: int, notes_fd: int | None, slots: int
    ):
        self.store = store
        self.function = function
        self.notes: CallNotes | _NoNotes = _NoNotes()
        if notes_fd is not None:
            try:
                self.notes = CallNotes(notes_fd, generation, slots)
            except OSError as exc:  # a full disk: the worker runs, its deaths are not counted meanwhile
                log.warning("worker of function %s runs without its call notes (%s)", function, exc)
            finally:
                os.close(notes_fd)  # the mapping keeps the file
        self.deaths: dict[tuple[int, int], int] = {}  # (vb, seqno) -> deaths counted on it (past checkpoints)
        # vb -> seqno ranges (first, last) handled one mutation at a time until the worker passed them
        self.suspects: dict[int, list[tuple[int, int]]] = {}
        self._found: list[tuple[int, int, int]] = []
        left = self.notes.left
        if len(left) == 1 and left[0][1] == left[0][2]:
            vb, seqno, _ = left[0]
            self.deaths[(vb, seqno)] = store.count_death(function, vb, seqno)
        else:
            self._found = left  # a run, or several calls at once: each is handled alone from now on

    def claimed(
        self, vbuckets: list[int], committed: dict[int, int], lettered: dict[tuple[int, int], str]
    ) -> None:
        """After a claim (WorkerCore.assign_vbuckets): the deaths counted on mutations of these vBuckets
        past their checkpoints. Those at the limit are marked to be dead-lettered when they come (a letter
        written already stands); the others, and the runs the last process died in, are handled alone."""
        wanted = set(vbuckets)
        deaths = self.store.deaths(self.function)
        for (vb, seqno), n in deaths.items():
            owner = owner_vb(vb)
            if owner not in wanted or (vb < TIMER_VB_BASE and seqno <= committed[vb]):
                continue
            self.deaths[(vb, seqno)] = n
            if n >= DEATHS_TO_DEAD_LETTER:
                lettered.setdefault((vb, seqno), CRASHED)
            elif vb < TIMER_VB_BASE:
                self.suspects.setdefault(vb, []).append((seqno, seqno))
        for vb, first, last in self._found:
            if vb in wanted and last > committed[vb]:
                self.suspects.setdefault(vb, []).append((max(first, committed[vb] + 1), last))

    def suspected(self, vb: int, rows: list) -> bool:
        """Whether a run of rows of one vBucket (seqno order) holds a mutation to be handled alone."""
        ranges = self.suspects.get(vb)
        if not ranges or not rows:
            return False
        low, high = rows[0][1], rows[-1][1]
        return any(first <= high and last >= low for first, last in ranges)

    def is_suspect(self, vb: int, seqno: int) -> bool:
        return any(first <= seqno <= last for first, last in self.suspects.get(vb, ()))

    def passed(self, vb: int, position: int) -> None:
        """The worker's position in the vBucket moved on: suspects behind it are done with."""
        ranges = self.suspects.get(vb)
        if ranges is None:
            return
        left = [(first, last) for first, last in ranges if last > position]
        if left:
            self.suspects[vb] = left
        else:
            del self.suspects[vb]

    def letter(self, m: Mutation) -> tuple[str, int]:
        """The error text and attempts of a `crashed` dead letter for `m`."""
        n = self.deaths.get((m.vb, m.seqno), DEATHS_TO_DEAD_LETTER)
        return (
            f"the worker's process died {n} times while the handler ran on this mutation alone (it ended its "
            "process, or crashed it in native code); dead-lettered so that the function goes on",
            n,
        )

    def close(self) -> None:
        self.notes.close()


def handle_alone(reader: SourceReader, vb: int, position: int, rows: list) -> int:
    """A worker's SourceReader (eventing.workers.source_reads) handling a run of one vBucket's rows holding
    suspects (CrashGuard): the rows between them as runs, each suspect alone, with a note naming it. A pool
    (`concurrency` > 1) first finishes the calls it took, and the suspect runs on the worker's thread while
    no other call runs."""
    guard = reader.crash_guard
    notes = guard.notes
    positions = reader.positions
    start = 0
    for i, row in enumerate(rows):
        if not guard.is_suspect(vb, row[1]):
            continue
        if i > start:
            run = rows[start:i]
            notes.note(0, vb, run[0][1], run[-1][1])
            try:
                reader.handle_rows_noted(vb, position, run)
            finally:
                notes.clear(0)
            position = positions[vb]
        if reader.batches is not None:  # on_batch: the suspect runs as a batch of its own
            reader.batches.run_alone(vb, position, row)
            position = positions[vb]
            start = i + 1
            continue
        if reader.calls is not None:
            reader.calls.drain()
        notes.note(0, vb, row[1], row[1])
        try:  # on the worker's thread, whatever run handler the worker has
            reader.handle_rows_noted(vb, position, [row], reader.handler.handle_serial)
        finally:
            notes.clear(0)
        position = positions[vb]
        start = i + 1
    if start < len(rows):
        run = rows[start:]
        notes.note(0, vb, run[0][1], run[-1][1])
        try:
            reader.handle_rows_noted(vb, position, run)
        finally:
            notes.clear(0)
    guard.passed(vb, positions[vb])
    return len(rows)
