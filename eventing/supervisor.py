"""Runs one deployed function: starts its workers per the vBucket plan, keeps them stepping with bounded
credits, restarts dead workers from their checkpoints, and stops them cleanly (checkpoint, release)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from eventing.bucket import LocalBucket
from eventing.definition import FunctionDefinition
from eventing.errors import EventingError
from eventing.executor import Executor, WorkerDied, WorkerHandle
from eventing.worker import StepReport, WorkerSpec
from metadata import FunctionRecord
from sharding import NUM_VBUCKETS, worker_plan

log = logging.getLogger("eventing.supervisor")

# Outstanding step calls per worker. Two hide the ~0.7 ms Ray round trip; the bound on work in flight
# is workers x CREDITS x batch_size mutations (credit-based flow control, as in Flink).
CREDITS = 2
IDLE_POLL_S = 0.05  # a caught-up worker is asked again after this long
RESTART_BACKOFF_S = (0.2, 1.0, 2.0, 5.0)


@dataclass
class WorkerSlot:
    spec: WorkerSpec
    handle: WorkerHandle | None = None
    starting: Any = None  # future of the "start" call
    inflight: list[Any] = field(default_factory=list)
    ready: bool = False
    caught_up: bool = False
    backlog: int = 0
    restarts: int = 0
    next_step_at: float = 0.0
    started_at: float = 0.0
    pid: int | None = None  # the worker's process, once started


class FunctionSupervisor:
    def __init__(
        self,
        data_dir: str,
        record: FunctionRecord,
        executor: Executor,
        *,
        until_caught_up: bool = False,
        node: str = "local",
    ):
        self.data_dir = data_dir
        self.record = record
        self.name = record.name
        self.defn = FunctionDefinition.from_dict(record.definition)
        self.executor = executor
        self.until_caught_up = until_caught_up
        targets = None
        if until_caught_up:
            source = LocalBucket.open(data_dir, self.defn.source_bucket)
            targets = tuple(source.high_seqnos())
            source.close()
        self.targets = targets
        self.slots: dict[str, WorkerSlot] = {}
        for index, vbs in enumerate(worker_plan(range(NUM_VBUCKETS), self.defn.worker_count)):
            wid = f"{node}/w{index}"
            self.slots[wid] = WorkerSlot(WorkerSpec(data_dir, self.name, record.generation, wid, tuple(vbs), targets))
        self.handled = 0
        self.error: EventingError | None = None
        self.started_at = time.monotonic()
        self._future_owner: dict[Any, str] = {}

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        for slot in self.slots.values():
            self._spawn(slot)

    def _spawn(self, slot: WorkerSlot) -> None:
        slot.handle = self.executor.start_worker(slot.spec)
        slot.starting = slot.handle.call("start")
        slot.ready = False
        slot.inflight = []
        slot.started_at = time.monotonic()
        self._future_owner[slot.starting] = slot.spec.worker_id

    @property
    def ready(self) -> bool:
        return all(s.ready for s in self.slots.values())

    @property
    def done(self) -> bool:
        return self.error is not None or (
            self.until_caught_up and all(s.ready and s.caught_up and not s.inflight for s in self.slots.values())
        )

    @property
    def backlog(self) -> int:
        return sum(s.backlog for s in self.slots.values())

    def pump(self, timeout: float = 0.1) -> int:
        """Submit steps where credits allow, wait up to `timeout` for results, handle them. Returns handled."""
        now = time.monotonic()
        for slot in self.slots.values():
            if not slot.ready or slot.handle is None:
                continue
            if self.until_caught_up and slot.caught_up:
                continue
            while len(slot.inflight) < CREDITS and now >= slot.next_step_at:
                fut = slot.handle.call("step")
                slot.inflight.append(fut)
                self._future_owner[fut] = slot.spec.worker_id
                if slot.caught_up:
                    break  # an idle worker gets one probe at a time
        pending = [f for s in self.slots.values() for f in ([s.starting] if s.starting is not None else []) + s.inflight]
        before = self.handled
        for fut in self.executor.wait(pending, timeout):
            self._settle(fut)
        return self.handled - before

    def _settle(self, fut: Any) -> None:
        wid = self._future_owner.pop(fut, None)
        if wid is None:
            return
        slot = self.slots[wid]
        try:
            value = self.executor.result(fut)
        except WorkerDied as exc:
            self._restart(slot, str(exc))
            return
        except EventingError as exc:
            log.error("function %s worker %s failed: %s", self.name, wid, exc)
            self.error = exc
            return
        if fut is slot.starting:
            slot.starting = None
            slot.ready = True
            slot.pid = value
            return
        slot.inflight.remove(fut)
        report: StepReport = value
        self.handled += report.handled
        slot.caught_up = report.caught_up
        slot.backlog = report.backlog
        if report.fenced:
            log.warning("function %s worker %s lost %d vBuckets to a newer owner", self.name, wid, len(report.fenced))
        if report.handled == 0:
            slot.next_step_at = time.monotonic() + IDLE_POLL_S

    def _restart(self, slot: WorkerSlot, why: str) -> None:
        for fut in slot.inflight + ([slot.starting] if slot.starting is not None else []):
            self._future_owner.pop(fut, None)
        delay = RESTART_BACKOFF_S[min(slot.restarts, len(RESTART_BACKOFF_S) - 1)]
        slot.restarts += 1
        log.warning(
            "function %s worker %s died (%s); restarting from its checkpoints in %.1fs",
            self.name, slot.spec.worker_id, why, delay,
        )
        if slot.handle is not None:
            self.executor.kill(slot.handle)
        time.sleep(delay)
        slot.caught_up = False
        self._spawn(slot)

    def kill_worker(self, worker_id: str) -> None:
        """Fault injection: kill one worker's process as kill -9 would (the supervisor restarts it)."""
        slot = self.slots[worker_id]
        if slot.handle is not None:
            self.executor.kill(slot.handle)

    def stop(self, timeout: float = 60.0) -> None:
        """Let in-flight steps finish, then checkpoint and release every vBucket, then end the workers."""
        deadline = time.monotonic() + timeout
        for slot in self.slots.values():
            while (slot.inflight or slot.starting is not None) and time.monotonic() < deadline:
                for fut in self.executor.wait(list(slot.inflight) + ([slot.starting] if slot.starting else []), 0.5):
                    self._settle(fut)
        stops = {}
        for wid, slot in self.slots.items():
            if slot.handle is not None and slot.ready:
                stops[wid] = slot.handle.call("stop")
        for wid, fut in stops.items():
            try:
                self.executor.wait([fut], max(0.1, deadline - time.monotonic()))
                self.executor.result(fut)
            except (WorkerDied, EventingError) as exc:
                log.warning("function %s worker %s did not stop cleanly (%s); its checkpoints stand", self.name, wid, exc)
        for slot in self.slots.values():
            if slot.handle is not None:
                self.executor.kill(slot.handle)
                slot.handle = None

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.slots.values())
